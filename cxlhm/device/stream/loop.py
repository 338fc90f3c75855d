"""Streamed I/O: one host thread keeps up to `depth` reads and writes in flight on the
wall clock, with the per-I/O work compiled.

Driving the device from the interpreter costs a round trip per I/O (checks, the plan,
the queue, the reap, the copies): ~10 us per 4 KiB read on the development machine, as
much as the SSD read itself at QD32. A stream runs the whole loop in one compiled call
(`run`), holding the device lock for a time slice:

    plan     the firmware's planner, for the next read, while fewer than `depth` are
             in flight; its fills are queued on the thread's io_uring ring
    reap     hand the queue to the kernel and wait for >= 1 completion (nogil)
    copy     each reaped fill's block is copied to its read's host buffer at once, so
             a long read's copies overlap its other blocks' I/O; the copies and
             checksums of one reap run on the copy engine (cxlhm/device/stream/copyengine.py), whose
             helper thread takes a share of a long run (large blocks: a reap takes all
             completions that are in); a read whose fills are all in releases its slots
             (BUSY -> idle). With large blocks the reap's room on the ring goes to the
             next reads' fills first: they are planned and queued before the reap is
             copied out, so the SSD's queue stays full through the copy

and returns to the driver (Device.stream_io) for what compiled code cannot do:
dirty victims' checksums to record once they land (the loop logs them itself before
their write-backs go on the ring: hashed, and written to the integrity log as one frame
with one write(2), after DIRTY records of the blocks written since; the driver does
that too where this build gives compiled code no xxhash or crc32), a block another
thread holds busy (wait for it without the lock),
reaped blocks to verify in Python (only where xxhash's C function is out of reach:
otherwise each block with a checksum record is hashed in the loop right after
its copy, by the copy engine), or the end of the slice (the lock is let go, so other
threads, the mailbox and the firmware's background work get their turn; their waits
are bounded by SLICE_NS).

While another stream shares the device, a slice leaves the I/Os it prepares (fills,
victims' write-backs) off the ring (state.py's `submit`): its driver puts them on in one
call right before it waits for completions without the lock (`reap_unlocked`), and any
other end of the slice puts them on before it returns. Entering the kernel to submit
(the block layer, the disk's doorbell) was about half of a slice's time under the lock
with 4 streams of 4 KiB random writes, and needs no device lock: the ring is the
thread's own.

Dirty victims are written back on the stream's own ring: the I/O that evicted them is
parked (its slots BUSY) until they land, while the stream keeps planning others, and no
I/O - of this stream or another thread - misses on a victim's block before its bytes
are on the SSD and its checksum is recorded.

The stream's state, the write-back table and the ring calls are in cxlhm/device/stream/state.py;
the compiled loop itself, one copy per policy, in cxlhm/device/stream/loop_kernels.py.

Rules shared with the access path: every slot of a read in flight is BUSY (other threads
wait for it, victim() skips it); a read that touches a busy block - another thread's or
one of this stream's own reads in flight - is not planned until that block is free;
fills in flight never exceed the ring's room (its CQ must not overflow). Poisoned blocks
need the device's erroring path: the driver streams only the reads before the first
read touching one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cxlhm import blocktable as btm
from cxlhm import firmware as fw
from cxlhm.jit import njit
from cxlhm.device.stream.state import (
    REAPED, RING, flush_pending, ring_reap)
from cxlhm.policies import Policy

_KERNELS: dict[int, tuple] = {}
_TEMPLATE = Path(__file__).with_name("loop_kernels.py")


def kernels_for(policy: Policy) -> tuple:
    """(complete, run) compiled around `policy`'s planner (cxlhm/device/stream/loop_kernels.py):
    once per install for a registered policy, like the firmware kernels."""
    key = id(policy)
    if key not in _KERNELS:
        module = fw.policy_module(_TEMPLATE, "stream", policy, f"the {policy.name} streamed I/O loop")
        _KERNELS[key] = module.complete, module.run
    return _KERNELS[key]


@njit
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


# (compiled when imported: threads that reach it first together would compile it together)
@njit(signature_or_function="int64(intp, int64, int64[::1], int64[::1], int64[::1], int64[:, ::1], int64[::1])")
def reap_unlocked(ring, fd, st, tags, res, pend_rows, pend_tags):
    """Put the I/Os the slice left pending on the ring (state.py's submit), wait for
    completions on the stream's ring (its own thread's: the
    device lock is not held) and take every one that is in into the stream's `reaped`
    (`tags`, `res`; st[REAPED]); `run` completes them when it runs next, all in its first
    step: each turn of the lock costs the driver's round trip (~15-25 us of the
    interpreter), so the more a turn completes, the less each I/O pays (4 clones of a
    4 KiB random-write job: ~25 us of CPU per write taking 4 at a time, ~15 us taking
    all). Returns how many were taken, or -errno."""
    # a quarter of what is on the ring (all of it lands: it was handed to the kernel), so
    # a thread that other threads keep from a CPU wakes once per few completions
    flush_pending(st, ring, fd, pend_rows, pend_tags)
    least = max(1, min(tags.shape[0], st[RING] // 4))
    got = ring_reap(ring, least, tags.shape[0], tags.ctypes.data, res.ctypes.data)
    if got > 0:
        st[REAPED] = got
    return got


@njit
def blocks_per_read(hpas, lens, block_size):
    """The most blocks one of the reads touches."""
    most = 0
    for i in range(hpas.shape[0]):
        if lens[i] > 0:
            most = max(most, (hpas[i] + lens[i] - 1) // block_size - hpas[i] // block_size + 1)
    return most


@njit(inline="always")
def _block_of_fill(arrays, block_size, hpas, fill_tag):
    """The device block a fill (its io_uring tag: read tag * max_blocks + row) reads."""
    tag_read, tag_slots, row_pos = arrays[1], arrays[6], arrays[8]
    max_blocks = tag_slots.shape[1]
    tag = fill_tag // max_blocks
    return hpas[tag_read[tag]] // block_size + row_pos[tag, fill_tag % max_blocks]


@njit
def reaped_blocks(arrays, block_size, hpas, tags, n, out):
    """The device block each of `n` reaped fills read."""
    for j in range(n):
        out[j] = _block_of_fill(arrays, block_size, hpas, tags[j]) if tags[j] >= 0 else -1  # < 0: a write-back


@njit
def slot_of_reaped(arrays, tag):
    """The device-DRAM slot a reaped fill (its tag) read into."""
    tag_slots, row_pos = arrays[6], arrays[8]
    max_blocks = tag_slots.shape[1]
    return tag_slots[tag // max_blocks, row_pos[tag // max_blocks, tag % max_blocks]]


@njit
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
