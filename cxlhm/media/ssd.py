"""The SSD back end: an image file or block device, opened O_DIRECT, driven through
io_uring in batches by the native extension (reads and writes go straight between
the file and device-DRAM slots; no copy through Python)."""
from __future__ import annotations

import errno
import os
import stat
import tempfile

import numpy as np

from cxlhm.config import ConfigError
from cxlhm.media import native

# One row per I/O, laid out exactly like `struct cxlhm_io` (native/cxlhm_native.h):
# buf address, length, file offset, write flag (+4 bytes of padding) = 4 x int64.
IO_BUF, IO_LEN, IO_OFFSET, IO_WRITE = range(4)
IO_FIELDS = 4


class SsdBackend:
    """Byte-addressed back end of `capacity` bytes at `path` (None: an anonymous temp file)."""

    def __init__(self, path: str | None, capacity: int, queue_depth: int, *, source: str = "config"):
        self.capacity = capacity
        self.path = path
        self.temporary = path is None
        self._ffi, self._lib = native.load()
        if self._ffi.sizeof("struct cxlhm_io") != IO_FIELDS * 8:
            raise native.NativeUnavailable("struct cxlhm_io layout changed; rebuild cxlhm")
        self.fd = self._open(path, capacity, source)
        err = self._ffi.new("int *")
        self._ring = self._lib.cxlhm_ring_open(queue_depth, err)
        if self._ring == self._ffi.NULL:
            os.close(self.fd)
            raise OSError(err[0], f"io_uring setup failed: {os.strerror(err[0])}")
        self._res = np.zeros(queue_depth, np.int64)
        self._res_ptr = self._ffi.from_buffer("int64_t[]", self._res)

    def _open(self, path: str | None, capacity: int, source: str) -> int:
        flags = os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC
        if path is None:
            folder = os.environ.get("CXLHM_TMPDIR", tempfile.gettempdir())
            fd_tmp, name = tempfile.mkstemp(prefix="cxlhm-", suffix=".img", dir=folder)
            os.close(fd_tmp)
            try:
                fd = os.open(name, flags)
            except OSError as exc:
                raise ConfigError(source, "backend.path", f"temporary image in {folder} cannot be opened O_DIRECT "
                                  f"({exc.strerror}); set backend.path or CXLHM_TMPDIR to a disk-backed folder") from None
            finally:
                os.unlink(name)  # anonymous: vanishes when closed, even after a crash
        else:
            try:
                fd = os.open(path, flags | os.O_CREAT, 0o644)
            except OSError as exc:
                hint = " (the file system does not support O_DIRECT; use a disk-backed path)" if exc.errno == errno.EINVAL else ""
                raise ConfigError(source, "backend.path", f"{path} cannot be opened with O_DIRECT: {exc.strerror}{hint}") from None
        st = os.fstat(fd)
        if stat.S_ISBLK(st.st_mode):
            size = os.lseek(fd, 0, os.SEEK_END)
            if size < capacity:
                os.close(fd)
                raise ConfigError(source, "capacity", f"{capacity} bytes do not fit block device {path} ({size} bytes)")
        elif stat.S_ISREG(st.st_mode):
            if st.st_size < capacity:
                try:
                    os.ftruncate(fd, capacity)  # sparse: no blocks allocated until written
                except OSError as exc:
                    os.close(fd)
                    raise ConfigError(source, "backend.path", f"cannot size {path or 'temporary image'} to {capacity} bytes: {exc.strerror}") from None
        else:
            os.close(fd)
            raise ConfigError(source, "backend.path", f"{path} is neither a regular file nor a block device")
        return fd

    def submit(self, ops: np.ndarray) -> np.ndarray:
        """Run the I/Os in `ops` (int64 rows laid out as struct cxlhm_io) as one batch and
        wait for all; returns bytes transferred per op, or -errno for a failed op."""
        n = ops.shape[0]
        if n == 0:
            return self._res[:0]
        if self._res.shape[0] < n:
            self._res = np.zeros(n, np.int64)
            self._res_ptr = self._ffi.from_buffer("int64_t[]", self._res)
        # from_buffer is the cheapest way to hand numpy memory to C (no copy)
        rc = self._lib.cxlhm_io_batch(self._ring, self.fd, self._ffi.from_buffer("struct cxlhm_io[]", ops), n,
                                      self._res_ptr)
        res = self._res[:n]
        if rc < 0:
            raise OSError(-rc, f"io_uring batch failed: {os.strerror(-rc)}")
        return res

    def run_closed_loop(self, ops: np.ndarray, qd: int, deadline_ns: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Keep `qd` of `ops` in flight until all finish (or CLOCK_MONOTONIC passes
        `deadline_ns`), like fio's io_uring engine at iodepth=qd. Returns (res, lat_ns)
        for the ops issued: bytes or -errno, and submission-to-completion latency."""
        n = ops.shape[0]
        res = np.zeros(n, np.int64)
        lat = np.zeros(n, np.int64)
        issued = self._lib.cxlhm_io_qd(
            self._ring, self.fd, self._ffi.cast("struct cxlhm_io *", ops.ctypes.data), n, qd, deadline_ns,
            self._ffi.cast("int64_t *", res.ctypes.data), self._ffi.cast("int64_t *", lat.ctypes.data))
        if issued < 0:
            raise OSError(-issued, f"io_uring closed loop failed: {os.strerror(-issued)}")
        return res[:issued], lat[:issued]

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self._ring is not None:
            self._lib.cxlhm_ring_close(self._ring)
            self._ring = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
