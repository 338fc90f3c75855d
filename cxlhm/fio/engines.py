"""I/O engines: carry out a chunk of I/Os with `iodepth` of them in flight.

- CxlhmEngine (ioengine=cxlhm): the emulated device through the host driver. A job
  with iodepth N hands the device N I/Os at once (readv/writev: one firmware pass, one
  io_uring batch), so the device sees them as N concurrent I/Os; the next N go when
  the batch is done. Latencies come from the job's clock (clocks.py).
- IoUringEngine (ioengine=io_uring): the raw baseline, O_DIRECT io_uring on a plain
  file with a native closed loop that keeps N I/Os in flight (fio's io_uring engine).

Buffers live in an IoArena: one page-aligned mmap cut in slots, filled once with
random bytes (the payload of writes, as fio's default buffers are).
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import threading
import time

import numpy as np

from cxlhm import counters as C
from cxlhm.fio.pattern import Chunk
from cxlhm.fio.stats import submit_bucket
from cxlhm.media.ssd import SsdBackend


class EngineError(OSError):
    """An I/O failed; errno and the offset say which."""

    def __init__(self, errno_: int, message: str):
        super().__init__(errno_, message)


class IoArena:
    """`slots` buffers of `slot_bytes` each, 4 KiB aligned (valid O_DIRECT buffers)."""

    def __init__(self, slots: int, slot_bytes: int, seed: int = 0):
        slot_bytes = -(-slot_bytes // 4096) * 4096
        self.slots, self.slot_bytes = slots, slot_bytes
        self._map = mmap.mmap(-1, slots * slot_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.data = np.frombuffer(self._map, np.uint8)
        pattern = np.random.default_rng(seed).integers(0, 256, min(self.data.shape[0], 1 << 20), dtype=np.uint8)
        for start in range(0, self.data.shape[0], pattern.shape[0]):
            piece = self.data[start:start + pattern.shape[0]]
            piece[:] = pattern[:piece.shape[0]]
        self.base = self.data.ctypes.data

    def view(self, slot: int, size: int) -> np.ndarray:
        start = slot * self.slot_bytes
        return self.data[start:start + size]

    def close(self) -> None:
        self.data = None
        try:
            self._map.close()
        except BufferError:  # a view is still alive; the GC frees the mapping later
            pass


@dataclasses.dataclass
class Completed:
    """The executed prefix of a chunk."""
    count: int
    slat: np.ndarray | None  # ns per I/O; None when the engine cannot measure it
    clat: np.ndarray  # ns per I/O
    end_ns: int
    depth: int  # I/Os in flight while these ran
    submits: np.ndarray  # fio's submit-size buckets (7 counts)
    cache: np.ndarray  # [direction][hit, miss] device-block counts (zeros: no cache)


class DeviceShare:
    """One open device used by every job clone that names its backing file. The lock
    makes (counters before, access, counters after) atomic, so hits are charged to the
    right clone; the device serialises accesses anyway."""

    def __init__(self, handle, clock):
        self.handle, self.clock = handle, clock
        self.lock = threading.Lock()
        counters = getattr(handle.device, "counters", None)
        self._counters = counters if isinstance(counters, np.ndarray) else None

    def hits_misses(self) -> tuple[int, int]:
        if self._counters is not None:
            return int(self._counters[C.HITS]), int(self._counters[C.MISSES])
        stats = self.handle.stats()
        return stats.get("hits", 0), stats.get("misses", 0)


class CxlhmEngine:
    name = "cxlhm"

    def __init__(self, share: DeviceShare, iodepth: int, max_bs: int):
        self.share, self.iodepth = share, iodepth
        self.clock = share.clock
        self._staging = np.empty(iodepth * max_bs, np.uint8)  # gathers mixed-size batches

    def now_ns(self) -> int:
        return self.clock.now_ns()

    def execute(self, chunk: Chunk, arena: IoArena, deadline_ns: int, *, keep_read_data: bool) -> Completed:
        n_total = len(chunk)
        slat = np.zeros(n_total, np.int64)
        clat = np.zeros(n_total, np.int64)
        submits = np.zeros(7, np.int64)
        cache = np.zeros((2, 2), np.int64)
        clock = self.clock
        done = 0
        end = clock.now_ns()
        while done < n_total and end < deadline_ns:
            batch_start = clock.now_ns()
            stop = min(done + self.iodepth, n_total)
            for idx in _groups(chunk.direction[done:stop], chunk.offset[done:stop], chunk.size[done:stop]):
                idx = idx + done
                token, lat, end, hm = self._device_call(chunk, arena, idx, keep_read_data)
                slat[idx] = token - batch_start
                clat[idx] = lat
                cache[int(chunk.direction[idx[0]])] += hm
            submits[submit_bucket(stop - done)] += 1
            done = stop
        return Completed(done, slat[:done], clat[:done], end, min(self.iodepth, max(done, 1)), submits, cache)

    def _device_call(self, chunk: Chunk, arena: IoArena, idx: np.ndarray, keep_read_data: bool):
        """One readv/writev of the I/Os at `idx` (same direction and size)."""
        n = idx.shape[0]
        size = int(chunk.size[idx[0]])
        slots = chunk.slot[idx]
        offsets = chunk.offset[idx]
        write = bool(chunk.direction[idx[0]])
        contiguous = size == arena.slot_bytes and bool((np.diff(slots) == 1).all())
        if contiguous:  # zero copy: consecutive whole slots are one flat buffer
            buf = arena.data[int(slots[0]) * size:(int(slots[-1]) + 1) * size]
        else:
            buf = self._staging[:n * size]
            if write:
                for i, slot in enumerate(slots.tolist()):
                    buf[i * size:(i + 1) * size] = arena.view(slot, size)
        share = self.share
        with share.lock:
            hits0, misses0 = share.hits_misses()
            token = self.clock.start_batch()
            if write:
                share.handle.writev(offsets, size, buf)
            else:
                share.handle.readv(offsets, size, buf)
            lat, end = self.clock.finish_batch(token, n)
            hits1, misses1 = share.hits_misses()
        if not write and not contiguous and keep_read_data:
            for i, slot in enumerate(slots.tolist()):
                arena.view(slot, size)[:] = buf[i * size:(i + 1) * size]
        return token, lat, end, (hits1 - hits0, misses1 - misses0)

    def close(self) -> None:
        pass


def _groups(direction: np.ndarray, offset: np.ndarray, size: np.ndarray):
    """Index arrays of one direction and size, one device call each. When no two I/Os of
    the batch overlap, order does not matter and all same-kind I/Os share a call; when
    some overlap, groups are consecutive runs in issue order so the last write wins."""
    n = direction.shape[0]
    if n == 0:
        return
    change = np.flatnonzero((direction[1:] != direction[:-1]) | (size[1:] != size[:-1])) + 1
    if change.size == 0:
        yield np.arange(n)
        return
    order = np.argsort(offset, kind="stable")
    if bool((offset[order][1:] < (offset[order] + size[order])[:-1]).any()):
        yield from np.split(np.arange(n), change)
        return
    keys = direction.astype(np.int64) * (1 << 40) + size
    for key in np.unique(keys):
        yield np.flatnonzero(keys == key)


class IoUringEngine:
    """Raw O_DIRECT io_uring on a plain file: the baseline the device is compared with."""
    name = "io_uring"

    def __init__(self, path: str, file_size: int, iodepth: int):
        self.iodepth = iodepth
        self.ssd = SsdBackend(path, file_size, max(iodepth, 1), source=f"filename={path}")
        self._ops = np.zeros((0, 4), np.int64)

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def execute(self, chunk: Chunk, arena: IoArena, deadline_ns: int, *, keep_read_data: bool) -> Completed:
        n = len(chunk)
        if self._ops.shape[0] < n:
            self._ops = np.zeros((n, 4), np.int64)
        ops = self._ops[:n]
        ops[:, 0] = arena.base + chunk.slot * arena.slot_bytes
        ops[:, 1] = chunk.size
        ops[:, 2] = chunk.offset
        ops[:, 3] = chunk.direction
        res, lat = self.ssd.run_closed_loop(ops, self.iodepth, deadline_ns)
        end = self.now_ns()
        done = res.shape[0]
        bad = np.flatnonzero(res != chunk.size[:done])
        if bad.size:
            i = int(bad[0])
            errno_ = -int(res[i]) if res[i] < 0 else 5
            raise EngineError(errno_, f"{'write' if chunk.direction[i] else 'read'} at offset {int(chunk.offset[i])}, "
                                      f"length {int(chunk.size[i])}: {os.strerror(errno_) if res[i] < 0 else 'short transfer'}")
        # the native loop refills one slot per completion after the first full submit
        submits = np.zeros(7, np.int64)
        if done:
            submits[submit_bucket(min(self.iodepth, done))] += 1
            submits[submit_bucket(1)] += max(done - self.iodepth, 0)
        return Completed(done, None, lat, end, min(self.iodepth, max(done, 1)), submits, np.zeros((2, 2), np.int64))

    def close(self) -> None:
        self.ssd.close()
