"""A back end in memory: the image is an mmap - of the file at `path` (shared, so it
persists and reopens like the SSD back end's image), or anonymous when `path` is None.
No io_uring, no O_DIRECT: each I/O row is one memmove. Fast tests run the device on
it; the SSD back end's conformance suite runs on it as well."""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
import threading

import numpy as np

from cxlhm.configerror import ConfigError
from cxlhm.media.backend import Backend, BackendCaps, lock_image, release_image
from cxlhm.media.ssd import IO_BUF, IO_LEN, IO_OFFSET, IO_WRITE


class MemoryBackend(Backend):
    def __init__(self, path: str | None, capacity: int, queue_depth: int = 128, *, source: str = "config"):
        self.path, self.capacity, self.queue_depth = path, capacity, queue_depth
        self.caps = BackendCaps(async_io=False, persistent=path is not None, direct=False)
        self.fd = -1
        if path is None:
            self._map = mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE)
        else:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise ConfigError(source, "backend.path", f"{path} cannot be opened: {exc.strerror}") from None
            lock_image(fd, path, source)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise ConfigError(source, "backend.path", f"{path} is not a regular file (the memory back end "
                                      "maps its image)")
                if st.st_size < capacity:
                    os.ftruncate(fd, capacity)  # sparse: nothing allocated until written
                self._map = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED)
            except OSError as exc:
                os.close(fd)
                raise ConfigError(source, "backend.path", f"cannot map {path} ({capacity} bytes): {exc.strerror}") from None
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
        self._anchor = ctypes.c_char.from_buffer(self._map)  # exports the map until close() drops it
        self._base = ctypes.addressof(self._anchor)
        self._lock = threading.Lock()  # close() against I/O of other threads

    def submit(self, ops: np.ndarray) -> np.ndarray:
        res = np.empty(ops.shape[0], np.int64)
        with self._lock:
            if self._map is None:
                res[:] = -errno.EBADF
                return res
            for i, (buf, length, offset, write) in enumerate(ops[:, [IO_BUF, IO_LEN, IO_OFFSET, IO_WRITE]].tolist()):
                if offset < 0 or length < 0 or offset + length > self.capacity:
                    res[i] = -errno.EINVAL
                    continue
                if write:
                    ctypes.memmove(self._base + offset, buf, length)
                else:
                    ctypes.memmove(buf, self._base + offset, length)
                res[i] = length
        return res

    def sync(self) -> None:
        with self._lock:
            if self._map is not None and self.path is not None:
                self._map.flush()

    def close(self) -> None:
        with self._lock:
            if self._map is None:
                return
            self._base, self._anchor = 0, None
            self._map.close()
            self._map = None
            if self.fd >= 0:
                release_image(self.fd)
                self.fd = -1


_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0)  # TB-scale anonymous images cost nothing until written
