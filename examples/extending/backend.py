"""A back end over a plain file: each I/O row is one pread or pwrite on the image, through
the page cache. Slower than the `ssd` back end's io_uring batches, but it runs wherever
Python does (no io_uring, no O_DIRECT alignment rules on the file system), and it keeps
its bytes across a reopen.

Registered as `pread-file`, a config selects it with ``backend: {kind: pread-file}``.
"""
from __future__ import annotations

import ctypes
import errno
import os
import tempfile

import numpy as np

from cxlhm.configerror import ConfigError
from cxlhm.media.backend import Backend, BackendCaps, lock_image, release_image
from cxlhm.media.ssd import IO_BUF, IO_LEN, IO_OFFSET, IO_WRITE


class PreadFileBackend(Backend):
    def __init__(self, path: str | None, capacity: int, queue_depth: int = 32, *, source: str = "config"):
        self.path, self.capacity, self.queue_depth = path, capacity, queue_depth
        self.caps = BackendCaps(async_io=False, persistent=path is not None, direct=False)
        if path is None:  # a temporary image: an unnamed file, gone when closed
            with tempfile.TemporaryFile() as scratch:
                self.fd = os.dup(scratch.fileno())
        else:
            try:
                self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise ConfigError(source, "backend.path", f"{path} cannot be opened: {exc.strerror}") from None
            lock_image(self.fd, path, source)  # one device per image; closes the file if refused
        try:
            if os.fstat(self.fd).st_size < capacity:
                os.ftruncate(self.fd, capacity)  # sparse: holes read as zeros
        except OSError as exc:
            self.close()
            raise ConfigError(source, "backend.path", f"cannot size {path} to {capacity} bytes: {exc.strerror}") from None

    def submit(self, ops: np.ndarray) -> np.ndarray:
        res = np.empty(ops.shape[0], np.int64)
        for i, (buf, length, offset, write) in enumerate(ops[:, [IO_BUF, IO_LEN, IO_OFFSET, IO_WRITE]].tolist()):
            if offset < 0 or length < 0 or offset + length > self.capacity:
                res[i] = -errno.EINVAL
                continue
            memory = memoryview((ctypes.c_char * length).from_address(buf)).cast("B")
            try:
                res[i] = self._pwrite_all(memory, offset) if write else self._pread_all(memory, offset)
            except OSError as exc:
                res[i] = -(exc.errno or errno.EIO)
        return res

    def _pread_all(self, memory: memoryview, offset: int) -> int:
        done = 0
        while done < len(memory):  # a short read is retried; end of file past a hole reads zeros
            n = os.preadv(self.fd, [memory[done:]], offset + done)
            if n == 0:
                memory[done:] = bytes(len(memory) - done)
                break
            done += n
        return len(memory)

    def _pwrite_all(self, memory: memoryview, offset: int) -> int:
        done = 0
        while done < len(memory):
            done += os.pwrite(self.fd, memory[done:], offset + done)
        return done

    def sync(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        if self.path is None:
            os.close(fd)
        else:
            release_image(fd)
