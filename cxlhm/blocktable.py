"""The block table: which device block lives in which DRAM slot, and in what state.

Everything is a numpy array sized by DRAM slots (never by capacity), updated by
numba-compiled, GIL-free functions so the same code serves the trace simulator,
the real-I/O device and the window's native fault handler (cxlhm/window).

Columns, one entry per DRAM slot:
  block   device block number held by the slot, or -1 when free
  flags   RESIDENT | DIRTY | BUSY | PINNED | PREFETCHED bits
  owner   session/tenant that last touched it (0 = none), for hint-aware policies
  stamp   logical time of the last access

The HPA -> slot index is an open-addressing hash table (linear probing, deletion by
backward shift, so no tombstones accumulate) with 2x..4x as many buckets as slots.

The prefetch ghost table remembers blocks that were evicted to make room for a
prefetch, so that a later host miss on one of them can be counted as prefetch
pollution (MQSim-CXL's definition). It is a 4-way set-associative table of block ids
with about one entry per slot (8 bytes per slot), FIFO within a set: it holds roughly
the last `n_slots` such evictions, and a set conflict may forget an older one early
(pollution is then undercounted, never overcounted). A block leaves it when it is
placed in DRAM again.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from cxlhm.jit import njit

RESIDENT = np.uint8(1)
DIRTY = np.uint8(2)
BUSY = np.uint8(4)  # taken by the access in progress: never a victim until it completes
PINNED = np.uint8(8)
PREFETCHED = np.uint8(16)  # filled by a prefetch and not yet read by the host
UNEVICTABLE = np.uint8(BUSY | PINNED)

# scalars[] indices
N_FREE = 0
N_PINNED = 1
NOW_NS = 2  # the device's clock in ns (wall or model), set by the runtime before each call

N_GHOSTS = 3  # entries in the prefetch ghost table

GHOST_WAYS = 4

BlockTable = namedtuple("BlockTable", "block flags owner stamp index_keys index_slots free scalars ghost ghost_next")

_EMPTY = np.int64(-1)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def new_block_table(n_slots: int) -> BlockTable:
    buckets = 1 << max(4, int(2 * n_slots - 1).bit_length())  # >= 2x slots, power of two
    ghost_sets = 1 << max(0, int(-(-n_slots // GHOST_WAYS) - 1).bit_length())  # sets x ways >= slots
    return BlockTable(
        block=np.full(n_slots, -1, np.int64),
        flags=np.zeros(n_slots, np.uint8),
        owner=np.zeros(n_slots, np.int64),
        stamp=np.zeros(n_slots, np.int64),
        index_keys=np.full(buckets, -1, np.int64),
        index_slots=np.full(buckets, -1, np.int64),
        # popped from the end: slot 0 is handed out first
        free=np.arange(n_slots - 1, -1, -1, dtype=np.int64),
        scalars=np.array([n_slots, 0, 0, 0], np.int64),
        # prefetch ghosts: GHOST_WAYS block ids per set (-1 empty), and each set's next way to replace
        ghost=np.full(ghost_sets * GHOST_WAYS, -1, np.int64),
        ghost_next=np.zeros(ghost_sets, np.uint8),
    )


@njit(inline="always")
def home_bucket(index_keys, block):
    mask = np.uint64(index_keys.shape[0] - 1)
    return np.int64((np.uint64(block) * _GOLDEN >> np.uint64(17)) & mask)


@njit(inline="always")
def _bucket(bt, block):
    return home_bucket(bt.index_keys, block)


@njit(inline="always")
def lookup_index(index_keys, index_slots, block):
    """Slot holding `block`, or -1, from the index arrays alone (callers from Python
    pass two arrays, not the whole table: numba's dispatch types every argument)."""
    mask = index_keys.shape[0] - 1
    i = home_bucket(index_keys, block)
    while True:
        key = index_keys[i]
        if key == block:
            return index_slots[i]
        if key == _EMPTY:
            return -1
        i = (i + 1) & mask


@njit
def lookup(bt, block):
    """Slot holding `block`, or -1."""
    return lookup_index(bt.index_keys, bt.index_slots, block)


@njit
def _index_put(bt, block, slot):
    mask = bt.index_keys.shape[0] - 1
    i = _bucket(bt, block)
    while bt.index_keys[i] != _EMPTY and bt.index_keys[i] != block:
        i = (i + 1) & mask
    bt.index_keys[i] = block
    bt.index_slots[i] = slot


@njit
def _index_delete(bt, block):
    mask = bt.index_keys.shape[0] - 1
    i = _bucket(bt, block)
    while bt.index_keys[i] != block:
        if bt.index_keys[i] == _EMPTY:
            return
        i = (i + 1) & mask
    # backward-shift deletion: pull later entries of the probe run into the hole
    j = i
    while True:
        j = (j + 1) & mask
        key = bt.index_keys[j]
        if key == _EMPTY:
            break
        home = _bucket(bt, key)
        # move key from j to i if its home is not cyclically within (i, j]
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            bt.index_keys[i] = key
            bt.index_slots[i] = bt.index_slots[j]
            i = j
    bt.index_keys[i] = _EMPTY
    bt.index_slots[i] = -1


@njit
def take_free_slot(bt):
    """Pop a free slot, or -1 when DRAM is full."""
    n = bt.scalars[N_FREE]
    if n == 0:
        return -1
    bt.scalars[N_FREE] = n - 1
    return bt.free[n - 1]


@njit
def install(bt, slot, block, owner, now):
    """Map `block` into the (free or just-evicted) `slot`."""
    _index_put(bt, block, slot)
    bt.block[slot] = block
    bt.flags[slot] = RESIDENT
    bt.owner[slot] = owner
    bt.stamp[slot] = now


@njit
def unmap(bt, slot):
    """Forget the slot's block (after eviction or invalidation); the slot stays taken."""
    block = bt.block[slot]
    if block >= 0:
        _index_delete(bt, block)
    if bt.flags[slot] & PINNED:
        bt.scalars[N_PINNED] -= 1
    bt.block[slot] = -1
    bt.flags[slot] = 0


@njit
def release_slot(bt, slot):
    """Return an unmapped slot to the free list."""
    n = bt.scalars[N_FREE]
    bt.free[n] = slot
    bt.scalars[N_FREE] = n + 1


@njit
def set_pinned(bt, first_block, n_blocks, pinned):
    """Pin (or unpin) the resident blocks of a range; returns how many of its blocks
    are not resident (a pin request must bring those in first)."""
    resident = 0
    if n_blocks <= bt.block.shape[0]:  # walk the range...
        for block in range(first_block, first_block + n_blocks):
            slot = lookup(bt, block)
            if slot >= 0:
                resident += 1
                _set_pin_flag(bt, slot, pinned)
    else:  # ...or, for a range larger than DRAM, the slots: work never exceeds DRAM size
        for slot in range(bt.block.shape[0]):
            block = bt.block[slot]
            if block >= first_block and block < first_block + n_blocks:
                resident += 1
                _set_pin_flag(bt, slot, pinned)
    return n_blocks - resident


@njit(inline="always")
def _set_pin_flag(bt, slot, pinned):
    if pinned and not bt.flags[slot] & PINNED:
        bt.flags[slot] |= PINNED
        bt.scalars[N_PINNED] += 1
    elif not pinned and bt.flags[slot] & PINNED:
        bt.flags[slot] &= ~PINNED
        bt.scalars[N_PINNED] -= 1


@njit(inline="always")
def evictable(bt, slot):
    return (bt.flags[slot] & UNEVICTABLE) == 0


@njit(inline="always")
def _ghost_set(bt, block):
    mask = np.uint64(bt.ghost_next.shape[0] - 1)
    return np.int64((np.uint64(block) * _GOLDEN >> np.uint64(23)) & mask)


@njit
def ghost_add(bt, block):
    """Remember that `block` was evicted to make room for a prefetch."""
    s = _ghost_set(bt, block)
    base = s * GHOST_WAYS
    for w in range(GHOST_WAYS):
        if bt.ghost[base + w] == block:
            return
    for w in range(GHOST_WAYS):
        if bt.ghost[base + w] < 0:
            bt.ghost[base + w] = block
            bt.scalars[N_GHOSTS] += 1
            return
    w = np.int64(bt.ghost_next[s])  # the set is full: replace its oldest entry
    bt.ghost[base + w] = block
    bt.ghost_next[s] = (w + 1) % GHOST_WAYS


@njit
def ghost_take(bt, block):
    """Forget `block` (it is being placed in DRAM again); True if it was a ghost."""
    if bt.scalars[N_GHOSTS] == 0:
        return False
    base = _ghost_set(bt, block) * GHOST_WAYS
    for w in range(GHOST_WAYS):
        if bt.ghost[base + w] == block:
            bt.ghost[base + w] = -1
            bt.scalars[N_GHOSTS] -= 1
            return True
    return False
