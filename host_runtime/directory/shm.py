"""The embedded content directory: one table in a shared-memory file that every
process on the machine maps (create once, attach from anywhere by path).

Lookups are lock-free compiled probes (seqlock per slot); publishes and removes take
one writer lock per batch: a thread lock inside a process and flock(2) on the table
file across processes (the kernel drops it if a writer is killed, and a slot a killed
writer left half-written keeps an odd seq, so readers skip it and the next write to it
repairs it). Capacity is fixed at creation (a power of two of slots, 48 bytes each);
publishes that find no room within the probe window are dropped and counted.
"""
from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import tempfile
import threading
from pathlib import Path

import numpy as np

from cxlhm.sharedfile import attach_shared
from host_runtime.directory import shm_table as T
from host_runtime.directory.base import ContentDirectory
from host_runtime.directory.location import SparseHits

MAGIC = b"CXLHMDIR"
FORMAT = 1
HEADER_BYTES = 4096
_HEADER = struct.Struct("<8sQQQ")  # magic, format, slots, max_probe
COUNTS_AT = 64                     # live, tombstones, dropped (uint64 each)
DEFAULT_MAX_PROBE = 512  # linear probing at ~0.6 load: the longest clusters of 10M keys pass 64
SLOT_BYTES = T.SLOT_WORDS * 8


class DirectoryFileError(ValueError):
    """The file is not a cxlhm shared-memory directory."""


def slots_for(entries: int, load: float = 0.7) -> int:
    """The power-of-two slot count that holds `entries` at most `load` full."""
    need = max(64, int(entries / load) + 1)
    return 1 << (need - 1).bit_length()


class SharedMemoryDirectory(ContentDirectory):
    def __init__(self, path: str, mm: mmap.mmap, fd: int, *, owner: bool):
        self.path, self._mm, self._fd, self.owner = path, mm, fd, owner
        magic, fmt, slots, max_probe = _HEADER.unpack_from(mm, 0)
        if magic != MAGIC or fmt != FORMAT:
            raise DirectoryFileError(f"{path}: not a cxlhm directory (magic {magic!r}, format {fmt})")
        if slots & (slots - 1) or len(mm) < HEADER_BYTES + slots * SLOT_BYTES:
            raise DirectoryFileError(f"{path}: {slots} slots do not fit a {len(mm)}-byte file")
        self.slots, self.max_probe = slots, max_probe
        self._counts = np.frombuffer(mm, np.int64, 3, COUNTS_AT)
        self._table = np.frombuffer(mm, np.uint64, slots * T.SLOT_WORDS, HEADER_BYTES).reshape(slots, T.SLOT_WORDS)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ lifetime
    @classmethod
    def create(cls, path: str | os.PathLike | None = None, *, entries: int = 1 << 20,
               max_probe: int = DEFAULT_MAX_PROBE) -> "SharedMemoryDirectory":
        """A new, empty directory sized for `entries` (default path: a fresh file in /dev/shm)."""
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 1:
            raise ValueError(f"entries must be a positive integer, got {entries!r}")
        if not 1 <= max_probe <= 4096:
            raise ValueError(f"max_probe must be 1..4096, got {max_probe}")
        slots = slots_for(entries)
        if path is None:
            folder = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
            fd, name = tempfile.mkstemp(prefix="cxlhm-dir-", suffix=".shm", dir=folder)
        else:
            name = str(Path(path))
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        size = HEADER_BYTES + slots * SLOT_BYTES
        try:
            os.ftruncate(fd, size)  # sparse: pages cost memory once written
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        _HEADER.pack_into(mm, 0, MAGIC, FORMAT, slots, max_probe)
        return cls(name, mm, fd, owner=True)

    @classmethod
    def attach(cls, path: str | os.PathLike) -> "SharedMemoryDirectory":
        name = str(path)
        return attach_shared(name, HEADER_BYTES,
                             lambda size: DirectoryFileError(f"{name}: {size} bytes is too small for a directory"),
                             lambda mm, fd: cls(name, mm, fd, owner=False))

    @classmethod
    def from_url(cls, url: str) -> "SharedMemoryDirectory":
        """shm:///path/of/the/table: attach an existing directory."""
        from urllib.parse import urlsplit
        return cls.attach(urlsplit(url).path)

    def close(self) -> None:
        if self._mm is None:
            return
        self._table = self._counts = None
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view
            pass
        self._mm = None
        os.close(self._fd)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    # ------------------------------------------------------------ state
    @property
    def live(self) -> int:
        return int(self._counts[0])

    @property
    def dropped(self) -> int:
        """Publishes refused for want of room (since creation, all processes)."""
        return int(self._counts[2])

    @contextlib.contextmanager
    def _writer(self):
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _check_open(self) -> None:
        if self._mm is None:
            raise ValueError(f"directory {self.path} is closed")

    # ------------------------------------------------------------ primitives
    def publish_words(self, keys, words) -> int:
        self._check_open()
        counts = np.zeros(2, np.int64)
        with self._writer():
            stored = T.publish(self._table, self.max_probe, keys, np.ascontiguousarray(words, np.uint64), counts)
            self._counts[0] += counts[0]
            self._counts[1] += counts[1]
            self._counts[2] += keys.shape[0] - stored
        return int(stored)

    def lookup_words(self, keys) -> SparseHits:
        self._check_open()
        hit = np.zeros(keys.shape[0], np.bool_)
        words = np.zeros((keys.shape[0], 3), np.uint64)
        T.lookup(self._table, self.max_probe, keys, hit, words)
        return SparseHits(hit, words)

    def remove_words(self, keys, expected) -> int:
        self._check_open()
        counts = np.zeros(2, np.int64)
        use = expected is not None
        exp = np.ascontiguousarray(expected, np.uint64) if use else np.zeros((1, 3), np.uint64)
        with self._writer():
            removed = T.remove(self._table, self.max_probe, keys, exp, use, counts)
            self._counts[0] += counts[0]
            self._counts[1] += counts[1]
        return int(removed)

    def clear(self) -> None:
        self._check_open()
        with self._writer():
            self._table[:] = 0
            self._counts[:] = 0
