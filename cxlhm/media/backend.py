"""What the device needs from a back end (the media behind device DRAM), declared.

A back end is byte-addressed storage of `capacity` bytes that runs batches of I/O
rows laid out like `struct cxlhm_io` (buffer address, length, offset, write flag; see
cxlhm/media/ssd.py) between host memory and itself. Everything else is optional and
announced by `caps`:

    async_io     the AsyncBackend protocol below (queue, reap, async_room, queued,
                 stream_ring, note_queued, shared_ring): I/O kept in flight across calls
                 on the calling thread's io_uring ring (the device's streamed and
                 split-phase reads, its write waves and writes behind)
    persistent   bytes survive close() and a reopen of the same path
    direct       I/O bypasses the page cache (O_DIRECT)

A back end opened on a path holds an exclusive lock on it until close(): one device
per image (`lock_image`). Adding one: a module with a `Backend` subclass, listed in
cxlhm/media/registry.py, and a subclass of cxlhm.testing.backends.BackendTests.
"""
from __future__ import annotations

import abc
import dataclasses
import errno
import fcntl
import logging
import os

import numpy as np

from typing import Protocol, runtime_checkable

from cxlhm.configerror import ConfigError


@dataclasses.dataclass(frozen=True)
class BackendCaps:
    async_io: bool = False
    persistent: bool = False
    direct: bool = False


class Backend(abc.ABC):
    """A back end as the device sees it (see the module docstring)."""

    caps: BackendCaps = BackendCaps()
    capacity: int
    path: str | None  # None: temporary, gone at close
    queue_depth: int  # ops one submit() should carry at most to keep the media busy
    fd: int  # the image's descriptor (power-loss emulation lands torn writes through it); -1 if none

    @property
    def temporary(self) -> bool:
        return self.path is None

    @abc.abstractmethod
    def submit(self, ops: np.ndarray) -> np.ndarray:
        """Run the I/O rows in `ops` and wait for all; returns bytes transferred per op,
        or -errno for a failed one. The array may be reused by the next submit()."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Make every completed write durable."""

    def register_memory(self, base: int, nbytes: int, unit: int) -> None:
        """The memory [base, base+nbytes) - the device's DRAM - is where this back end's
        I/O lands and leaves from, mapped until close(): a back end may map it for its
        I/O once (SsdBackend registers it with io_uring, in pieces of at least `unit`). A
        speed-up only: by default nothing."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything (the image lock too). No I/O may be running."""


@runtime_checkable
class SplitPhaseRing(Protocol):
    """A split-phase ring any thread may use while it holds the owner's lock
    (AsyncBackend.shared_ring); closed with its back end."""

    def queue(self, ops: np.ndarray, tags: np.ndarray) -> int:
        """Hand the rows to the kernel, tagged; returns how many were queued."""

    def reap_all(self) -> tuple[np.ndarray, np.ndarray]:
        """Wait for every queued op; (tags, results: bytes or -errno)."""


@runtime_checkable
class AsyncBackend(Protocol):
    """What a back end with `caps.async_io` offers beyond Backend: I/O kept in flight
    across calls, per calling thread (each thread has its own ring of `queue_depth`).
    The device's streamed reads and writes (cxlhm.device.stream), split-phase reads
    (cxlhm.device.media), write waves and writes behind use it; the back-end
    conformance suite (cxlhm.testing.backends) checks a back end claiming async_io
    against it."""

    queue_depth: int

    def queue(self, ops: np.ndarray, tags: np.ndarray) -> int:
        """Queue the I/O rows without waiting (a completion reports its tag); returns
        how many were queued, at most async_room()."""

    def reap(self, min_complete: int = 1, max_complete: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Send what is queued, wait until `min_complete` of the calling thread's ops
        completed; (tags, results: bytes or -errno) of those taken (at most
        `max_complete` if given). The arrays are reused by the thread's next reap()."""

    def async_room(self) -> int:
        """Ops the calling thread may still queue (its ring never holds more than
        queue_depth, so completions never overflow)."""

    def queued(self) -> int:
        """The calling thread's queued ops not reaped yet."""

    def stream_ring(self) -> tuple[int, int]:
        """(address of the calling thread's ring, fd): compiled code queues on it itself
        (cxlhm.device.stream), reports what it queued with note_queued() and takes the
        completions with reap()."""

    def note_queued(self, n: int) -> None:
        """`n` ops were queued on the calling thread's ring by compiled code."""

    def shared_ring(self, depth: int) -> SplitPhaseRing:
        """A ring of `depth` entries any thread may use while it holds the caller's lock."""


def lock_image(fd: int, path: str, source: str) -> None:
    """Take the one-owner lock of the image at `path` (open as `fd`) or raise
    ConfigError: a second device on the same image would serve its own stale copy."""
    from cxlhm.sharedfile import OWNER_EXIT_WAIT_S, lock_exclusive
    try:
        waited = lock_exclusive(fd)  # a killed owner's lock goes a moment after the owner
    except OSError as exc:
        os.close(fd)
        raise ConfigError(source, "backend.path", f"cannot lock {path}: {exc.strerror}") from None
    if waited is None:
        os.close(fd)
        raise ConfigError(source, "backend.path", f"{path} is already open by another device (in this or another "
                          f"process; waited {OWNER_EXIT_WAIT_S} s for an owner that just exited to let go); one "
                          "device owns an image at a time: close that one first")
    if waited > 0.01:
        logging.getLogger("cxlhm.media").info("%s: waited %.0f ms for the previous owner's lock to go (an owner "
                                              "that had just exited or been killed)", path, waited * 1e3)


def release_image(fd: int) -> None:
    """Give up the image's lock and close `fd`. The lock is dropped first, explicitly:
    close() alone releases it only when the last reference to the open file goes, and an
    io_uring ring being torn down in the background may still hold one for a moment, so
    a device opened on the image right after this one closed would be refused."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
