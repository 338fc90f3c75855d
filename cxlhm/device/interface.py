"""The device as its users see it, declared.

`MailboxTarget` is what the mailbox's firmware thread asks of a device (geometry,
hints, health, poison); a pooled device's per-host port is one. `HostDevice` adds the
data path: what `host_runtime.driver` and the KV store may call on any device (the
explicit-mode `Device`, the window's `WindowDevice`, or an outside one). `DeviceCaps`
says what else a device offers; `IntegrityDevice` is what `caps.integrity` promises.
cxlhm.testing.device.DeviceTests checks an implementation against them."""
from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class DeviceCaps:
    streams_io: bool = False  # stream_io keeps many reads and writes in flight (StreamDevice)
    model_clock: bool = False  # latencies are on the timing model's clock (advance_to works)
    moves_data: bool = True  # bytes are real (else timing only)
    integrity: bool = False  # checksums, poison, integrity log (block_checksums, integrity_report)
    power_loss: bool = False  # arm_power_loss / simulate_power_loss
    persistent: bool = False  # a clean close and reopen of the same image sees the same bytes


@runtime_checkable
class MailboxTarget(Protocol):
    cfg: object
    capacity: int
    block_size: int

    @property
    def closed(self) -> bool: ...

    @property
    def unclean_shutdown_detected(self) -> bool:
        """The image was not closed cleanly the last time (what was lost is poisoned)."""

    def warm_up(self) -> None:
        """Compile what hints run (the mailbox calls it before it reports ready)."""

    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0) -> bool:
        """A request-lifecycle hint; advisory (False: not followed)."""

    def hint_batch(self, kind: int, sessions: np.ndarray, first_blocks: np.ndarray, n_blocks: np.ndarray,
                   args: np.ndarray) -> int:
        """Hints of one kind (int64 arrays), in order; returns how many were not followed."""

    def poison_records(self, dpa: int, length: int, max_records: int):
        """Get Poison List: a cxlhm.mailbox.poison.PoisonList of the poisoned blocks in the range."""


@runtime_checkable
class HostDevice(MailboxTarget, Protocol):
    write_mode: str  # what the firmware does with a write: "write-back", "write-through", ...

    @property
    def caps(self) -> DeviceCaps: ...

    @property
    def image_path(self) -> str | None:
        """The back end's file (None: a temporary image, gone at close)."""

    def check_extent(self, hpa: int, n: int) -> None:
        """Raise AccessOutOfRange unless [hpa, hpa+n) lies inside the HDM window."""

    def access(self, ext_hpa: np.ndarray, ext_len: np.ndarray, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """Read or write the extents, laid end to end at `user_addr`; returns the latency (ns)."""

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None) -> float:
        """access() of one extent."""

    def prefetch(self, blocks, owners=None) -> int:
        """Bring blocks into device DRAM ahead of use; returns how many were requested or read."""

    def run_background(self, budget: int = 32) -> int:
        """Run background work now; returns the jobs run."""

    def flush(self) -> int:
        """Make every written byte durable; raises if a write-back failed."""

    def stats(self) -> dict:
        """Counters (cxlhm.counters) and device figures."""

    def thread_hits_misses(self) -> tuple[int, int]:
        """Device-block hits and misses of the calling thread's accesses so far (a device
        that cannot tell threads apart counts every thread's)."""

    def start_mailbox(self, **options):
        """The CXL mailbox over this device."""

    def close(self) -> None:
        """Flush and release everything."""


@runtime_checkable
class StreamDevice(HostDevice, Protocol):
    """What a device with `caps.streams_io` offers beyond HostDevice."""

    def stream_io(self, ext_hpa, ext_len, addrs, depth: int, *, deadline_ns: int = 0, slat=None, clat=None,
                    owner: int = 0, writes=None):
        """Run extent i against the host buffer at addrs[i] (a read, or a write where
        writes[i]), in order, up to `depth` in flight; returns a result whose `count` says
        how many ran (it stops early at the deadline or before a poisoned block)."""


@runtime_checkable
class ModelClockDevice(HostDevice, Protocol):
    """What a device with `caps.model_clock` offers beyond HostDevice."""

    def now_ns(self) -> float:
        """The model clock's time: when the last operation issued so far completes."""

    def advance_to(self, t_ns: float) -> None:
        """Let time pass until `t_ns` with the host idle (background work runs meanwhile)."""


@runtime_checkable
class IntegrityDevice(HostDevice, Protocol):
    """What a device with `caps.integrity` offers beyond HostDevice."""

    def block_checksums(self, first_block: int, n_blocks: int) -> list[int | None]:
        """The checksum of the bytes the back end holds for each block (None: none yet, or lost)."""

    def integrity_report(self) -> dict:
        """What the last open recovered and what the integrity log holds now."""
