"""Deterministic fault injection for the SSD back end (issue: reliability).

Configured under ``backend.faults`` (or built directly in tests). Every decision is a
function of (seed, I/O sequence number), so a run with the same seed, config and trace
fails in exactly the same places:

  read_error_rate / write_error_rate   an op fails with EIO (nothing transferred)
  short_read_rate / short_write_rate   an op transfers only part of its bytes
  spike_rate, spike_ns                 an op takes spike_ns longer (wall clock: a sleep)
  capacity_bytes                       the back end "fills up": writes past this many
                                       bytes written in total fail with ENOSPC
"""
from __future__ import annotations

import dataclasses
import errno
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cxlhm.media.ssd import IO_LEN, IO_WRITE

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    read_error_rate: float = 0.0
    write_error_rate: float = 0.0
    short_read_rate: float = 0.0
    short_write_rate: float = 0.0
    spike_rate: float = 0.0
    spike_ns: int = 0
    capacity_bytes: int = 0  # 0: unlimited
    seed: int = 0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], seed: int = 0) -> "FaultPlan":
        """Validate a ``backend.faults`` mapping; ValueError names the bad key."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {"seed": seed}
        for key, value in raw.items():
            if key not in fields or key == "seed":
                raise ValueError(f"unknown fault key {key!r}; accepted: {', '.join(k for k in fields if k != 'seed')}")
            if key.endswith("_rate"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                    raise ValueError(f"{key} must be a probability in [0, 1], got {value!r}")
                value = float(value)
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
            values[key] = value
        return cls(**values)

    @property
    def active(self) -> bool:
        return any((self.read_error_rate, self.write_error_rate, self.short_read_rate, self.short_write_rate,
                    self.spike_rate, self.capacity_bytes))


def _uniform(seed: int, n: int, salt: int) -> float:
    """A deterministic uniform [0, 1) draw for op `n` (splitmix64)."""
    z = (seed * _GOLDEN + n * 0xBF58476D1CE4E5B9 + salt * 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


class FaultInjector:
    """Wraps an SsdBackend: same submit() contract, with the plan's faults injected."""

    def __init__(self, backend, plan: FaultPlan):
        self.backend, self.plan = backend, plan
        self.ops = 0  # I/O sequence number: the source of every decision
        self.bytes_written = 0
        self.injected = {"read_error": 0, "write_error": 0, "short_read": 0, "short_write": 0, "spike": 0, "enospc": 0}
        # host threads may submit at once (the device runs fills outside its lock):
        # sequence numbers and totals are taken under this lock; the I/O and the
        # injected delay are not, so spikes of different threads overlap as on an SSD
        self._lock = threading.Lock()

    def __getattr__(self, name):  # everything else is the real back end's
        return getattr(self.backend, name)

    def submit(self, ops: np.ndarray) -> np.ndarray:
        with self._lock:
            verdict, spike = self._decide(ops)
        run = verdict >= 0
        short = verdict > 0
        res = np.where(run, 0, verdict)
        if run.any():
            issue = ops[run].copy()
            issue[short[run], IO_LEN] = verdict[run & short]
            res[run] = self.backend.submit(issue)
        with self._lock:
            self.bytes_written += int(res[(ops[:, IO_WRITE] == 1) & (res > 0)].sum())
        if spike:
            time.sleep(spike / 1e9)
        return res

    def _decide(self, ops: np.ndarray) -> tuple[np.ndarray, int]:
        """Each op's fate: 0 run as is, -errno fail, >0 transfer only this many bytes;
        plus the delay to add (ns)."""
        p = self.plan
        n = ops.shape[0]
        verdict = np.zeros(n, np.int64)
        spike = 0
        for i in range(n):
            seq = self.ops
            self.ops += 1
            write = bool(ops[i, IO_WRITE])
            length = int(ops[i, IO_LEN])
            if write and p.capacity_bytes and self.bytes_written + length > p.capacity_bytes:
                verdict[i] = -errno.ENOSPC
                self.injected["enospc"] += 1
            elif _uniform(p.seed, seq, 1) < (p.write_error_rate if write else p.read_error_rate):
                verdict[i] = -errno.EIO
                self.injected["write_error" if write else "read_error"] += 1
            elif _uniform(p.seed, seq, 2) < (p.short_write_rate if write else p.short_read_rate):
                verdict[i] = max(512, (length // 2) // 512 * 512)  # O_DIRECT transfers stay sector-sized
                self.injected["short_write" if write else "short_read"] += 1
            if _uniform(p.seed, seq, 3) < p.spike_rate:
                spike += p.spike_ns
                self.injected["spike"] += 1
        return verdict, spike
