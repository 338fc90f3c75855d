"""The SSD back end: an image file or block device, opened O_DIRECT, driven through
io_uring in batches by the native extension (reads and writes go straight between
the file and device-DRAM slots; no copy through Python)."""
from __future__ import annotations

import errno
import os
import stat
import tempfile
import threading
import weakref

import numpy as np

from cxlhm.configerror import ConfigError
from cxlhm.media import native
from cxlhm.media.backend import Backend, BackendCaps, lock_image, release_image

# One row per I/O, laid out exactly like `struct cxlhm_io` (native/cxlhm_native.h):
# buf address, length, file offset, write flag (+4 bytes of padding) = 4 x int64.
IO_BUF, IO_LEN, IO_OFFSET, IO_WRITE = range(4)
IO_FIELDS = 4

# Registered memory: at most this many pieces (the kernel's table of fixed buffers holds
# 16384), each at most 1 GiB (the kernel's limit for one) and at least a huge page.
FIXED_TABLE = 1 << 14
FIXED_MAX_PIECE = 1 << 30
FIXED_MIN_PIECE = 2 << 20


def fixed_piece(nbytes: int, unit: int) -> int | None:
    """The piece registered memory of `nbytes` is registered in: the smallest power of two
    of at least `unit` and a huge page whose table fits the kernel's; None where there is
    nothing to register or a piece would be larger than the kernel registers at once."""
    if nbytes <= 0 or unit <= 0:
        return None
    piece = max(FIXED_MIN_PIECE, 1 << (max(unit, -(-nbytes // FIXED_TABLE)) - 1).bit_length())
    return piece if piece <= FIXED_MAX_PIECE else None


class SsdBackend(Backend):
    """Byte-addressed back end of `capacity` bytes at `path` (None: an anonymous temp file)."""

    caps = BackendCaps(async_io=True, persistent=True, direct=True)

    def __init__(self, path: str | None, capacity: int, queue_depth: int, *, source: str = "config",
                 submit_batch: int = 1):
        self.capacity = capacity
        # SQEs prepared before one io_uring_enter() hands them over; 1: each I/O at once
        # (fio's iodepth_batch_submit; see cxlhm_ring_submit_batch)
        self.submit_batch = submit_batch
        self.path = path
        self._ffi, self._lib = native.load()
        if self._ffi.sizeof("struct cxlhm_io") != IO_FIELDS * 8:
            raise native.NativeUnavailable("struct cxlhm_io layout changed; rebuild cxlhm")
        self.fd = self._open(path, capacity, source)
        self.queue_depth = queue_depth
        self._fixed = self._ffi.new("struct cxlhm_fixed *")  # len 0: no registered memory yet
        # io_uring rings are not thread-safe (SQ/CQ heads are plain memory), and the
        # device lets several host threads run I/O at once: each thread gets its own
        # ring and result array, made on first use; close() closes them all.
        self._local = threading.local()
        self._rings: list = []
        self._rings_lock = threading.Lock()
        try:
            self._thread_state()  # the opening thread's ring: fail here, not on the first I/O
        except BaseException:
            os.close(self.fd)
            raise

    def _open_ring(self, opener=None, depth: int = 0, submit_batch: int = 0):
        """A new io_uring ring, closed with the back end. By default one of queue_depth
        entries that only the calling thread may submit on (rings are per thread: the
        kernel then posts completions in batches, when the thread waits for them);
        `opener`, `depth` and `submit_batch` make another kind."""
        err = self._ffi.new("int *")
        with self._rings_lock:
            if self.fd < 0:
                raise OSError(errno.EBADF, "the SSD back end is closed")
            ring = (opener or self._lib.cxlhm_ring_open_owned)(depth or self.queue_depth, err)
            if ring == self._ffi.NULL:
                raise OSError(err[0], f"io_uring setup failed: {os.strerror(err[0])}")
            self._lib.cxlhm_ring_submit_batch(ring, submit_batch or self.submit_batch)
            self._lib.cxlhm_ring_use_fixed(ring, self._fixed)
            self._rings.append(ring)
        return ring

    def _thread_state(self) -> "_ThreadRing":
        """The calling thread's ring and result array."""
        state = getattr(self._local, "state", None)
        if state is not None:
            return state
        ring = self._open_ring()
        state = self._local.state = _ThreadRing(ring, np.zeros(self.queue_depth, np.int64), self._ffi)
        # the ring goes when its thread does (threading.local drops the state), so
        # short-lived host threads do not pile up rings and descriptors
        weakref.finalize(state, self._drop_ring, ring)
        return state

    def _drop_ring(self, ring) -> None:
        with self._rings_lock:
            if ring in self._rings:  # not already closed by close()
                self._rings.remove(ring)
                self._lib.cxlhm_ring_close(ring)

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
            lock_image(fd, path, source)
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

    def register_memory(self, base: int, nbytes: int, unit: int) -> None:
        """Every ring of this back end sends its I/O inside [base, base+nbytes) on
        registered buffers and the registered image (native/cxlhm_native.c says why and
        how), the memory registered piece by piece as I/O first lands in it; pieces are a
        power of two of at least `unit` bytes (a slot's size), so no slot straddles two.
        Call it before any I/O uses the memory. CXLHM_URING_FIXED=0 turns it off."""
        piece = fixed_piece(nbytes, unit)
        if piece is None or os.environ.get("CXLHM_URING_FIXED", "1") == "0":
            return
        self._fixed.base = self._ffi.cast("const char *", base)
        self._fixed.chunk = piece
        self._fixed.fd = self.fd
        self._fixed.len = nbytes  # last: a ring reads len first

    def fixed_counts(self) -> dict[str, int]:
        """Over all open rings: I/Os sent on registered buffers (`fixed`) and as ordinary
        ones (`plain`), pieces registered, registrations the kernel refused."""
        out = self._ffi.new("int64_t[]", self._lib.CXLHM_FIXED_COUNTS)
        with self._rings_lock:
            for ring in self._rings:
                self._lib.cxlhm_ring_fixed_counts(ring, out)
        return {"fixed": out[self._lib.CXLHM_FIXED_OPS], "plain": out[self._lib.CXLHM_FIXED_PLAIN],
                "pieces": out[self._lib.CXLHM_FIXED_CHUNKS], "refused": out[self._lib.CXLHM_FIXED_REFUSED]}

    def submit(self, ops: np.ndarray) -> np.ndarray:
        """Run the I/Os in `ops` (int64 rows laid out as struct cxlhm_io) as one batch and
        wait for all; returns bytes transferred per op, or -errno for a failed op. The
        result array is the calling thread's and is reused by its next submit()."""
        n = ops.shape[0]
        state = self._thread_state()
        if n == 0:
            return state.res[:0]
        if state.res.shape[0] < n:
            state.set_results(np.zeros(n, np.int64), self._ffi)
        # from_buffer is the cheapest way to hand numpy memory to C (no copy); cffi
        # releases the GIL for the call, so other threads run while this one waits
        rc = self._lib.cxlhm_io_batch(state.ring, self.fd, self._ffi.from_buffer("struct cxlhm_io[]", ops), n,
                                      state.res_ptr)
        res = state.res[:n]
        if rc < 0:
            raise OSError(-rc, f"io_uring batch failed: {os.strerror(-rc)}")
        return res

    # ---------------------------------------------------------------- split phase
    # For a host thread that keeps many I/Os of its own in flight and handles each as it
    # completes (the device's streams, cxlhm/device/stream/loop.py). They use a second ring of the
    # thread's, so submit() on the same thread never takes their completions.
    def queue(self, ops: np.ndarray, tags: np.ndarray) -> int:
        """Prepare `ops` (tagged: a completion reports its tag) without waiting for any:
        each goes to the kernel once `submit_batch` are prepared (1: at once), the rest
        with the next reap(). Returns how many were queued (at most async_room())."""
        state = self._async_state()
        n = min(ops.shape[0], self.async_room())
        if n <= 0:
            return 0
        tags = np.ascontiguousarray(tags, np.int64)
        queued = self._lib.cxlhm_io_queue(state.async_ring, self.fd, self._ffi.from_buffer("struct cxlhm_io[]", ops),
                                          n, self._ffi.from_buffer("int64_t[]", tags))
        state.in_flight += queued
        return queued

    def async_room(self) -> int:
        """Ops the calling thread may still queue: its ring keeps at most queue_depth in
        flight, so completions never overflow the CQ ring."""
        state = self._thread_state()
        return self.queue_depth - state.in_flight

    def reap(self, min_complete: int = 1, max_complete: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Send what is queued and wait until `min_complete` of the thread's queued ops
        completed; returns (tags, results: bytes or -errno) of the completions taken (at
        most `max_complete`, if given; the rest stay for the next reap). The arrays are
        reused by the thread's next reap()."""
        state = self._async_state()
        min_complete = min(min_complete, state.in_flight)
        most = state.tags.shape[0] if max_complete <= 0 else min(max_complete, state.tags.shape[0])
        got = self._lib.cxlhm_io_reap(state.async_ring, min_complete, most, state.tags_ptr, state.reaped_ptr)
        if got < 0:
            raise OSError(-got, f"io_uring reap failed: {os.strerror(-got)}")
        state.in_flight -= got
        return state.tags[:got], state.reaped[:got]

    def stream_ring(self) -> tuple[int, int]:
        """(address of the calling thread's split-phase ring, fd), for compiled code that
        queues on it itself (cxlhm/device/stream/loop.py); it reports what it queued with
        note_queued() and takes completions with reap()."""
        state = self._async_state()
        return int(self._ffi.cast("uintptr_t", state.async_ring)), self.fd

    def note_queued(self, n: int) -> None:
        """`n` ops were queued on the calling thread's ring by compiled code."""
        self._thread_state().in_flight += n

    def queued(self) -> int:
        """The calling thread's queued ops not yet reaped."""
        return self._thread_state().in_flight

    def shared_ring(self, depth: int) -> "SharedRing":
        """A split-phase ring of `depth` entries that any thread may use while it holds
        the caller's lock (the device's write-behind, settled by whichever thread needs
        it); closed with the back end. Each queue() call is handed to the kernel at once
        (submit batch 1), whatever the back end's own rings do."""
        return SharedRing(self, self._open_ring(self._lib.cxlhm_ring_open_shared, depth, 1), depth)

    def _async_state(self) -> "_ThreadRing":
        state = self._thread_state()
        if state.async_ring is None:
            ring = state.async_ring = self._open_ring()
            state.tags = np.zeros(self.queue_depth, np.int64)
            state.reaped = np.zeros(self.queue_depth, np.int64)
            state.tags_ptr = self._ffi.from_buffer("int64_t[]", state.tags)
            state.reaped_ptr = self._ffi.from_buffer("int64_t[]", state.reaped)
            weakref.finalize(state, self._drop_ring, ring)
        return state

    def run_closed_loop(self, ops: np.ndarray, qd: int, deadline_ns: int = 0, *,
                        serialize_overlap: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Keep `qd` of `ops` in flight until all finish (or CLOCK_MONOTONIC passes
        `deadline_ns`), like fio's io_uring engine at iodepth=qd; with
        `serialize_overlap` an op overlapping one in flight waits for it, as in fio.
        Returns (res, lat_ns) for the ops issued: bytes or -errno, and
        submission-to-completion latency."""
        n = ops.shape[0]
        res = np.zeros(n, np.int64)
        lat = np.zeros(n, np.int64)
        issued = self._lib.cxlhm_io_qd(
            self._thread_state().ring, self.fd, self._ffi.cast("struct cxlhm_io *", ops.ctypes.data), n, qd, deadline_ns,
            int(serialize_overlap), self._ffi.cast("int64_t *", res.ctypes.data), self._ffi.cast("int64_t *", lat.ctypes.data))
        if issued < 0:
            raise OSError(-issued, f"io_uring closed loop failed: {os.strerror(-issued)}")
        return res[:issued], lat[:issued]

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        """Close every thread's ring and the file. No I/O may be running (the device
        closes its back end only after its last access)."""
        with self._rings_lock:
            for ring in self._rings:
                self._lib.cxlhm_ring_close(ring)
            self._rings.clear()
            if self.fd >= 0:
                release_image(self.fd)
                self.fd = -1
        # a thread's cached ring is now dangling; a later I/O gets EBADF instead
        self._local = threading.local()


class _ThreadRing:
    """One host thread's io_uring rings: `ring` for whole batches (submit), with the
    result array they reuse, and `async_ring` for split-phase I/O (queue / reap),
    made on first use."""
    __slots__ = ("ring", "res", "res_ptr", "async_ring", "in_flight", "tags", "reaped", "tags_ptr", "reaped_ptr",
                 "__weakref__")

    def __init__(self, ring, res: np.ndarray, ffi):
        self.ring = ring
        self.set_results(res, ffi)
        self.async_ring = None
        self.in_flight = 0

    def set_results(self, res: np.ndarray, ffi) -> None:
        self.res, self.res_ptr = res, ffi.from_buffer("int64_t[]", res)


class SharedRing:
    """SsdBackend.shared_ring(): queue() ops without waiting, reap() them later, from any
    thread - one at a time (the caller's lock serializes them)."""

    def __init__(self, ssd: SsdBackend, ring, depth: int):
        self.ssd, self.ring, self.depth = ssd, ring, depth
        self.in_flight = 0
        self.tags, self.reaped = np.zeros(depth, np.int64), np.zeros(depth, np.int64)
        self._tags_ptr = ssd._ffi.from_buffer("int64_t[]", self.tags)
        self._reaped_ptr = ssd._ffi.from_buffer("int64_t[]", self.reaped)

    def queue(self, ops: np.ndarray, tags: np.ndarray) -> int:
        """Hand `ops` to the kernel, tagged, in one enter (adjacent writes merge); returns
        how many were queued (at most depth - in_flight)."""
        n = min(ops.shape[0], self.depth - self.in_flight)
        if n <= 0:
            return 0
        ffi = self.ssd._ffi
        queued = self.ssd._lib.cxlhm_io_queue(self.ring, self.ssd.fd, ffi.from_buffer("struct cxlhm_io[]", ops), n,
                                              ffi.from_buffer("int64_t[]", np.ascontiguousarray(tags, np.int64)))
        self.in_flight += queued
        return queued

    def reap_all(self) -> tuple[np.ndarray, np.ndarray]:
        """Wait for every queued op; returns (tags, results: bytes or -errno)."""
        tags, res = [], []
        while self.in_flight:
            got = self.ssd._lib.cxlhm_io_reap(self.ring, self.in_flight, self.depth, self._tags_ptr, self._reaped_ptr)
            if got < 0:
                raise OSError(-got, f"io_uring reap failed: {os.strerror(-got)}")
            tags.append(self.tags[:got].copy())
            res.append(self.reaped[:got].copy())
            self.in_flight -= got
        if not tags:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(tags), np.concatenate(res)
