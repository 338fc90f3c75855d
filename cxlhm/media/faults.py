"""Deterministic fault injection for the SSD back end.

Configured under ``backend.faults`` (or built directly in tests). Every decision is a
function of (seed, I/O sequence number), so a run with the same seed, config and trace
fails in exactly the same places:

  read_error_rate / write_error_rate   an op fails with EIO (nothing transferred)
  short_read_rate / short_write_rate   an op transfers only part of its bytes
  spike_rate, spike_ns                 an op takes spike_ns longer (wall clock: a sleep)
  capacity_bytes                       the back end "fills up": writes past this many
                                       bytes written in total fail with ENOSPC
  power_loss_at_write                  power fails while the Nth write op (1-based, counted
                                       from open) is in flight: see below

Power loss (a torn write). The write ops of a batch before the Nth land whole; the Nth
lands only partly - its first `power_loss_pages` 4 KiB pages, then the first
`power_loss_torn_bytes` bytes (a multiple of 512, one sector) of the next page, the
rest of it keeps the bytes it had; -1 (the default) lets the seed choose both - and
nothing after it lands. `power_loss_action` says what happens next:

  freeze   the emulator keeps running with the power off: later writes are dropped
           (reported done, as a volatile write cache would), reads fail with EIO, and
           the device's integrity log records nothing more. Call
           `Device.simulate_power_loss()` to drop device DRAM and abandon the device,
           then reopen the image: an unclean shutdown.
  kill     the process is SIGKILLed at once, like the host losing power with it (the
           crash harness uses this: tests/test_crash.py).

The partial landing goes through a second, buffered descriptor of the same image
(reopened through /proc/self/fd, so an anonymous image works too) and is fdatasync'ed,
so whoever opens the image next sees exactly the torn bytes. `FaultInjector.arm_power_loss`
arms the same cut at run time; `Device.arm_power_loss` wraps a device's back end in an
injector first if it has none.
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cxlhm.media.ssd import IO_BUF, IO_LEN, IO_OFFSET, IO_WRITE

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
PAGE = 4096
SECTOR = 512
POWER_LOSS_ACTIONS = ("freeze", "kill")
_SIGNED = {"power_loss_pages", "power_loss_torn_bytes"}  # -1: the seed chooses


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    read_error_rate: float = 0.0
    write_error_rate: float = 0.0
    short_read_rate: float = 0.0
    short_write_rate: float = 0.0
    spike_rate: float = 0.0
    spike_ns: int = 0
    capacity_bytes: int = 0  # 0: unlimited
    power_loss_at_write: int = 0  # 0: never
    power_loss_pages: int = -1
    power_loss_torn_bytes: int = -1
    power_loss_action: str = "freeze"
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
            elif key == "power_loss_action":
                if value not in POWER_LOSS_ACTIONS:
                    raise ValueError(f"{key} must be one of {', '.join(POWER_LOSS_ACTIONS)}, got {value!r}")
            elif key in _SIGNED:
                if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                    raise ValueError(f"{key} must be a non-negative integer (or -1: chosen by the seed), got {value!r}")
                if key == "power_loss_torn_bytes" and value > 0 and (value % SECTOR or value >= PAGE):
                    raise ValueError(f"{key} must be a multiple of {SECTOR} below {PAGE}, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
            values[key] = value
        return cls(**values)

    @property
    def active(self) -> bool:
        return any((self.read_error_rate, self.write_error_rate, self.short_read_rate, self.short_write_rate,
                    self.spike_rate, self.capacity_bytes, self.power_loss_at_write))


def _uniform(seed: int, n: int, salt: int) -> float:
    """A deterministic uniform [0, 1) draw for op `n` (splitmix64)."""
    z = (seed * _GOLDEN + n * 0xBF58476D1CE4E5B9 + salt * 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


class FaultInjector:
    """Wraps a back end (cxlhm.media.backend): same submit() contract, with the plan's faults injected."""

    def __init__(self, backend, plan: FaultPlan):
        self.backend, self.plan = backend, plan
        self.ops = 0  # I/O sequence number: the source of every decision
        self.writes = 0  # write ops seen (power_loss_at_write counts these)
        self.bytes_written = 0
        self.injected = {"read_error": 0, "write_error": 0, "short_read": 0, "short_write": 0, "spike": 0, "enospc": 0,
                         "power_loss": 0, "torn_write": 0, "dropped_write": 0}
        self.power_lost = False
        self.torn: tuple[int, int, int] | None = None  # (file offset, bytes that landed, op length) of the cut write
        self.on_power_loss: list = []  # callables run at the cut (the device freezes its integrity log)
        # host threads may submit at once (the device runs fills outside its lock):
        # sequence numbers and totals are taken under this lock; the I/O and the
        # injected delay are not, so spikes of different threads overlap as on an SSD
        self._lock = threading.Lock()

    def __getattr__(self, name):  # everything else is the real back end's
        return getattr(self.backend, name)

    @property
    def caps(self):
        """The wrapped back end's, without split-phase I/O (submit() is where faults go in)."""
        return dataclasses.replace(self.backend.caps, async_io=False)

    def arm_power_loss(self, at_write: int | None = None, *, pages: int = -1, torn_bytes: int = -1,
                       action: str = "freeze") -> int:
        """Cut the power while the `at_write`-th write op from now is in flight (default:
        the next one). Returns the absolute write number of the cut."""
        at = self.writes + (1 if at_write is None else int(at_write))
        checked = FaultPlan.from_mapping({"power_loss_at_write": at, "power_loss_pages": pages,
                                          "power_loss_torn_bytes": torn_bytes, "power_loss_action": action})
        self.plan = dataclasses.replace(self.plan, power_loss_at_write=checked.power_loss_at_write,
                                        power_loss_pages=pages, power_loss_torn_bytes=torn_bytes, power_loss_action=action)
        return at

    def cut_power(self) -> None:
        """Power fails now, with no write in flight."""
        with self._lock:
            if self.power_lost:
                return
            self.power_lost = True
            self.injected["power_loss"] += 1
        for callback in self.on_power_loss:
            callback()

    def submit(self, ops: np.ndarray) -> np.ndarray:
        if self.power_lost:
            return self._powered_off(ops)
        with self._lock:
            verdict, spike = self._decide(ops)
            cut = self._cut_index(ops)
        if cut >= 0:
            return self._power_cut(ops, verdict, cut)
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

    def _cut_index(self, ops: np.ndarray) -> int:
        """Count the batch's writes; the row of the one power fails during, or -1."""
        at = self.plan.power_loss_at_write
        n_writes = int(np.count_nonzero(ops[:, IO_WRITE]))
        first = self.writes + 1
        self.writes += n_writes
        if not at or not first <= at <= self.writes:
            return -1
        return int(np.flatnonzero(ops[:, IO_WRITE])[at - first])

    def _power_cut(self, ops: np.ndarray, verdict: np.ndarray, cut: int) -> np.ndarray:
        """The ops before `cut` run (with their faults), op `cut` lands partly, none after."""
        res = np.zeros(ops.shape[0], np.int64)
        if cut:
            head = ops[:cut]
            v = verdict[:cut]
            run = v >= 0
            res[:cut] = np.where(run, 0, v)
            if run.any():
                issue = head[run].copy()
                short = v > 0
                issue[short[run], IO_LEN] = v[run & short]
                res[:cut][run] = self.backend.submit(issue)
        landed = self._land_torn(ops[cut])
        with self._lock:
            self.power_lost = True
            self.injected["power_loss"] += 1
            self.injected["torn_write"] += int(0 < landed < int(ops[cut, IO_LEN]))
            self.injected["dropped_write"] += int(np.count_nonzero(ops[cut + 1:, IO_WRITE]))
            self.torn = (int(ops[cut, IO_OFFSET]), landed, int(ops[cut, IO_LEN]))
        for callback in self.on_power_loss:
            callback()
        if self.plan.power_loss_action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)  # never reached: SIGKILL cannot be caught
        tail = ops[cut:]
        res[cut:] = np.where(tail[:, IO_WRITE] == 1, tail[:, IO_LEN], -errno.EIO)
        return res

    def _land_torn(self, op: np.ndarray) -> int:
        """Write the part of `op` that reaches the media before the power goes; returns
        its length in bytes."""
        p = self.plan
        length = int(op[IO_LEN])
        pages = max(1, length // PAGE)
        landed_pages = p.power_loss_pages
        if landed_pages < 0:
            landed_pages = int(_uniform(p.seed, p.power_loss_at_write, 4) * pages)
        landed = min(landed_pages * PAGE, length)
        torn = p.power_loss_torn_bytes
        if torn < 0:
            torn = int(_uniform(p.seed, p.power_loss_at_write, 5) * (PAGE // SECTOR)) * SECTOR
        landed = min(length, landed + (torn if landed < length else 0))
        if landed:
            data = ctypes.string_at(int(op[IO_BUF]), landed)
            fd = os.open(f"/proc/self/fd/{self.backend.fd}", os.O_RDWR | os.O_CLOEXEC)  # buffered, not O_DIRECT
            try:
                os.pwrite(fd, data, int(op[IO_OFFSET]))
                os.fdatasync(fd)
            finally:
                os.close(fd)
        return landed

    def _powered_off(self, ops: np.ndarray) -> np.ndarray:
        """After the cut: writes vanish (reported done), reads fail."""
        writes = ops[:, IO_WRITE] == 1
        with self._lock:
            self.injected["dropped_write"] += int(np.count_nonzero(writes))
        return np.where(writes, ops[:, IO_LEN], -errno.EIO).astype(np.int64)

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
