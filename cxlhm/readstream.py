"""Streamed reads: one host thread keeps up to `depth` reads in flight on the wall clock,
with the per-read work compiled.

`Device.read_start` / `read_reap` already let a thread keep reads in flight, but every
run of reads pays an interpreter round trip through the device (checks, a ticket, the
plan, the queue, the reap, the copies): ~10 us per 4 KiB read on the development
machine, as much as the SSD read itself at QD32. A stream runs the whole loop in one
compiled call (`run`), holding the device lock for a time slice:

    plan     the firmware's planner, for the next read, while fewer than `depth` are
             in flight; its fills are queued on the thread's io_uring ring
    reap     hand the queue to the kernel and wait for >= 1 completion (nogil)
    copy     each completed fill's block is copied to its read's host buffer at once,
             so a long read's copies overlap its other blocks' I/O; a read whose fills
             are all in releases its slots (BUSY -> idle)

and returns to the driver (Device.read_stream) for what compiled code cannot do:
dirty victims to write back, a block another thread holds busy (wait for it without
the lock), reaped blocks to verify in Python (only where xxhash's C function is out of
reach: otherwise each block with a checksum record is hashed in the loop right after
its copy, cxlhm/sumtable.py), or the end of the slice (the lock is let go, so other
threads, the mailbox and the firmware's background work get their turn; their waits
are bounded by SLICE_NS).

Rules shared with read_start: every slot of a read in flight is BUSY (other threads
wait for it, victim() skips it); a read that touches a busy block - another thread's or
one of this stream's own reads in flight - is not planned until that block is free;
fills in flight never exceed the ring's room (its CQ must not overflow). Poisoned blocks
need the device's erroring path: the driver streams only the reads before the first
read touching one.
"""
from __future__ import annotations

import ctypes

import numba
import numpy as np

from cxlhm import _native
from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm import sumtable
from cxlhm.jit import njit_without_refcounts
from firmware_policies.base import Policy

# What `run` hands back (the driver's next move)
FINISHED = 0  # every read up to `stop` is complete (or the deadline passed with none in flight)
BLOCKED = 1  # the next read touches a busy block (another thread's) and none of ours is in flight
WRITE_BACK = 2  # the next read is planned; write back its dirty victims, then run again
DEVICE_FULL = 3  # the planner found no evictable slot for the next read (slots released)
VERIFY = 4  # reaped fills wait in `reaped`: verify those with a checksum, then complete()
SLICE = 5  # the time slice is over: let the lock go, then run again
WIDE = 7  # the next read touches more blocks than a stream read may hold (none of ours in flight)
LOG_WRITES = 8  # blocks written since the last return wait in `wblocks`: log them dirty, then run again
ISSUED = 6  # (internal) as many reads in flight as allowed: reap

# Which reaped blocks the driver must verify (run's `verify`)
VERIFY_NONE = 0  # the device has no checksum records
VERIFY_HERE = 1  # those with a record in the sum table, hashed in the loop as they are copied
VERIFY_ALL = 2  # every reap goes to the driver (this xxhash build gives compiled code no hash)

# Completions taken per pass before planning and submitting the next reads. Taking all
# that are in (often 26-32 at QD32) and copying them out first leaves their queue slots
# empty at the disk meanwhile: 4 KiB random reads at QD32 measured 63k IOPS that way and
# 75k with 2 (fio: 82k; 1, 2 and 4 were alike, 2 costs the least CPU). Completions still
# waiting are taken on the next pass without entering the kernel.
REAP_AT_ONCE = 2

SLICE_NS = 500_000  # longest lock hold: what other threads may wait (3% of a slice is the round trip)

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
N_PARKED = 18  # I/Os planned and waiting for their victims' write-back (their tags in `parked`)
N_SCALARS = 19

# Written blocks a stream gathers before the driver logs them (LOG_WRITES)
WBLOCKS = 4096

_CLOCK_MONOTONIC = 1
_libc = ctypes.CDLL(None)
_clock_gettime = _libc.clock_gettime
_clock_gettime.argtypes = [ctypes.c_int, ctypes.c_void_p]
_clock_gettime.restype = ctypes.c_int
# The cffi extension's own symbols (the same loaded object, so the same liburing table).
_lib = ctypes.CDLL(_native.__file__)
_queue = _lib.cxlhm_io_queue
_queue.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
_queue.restype = ctypes.c_int
_reap = _lib.cxlhm_io_reap
_reap.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_reap.restype = ctypes.c_int


@numba.njit(nogil=True)
def _now_ns(ts):
    _clock_gettime(_CLOCK_MONOTONIC, ts.ctypes.data)
    return ts[0] * 1_000_000_000 + ts[1]


@numba.njit(nogil=True)
def _copy_piece(base, block_size, slot, block, hpa, length, addr):
    """memcpy the part of read [hpa, hpa+length) that lies in `block` out of its slot."""
    start = max(hpa, block * block_size)
    end = min(hpa + length, (block + 1) * block_size)
    fw._memcpy(addr + (start - hpa), base + slot * block_size + (start - block * block_size), end - start)


@numba.njit(nogil=True)
def _copy_in_piece(base, block_size, slot, block, hpa, length, addr):
    """memcpy the part of write [hpa, hpa+length) that lies in `block` into its slot."""
    start = max(hpa, block * block_size)
    end = min(hpa + length, (block + 1) * block_size)
    fw._memcpy(base + slot * block_size + (start - block * block_size), addr + (start - hpa), end - start)


@numba.njit(nogil=True)
def _copy_write_in(base, block_size, slots, k, hpa, length, addr):
    first = hpa // block_size
    for q in range(k):
        _copy_in_piece(base, block_size, slots[q], first + q, hpa, length, addr)


@numba.njit(nogil=True)
def _touches_rows(rows, n, hpa, length, block_size):
    """Whether [hpa, hpa+length) touches the block of one of the first `n` I/O rows."""
    first = hpa // block_size
    last = (hpa + length - 1) // block_size
    for r in range(n):
        block = rows[r, 2] // block_size
        if first <= block <= last:
            return True
    return False


@numba.njit(nogil=True)
def _submit_bucket(n):
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
        self.writebacks = fw.new_io_rows(depth * max_blocks)  # the parked I/Os' victims, together
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
        self.parked = np.zeros(depth, np.int64)

    def arrays(self) -> tuple:
        return (self.st, self.tag_read, self.tag_pending, self.tag_k, self.tag_failed, self.tag_issued,
                self.tag_slots, self.tag_installed, self.row_pos, self.row_bad, self.free_tags, self.writebacks,
                self.fills, self.fill_tags, self.ts, self.reaped_tags, self.reaped_res, self.bad, self.submits,
                self.wblocks, self.parked)


def _build(plan, invalidate):
    finish, touches_busy = fw.finish, fw.touches_busy

    @njit_without_refcounts
    def complete(bt, ps, clock, base, block_size, hpas, lens, addrs, kinds, clat, failed_out, arrays, tags, res,
                 bad, n, sum_keys, sum_values):
        """Take `n` reaped fills (tag = read tag * max_blocks + row); bad[j]: fill j read
        the wrong bytes (its checksum did not match). A block with a record in the sum
        table (empty: none) is hashed right after its fill (a read: after its copy out,
        while its bytes are in the CPU's cache); a mismatch fails its I/O like a failed
        fill (the driver runs it again through the verifying path, which poisons it). A
        write (kinds[i]) whose fills are all in copies its bytes into its slots."""
        (st, tag_read, tag_pending, tag_k, tag_failed, tag_issued, tag_slots, tag_installed, row_pos, row_bad,
         free_tags, _wb, _fills, _ftags, ts, _rt, _rr, _bad, _sub, _wbl, _pk) = arrays
        max_blocks = tag_slots.shape[1]
        now = _now_ns(ts)
        for j in range(n):
            tag = tags[j] // max_blocks
            row = tags[j] % max_blocks
            i = tag_read[tag]
            p = row_pos[tag, row]
            good = res[j] == block_size and not bad[j]
            if good:
                slot = tag_slots[tag, p]
                if not kinds[i]:
                    _copy_piece(base, block_size, slot, hpas[i] // block_size + p, hpas[i], lens[i], addrs[i])
                if sum_keys.shape[0]:
                    b = sumtable.find(sum_keys, hpas[i] // block_size + p)
                    good = b < 0 or sumtable.hash_block(base + slot * block_size, block_size) == sum_values[b]
            if not good:  # failed, short or corrupt: the caller runs it again, verifying
                tag_failed[tag] = 1
                row_bad[tag, row] = 1
            st[FILLS] -= 1
            tag_pending[tag] -= 1
            if tag_pending[tag] > 0:
                continue
            k = tag_k[tag]
            if tag_failed[tag]:
                r = 0
                for q in range(k):
                    if tag_installed[tag, q]:
                        # a write's newly placed blocks hold nothing it wrote: all go
                        if kinds[i] or row_bad[tag, r]:
                            invalidate(bt, ps, tag_slots[tag, q], clock[0])
                        row_bad[tag, r] = 0
                        r += 1
                failed_out[st[FAILED]] = i
                st[FAILED] += 1
                tag_failed[tag] = 0
                clat[i] = -1
            else:
                if kinds[i]:
                    _copy_write_in(base, block_size, tag_slots[tag], k, hpas[i], lens[i], addrs[i])
                clat[i] = now - tag_issued[tag]
            finish(bt, tag_slots[tag], k)
            st[SLOTS] -= k
            st[IN_FLIGHT] -= 1
            st[DONE] += 1
            tag_read[tag] = -1
            free_tags[tag_k.shape[0] - 1 - st[IN_FLIGHT] - st[N_PARKED]] = tag  # a stack over the tags in use

    @njit_without_refcounts
    def _issue(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, slat, clat,
               arrays, tag, n_fill, begin, ring, fd):
        """Queue the planned I/O's fills, or - none needed - complete it now (a read
        whose blocks are all in DRAM, a write that replaces whole blocks or hits)."""
        (st, tag_read, tag_pending, tag_k, tag_failed, tag_issued, tag_slots, tag_installed, row_pos, row_bad,
         free_tags, _wb, fills, fill_tags, ts, _rt, _rr, _bad, _sub, _wbl, _pk) = arrays
        max_blocks = tag_slots.shape[1]
        i = tag_read[tag]
        k = tag_k[tag]
        write = kinds[i] != 0
        # Submitted once planned (fio's slat: taken -> submitted); the copies of blocks
        # already in device DRAM are completion work, in clat like the fills' wait.
        now = _now_ns(ts)
        slat[i] = now - begin
        first = hpas[i] // block_size
        r = 0
        for q in range(k):
            if tag_installed[tag, q]:
                block = first + q
                # plan() fills a newly placed block unless a write replaces all of it
                if write and block * block_size >= hpas[i] and (block + 1) * block_size <= hpas[i] + lens[i]:
                    continue
                row_pos[tag, r] = q
                fill_tags[r] = tag * max_blocks + r
                r += 1
            elif not write:  # resident and not busy (checked before planning): its bytes are good
                _copy_piece(base, block_size, tag_slots[tag, q], first + q, hpas[i], lens[i], addrs[i])
        if n_fill == 0:
            if write:
                _copy_write_in(base, block_size, tag_slots[tag], k, hpas[i], lens[i], addrs[i])
            clat[i] = _now_ns(ts) - now
            finish(bt, tag_slots[tag], k)
            st[DONE] += 1
            tag_read[tag] = -1
            free_tags[tag_k.shape[0] - 1 - st[IN_FLIGHT] - st[N_PARKED]] = tag  # a stack over the tags in use
            return
        tag_fills = fills[tag * max_blocks:(tag + 1) * max_blocks]
        _queue(ring, fd, tag_fills.ctypes.data, n_fill, fill_tags.ctypes.data)  # room was checked
        tag_pending[tag] = n_fill
        tag_issued[tag] = now
        st[IN_FLIGHT] += 1
        st[PEAK] = max(st[PEAK], st[IN_FLIGHT])
        st[SLOTS] += k
        st[FILLS] += n_fill
        st[QUEUED] += 1

    @njit_without_refcounts
    def step(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop, deadline_ns,
             slat, clat, arrays, ring, fd, ring_room, other_slots, n_slots, owner):
        """Resume an I/O parked for its write-backs, then plan and issue I/Os until
        `depth` are in flight (or the ring, the slots or the I/Os run out)."""
        (st, tag_read, tag_pending, tag_k, tag_failed, tag_issued, tag_slots, tag_installed, row_pos, row_bad,
         free_tags, writebacks, fills, fill_tags, ts, reaped_tags, reaped_res, bad, _sub, wblocks, parked) = arrays
        depth = tag_k.shape[0]
        while st[N_PARKED] > 0:  # their victims are on the SSD now
            st[N_PARKED] -= 1  # (before _issue: the tag stack counts in-flight and parked tags)
            tag = parked[st[N_PARKED]]
            st[SLOTS] -= tag_k[tag]  # counted while parked (its slots were BUSY); _issue counts them again
            _issue(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, slat, clat,
                   arrays, tag, tag_pending[tag], tag_issued[tag], ring, fd)
        st[PARKED_WBS] = 0
        while True:
            # Every way out with I/Os parked writes their victims back first (one batch at
            # the SSD's depth): no I/O may miss on a victim's block before its bytes are there.
            if st[NEXT] >= stop or st[IN_FLIGHT] + st[N_PARKED] >= depth:
                return WRITE_BACK if st[N_PARKED] else ISSUED
            i = st[NEXT]
            one_hpa = hpas[i:i + 1]
            one_len = lens[i:i + 1]
            write = kinds[i] != 0
            blocks, busy = touches_busy(bt, one_hpa, one_len, block_size)
            if st[N_PARKED] and (blocks > tag_slots.shape[1] or busy
                                 or st[PARKED_WBS] + blocks > writebacks.shape[0]
                                 or _touches_rows(writebacks, st[PARKED_WBS], hpas[i], lens[i], block_size)):
                return WRITE_BACK
            if blocks > tag_slots.shape[1]:
                return ISSUED if st[IN_FLIGHT] else WIDE
            if busy:
                return ISSUED if st[IN_FLIGHT] else BLOCKED
            room = n_slots - bt.scalars[btm.N_PINNED] - other_slots - st[SLOTS]
            if blocks > room or st[FILLS] + blocks > ring_room:
                if st[N_PARKED]:
                    return WRITE_BACK
                return ISSUED if st[IN_FLIGHT] else BLOCKED
            if write and st[WRITTEN] + blocks > wblocks.shape[0]:
                return WRITE_BACK if st[N_PARKED] else LOG_WRITES
            begin = _now_ns(ts)
            if deadline_ns > 0 and begin >= deadline_ns:
                return WRITE_BACK if st[N_PARKED] else ISSUED
            tag = free_tags[depth - 1 - st[IN_FLIGHT] - st[N_PARKED]]
            tag_read[tag] = i
            hits0 = counters[C.HITS]
            misses0 = counters[C.MISSES]
            ok, k, n_wb, n_fill = plan(bt, ps, counters, clock, one_hpa, one_len, write, write_mode, owner, base,
                                       block_size, tag_slots[tag], tag_installed[tag],
                                       writebacks[st[PARKED_WBS]:],
                                       fills[tag * tag_slots.shape[1]:(tag + 1) * tag_slots.shape[1]])
            st[HITS] += counters[C.HITS] - hits0
            st[MISSES] += counters[C.MISSES] - misses0
            if write:
                st[W_HITS] += counters[C.HITS] - hits0
                st[W_MISSES] += counters[C.MISSES] - misses0
            st[NEXT] = i + 1
            tag_k[tag] = k
            if not ok:
                # victims already unmapped have been written back by nobody: hand them
                # over like a write-back; the driver writes them, then reports full
                for q in range(k):
                    if tag_installed[tag, q]:
                        invalidate(bt, ps, tag_slots[tag, q], clock[0])
                finish(bt, tag_slots[tag], k)
                tag_read[tag] = -1
                st[PARKED_WBS] += n_wb
                return DEVICE_FULL
            if write:  # dirty now: the driver logs them (after this I/O's victims are written back)
                first = hpas[i] // block_size
                for q in range(k):
                    wblocks[st[WRITTEN]] = first + q
                    st[WRITTEN] += 1
            if n_wb > 0:  # parked until the driver writes its victims back, with the others'
                tag_issued[tag] = begin
                tag_pending[tag] = n_fill
                st[SLOTS] += k  # BUSY while the driver writes back (other threads plan around them)
                parked[st[N_PARKED]] = tag
                st[N_PARKED] += 1
                st[PARKED_WBS] += n_wb
                continue
            _issue(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, slat, clat,
                   arrays, tag, n_fill, begin, ring, fd)

    @njit_without_refcounts
    def run(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop, deadline_ns,
            slat, clat, failed_out, arrays, ring, fd, ring_room, other_slots, n_slots, owner, verify, sum_keys,
            sum_values):
        """The stream's loop for one time slice (see the module docstring). A reap goes
        back to the driver for verification: always (VERIFY_ALL), or when one of its
        blocks does not match its record in the sum table (VERIFY_HERE)."""
        st, ts, reaped_tags, reaped_res, bad, submits = arrays[0], arrays[14], arrays[15], arrays[16], arrays[17], \
            arrays[18]
        slice_end = _now_ns(ts) + SLICE_NS
        while True:
            status = step(bt, ps, counters, clock, write_mode, base, block_size, hpas, lens, addrs, kinds, stop,
                          deadline_ns, slat, clat, arrays, ring, fd, ring_room, other_slots, n_slots, owner)
            if status != ISSUED:
                return status
            if st[IN_FLIGHT] == 0:
                return FINISHED
            if st[QUEUED] > 0:
                submits[_submit_bucket(st[QUEUED])] += 1
                st[QUEUED] = 0
            got = _reap(ring, 1, REAP_AT_ONCE, reaped_tags.ctypes.data, reaped_res.ctypes.data)
            if got < 0:
                st[ERRNO] = got
                return VERIFY  # the driver raises; nothing was taken
            st[REAPED] = got
            if verify == VERIFY_ALL:
                return VERIFY
            for j in range(got):
                bad[j] = 0
            complete(bt, ps, clock, base, block_size, hpas, lens, addrs, kinds, clat, failed_out, arrays,
                     reaped_tags, reaped_res, bad, got, sum_keys if verify == VERIFY_HERE else sum_keys[:0],
                     sum_values)
            st[REAPED] = 0
            if _now_ns(ts) >= slice_end:
                return SLICE

    return complete, run


_KERNELS: dict[int, tuple] = {}


def kernels_for(policy: Policy) -> tuple:
    """(complete, run) compiled around `policy`'s planner (once per process)."""
    key = id(policy)
    if key not in _KERNELS:
        k = fw.kernels_for(policy)
        _KERNELS[key] = _build(k.plan, k.invalidate)
    return _KERNELS[key]


@numba.njit(nogil=True)
def clean_prefix(hpas, lens, block_size, special):
    """Length of the longest prefix of reads touching none of `special` (sorted blocks)."""
    if special.shape[0] == 0:
        return hpas.shape[0]
    for i in range(hpas.shape[0]):
        if lens[i] <= 0:
            continue
        first = hpas[i] // block_size
        last = (hpas[i] + lens[i] - 1) // block_size
        j = np.searchsorted(special, first)
        if j < special.shape[0] and special[j] <= last:
            return i
    return hpas.shape[0]


@numba.njit(nogil=True)
def blocks_per_read(hpas, lens, block_size):
    """The most blocks one of the reads touches."""
    most = 0
    for i in range(hpas.shape[0]):
        if lens[i] > 0:
            most = max(most, (hpas[i] + lens[i] - 1) // block_size - hpas[i] // block_size + 1)
    return most


@numba.njit(nogil=True, inline="always")
def _block_of_fill(arrays, block_size, hpas, fill_tag):
    """The device block a fill (its io_uring tag: read tag * max_blocks + row) reads."""
    tag_read, tag_slots, row_pos = arrays[1], arrays[6], arrays[8]
    max_blocks = tag_slots.shape[1]
    tag = fill_tag // max_blocks
    return hpas[tag_read[tag]] // block_size + row_pos[tag, fill_tag % max_blocks]


@numba.njit(nogil=True)
def reaped_blocks(arrays, block_size, hpas, tags, n, out):
    """The device block each of `n` reaped fills read."""
    for j in range(n):
        out[j] = _block_of_fill(arrays, block_size, hpas, tags[j])


@numba.njit(nogil=True)
def slot_of_reaped(arrays, tag):
    """The device-DRAM slot a reaped fill (its tag) read into."""
    tag_slots, row_pos = arrays[6], arrays[8]
    max_blocks = tag_slots.shape[1]
    return tag_slots[tag // max_blocks, row_pos[tag // max_blocks, tag % max_blocks]]


@numba.njit(nogil=True)
def missing_blocks(index_keys, index_slots, hpa, n, block_size, most):
    """How many blocks of [hpa, hpa+n) are not in device DRAM, counting up to `most`
    (a hint, read unlocked)."""
    missing = 0
    for block in range(hpa // block_size, (hpa + n - 1) // block_size + 1):
        if btm.lookup_index(index_keys, index_slots, block) < 0:
            missing += 1
            if missing >= most:
                break
    return missing
