"""The embedded content directory: one table in a shared-memory file that every
process on the machine maps (create once, attach from anywhere by path).

Lookups are lock-free compiled probes (seqlock per slot); publishes and removes take
one writer lock per batch: a thread lock inside a process and flock(2) on the table
file across processes, waited for at most `lock_timeout_s` (a stopped holder costs the
others their publishes - dropped and counted as `lock_timeouts` - never a hang). The
kernel drops the flock if a writer is killed; the writer marks the table while it
writes, so the next writer to take the lock after a killed one finds the mark and
repairs what was left half-written (a slot with an odd seq becomes a removed entry:
that one key misses, the keys probed past it hit again).

Every open directory holds an OFD read lock on the file's first byte, so `create()`
can tell a live table (refused) from a stale file (replaced by a new file renamed
over it, never truncated in place under a reader). Each batch first checks the file
still holds the whole table (fstat): a table someone truncated reads as misses and
refuses writes with an error. A truncation racing a batch, between that check and its
access, would fault (SIGBUS) on the missing pages: the mapping is registered with
sigbus_guard, whose handler maps zeros over the whole table and marks it, so the batch
in flight misses (or writes into memory nobody reads) and the next one sees the mark.

Capacity is fixed at creation (a power of two of slots, 48 bytes each); publishes that
find no room within the probe window are dropped and counted.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import struct
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from cxlhm.sharedfile import attach_shared
from host_runtime.directory import shm_table as T
from host_runtime.directory import sigbus_guard
from host_runtime.directory.base import ContentDirectory, DirectoryUnavailable
from host_runtime.directory.location import SparseHits

MAGIC = b"CXLHMDIR"
FORMAT = 1
HEADER_BYTES = 4096
_HEADER = struct.Struct("<8sQQQ")  # magic, format, slots, max_probe
COUNTS_AT = 64                     # live, tombstones, dropped, writing (uint64 each)
WRITING = 3                        # counts[WRITING]: 1 while a writer is inside a batch
DEFAULT_MAX_PROBE = 512  # linear probing at ~0.6 load: the longest clusters of 10M keys pass 64
SLOT_BYTES = T.SLOT_WORDS * 8


class DirectoryFileError(ValueError):
    """The file is not a cxlhm shared-memory directory (or no longer a whole one)."""


class DirectoryBusy(TimeoutError):
    """The writer lock was not free within the deadline."""


_FLOCK = struct.Struct("hh4xqqi4x")  # struct flock on x86-64 / aarch64 Linux


def _ofd_lock(fd: int, kind: int) -> bool:
    """An OFD lock on byte 0 (F_RDLCK: this table is in use; F_WRLCK: test for users)."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, 0, 1, 0))
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


_compiled = False


def _compile_outside_the_lock(table) -> None:
    """Compile (or load) the writers' code before the first batch takes the lock, so no
    process holds the lock through a compile while the others' deadlines run out."""
    global _compiled
    if not _compiled:
        keys, words, counts = np.zeros((0, 2), np.uint64), np.zeros((0, 3), np.uint64), np.zeros(2, np.int64)
        T.publish(table, 1, keys, words, counts)
        T.remove(table, 1, keys, words, False, counts)
        T.repair(np.zeros((0, T.SLOT_WORDS), np.uint64))
        _compiled = True


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
        self.size = HEADER_BYTES + slots * SLOT_BYTES
        self._counts = np.frombuffer(mm, np.int64, 4, COUNTS_AT)
        self._table = np.frombuffer(mm, np.uint64, slots * T.SLOT_WORDS, HEADER_BYTES).reshape(slots, T.SLOT_WORDS)
        self._lock = threading.Lock()
        self.lock_timeout_s = 5.0
        self.lock_timeouts = 0   # batches dropped because the writer lock stayed taken
        self.truncated_batches = 0  # batches refused because the file no longer held the table
        self.repairs = 0         # times this client repaired after a killed writer
        _ofd_lock(fd, fcntl.F_RDLCK)  # in use (create() refuses to replace a table in use)
        self._guard = sigbus_guard.register(mm)  # a truncation racing an access: zeros, not SIGBUS

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
            tmp = None
        else:
            name = str(Path(path))
            cls._refuse_live(name)
            tmp = f"{name}.{os.getpid()}.{threading.get_ident()}.new"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        size = HEADER_BYTES + slots * SLOT_BYTES
        try:
            os.ftruncate(fd, size)  # sparse: pages cost memory once written
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            _HEADER.pack_into(mm, 0, MAGIC, FORMAT, slots, max_probe)
            made = cls(name, mm, fd, owner=True)
            if tmp is not None:
                os.replace(tmp, name)  # a new file: readers of a stale one keep theirs, whole
        except BaseException:
            os.close(fd)
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        return made

    @staticmethod
    def _refuse_live(name: str) -> None:
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW)  # (a write lock needs a writable descriptor)
        except FileNotFoundError:
            return
        try:
            if not _ofd_lock(fd, fcntl.F_WRLCK):
                raise DirectoryFileError(f"{name}: a directory in use by a live process (attached); "
                                         "create() will not replace it: attach() it, or remove it first")
        finally:
            os.close(fd)  # (drops the test lock with it)

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
        sigbus_guard.unregister(self._guard)
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
        """The writer lock (DirectoryBusy past `lock_timeout_s`); repairs after a
        writer that was killed inside its batch."""
        _compile_outside_the_lock(self._table)
        deadline = time.monotonic() + self.lock_timeout_s
        if not self._lock.acquire(timeout=self.lock_timeout_s):
            raise DirectoryBusy(f"{self.path}: another thread of this process held the writer lock "
                                f"for {self.lock_timeout_s} s")
        try:
            delay = 0.0005
            while True:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise DirectoryBusy(f"{self.path}: another process held the writer lock for "
                                            f"{self.lock_timeout_s} s (stopped or stuck)") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.02)
            try:
                self._check_whole()
                if self._counts[WRITING]:  # the last writer died inside its batch
                    self._repair()
                self._counts[WRITING] = 1
                yield
                self._counts[WRITING] = 0
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def _repair(self) -> None:
        live, tombstones, repaired = T.repair(self._table)
        self._counts[0], self._counts[1] = live, tombstones
        self.repairs += 1
        logging.getLogger("cxlhm.directory").warning(
            "%s: a writer was killed inside a batch; %d half-written slot(s) dropped", self.path, repaired)

    def _whole(self) -> bool:
        return not sigbus_guard.faulted(self._guard) and os.fstat(self._fd).st_size >= self.size

    def _check_whole(self) -> None:
        if not self._whole():
            raise DirectoryUnavailable(f"{self.path}: the file was truncated (now {os.fstat(self._fd).st_size} "
                                       f"bytes) under this directory ({self.size} expected); create a new one")

    def _check_open(self) -> None:
        if self._mm is None:
            raise ValueError(f"directory {self.path} is closed")

    # ------------------------------------------------------------ primitives
    def publish_words(self, keys, words) -> int:
        self._check_open()
        counts = np.zeros(2, np.int64)
        try:
            with self._writer():
                stored = T.publish(self._table, self.max_probe, keys, np.ascontiguousarray(words, np.uint64), counts)
                self._counts[0] += counts[0]
                self._counts[1] += counts[1]
                self._counts[2] += keys.shape[0] - stored
        except DirectoryBusy:
            self.lock_timeouts += 1
            return 0  # best-effort: dropped, counted
        return int(stored)

    def lookup_words(self, keys) -> SparseHits:
        self._check_open()
        hit = np.zeros(keys.shape[0], np.bool_)
        words = np.zeros((keys.shape[0], 3), np.uint64)
        if not self._whole():  # truncated under us: the missing pages would fault
            self.truncated_batches += 1
            return SparseHits(hit, words)
        T.lookup(self._table, self.max_probe, keys, hit, words)
        return SparseHits(hit, words)

    def remove_words(self, keys, expected) -> int:
        self._check_open()
        counts = np.zeros(2, np.int64)
        use = expected is not None
        exp = np.ascontiguousarray(expected, np.uint64) if use else np.zeros((1, 3), np.uint64)
        try:
            with self._writer():
                removed = T.remove(self._table, self.max_probe, keys, exp, use, counts)
                self._counts[0] += counts[0]
                self._counts[1] += counts[1]
        except DirectoryBusy:
            self.lock_timeouts += 1
            return 0
        return int(removed)

    def clear(self) -> None:
        self._check_open()
        with self._writer():
            self._table[:] = 0
            self._counts[:] = 0
