"""fio's own I/O engines on a plain file: psync, sync, pvsync, pvsync2, libaio,
posixaio, mmap, ftruncate and io_uring, buffered or O_DIRECT (direct=1), as fio runs them.

Each engine is one `IOEngineOps` (cxlhm_apps.fio.ioengine; fio's `struct ioengine_ops`):
its name, flags (SYNC: fio caps a synchronous engine's queue depth at 1), the options it
declares and those of fio's it refuses, and how a clone opens it. Every clone opens the
file itself, so any
number of jobs and clones share one file as they do under fio (no lock: that belongs to
the emulated device, whose image must not change behind its back).

What differs from fio, and why:
- psync/sync/pvsync/pvsync2/mmap: one system call (or copy) per I/O from Python, as
  fio issues them; the latency includes the interpreter's call overhead (about a
  microsecond).
- libaio: Linux's native AIO through its system calls (io_setup/io_submit/
  io_getevents), a closed loop of `iodepth` I/Os, reaped from Python.
- posixaio: glibc runs POSIX AIO on helper threads that do pread/pwrite; here
  `iodepth` threads do the same directly.
- io_uring: the project's native closed loop (one ring per clone, `iodepth` SQEs in
  flight), the same loop the device's SSD path uses.
- Command priorities (cmdprio.py): libaio sets each I/O's priority in aio_reqprio with
  IOCB_FLAG_IOPRIO, as fio. io_uring chooses and reports them the same way, but the
  native loop's struct cxlhm_io has no priority field, so its SQEs go out with ioprio 0
  (the kernel does not see the priority; the per-priority latencies are of the I/Os
  that would carry it).
"""
from __future__ import annotations

import collections
import ctypes
import errno
import mmap
import os
import time

import numpy as np

from cxlhm_apps.fio import options as O
from cxlhm_apps.fio import values as V
from cxlhm_apps.fio.cmdprio import OPTIONS as CMDPRIO_OPTIONS
from cxlhm_apps.fio.cmdprio import PRIO_OPTIONS, job_ioprio, job_priority
from cxlhm_apps.fio.cmdprio import CmdPrio, cmdprio_for
from cxlhm_apps.fio.ioengine import IOENGINE_VERSION, Completed, EngineFlags, EngineJob, IOEngineOps
from cxlhm_apps.fio.stats import submit_bucket

RWF_HIPRI = 0x1


class RawEngineError(OSError):
    """An I/O failed; errno and the offset say which."""


def open_flags(direct: bool, writes: bool, o_sync: bool = False) -> int:
    flags = (os.O_RDWR if writes else os.O_RDONLY) | os.O_CLOEXEC | (os.O_SYNC if o_sync else 0)
    return flags | os.O_DIRECT if direct else flags


def access_advice(values) -> str | None:
    """fio's fadvise_hint: "random" or "sequential", the access the kernel is told to
    expect (1, the default: the job's own - random for randread, randwrite, randrw), or
    None (0: no advice)."""
    hint = values.get("fadvise_hint", "1")
    if hint == "0":
        return None
    if hint == "1":
        rw = values.get("rw")
        return "random" if rw is not None and rw.random else "sequential"
    return hint


class RawEngine:
    """A clone's open file and its I/O loop. Subclasses run `_run(chunk, arena, deadline)`
    and return (count, clat) for the issued prefix of the chunk."""
    sync = True
    helper_cpu = (0.0, 0.0)
    measures_slat = False  # a subclass that does sets _slat in _run: each I/O's submission latency
    _slat: np.ndarray | None = None

    def __init__(self, path: str, file_end: int, iodepth: int, *, direct: bool, writes: bool, values: dict):
        self.path, self.file_end = path, file_end
        self.iodepth = 1 if self.sync else iodepth
        self.direct = direct
        self.values = values
        self.fd = os.open(path, open_flags(direct, writes, bool(values.get("sync"))))
        advice = access_advice(values)
        if advice is not None:  # (the page cache's read-ahead for this open file, as fio sets it)
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM if advice == "random" else os.POSIX_FADV_SEQUENTIAL)

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def drain(self) -> int:
        return time.monotonic_ns()

    def flush(self, data_only: bool = False) -> int:
        """fio's sync on a file engine: fsync, or fdatasync."""
        (os.fdatasync if data_only else os.fsync)(self.fd)
        return time.monotonic_ns()

    cmdprio: CmdPrio | None = None  # libaio/io_uring: the job's command priorities (set by the opener)
    _tags: np.ndarray | None = None  # the chunk's priority tags while it runs

    def execute(self, chunk, arena, deadline_ns: int, *, keep_read_data: bool) -> Completed:
        self._tags = self.cmdprio.tags(chunk.direction, chunk.size) if self.cmdprio is not None else None
        # as fio: the job's I/O runs at its prioclass/prio, which the kernel gives each I/O
        # that names no priority of its own
        with job_priority(job_ioprio(self.values)):
            count, clat, submits = self._run(chunk, arena, deadline_ns)
        slat = self._slat[:count] if self.measures_slat and self._slat is not None else None
        return Completed(count, slat, clat, time.monotonic_ns(), min(self.iodepth, max(count, 1)), submits,
                         np.zeros((2, 2), np.int64), None if self._tags is None else self._tags[:count])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @staticmethod
    def _failed(chunk, i: int, errno_: int | None, got: int | None = None) -> RawEngineError:
        what = "write" if chunk.direction[i] else "read"
        reason = os.strerror(errno_) if errno_ else f"short transfer ({got} of {int(chunk.size[i])} bytes)"
        return RawEngineError(errno_ or errno.EIO, f"{what} at offset {int(chunk.offset[i])}, length "
                                                   f"{int(chunk.size[i])}: {reason}")


def _one_per_submit(count: int) -> np.ndarray:
    submits = np.zeros(7, np.int64)
    if count:
        submits[submit_bucket(1)] += count
    return submits


class _SyncLoop(RawEngine):
    """One I/O at a time, in issue order; `_io(i, buf, offset, write)` does one."""

    def _run(self, chunk, arena, deadline_ns):
        n = len(chunk)
        clat = np.zeros(n, np.int64)
        offsets, sizes, slots, dirs = (chunk.offset.tolist(), chunk.size.tolist(), chunk.slot.tolist(),
                                       chunk.direction.tolist())
        clock = time.monotonic_ns
        done = 0
        for i in range(n):
            t0 = clock()
            if t0 >= deadline_ns:
                break
            try:
                got = self._io(arena.view(slots[i], sizes[i]), offsets[i], dirs[i])
            except OSError as exc:
                raise self._failed(chunk, i, exc.errno) from None
            clat[i] = clock() - t0
            if got != sizes[i]:
                raise self._failed(chunk, i, None, got)
            done += 1
        return done, clat[:done], _one_per_submit(done)


class PsyncEngine(_SyncLoop):
    def _io(self, buf, offset, write):
        return os.pwrite(self.fd, buf, offset) if write else os.preadv(self.fd, [buf], offset)


class SyncEngine(_SyncLoop):
    """read(2)/write(2) after lseek(2), as fio's sync engine (it seeks only when the
    file position is not already the I/O's offset)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pos = -1

    def _io(self, buf, offset, write):
        if self._pos != offset:
            os.lseek(self.fd, offset, os.SEEK_SET)
        got = os.write(self.fd, buf) if write else os.readv(self.fd, [buf])
        self._pos = offset + got
        return got


class PvsyncEngine(_SyncLoop):
    def _io(self, buf, offset, write):
        return os.pwritev(self.fd, [buf], offset) if write else os.preadv(self.fd, [buf], offset)


class Pvsync2Engine(_SyncLoop):
    """preadv2/pwritev2; hipri=1 sets RWF_HIPRI (polled completion where the device
    supports it; a plain file system refuses it with EOPNOTSUPP, as under fio)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._flags = RWF_HIPRI if self.values.get("hipri") else 0

    def _io(self, buf, offset, write):
        if write:
            return os.pwritev(self.fd, [buf], offset, self._flags)
        return os.preadv(self.fd, [buf], offset, self._flags)


class FtruncateEngine(_SyncLoop):
    """fio's ftruncate engine: each write sets the file's length to its offset
    (ftruncate(2)); its bytes are counted as done, none are moved. A read fails the job
    with EINVAL, as in fio."""

    def _io(self, buf, offset, write):
        if not write:
            raise OSError(errno.EINVAL, "ioengine=ftruncate does only writes")
        os.ftruncate(self.fd, offset)
        return buf.shape[0]


class MmapEngine(_SyncLoop):
    """The file mapped shared; a read copies out of the mapping, a write into it (page
    faults do the I/O, as in fio's mmap engine). direct=1 is refused at parse time: an
    mmap goes through the page cache by nature (fio's engine ignores O_DIRECT)."""

    def __init__(self, path, file_end, iodepth, *, direct, writes, values):
        super().__init__(path, file_end, iodepth, direct=False, writes=writes, values=values)
        size = max(file_end, os.fstat(self.fd).st_size)
        self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                              mmap.PROT_READ | (mmap.PROT_WRITE if writes else 0))
        self._view = np.frombuffer(self._map, np.uint8) if writes else np.frombuffer(self._map, np.uint8)
        advice = access_advice(values)
        if advice is not None:  # (fio's mmap engine advises the mapping, madvise)
            self._map.madvise(mmap.MADV_RANDOM if advice == "random" else mmap.MADV_SEQUENTIAL)

    def _io(self, buf, offset, write):
        n = buf.shape[0]
        if write:
            self._view[offset:offset + n] = buf
        else:
            buf[:] = self._view[offset:offset + n]
        return n

    def flush(self, data_only: bool = False) -> int:
        """fio's mmap engine syncs with msync(MS_SYNC): the mapping's dirty pages written."""
        self._map.flush()
        return super().flush(data_only)

    def close(self) -> None:
        self._view = None
        try:
            self._map.close()
        except BufferError:
            pass
        super().close()


class PosixaioEngine(RawEngine):
    """glibc's POSIX AIO, as fio's posixaio engine meets it: a file's requests run one at a
    time, in order, on glibc's helper thread for that file, so `iodepth` requests in flight
    wait in that queue behind the ones before them (fio's posixaio at iodepth=8 on one file
    does the IOPS of iodepth=1, each completion latency 8 times as long). The job's thread
    runs the queue itself: I/O i is submitted when I/O i - iodepth completes (the first
    `iodepth` at once) and its completion latency runs from then. No I/O is submitted past
    the deadline; what ran is a prefix of the chunk."""
    sync = False

    def _run(self, chunk, arena, deadline_ns):
        n = len(chunk)
        clat = np.zeros(n, np.int64)
        depth = max(1, self.iodepth)
        offsets, sizes, slots, dirs = (chunk.offset.tolist(), chunk.size.tolist(), chunk.slot.tolist(),
                                       chunk.direction.tolist())
        fd = self.fd
        start = time.monotonic_ns()
        ends: collections.deque[int] = collections.deque()  # the completion times of the last `depth` I/Os
        done = 0
        for i in range(n):
            submitted = start if i < depth else ends.popleft()
            if submitted >= deadline_ns:
                break
            buf = arena.view(slots[i], sizes[i])
            try:
                got = os.pwrite(fd, buf, offsets[i]) if dirs[i] else os.preadv(fd, [buf], offsets[i])
            except OSError as exc:
                raise self._failed(chunk, i, exc.errno) from None
            if got != sizes[i]:
                raise self._failed(chunk, i, None, got)
            end = time.monotonic_ns()
            ends.append(end)
            clat[i] = end - submitted
            done = i + 1
        return done, clat[:done], _one_per_submit(done)


# Linux native AIO: system call numbers and the kernel's struct iocb / io_event (x86-64
# and aarch64 share the layout; the numbers differ).
_AIO_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
IOCB_CMD_PREAD, IOCB_CMD_PWRITE = 0, 1
IOCB_FLAG_IOPRIO = 1 << 1  # aio_reqprio carries the I/O's priority (Linux 5.0+)


class _Iocb(ctypes.Structure):
    _fields_ = [("aio_data", ctypes.c_uint64), ("aio_key", ctypes.c_uint32), ("aio_rw_flags", ctypes.c_int32),
                ("aio_lio_opcode", ctypes.c_uint16), ("aio_reqprio", ctypes.c_int16), ("aio_fildes", ctypes.c_uint32),
                ("aio_buf", ctypes.c_uint64), ("aio_nbytes", ctypes.c_uint64), ("aio_offset", ctypes.c_int64),
                ("aio_reserved2", ctypes.c_uint64), ("aio_flags", ctypes.c_uint32), ("aio_resfd", ctypes.c_uint32)]


class _IoEvent(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64), ("res", ctypes.c_int64), ("res2", ctypes.c_int64)]


def libaio_unavailable() -> str | None:
    """Why libaio cannot run here (None: it can)."""
    if os.uname().machine not in _AIO_SYSCALLS:
        return f"Linux native AIO's system calls are not known for {os.uname().machine}"
    return None


class LibaioEngine(RawEngine):
    """Linux native AIO: `iodepth` iocbs in flight, each submitted as it is prepared
    (fio's iodepth_batch_submit=1 default), completions reaped as they come. As fio's: an
    I/O's submission latency runs from its preparation to io_submit's return, its
    completion latency from there."""
    sync = False
    measures_slat = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._setup, self._destroy, self._getevents, self._submit = _AIO_SYSCALLS[os.uname().machine]
        self._ctx = ctypes.c_ulong(0)
        if self._libc.syscall(self._setup, ctypes.c_long(self.iodepth), ctypes.byref(self._ctx)) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise RawEngineError(err, f"io_setup({self.iodepth}) failed: {os.strerror(err)}")
        self._iocbs = (_Iocb * self.iodepth)()
        self._events = (_IoEvent * self.iodepth)()
        batch = int(values_get(self.values, "iodepth_batch_submit", 1)) or self.iodepth
        self._batch = min(batch, self.iodepth)

    def _syscall(self, number, *args) -> int:
        got = self._libc.syscall(number, *args)
        if got < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                return 0
            raise RawEngineError(err, f"native AIO system call failed: {os.strerror(err)}")
        return got

    def _run(self, chunk, arena, deadline_ns):
        n = len(chunk)
        clat = np.zeros(n, np.int64)
        issued_at = np.zeros(n, np.int64)
        self._slat = slat = np.zeros(n, np.int64)
        submits = np.zeros(7, np.int64)
        offsets, sizes, dirs = chunk.offset.tolist(), chunk.size.tolist(), chunk.direction.tolist()
        addrs = (arena.base + chunk.slot * arena.slot_bytes).tolist()
        free = list(range(self.iodepth))
        slot_io = [0] * self.iodepth
        ctx = self._ctx
        next_i, inflight, done = 0, 0, 0
        ptrs = (ctypes.POINTER(_Iocb) * self.iodepth)()
        failure = None
        ioprio = (self._tags & 0xFFFF).tolist() if self._tags is not None else None
        while done < next_i or (next_i < n and failure is None):
            prepared = time.monotonic_ns()
            stop = failure is not None or prepared >= deadline_ns
            k, batch = 0, []
            while not stop and free and next_i < n and k < self._batch:
                s = free.pop()
                cb = self._iocbs[s]
                cb.aio_data, cb.aio_fildes = s, self.fd
                cb.aio_lio_opcode = IOCB_CMD_PWRITE if dirs[next_i] else IOCB_CMD_PREAD
                cb.aio_buf, cb.aio_nbytes, cb.aio_offset = addrs[next_i], sizes[next_i], offsets[next_i]
                if ioprio is not None:  # (as fio's libaio: IOCB_FLAG_IOPRIO with the priority in aio_reqprio)
                    cb.aio_reqprio = ioprio[next_i]
                    cb.aio_flags = IOCB_FLAG_IOPRIO if ioprio[next_i] else 0
                ptrs[k] = ctypes.pointer(cb)
                slot_io[s] = next_i
                batch.append(next_i)
                next_i += 1
                k += 1
            if k:
                sent = 0
                while sent < k:
                    sent += self._syscall(self._submit, ctx, ctypes.c_long(k - sent),
                                          ctypes.byref(ptrs, sent * ctypes.sizeof(ctypes.c_void_p)))
                issued_at[batch] = submitted = time.monotonic_ns()
                slat[batch] = submitted - prepared
                submits[submit_bucket(k)] += 1
                inflight += k
            if inflight and (not free or next_i >= n or stop or k == 0):
                got = self._syscall(self._getevents, ctx, ctypes.c_long(1), ctypes.c_long(self.iodepth),
                                    self._events, None)
                now = time.monotonic_ns()
                for e in range(got):
                    ev = self._events[e]
                    s = int(ev.data)
                    i = slot_io[s]
                    clat[i] = now - issued_at[i]
                    if ev.res != sizes[i] and failure is None:
                        failure = self._failed(chunk, i, -ev.res if ev.res < 0 else None, ev.res)
                    free.append(s)
                inflight -= got
                done += got
            elif not inflight and stop:
                break
        if failure is not None:
            raise failure
        return next_i, clat[:next_i], submits

    def close(self) -> None:
        if self._ctx.value:
            self._libc.syscall(self._destroy, self._ctx)
            self._ctx = ctypes.c_ulong(0)
        super().close()


def values_get(values: dict, name: str, default):
    value = values.get(name, default)
    return default if value is None else value


class IoUringRawEngine(RawEngine):
    """io_uring on the file (O_DIRECT or buffered): the native closed loop keeps
    `iodepth` I/Os in flight; iodepth_batch_submit SQEs go in per io_uring_enter."""
    sync = False

    def __init__(self, path, file_end, iodepth, *, direct, writes, values):
        from cxlhm.media import native
        super().__init__(path, file_end, iodepth, direct=direct, writes=writes, values=values)
        self._ffi, self._lib = native.load()
        batch = int(values_get(values, "iodepth_batch_submit", 1)) or self.iodepth
        self.submit_batch = min(batch, self.iodepth)
        self.serialize_overlap = bool(values.get("serialize_overlap"))
        self._ring = None  # made by the thread that runs the job: the ring has a single issuer (as fio's)
        self._ops = np.zeros((0, 4), np.int64)

    def _open_ring(self):
        err = self._ffi.new("int *")
        ring = self._lib.cxlhm_ring_open_owned(max(self.iodepth, 1), err)
        if ring == self._ffi.NULL:
            raise RawEngineError(err[0], f"io_uring setup failed: {os.strerror(err[0])}")
        self._lib.cxlhm_ring_submit_batch(ring, self.submit_batch)
        self._ring = ring

    def _run(self, chunk, arena, deadline_ns):
        if self._ring is None:
            self._open_ring()
        n = len(chunk)
        if self._ops.shape[0] < n:
            self._ops = np.zeros((n, 4), np.int64)
        ops = self._ops[:n]
        ops[:, 0] = arena.base + chunk.slot * arena.slot_bytes
        ops[:, 1] = chunk.size
        ops[:, 2] = chunk.offset
        ops[:, 3] = chunk.direction
        res = np.zeros(n, np.int64)
        lat = np.zeros(n, np.int64)
        ffi = self._ffi
        issued = self._lib.cxlhm_io_qd(self._ring, self.fd, ffi.cast("struct cxlhm_io *", ops.ctypes.data), n,
                                       self.iodepth, deadline_ns, int(self.serialize_overlap),
                                       ffi.cast("int64_t *", res.ctypes.data), ffi.cast("int64_t *", lat.ctypes.data))
        if issued < 0:
            raise RawEngineError(-issued, f"io_uring closed loop failed: {os.strerror(-issued)}")
        bad = np.flatnonzero(res[:issued] != chunk.size[:issued])
        if bad.size:
            i = int(bad[0])
            raise self._failed(chunk, i, -int(res[i]) if res[i] < 0 else None, int(res[i]))
        # the loop submits once `submit_batch` I/Os are prepared, or when it has to wait
        submits = np.zeros(7, np.int64)
        if issued:
            batches, rest = divmod(issued, self.submit_batch)
            submits[submit_bucket(self.submit_batch)] += batches
            if rest:
                submits[submit_bucket(rest)] += 1
        return issued, lat[:issued], submits

    def close(self) -> None:
        if self._ring is not None:
            self._lib.cxlhm_ring_close(self._ring)
            self._ring = None
        super().close()


def _hipri(text: str, kb_base: int) -> bool:
    return V.parse_bool(text)


def _opener(name: str, cls: type[RawEngine]):
    """ops.open for one of these engines: the clone opens the file itself."""
    def open_(job: EngineJob) -> RawEngine:
        try:
            engine = cls(job.filename, job.file_end, job.iodepth, direct=job.direct, writes=job.writes,
                         values=job.options)
        except OSError as exc:
            option = "direct" if exc.errno == errno.EINVAL and job.direct else "filename"
            hint = " (the file system does not support O_DIRECT; set direct=0 or use a disk-backed path)" \
                if option == "direct" else ""
            raise job.error(option, f"ioengine={name}: cannot open {job.filename}: {exc.strerror or exc}{hint}") \
                from None
        if any(opt.name == "cmdprio_percentage" for opt in ENGINE_OPS[name].options):
            try:
                engine.cmdprio = cmdprio_for(job.options, job.clone)
            except ValueError as exc:
                engine.close()
                raise job.error("cmdprio_bssplit", str(exc)) from None
        return engine
    return open_


def _ops(name: str, cls: type[RawEngine], help_: str, *, options=(), refused=None, unavailable=None) -> IOEngineOps:
    flags = EngineFlags.SYNC if cls.sync else EngineFlags.NONE
    if cls.measures_slat:
        flags |= EngineFlags.MEASURES_SLAT
    return IOEngineOps(name, IOENGINE_VERSION, _opener(name, cls), flags, PRIO_OPTIONS + tuple(options),
                       dict(refused or {}),
                       help_, unavailable)


_HIPRI = O.Option("hipri", "bool", _hipri, False,
                  "ioengine=pvsync2: polled completion (RWF_HIPRI); needs a device that polls: a plain file "
                  "system refuses it, as under fio", flag=True, group="engine")
_NOT_ON_A_FILE = "needs a block device with polled queues (a plain file has none)"
_PVSYNC2_REFUSED = {
    "hipri_percentage": "a share of polled I/Os is not modelled (hipri=1 polls every I/O)",
    "uncached": "RWF_UNCACHED is not modelled", "nowait": "RWF_NOWAIT is not modelled",
}
_IO_URING_REFUSED = {
    "hipri": f"IORING_SETUP_IOPOLL {_NOT_ON_A_FILE}",
    "sqthread_poll": "a kernel SQ polling thread is not modelled (the ring's issuer enters the kernel itself)",
    "sqthread_poll_cpu": "a kernel SQ polling thread is not modelled",
    "fixedbufs": "registered buffers are not modelled (each SQE names its buffer)",
    "registerfiles": "registered files are not modelled (each SQE names the file descriptor)",
    "nonvectored": "the closed loop always issues IORING_OP_READ/WRITE (non-vectored)",
    "uncached": "RWF_UNCACHED is not modelled", "nowait": "RWF_NOWAIT is not modelled",
    "force_async": "IOSQE_ASYNC is not modelled",
}
_LIBAIO_REFUSED = {
    "userspace_reap": "completions are reaped with io_getevents(2), not from the ring in user space",
    "nowait": "RWF_NOWAIT is not modelled",
}

PSYNC = _ops("psync", PsyncEngine, "pread(2)/pwrite(2), one I/O at a time (fio's default engine)")
SYNC = _ops("sync", SyncEngine, "read(2)/write(2) after lseek(2), one I/O at a time")
PVSYNC = _ops("pvsync", PvsyncEngine, "preadv(2)/pwritev(2), one I/O at a time")
PVSYNC2 = _ops("pvsync2", Pvsync2Engine, "preadv2(2)/pwritev2(2), one I/O at a time", options=(_HIPRI,),
               refused=_PVSYNC2_REFUSED)
MMAP = _ops("mmap", MmapEngine, "copies to and from the file mapped shared (buffered only)")
FTRUNCATE = _ops("ftruncate", FtruncateEngine, "each write truncates the file to its offset (ftruncate(2)); "
                 "its bytes counted, none moved")
POSIXAIO = _ops("posixaio", PosixaioEngine, "POSIX AIO: iodepth I/Os in flight on helper threads")
LIBAIO = _ops("libaio", LibaioEngine, "Linux native AIO (io_submit): iodepth I/Os in flight", refused=_LIBAIO_REFUSED,
              unavailable=libaio_unavailable, options=CMDPRIO_OPTIONS)
IO_URING = _ops("io_uring", IoUringRawEngine, "io_uring: iodepth I/Os in flight (native loop)",
                refused=_IO_URING_REFUSED, options=CMDPRIO_OPTIONS)

# fio's own engines on a plain file, by name (each registered in ioengine.ENGINES)
ENGINE_OPS: dict[str, IOEngineOps] = {ops.name: ops for ops in (PSYNC, SYNC, PVSYNC, PVSYNC2, MMAP, FTRUNCATE,
                                                                POSIXAIO, LIBAIO, IO_URING)}
