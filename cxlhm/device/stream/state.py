"""A stream's state and the pieces its compiled loop (cxlhm/device/stream/loop.py) is built
from: what the loop hands back to the driver, the stream's scalars and per-tag arrays
(`StreamState`), the write-back table of its dirty victims, and the thread's io_uring
ring as compiled code reaches it (the native extension's queue and reap, bound by symbol
name so the compiled loop is cached on disk)."""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
from numba.types import int32, int64, intp, uint32, uint64

from cxlhm import _native, sumtable
from cxlhm.device.stream import copyengine, victims
from cxlhm.device.stream.victims import VictimRow
from cxlhm import firmware as fw
from cxlhm.jit import c_function, njit

# What `run` hands back (the driver's next move)
FINISHED = 0  # every read up to `stop` is complete (or the deadline passed with none in flight)
BLOCKED = 1  # the next read touches a busy block (another thread's) and none of ours is in flight
WRITE_BACK = 2  # planned I/Os' dirty victims wait in the staged list: log their checksums, then run again
DEVICE_FULL = 3  # the planner found no evictable slot for the next read (slots released)
VERIFY = 4  # reaped fills wait in `reaped`: verify those with a checksum, then complete()
SLICE = 5  # the time slice is over: let the lock go, then run again
WIDE = 7  # the next read touches more blocks than a stream read may hold (none of ours in flight)
LOG_WRITES = 8  # blocks written since the last return wait in `wblocks`: log them dirty, then run again
ISSUED = 6  # (internal) as many reads in flight as allowed: reap
WB_FAILED = 9  # write-backs failed on the ring (`wb_failed`): the driver retries them, then runs again
REAP_UNLOCKED = 10  # another stream shares the device and no completion is in: the driver waits for
# one on the ring without the lock (reap_unlocked), then runs again

# Which reaped blocks the driver must verify (run's `verify`)
VERIFY_NONE = 0  # the device has no checksum records
VERIFY_HERE = 1  # those with a record in the sum table, hashed in the loop as they are copied
VERIFY_ALL = 2  # every reap goes to the driver (this xxhash build gives compiled code no hash)

# Completions taken per pass before planning and submitting the next reads. Taking all
# that are in (often 26-32 at QD32) and copying them out first leaves their queue slots
# empty at the disk meanwhile: 4 KiB random reads at QD32 measured 63k IOPS that way and
# 75k with 2 (fio: 82k; 1, 2 and 4 were alike then). Completions still waiting are taken
# on the next pass without entering the kernel. Since slices go on while nobody waits for
# the device, 4 ran 1.04x the randread IOPS of 2 and 8 0.99x of 4 (bench_fio's job,
# interleaved runs, medians of 8 pairs); randwrite 1.01x (4 against 2, 6 pairs).
REAP_AT_ONCE = 4
# Blocks this large, read several to an I/O, are copied and checksummed by the copy
# engine in runs: a reap takes every completion that is in (the blocks of a wide read
# tend to land together), so the engine's helper thread can share the run.
WIDE_BLOCK = 32 << 10

# Longest lock hold: what other threads may wait. The driver's round trip between two
# slices leaves the stream's completions waiting: 150-250 us of interpreter time on the
# loaded 2-core machine (recording ~70 landed write-backs' sums at 35k writes/s), and 4k
# random writes at QD32 measured 0.80 of fio's IOPS with 0.5 ms slices, 0.89 with 2 ms.
SLICE_NS = 2_000_000
# While no other thread waits for the device (cxlhm/device/lock.py) a slice goes on past
# SLICE_NS, up to this: the driver's turn still comes (the integrity log's compaction,
# the back end's accounting), and a thread that starts waiting gets the lock within
# SLICE_NS. The loop keeps the firmware's clock (NOW_NS) meanwhile.
SLICE_MAX_NS = 20_000_000
# While several streams share the device, a slice ends once another thread is blocked on
# the lock - but not before this: each turn of the lock costs the driver's round trip,
# and a turn that ends after one reap pays it for a few I/Os (4 clones of a 4 KiB
# random-write job: ~25 us of CPU per write with turns of one reap, ~15 us with turns of
# at least this and the unlocked reap taking all that is in; a stream waiting meanwhile
# has its I/O at the SSD, whose writes take ~1 ms at 64 in flight)
SHARED_SLICE_NS = 1_000_000

# scalar state of a stream (StreamState.st)
NEXT = 0  # index of the next read to plan
IN_FLIGHT = 1  # reads in flight
SLOTS = 2  # slots held by reads in flight
FILLS = 3  # fills queued or in flight
PARKED = 4  # tag of a planned read waiting for its write-backs (-1: none)
PARKED_FILLS = 5
PARKED_WBS = 6
DONE = 7  # reads completed (good or failed)
FAILED = 8  # reads whose fills failed (to be read again through the verifying path)
HITS = 9
MISSES = 10
REAPED = 11  # fills in reaped_tags / reaped_res not yet completed
ERRNO = 12  # a failed reap: -errno
QUEUED = 13  # reads queued since the last reap (they go to the kernel in one submission)
PEAK = 14  # the most reads in flight at once
WRITTEN = 15  # blocks in wblocks (written, not yet logged dirty by the driver)
W_HITS = 16  # device-block hits and misses of the stream's writes (HITS, MISSES count all)
W_MISSES = 17
N_PARKED = 18  # I/Os planned and not yet issued: their victims' write-backs are staged or on the ring
N_READY = 19  # of those, I/Os whose write-backs have all landed (their tags in `parked`, issued next)
WB_USED = 20  # rows of the write-back table in use (staged, on the ring, landed or failed)
WB_STAGED = 21  # rows in `wb_staged`: planned victims whose checksums the driver has not logged yet
WB_LOGGED = 22  # of those, the first WB_LOGGED are logged (queued on the ring by the next step)
WB_LANDED = 23  # rows in `wb_landed`: on the SSD, their checksums not yet recorded by the driver
WB_FAILED_N = 24  # rows in `wb_failed`: write-backs the ring reported failed or short
RING = 25  # fills and write-backs on the ring, not yet reaped
LOG_RECORDS = 26  # SUM records the loop wrote to the integrity log itself, not yet counted by the driver
LOG_SHORT = 27  # a short write of the integrity log by the loop: 1 + the bytes that went in (0: none)
WRITTEN_LOGGED = 28  # of the blocks in wblocks, the first WRITTEN_LOGGED were logged dirty by the loop
BYPASS_CACHES = 29  # 1: the stream's reads are too large for the caches, their copies out stream past them
DEFER = 30  # 1: this slice leaves its I/Os off the ring, in `pend_rows` (run sets it; see submit)
N_PEND = 31  # rows in pend_rows / pend_tags: prepared for the ring, not yet on it
N_SCALARS = 32

# Staged victims the loop gathers before logging their checksums (one write(2) of the
# integrity log, or one interpreter round trip where the driver logs them), unless
# nothing else is on the ring to wait for: a quarter of the depth, at most STAGE_BYTES of
# them (large blocks: at once, their write is long). A staged victim's I/O waits for the
# batch, and each batch costs a write(2) or a round trip. On the 2-core development
# machine 4k random writes at QD32 are CPU-bound (fio's thread and the kernel's io_uring
# workers fill both cores), so the write(2)s saved count more than the wait: with the loop
# logging, a quarter (8) ran 1.09x the IOPS of an eighth (4), which ran 1.17x those of a
# write(2) per victim, and a half (16) ran 0.94x a quarter (interleaved runs of the
# bench_fio job, medians of 8). Where the driver logs, a quarter measured 0.62 of fio's
# IOPS (41% CPU) and an eighth 0.57 (90% CPU: the round trips).
STAGE_SHARE = 4
STAGE_BYTES = 1 << 20

# Where the staged victims' checksums are logged (run's `log_ctl[0]`, the integrity
# log's IntegrityLog.ctl): a file descriptor >= 0 - the loop hashes them and writes their
# SUM records itself, one frame in one write(2) as IntegrityLog.append writes it, and
# goes on without a round trip; LOG_NONE - the loop hashes them and records nothing (no
# log, or the power is gone); LOG_IN_DRIVER - the driver does both (WRITE_BACK).
LOG_NONE = -1
LOG_IN_DRIVER = -2
_FRAME_BYTES = 8  # the integrity log's frame header: payload length, crc32(payload) (u32 each)
_RECORD_BYTES = 17  # its record: kind, block, value (u8, u64, u64, little-endian)
_SUM_KIND, _DIRTY_KIND = ord("S"), ord("D")

# state of a write-back row (StreamState.wb_state)
WB_FREE, WB_STAGE, WB_RING, WB_LAND, WB_FAIL = range(5)
assert victims.WB_FREE == WB_FREE

# Written blocks a stream gathers before the driver logs them (LOG_WRITES)
WBLOCKS = 4096

_CLOCK_MONOTONIC = 1
_clock_gettime = c_function("cxlhm_stream_clock_gettime", ctypes.CDLL(None).clock_gettime, int32(int32, intp))
# The cffi extension's own symbols (the same loaded object, so the same liburing table).
_lib = ctypes.CDLL(_native.__file__)
_queue = c_function("cxlhm_stream_io_queue", _lib.cxlhm_io_queue, int32(intp, int32, intp, int32, intp))
ring_reap = c_function("cxlhm_stream_io_reap", _lib.cxlhm_io_reap, int32(intp, int32, int32, intp, intp))
_write = c_function("cxlhm_stream_write", ctypes.CDLL(None).write, int64(int32, intp, int64))
_libz = ctypes.util.find_library("z")
_crc32 = c_function("cxlhm_stream_crc32", ctypes.CDLL(_libz).crc32, uint64(uint64, intp, uint32)) if _libz else None
# whether the loop can log the staged victims itself (else the driver does: LOG_IN_DRIVER)
COMPILED_LOG = sumtable.COMPILED_HASH and _crc32 is not None
# the device's copy engine, out to the host's buffers (cxlhm/device/stream/copyengine.py, which also gives it the checksum function)
native_copy_out_many = c_function("cxlhm_stream_copy_out_many", _lib.cxlhm_copy_out_many, int64(intp, int64))
native_copy_many = c_function("cxlhm_stream_copy_many", _lib.cxlhm_copy_many, int64(intp, int64))


@njit(cache=False)
def monotonic_ns(ts):
    _clock_gettime(_CLOCK_MONOTONIC, ts.ctypes.data)
    return ts[0] * 1_000_000_000 + ts[1]


@njit(cache=False, inline="always")
def _piece(base, block_size, slot, block, hpa, length, addr):
    """The part of I/O [hpa, hpa+length) that lies in `block`: (its address in the
    block's slot, its address in the host buffer at `addr`, its bytes)."""
    start = max(hpa, block * block_size)
    end = min(hpa + length, (block + 1) * block_size)
    return base + slot * block_size + (start - block * block_size), addr + (start - hpa), end - start


@njit(cache=False)
def copy_piece(base, block_size, slot, block, hpa, length, addr):
    """memcpy the part of read [hpa, hpa+length) that lies in `block` out of its slot."""
    in_slot, in_host, n = _piece(base, block_size, slot, block, hpa, length, addr)
    fw.memcpy(in_host, in_slot, n)


@njit(cache=False)
def _copy_in_piece(base, block_size, slot, block, hpa, length, addr):
    """memcpy the part of write [hpa, hpa+length) that lies in `block` into its slot."""
    in_slot, in_host, n = _piece(base, block_size, slot, block, hpa, length, addr)
    fw.memcpy(in_slot, in_host, n)


@njit(cache=False)
def copy_write_in(base, block_size, slots, k, hpa, length, addr):
    first = hpa // block_size
    for q in range(k):
        _copy_in_piece(base, block_size, slots[q], first + q, hpa, length, addr)


@njit(cache=False)
def piece_job(jobs, row, base, block_size, slot, block, hpa, length, addr):
    """Job `row` copies the part of read [hpa, hpa+length) that lies in `block` out of
    its slot (as copy_piece does) and checksums nothing yet."""
    jobs[row, copyengine.SRC], jobs[row, copyengine.DST], jobs[row, copyengine.LEN] = _piece(
        base, block_size, slot, block, hpa, length, addr)
    jobs[row, copyengine.HASH_AT] = 0
    jobs[row, copyengine.HASH_LEN] = 0


@njit(cache=False)
def touches_writebacks(wb_rows, wb_state, hpa, length, block_size):
    """Whether [hpa, hpa+length) touches a block whose write-back this stream holds (a
    victim staged, on the ring, or landed with its checksum not yet recorded): it may not
    be read back from the SSD before then."""
    # a row holds its block's byte offset: compared with the blocks' byte range, not
    # divided (a division per row was most of this scan's cost)
    low = hpa // block_size * block_size
    high = ((hpa + length - 1) // block_size + 1) * block_size
    for w in range(wb_rows.shape[0]):
        if wb_state[w] != WB_FREE and low <= wb_rows[w, 2] < high:
            return True
    return False


@njit(cache=False)
def queue_all(ring, fd, rows, n, tags):
    """Queue `n` rows on the ring, handing queued ones to the kernel whenever its
    submission queue is full (the ring's room for completions was checked)."""
    done = 0
    while done < n:
        done += _queue(ring, fd, rows + done * 32, n - done, tags + done * 8)
        if done < n:
            ring_reap(ring, 0, 0, 0, 0)  # submit only: takes no completion


@njit(cache=False)
def submit(arrays, ring, fd, rows, n, tags):
    """Put `n` I/O rows (`rows`, their `tags`) on the ring - or, while the slice defers
    them (st[DEFER]: another stream shares the device), in the stream's pending rows,
    which go on the ring in one call when the driver waits for completions without the
    lock (flush_pending): entering the kernel to submit (the block layer, the disk's
    doorbell) is most of a turn's kernel time, and needs no device lock."""
    st = arrays[0]
    if st[DEFER] == 0:
        queue_all(ring, fd, rows.ctypes.data, n, tags.ctypes.data)
        return
    pend_rows, pend_tags = arrays[AT_PEND_ROWS], arrays[AT_PEND_TAGS]
    at = st[N_PEND]
    for r in range(n):
        for c in range(rows.shape[1]):
            pend_rows[at + r, c] = rows[r, c]
        pend_tags[at + r] = tags[r]
    st[N_PEND] = at + n


@njit(cache=False)
def flush_pending(st, ring, fd, pend_rows, pend_tags):
    """The pending rows (submit) go on the ring, handed to the kernel in one call."""
    n = st[N_PEND]
    if n:
        queue_all(ring, fd, pend_rows.ctypes.data, n, pend_tags.ctypes.data)
        st[N_PEND] = 0


@njit(cache=False)
def submit_bucket(n):
    """fio's submit rows (cxlhm_apps.fio.stats.submit_bucket): 1-4 -> 1, 5-8 -> 2, ... >64 -> 6."""
    bucket = 1
    bound = 4
    while n > bound and bucket < 6:
        bucket += 1
        bound *= 2
    return bucket


class StreamState:
    """One thread's stream over one device: per-tag (read in flight) arrays, the I/O rows
    of the read being planned, and the scalars above."""

    def __init__(self, depth: int, max_blocks: int):
        self.depth, self.max_blocks = depth, max_blocks
        self.st = np.zeros(N_SCALARS, np.int64)
        self.st[PARKED] = -1
        self.tag_read = np.full(depth, -1, np.int64)  # index of the read each tag carries
        self.tag_pending = np.zeros(depth, np.int64)  # its fills not yet in
        self.tag_k = np.zeros(depth, np.int64)  # its slots
        self.tag_failed = np.zeros(depth, np.uint8)
        self.tag_issued = np.zeros(depth, np.int64)  # CLOCK_MONOTONIC ns at its submission
        self.tag_slots = np.zeros((depth, max_blocks), np.int64)
        self.tag_installed = np.zeros((depth, max_blocks), np.uint8)
        self.row_pos = np.zeros((depth, max_blocks), np.int64)  # fill row -> position in the read's slots
        self.row_bad = np.zeros((depth, max_blocks), np.uint8)
        self.free_tags = np.arange(depth, dtype=np.int64)[::-1].copy()  # a stack; st[..] counts the used
        self.writebacks = fw.new_io_rows(max_blocks)  # the victims of the I/O being planned
        # each tag's fill rows apart: an I/O parked for its victims keeps them while others plan
        self.fills = fw.new_io_rows(depth * max_blocks)
        self.fill_tags = np.zeros(max_blocks, np.int64)
        self.ts = np.zeros(2, np.int64)  # struct timespec
        self.reaped_tags = np.zeros(depth * max_blocks, np.int64)  # the last reap (fills in flight fit)
        self.reaped_res = np.zeros(depth * max_blocks, np.int64)
        self.bad = np.zeros(depth * max_blocks, np.uint8)  # per reaped fill: checksum mismatch
        self.blocks = np.zeros(depth * max_blocks, np.int64)  # per reaped fill: its block
        self.submits = np.zeros(7, np.int64)  # reads per submission, in fio's buckets (0, <=4, <=8, ... >64)
        self.wblocks = np.zeros(WBLOCKS + max_blocks, np.int64)  # blocks written (see LOG_WRITES)
        self.parked = np.zeros(depth, np.int64)  # tags of parked I/Os ready to issue (a stack, N_READY)
        # The write-back table: a victim's row stays here from its planning until the
        # driver recorded its checksum (its block may not be read back from the SSD before)
        # every I/O not yet complete has at most max_blocks victims, and three times as
        # many may have landed since the driver last recorded them (a slice of writes that
        # each evict one lands more than `depth` of them; a full table is a round trip)
        rows = 4 * depth * max_blocks
        self.wb_rows = fw.new_io_rows(rows)
        self.wb_state = np.zeros(rows, np.uint8)
        self.wb_owner = np.full(rows, -1, np.int64)  # the tag of the I/O waiting for it
        self.wb_sum = np.zeros(rows, np.uint64)  # the checksum the driver logged for it
        self.wb_free = np.arange(rows, dtype=np.int64)[::-1].copy()  # a stack; st[WB_USED] counts the used
        self.wb_staged = np.zeros(rows, np.int64)
        self.wb_landed = np.zeros(rows, np.int64)
        self.wb_failed = np.zeros(rows, np.int64)
        # the blocks of the rows in use, sorted, as the stream last let the lock go (note_victims):
        # what the other streams plan around - its row of the registry's victim table
        # (victims.py; a row of its own until it is registered)
        self.victim_row = VictimRow(rows)
        # a logged batch of write-backs, gathered to go to the kernel in one enter (their rows, tags)
        self.wb_out = fw.new_io_rows(rows)
        self.wb_out_tags = np.zeros(rows, np.int64)
        self.tag_wbs = np.zeros(depth, np.int64)  # per parked I/O: its write-backs not yet landed
        # a reap's copies and checksums, run by the copy engine: per reaped fill its job
        # row (-1: none), per job the checksum it must match if copy_checked says so
        self.copy_jobs = copyengine.new_jobs(depth * max_blocks)
        self.copy_of = np.full(depth * max_blocks, -1, np.int64)
        self.copy_expected = np.zeros(depth * max_blocks, np.uint64)
        self.copy_checked = np.zeros(depth * max_blocks, np.uint8)
        # one frame of records: a DIRTY for every written block, a SUM for every write-back row (log_staged)
        self.log_frame = np.zeros(_FRAME_BYTES + _RECORD_BYTES * (rows + self.wblocks.shape[0]), np.uint8)
        # I/Os prepared for the ring while a slice defers them (submit): at most every fill of
        # the tags in flight and every write-back row, each once (a row is prepared once
        # before it completes)
        self.pend_rows = fw.new_io_rows(rows + depth * max_blocks)
        self.pend_tags = np.zeros(rows + depth * max_blocks, np.int64)
        self._arrays = self._all_arrays()

    def arrays(self) -> tuple:
        """Every array of the state, as the compiled loop takes them (the same tuple each
        time: the arrays are filled in place, never replaced)."""
        return self._arrays

    def _all_arrays(self) -> tuple:
        return (self.st, self.tag_read, self.tag_pending, self.tag_k, self.tag_failed, self.tag_issued,
                self.tag_slots, self.tag_installed, self.row_pos, self.row_bad, self.free_tags, self.writebacks,
                self.fills, self.fill_tags, self.ts, self.reaped_tags, self.reaped_res, self.bad, self.submits,
                self.wblocks, self.parked, self.wb_rows, self.wb_state, self.wb_owner, self.wb_free,
                self.wb_staged, self.wb_landed, self.wb_failed, self.wb_out_tags, self.tag_wbs, self.wb_sum,
                self.copy_jobs, self.copy_of, self.copy_expected, self.copy_checked, self.log_frame, self.wb_out,
                self.pend_rows, self.pend_tags)

    def reset(self) -> None:
        """For a new stream: no I/O, no write-back. A row freed goes back FREE, without an
        owner, on the free stack: with none in use the rows are as a reset leaves them (in
        another order on the stack), so only a stream that ended with rows in use (an
        error) needs them reset - resetting them every time was most of this call's cost
        in a KV get."""
        self.victim_row.clear()
        if self.st[WB_USED]:
            self.wb_state[:] = WB_FREE
            self.wb_owner[:] = -1
            self.wb_free[:] = np.arange(self.wb_free.shape[0], dtype=np.int64)[::-1]
        self.st[:] = 0
        self.st[PARKED] = -1
        self.submits[:] = 0

    def victim_blocks(self, block_size: int) -> np.ndarray:
        """The blocks of the write-back rows in use (staged, on the ring, landed)."""
        return self.victim_offsets() // block_size

    def victim_offsets(self) -> np.ndarray:
        """The byte offsets of the blocks of the write-back rows in use (a new array)."""
        return self.wb_rows[:, 2][self.wb_state != WB_FREE]

    @property
    def victims(self) -> np.ndarray:
        """Its victims' blocks as it last noted them, sorted (a view of its table row)."""
        return self.victim_row.blocks()

    def note_victims(self, block_size: int) -> None:
        """Under the lock, at the end of each of the stream's turns (its table changes only
        then): its victims' blocks, sorted, into its row of the victim table, in place, for
        the other streams' loops and the other parts (StreamRegistry.victim_blocks)."""
        self.victim_row.note(self.wb_rows, self.wb_state, block_size, bool(self.st[WB_USED]))

    def free_landed(self, rows: np.ndarray) -> None:
        """Release write-back rows that landed and whose checksums the driver recorded
        (settle_writebacks(arrays, rows, True) for rows in WB_LAND, whose I/Os were told
        when they landed), without a compiled call: the driver does this on most round
        trips, and handing the compiled code every array costs more than these lines."""
        n = rows.shape[0]
        used = int(self.st[WB_USED])
        self.wb_state[rows] = WB_FREE
        self.wb_owner[rows] = -1
        top = self.wb_free.shape[0] - used  # the free stack grows down from the end, as settle_writebacks pushes
        self.wb_free[top:top + n] = rows
        self.st[WB_USED] = used - n

    def staged_rows(self) -> np.ndarray:
        """Indices of the write-back rows staged and not yet logged."""
        return self.wb_staged[int(self.st[WB_LOGGED]):int(self.st[WB_STAGED])]


# positions of the write-back table in StreamState.arrays()
AT_WB_ROWS, AT_WB_STATE, AT_WB_OWNER, AT_WB_FREE, AT_WB_STAGED, AT_WB_LANDED, AT_WB_FAILED, AT_WB_OUT_TAGS, AT_TAG_WBS, AT_WB_SUM = \
    range(21, 31)
AT_COPY_JOBS, AT_COPY_OF, AT_COPY_EXPECTED, AT_COPY_CHECKED, AT_LOG_FRAME, AT_WB_OUT = range(31, 37)
AT_PEND_ROWS, AT_PEND_TAGS = 37, 38


@njit(cache=False, inline="always")
def _put_le(buf, pos, value, nbytes):
    """`value` (a uint64) as `nbytes` little-endian bytes at buf[pos:]."""
    for k in range(nbytes):
        buf[pos + k] = np.uint8((value >> np.uint64(8 * k)) & np.uint64(0xFF))


if COMPILED_LOG:
    @njit(cache=False)
    def log_staged(arrays, block_size, log_ctl, record):
        """Write-ahead in the loop: hash each staged victim's slot (its wb_sum) and log
        their SUM records before they go on the ring (log_ctl[0]: see LOG_NONE), after a
        DIRTY record for each block written since the last record (a victim written in
        this slice is written before it is evicted: its last record must be the SUM),
        as one frame, one write(2); the written blocks join the dirty set (record[3:6],
        BlockChecksums.dirty). False: the driver logs them (WRITE_BACK) - its own write
        says why the loop's failed (a short write is in st[LOG_SHORT]), or its dirty set
        needs room to grow."""
        st, wblocks, wb_rows, wb_staged, wb_sum, frame = arrays[0], arrays[19], arrays[AT_WB_ROWS], \
            arrays[AT_WB_STAGED], arrays[AT_WB_SUM], arrays[AT_LOG_FRAME]
        fd = log_ctl[0]
        if fd == LOG_IN_DRIVER:
            return False
        dirty_keys, dirty_values, dirty_meta = record[3], record[4], record[5]
        if fd >= 0 and 2 * (dirty_meta[0] + st[WRITTEN] - st[WRITTEN_LOGGED]) > dirty_keys.shape[0]:
            return False  # (the driver reserves room for a slice's writes: not seen in practice)
        pos = _FRAME_BYTES
        for q in range(st[WRITTEN_LOGGED], st[WRITTEN]):
            frame[pos] = _DIRTY_KIND
            _put_le(frame, pos + 1, np.uint64(wblocks[q]), 8)
            _put_le(frame, pos + 9, np.uint64(0), 8)
            pos += _RECORD_BYTES
        for r in range(st[WB_LOGGED], st[WB_STAGED]):
            w = wb_staged[r]
            s = sumtable.hash_block(wb_rows[w, 0], block_size)
            wb_sum[w] = s
            frame[pos] = _SUM_KIND
            _put_le(frame, pos + 1, np.uint64(wb_rows[w, 2] // block_size), 8)
            _put_le(frame, pos + 9, s, 8)
            pos += _RECORD_BYTES
        if fd >= 0:
            length = pos - _FRAME_BYTES
            _put_le(frame, 0, np.uint64(length), 4)
            _put_le(frame, 4, _crc32(0, frame.ctypes.data + _FRAME_BYTES, length), 4)
            written = _write(np.int32(fd), frame.ctypes.data, pos)
            if written < 0:
                return False  # nothing went in: the driver's own write says why
            if written != pos:
                st[LOG_SHORT] = 1 + written
                return False
            st[LOG_RECORDS] += length // _RECORD_BYTES
            for q in range(st[WRITTEN_LOGGED], st[WRITTEN]):
                sumtable.put_if_room(dirty_keys, dirty_values, dirty_meta, wblocks[q], np.uint64(0))
        st[WRITTEN_LOGGED] = st[WRITTEN]
        st[WB_LOGGED] = st[WB_STAGED]
        return True
else:
    @njit(cache=False)
    def log_staged(arrays, block_size, log_ctl, record):  # no compiled hash or crc32: the driver logs
        return False


@njit(cache=False)
def landed_sum(arrays, block, block_size):
    """The checksum of `block` if this stream's write-back of it landed and the driver has
    not recorded it yet (the sum table still has the one before), else -1 (in `found`)."""
    st, wb_rows, wb_state, wb_sum = arrays[0], arrays[AT_WB_ROWS], arrays[AT_WB_STATE], arrays[AT_WB_SUM]
    if st[WB_LANDED]:
        offset = block * block_size
        for w in range(wb_rows.shape[0]):
            if wb_state[w] == WB_LAND and offset <= wb_rows[w, 2] < offset + block_size:
                return True, wb_sum[w]
    return False, wb_sum[0]


@njit(cache=False)
def writeback_done(arrays, w):
    """Write-back row `w` is settled (landed, or failed for good): its I/O goes on once
    its last one is."""
    st, parked, wb_owner, tag_wbs = arrays[0], arrays[20], arrays[AT_WB_OWNER], arrays[AT_TAG_WBS]
    tag = wb_owner[w]
    tag_wbs[tag] -= 1
    if tag_wbs[tag] == 0:
        parked[st[N_READY]] = tag
        st[N_READY] += 1


@njit  # called by the driver: cached on disk (the others are compiled into their callers)
def settle_writebacks(arrays, rows, free):
    """The driver settled these write-back rows: their I/Os go on (unless they landed
    through the ring, which told them already); with `free`, the rows are released."""
    wb_state = arrays[AT_WB_STATE]
    for w in rows:
        if wb_state[w] != WB_LAND:
            writeback_done(arrays, w)
            wb_state[w] = WB_LAND
        if free:
            _free_writeback(arrays, w)


@njit(cache=False)
def _free_writeback(arrays, w):
    """Write-back row `w` goes back on the free stack."""
    st, wb_state, wb_owner, wb_free = arrays[0], arrays[AT_WB_STATE], arrays[AT_WB_OWNER], arrays[AT_WB_FREE]
    wb_state[w] = WB_FREE
    wb_owner[w] = -1
    st[WB_USED] -= 1
    wb_free[wb_free.shape[0] - 1 - st[WB_USED]] = w


@njit(cache=False)
def record_landed(arrays, w, block_size, record):
    """Write-back row `w` landed: record its checksum in the sum table and take its block
    out of the dirty set (record: the two tables' compiled arrays, BlockChecksums'
    sums.table and dirty), as the driver would at the slice's end, and free the row.
    False: the loop does not record (record[2] is empty) or the sum table is too full
    to take it without growing - the row waits in WB_LAND for the driver."""
    if record[2].shape[0] == 0:
        return False
    block = arrays[AT_WB_ROWS][w, 2] // block_size
    if not sumtable.put_if_room(record[0], record[1], record[2], block, arrays[AT_WB_SUM][w]):
        return False
    sumtable.remove(record[3], record[4], record[5], block)
    _free_writeback(arrays, w)
    return True


@njit(cache=False)
def queue_writebacks(arrays, ring, fd):
    """Put the logged staged write-backs on the ring (tag -1 - row: fills are >= 0), gathered
    into one call: one enter for the batch (an enter each cost ~2 us of kernel CPU per
    write in the randwrite job, docs/fio.md "Reference counting")."""
    st, wb_rows, wb_state, wb_staged, out, out_tags = arrays[0], arrays[AT_WB_ROWS], arrays[AT_WB_STATE], \
        arrays[AT_WB_STAGED], arrays[AT_WB_OUT], arrays[AT_WB_OUT_TAGS]
    logged = st[WB_LOGGED]
    for r in range(logged):
        w = wb_staged[r]
        for c in range(wb_rows.shape[1]):
            out[r, c] = wb_rows[w, c]
        out_tags[r] = -1 - w
        wb_state[w] = WB_RING
        st[RING] += 1
    if logged:
        submit(arrays, ring, fd, out, logged, out_tags)
        rest = st[WB_STAGED] - logged
        for r in range(rest):
            wb_staged[r] = wb_staged[logged + r]
        st[WB_STAGED] = rest
        st[WB_LOGGED] = 0
