"""I/O engines: carry out a chunk of I/Os with `iodepth` of them in flight.

- CxlhmEngine (ioengine=cxlhm): the emulated device through the host driver.
  Wall clock: the job's I/Os go to Device.stream_io, the device's compiled loop that
  keeps N = iodepth of them in flight (reads and writes; dirty victims are written back
  on the same ring), so the SSD queue stays near N as in fio's io_uring loop. A device
  that cannot stream (injected faults) gets up to MAX_SUBMITTERS threads, each running
  whole readv/writev batches of its share of N; the device runs their SSD reads outside
  its lock, so they overlap. An I/O's latency runs from its submission to the moment
  its completion is seen.
  Model clock: the job is an event loop over N outstanding I/Os (clocks.ModelLoop);
  each I/O is issued at the model time the one it replaces completes.
  N is opened at the job's iodepth; fio's latency-target search lowers and raises how
  many of them the job keeps in flight (`iodepth`, at most the opened `queue_depth`).
  Command priorities (cmdprio.py) tag each I/O for fio's per-priority statistics; the
  device model does not order I/Os by priority.
  It is the IOEngineOps `CXLHM` (cxlhm_apps.fio.ioengine); it uses the device only
  through the host driver's handle and its declared interface (stream_io,
  thread_hits_misses, write_mode, access_one, now_ns).
- fio's own engines on a plain file (psync, sync, pvsync, pvsync2, mmap, posixaio,
  libaio, io_uring; buffered or direct) live in raw_engines; ioengine.ENGINES names them all.

Buffers live in an IoArena: one page-aligned mmap cut in slots, filled once with
random bytes (the payload of writes, as fio's default buffers are).
"""
from __future__ import annotations

import mmap
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cxlhm_apps.fio import cmdprio
from cxlhm_apps.fio import options as O
from cxlhm_apps.fio import values as V
from cxlhm_apps.fio.cmdprio import CmdPrio
from cxlhm_apps.fio.clocks import ModelTimeScheduler
from cxlhm_apps.fio.ioengine import (ENGINES, IOENGINE_VERSION, Completed, EngineFlags, EngineJob, IOEngineOps,
                                     engine_ops)
from cxlhm_apps.fio.pattern import Chunk
from cxlhm_apps.fio.stats import submit_bucket

# Submitter threads per job on the wall clock, measured on the 2-core development machine
# (4k random reads, QD32, all misses). Whole batches: 1 thread x 32 deep 27k IOPS,
# 2 x 16 28k, 4 x 8 37k, 8 x 4 29k (more threads: more interpreter work and GIL
# hand-offs per I/O). A stream keeps the whole depth in flight from one thread.
MAX_SUBMITTERS = 4


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


class DeviceShare:
    """One open device used by every job clone that names its backing file."""

    def __init__(self, handle, clock):
        self.handle, self.clock = handle, clock  # host_runtime.driver.DeviceHandle, the jobs' clock

    def hits_misses(self) -> tuple[int, int]:
        """Device-block hits and misses of the calling thread's accesses so far."""
        return self.handle.thread_hits_misses()


class _Tally:
    """What one submitter thread did with its part of a chunk."""

    def __init__(self):
        self.submits = np.zeros(7, np.int64)
        self.cache = np.zeros((2, 2), np.int64)
        self.error: BaseException | None = None
        self.cpu = (0.0, 0.0)  # user, system seconds (helper threads: the runner sees only its own)


class CxlhmEngine:
    name = "cxlhm"
    cmdprio: CmdPrio | None = None  # the job's command priorities (set by the opener): tags only, see the module doc

    def __init__(self, share: DeviceShare, iodepth: int, max_bs: int):
        self.share = share
        self.queue_depth = self._issue_depth = iodepth  # what the engine was opened for; what it keeps in flight
        self.clock = share.clock
        self._loop = self.clock.open_loop(iodepth) if isinstance(self.clock, ModelTimeScheduler) else None
        # A device that streams (wall clock, real data, no fault injector) keeps the I/Os
        # in flight itself (stream_io); on one that does not, each submitter runs whole
        # batches (readv / writev).
        self._stream = self._loop is None and streams(share.handle)
        most = 1 if self._loop is not None or self._stream else MAX_SUBMITTERS
        n = min(most, max(iodepth, 1))
        self._depths = [iodepth // n + (i < iodepth % n) for i in range(n)]  # iodepth shared out, first ones deeper
        self._staging = [np.empty(d * max_bs, np.uint8) for d in self._depths]  # gathers mixed-size groups
        self._serial_staging = None
        self._max_bs = max_bs
        self._pool = ThreadPoolExecutor(n - 1, thread_name_prefix="cxlhm-fio-submit") if n > 1 else None
        self.helper_cpu = (0.0, 0.0)  # CPU seconds (user, system) of the helper submitters
        self._take = threading.Lock()
        self._next = 0
        self._stop = False

    @property
    def iodepth(self) -> int:
        """How many I/Os the job keeps in flight: the opened depth, or less while fio's
        latency-target search holds it lower."""
        return self._issue_depth

    @iodepth.setter
    def iodepth(self, depth: int) -> None:
        if not 1 <= depth <= self.queue_depth:
            raise ValueError(f"an issue depth of {depth} is outside 1..{self.queue_depth}, the depth the engine "
                             "was opened with")
        self._issue_depth = depth
        if self._loop is not None:
            self._loop.set_depth(depth)

    def _shares(self) -> tuple[list[int], list[np.ndarray]]:
        """The current depth shared out over the submitters (first ones deeper), each with
        its staging buffer (sized at open for its share of the opened depth, no smaller
        than its share of a lower one)."""
        depth = self._issue_depth
        if depth == self.queue_depth:
            return self._depths, self._staging
        n = min(len(self._depths), depth)
        return [depth // n + (i < depth % n) for i in range(n)], self._staging[:n]

    def now_ns(self) -> int:
        return self._loop.now_ns() if self._loop is not None else self.clock.now_ns()

    def drain(self) -> int:
        """No more I/O from this job: the time its last I/O completes (every wall-clock
        I/O has completed when execute() returns)."""
        return self._loop.drain() if self._loop is not None else self.clock.now_ns()

    def execute(self, chunk: Chunk, arena: IoArena, deadline_ns: int, *, keep_read_data: bool) -> Completed:
        if self._loop is not None:
            return self._execute_model(chunk, arena, deadline_ns)
        n_total = len(chunk)
        slat = np.zeros(n_total, np.int64)
        clat = np.zeros(n_total, np.int64)
        self._next, self._stop = 0, False
        depths, staging = self._shares()
        if len(depths) > 1 and _overlapping_writes(chunk):  # (in issue order, the last one wins: one submitter)
            if self._serial_staging is None:
                self._serial_staging = np.empty(self.queue_depth * self._max_bs, np.uint8)
            depths, staging = [self.iodepth], [self._serial_staging]
        args = (chunk, arena, deadline_ns, keep_read_data, slat, clat)
        helpers = [self._pool.submit(self._helper, depths[i], staging[i], *args) for i in range(1, len(depths))]
        tallies = [self._submitter(depths[0], staging[0], *args)] + [h.result() for h in helpers]
        for tally in tallies[1:]:
            self.helper_cpu = (self.helper_cpu[0] + tally.cpu[0], self.helper_cpu[1] + tally.cpu[1])
        for tally in tallies:
            if tally.error is not None:
                raise tally.error
        done = self._next
        submits = sum(t.submits for t in tallies)
        cache = sum(t.cache for t in tallies)
        return Completed(done, slat[:done], clat[:done], self.clock.now_ns(), min(self.iodepth, max(done, 1)),
                         submits, cache, self._tags(chunk, done))

    def _tags(self, chunk: Chunk, done: int) -> np.ndarray | None:
        """The priority tags of the chunk's first `done` I/Os (None: the job sets none).
        They go to the statistics only: the device serves every I/O alike."""
        if self.cmdprio is None:
            return None
        return self.cmdprio.tags(chunk.direction, chunk.size)[:done]

    def _helper(self, *args) -> _Tally:
        before = resource.getrusage(resource.RUSAGE_THREAD)
        tally = self._submitter(*args)
        after = resource.getrusage(resource.RUSAGE_THREAD)
        tally.cpu = (after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)
        return tally

    def _take_run(self, most: int, chunk: Chunk, deadline_ns: int) -> tuple[int, int] | None:
        """The chunk's next I/Os for a submitter: at most `most`, one direction. Runs are
        taken in chunk order and every run taken is run, so what ran is always a prefix
        of the chunk. None: the chunk is done, the deadline passed, or a submitter failed."""
        with self._take:
            start = self._next
            if self._stop or start >= len(chunk) or self.clock.now_ns() >= deadline_ns:
                return None
            stop = self._next = start + _same_direction(chunk.direction, start, most)
            return start, stop

    def _submitter(self, depth: int, staging: np.ndarray, chunk: Chunk, arena: IoArena, deadline_ns: int,
                   keep_read_data: bool, slat: np.ndarray, clat: np.ndarray) -> _Tally:
        tally = _Tally()
        try:
            if self._stream:
                self._stream_loop(tally, depth, staging, chunk, arena, deadline_ns, keep_read_data, slat, clat)
            else:
                self._batch_loop(tally, depth, staging, chunk, arena, deadline_ns, keep_read_data, slat, clat)
        except BaseException as exc:  # noqa: BLE001 - handed to execute(), which raises it
            tally.error = exc
            self._stop = True
        return tally

    def _batch_loop(self, tally, depth, staging, chunk, arena, deadline_ns, keep_read_data, slat, clat) -> None:
        """Take up to `depth` I/Os, run them as whole device calls, repeat."""
        while (run := self._take_run(depth, chunk, deadline_ns)) is not None:
            taken = time.monotonic_ns()
            self._run_whole(tally, run, staging, chunk, arena, keep_read_data, slat, clat, taken)

    def _run_whole(self, tally, run, staging, chunk, arena, keep_read_data, slat, clat, taken) -> None:
        start, stop = run
        for idx in _groups(chunk.direction[start:stop], chunk.offset[start:stop], chunk.size[start:stop]):
            idx = idx + start
            issued, lat, hm = self._device_call(chunk, arena, idx, keep_read_data, staging)
            slat[idx] = issued - taken
            clat[idx] = lat
            tally.cache[int(chunk.direction[idx[0]])] += hm
        tally.submits[submit_bucket(stop - start)] += 1

    def _stream_loop(self, tally, depth, staging, chunk, arena, deadline_ns, keep_read_data, slat, clat) -> None:
        """The chunk goes to Device.stream_io (the compiled loop that keeps `depth` I/Os
        in flight, reads and writes alike, each waiting only for an earlier one that
        holds one of its blocks); on a write-through device only runs of reads do, and
        writes run whole. What a stream leaves (it stops before a read of a poisoned
        block) runs as whole device calls, which raise that read's error."""
        device = self.share.handle
        streams_writes = device.write_mode != "write-through"
        addrs = arena.base + chunk.slot * arena.slot_bytes
        while True:
            with self._take:
                start = self._next
                if self._stop or start >= len(chunk) or self.clock.now_ns() >= deadline_ns:
                    return
                if streams_writes:
                    stop = len(chunk)
                elif chunk.direction[start]:
                    stop = start + _same_direction(chunk.direction, start, depth)
                else:  # the whole run of reads: the stream keeps `depth` of them in flight
                    stop = start + _same_direction(chunk.direction, start, len(chunk) - start)
                self._next = stop
            if chunk.direction[start] and not streams_writes:
                self._run_whole(tally, (start, stop), staging, chunk, arena, keep_read_data, slat, clat,
                                time.monotonic_ns())
                continue
            ran = device.stream_io(chunk.offset[start:stop], chunk.size[start:stop], addrs[start:stop], depth,
                                     deadline_ns=deadline_ns, slat=slat[start:stop], clat=clat[start:stop],
                                     writes=chunk.direction[start:stop] if streams_writes else None)
            tally.cache[0] += (ran.hits - ran.write_hits, ran.misses - ran.write_misses)
            tally.cache[1] += (ran.write_hits, ran.write_misses)
            if ran.submits is not None:
                tally.submits += ran.submits
            with self._take:
                self._next = start + ran.count  # what ran is a prefix: the deadline or a poisoned block stopped it
            if ran.count < stop - start:
                if self.clock.now_ns() >= deadline_ns:
                    return
                self._batch_loop(tally, depth, staging, chunk, arena, deadline_ns, keep_read_data, slat, clat)
                return

    def _device_call(self, chunk: Chunk, arena: IoArena, idx: np.ndarray, keep_read_data: bool,
                     staging: np.ndarray):
        """One readv/writev of the I/Os at `idx` (same direction and size): (issue time,
        latency, [hits, misses] of this call - counted per thread by the device)."""
        n = idx.shape[0]
        size = int(chunk.size[idx[0]])
        slots = chunk.slot[idx]
        offsets = chunk.offset[idx]
        write = bool(chunk.direction[idx[0]])
        contiguous = size == arena.slot_bytes and bool((np.diff(slots) == 1).all())
        if contiguous:  # zero copy: consecutive whole slots are one flat buffer
            buf = arena.data[int(slots[0]) * size:(int(slots[-1]) + 1) * size]
        else:
            buf = staging[:n * size]
            if write:
                for i, slot in enumerate(slots.tolist()):
                    buf[i * size:(i + 1) * size] = arena.view(slot, size)
        share = self.share
        hits0, misses0 = share.hits_misses()
        issued = time.monotonic_ns()
        if write:
            share.handle.writev(offsets, size, buf)
        else:
            share.handle.readv(offsets, size, buf)
        lat = time.monotonic_ns() - issued
        hits1, misses1 = share.hits_misses()
        if not write and not contiguous and keep_read_data:
            for i, slot in enumerate(slots.tolist()):
                arena.view(slot, size)[:] = buf[i * size:(i + 1) * size]
        return issued, lat, (hits1 - hits0, misses1 - misses0)

    def _execute_model(self, chunk: Chunk, arena: IoArena, deadline_ns: int) -> Completed:
        """The model clock's event loop: I/O i is issued when a slot of the iodepth frees
        up (clocks.ModelLoop) and completes when the timing model says so."""
        n_total = len(chunk)
        clat = np.zeros(n_total, np.int64)
        cache = np.zeros((2, 2), np.int64)
        loop, device = self._loop, self.share.handle
        offsets, sizes, directions = chunk.offset.tolist(), chunk.size.tolist(), chunk.direction.tolist()
        addrs = (arena.base + chunk.slot * arena.slot_bytes).tolist()
        done = 0
        for i in range(n_total):
            if loop.next_issue_ns() >= deadline_ns:
                loop.reach(deadline_ns)
                break
            hits0, misses0 = device.thread_hits_misses()
            write = bool(directions[i])
            clat[i] = round(loop.issue(lambda t: device.access_one(offsets[i], sizes[i], addrs[i], write,
                                                                    issue_ns=t)))
            hits1, misses1 = device.thread_hits_misses()
            cache[int(write)] += (hits1 - hits0, misses1 - misses0)
            done += 1
        submits = np.zeros(7, np.int64)
        submits[submit_bucket(1)] += done  # one I/O per submission, as the loop issues them
        return Completed(done, np.zeros(done, np.int64), clat[:done], loop.now_ns(), min(self.iodepth, max(done, 1)),
                         submits, cache, self._tags(chunk, done))

    def flush(self, data_only: bool = False) -> int:
        """fio's sync on the device: every dirty block of its DRAM written back and made
        durable (the device's flush, for fsync and fdatasync alike: it has no metadata;
        the clones sharing the device share it too)."""
        self.drain()
        self.share.handle.flush()
        return self.now_ns()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._loop is not None:
            self._loop.drain()


def streams(handle) -> bool:
    """Whether the device keeps I/Os in flight itself (StreamDevice.stream_io)."""
    return handle.caps.streams_io


def warm_stream(device, hpa: int, buf: np.ndarray) -> None:
    """Compile the device's streamed path (a read of the block at `hpa`) before a job's
    clock runs; `device`: the host driver's handle."""
    if streams(device):
        extent = (np.array([hpa], np.int64), np.array([buf.shape[0]], np.int64), np.array([buf.ctypes.data], np.int64))
        device.stream_io(*extent, 1)


def _same_direction(direction: np.ndarray, start: int, most: int) -> int:
    """Length of the run of I/Os from `start` (at most `most`) in one direction."""
    run = direction[start:start + most]
    change = np.flatnonzero(run != run[0])
    return int(change[0]) if change.size else run.shape[0]


def _overlapping_writes(chunk: Chunk) -> bool:
    """Whether the chunk has a write overlapping another I/O of it (their order matters)."""
    if not chunk.direction.any():
        return False
    order = np.argsort(chunk.offset, kind="stable")
    return bool((chunk.offset[order][1:] < (chunk.offset[order] + chunk.size[order])[:-1]).any())


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


def _open_cxlhm(job: EngineJob) -> CxlhmEngine:
    if job.share is None:
        raise job.error("ioengine", "ioengine=cxlhm: the runner opened no device for this job")
    prios = cmdprio.job_cmdprio(job)  # (before the engine: a bad combination opens nothing)
    engine = CxlhmEngine(job.share, job.iodepth, job.max_bs)
    engine.cmdprio = prios
    return engine


def _text(text: str, kb_base: int) -> str:
    return text


def _positive_size(text: str, kb_base: int) -> int:
    n = -1 if text.strip().startswith("-") else V.parse_size(text, kb_base=kb_base)
    if n <= 0:
        raise ValueError(f"must be a positive size, got {text!r}")
    return n


def _clock(text: str, kb_base: int) -> str:
    word = text.strip()
    if word not in ("wall", "model"):
        raise ValueError(f"must be one of wall, model; got {text!r}")
    return word


# The device engine's own options: they configure the device a job's file is the image of
# (devices.py opens it; a setting the device refuses is reported against the option).
DEVICE_OPTIONS = (
    O.Option("cxlhm_profile", "str", _text, None, "device profile name or YAML config (default: cmm-h)",
             group="device"),
    O.Option("cxlhm_policy", "str", _text, None, "firmware policy (`cxlhm policies` lists them)", group="device"),
    O.Option("cxlhm_dram", "int", _positive_size, None, "device DRAM bytes (default: the profile's)", group="device"),
    O.Option("cxlhm_block_size", "int", _positive_size, None,
             "device block: caching and SSD I/O unit (default: the profile's)", group="device"),
    O.Option("cxlhm_clock", "str", _clock, None,
             "wall: measured time; model: the timing model (default: the profile's clock)", group="device"),
)

CXLHM = IOEngineOps(
    "cxlhm", IOENGINE_VERSION, _open_cxlhm, EngineFlags.USES_DEVICE | EngineFlags.MEASURES_SLAT,
    options=DEVICE_OPTIONS + cmdprio.PRIO_OPTIONS + cmdprio.OPTIONS,
    refused={"sync": "the device acknowledges a write once it is in its DRAM; a write that waits for its "
                     "write-back is not modelled (fsync=N and end_fsync write the DRAM back)",
             "unlink": "the file is the device's image, kept with its checksum sidecars (<file>.cxlhm.*); remove "
                       "them yourself"},
    help="the emulated CXL-HM device through the host driver (its cxlhm_* options configure it)")


def engine_of(job) -> IOEngineOps:
    """The registered ioengine a job names."""
    return engine_ops(job["ioengine"])


def open_engine(worker):
    """The engine of a runner's worker (one job clone), opened by its ops."""
    plan, job = worker.plan, worker.job
    ctx = EngineJob(job.name, plan.clone, plan.filename, plan.file_end, job["iodepth"], bool(job["direct"]),
                    job["rw"].writes, worker.arena.slot_bytes, job.values, worker.share, job)
    return engine_of(job).open(ctx)


__all__ = ["CXLHM", "DEVICE_OPTIONS", "ENGINES", "Completed", "CxlhmEngine", "DeviceShare", "EngineError", "IoArena", "engine_of",
           "open_engine", "streams", "warm_stream"]
