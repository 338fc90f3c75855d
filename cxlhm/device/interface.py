"""The device as a host sees it, declared: what `host_runtime.driver`, the mailbox and
the KV store may call on any device (the explicit-mode `Device`, the window's
`WindowDevice`, or an outside one), and the capability flags that say what else it
offers. cxlhm.testing.device.DeviceTests checks an implementation against it."""
from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class DeviceCaps:
    streams_reads: bool = False  # read_stream / read_start / read_reap keep reads in flight across calls
    model_clock: bool = False  # latencies are on the timing model's clock (advance_to works)
    moves_data: bool = True  # bytes are real (else timing only)
    integrity: bool = False  # checksums, poison, integrity log (block_checksums, integrity_report)
    power_loss: bool = False  # arm_power_loss / simulate_power_loss
    persistent: bool = False  # a clean close and reopen of the same image sees the same bytes


@runtime_checkable
class HostDevice(Protocol):
    cfg: object
    capacity: int
    block_size: int

    @property
    def closed(self) -> bool: ...

    def check_extent(self, hpa: int, n: int) -> None:
        """Raise AccessOutOfRange unless [hpa, hpa+n) lies inside the HDM window."""

    def access(self, ext_hpa: np.ndarray, ext_len: np.ndarray, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """Read or write the extents, laid end to end at `user_addr`; returns the latency (ns)."""

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None) -> float:
        """access() of one extent."""

    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0) -> bool:
        """A request-lifecycle hint; advisory (False: not followed)."""

    def prefetch(self, blocks, owners=None) -> int:
        """Bring blocks into device DRAM ahead of use; returns how many were requested or read."""

    def run_background(self, budget: int = 32) -> int:
        """Run background work now; returns the jobs run."""

    def flush(self) -> int:
        """Make every written byte durable; raises if a write-back failed."""

    def stats(self) -> dict:
        """Counters (cxlhm.counters) and device figures."""

    def start_mailbox(self, **options):
        """The CXL mailbox over this device."""

    def close(self) -> None:
        """Flush and release everything."""
