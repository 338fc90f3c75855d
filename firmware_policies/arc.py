"""ARC (Megiddo & Modha, FAST'03): recency list T1 and frequency list T2 over DRAM, ghost
lists B1/B2 of their recent victims, and a target size `p` for T1 that a ghost hit in B1
grows and a ghost hit in B2 shrinks.

Follows libCacheSim's ARC (real-valued p, its REPLACE rule and ghost trimming) with one
difference the hook interface forces: `victim` runs before the firmware knows which
block is missing, so the victim is chosen with the current `p`, and a ghost hit adapts
`p` when the block is inserted, one step later than in the paper. Ghost trimming, which
depends on whether the missing block was a ghost, is also settled in `on_insert`, from
the list sizes `victim` saw.
"""
import numpy as np

from cxlhm.blocktable import evictable
from cxlhm.jit import njit, prefetch
from firmware_policies import lists as L
from firmware_policies.base import Policy

T1, T2 = 1, 2
C, VICTIM_AT, VICTIM_LIST, PRE_T1, PRE_B1, PRE_B2, PRE_TOTAL = range(7)


def make_state(n_slots, params):
    prev, nxt = L.new_links(n_slots)
    meta = np.array([n_slots, -1, 0, 0, 0, 0, 0], np.int64)
    # |B1| + |B2| <= c once |T1| + |T2| = c; one more between a victim and its insert
    p = np.zeros(1, np.float64)  # T1's target size; real-valued, as in libCacheSim
    return (prev, nxt, np.zeros(n_slots, np.int8), L.new_list(), L.new_list(),
            L.new_ghosts(n_slots + 2), L.new_list(), L.new_list(), meta, p)


@njit
def on_hit(ps, bt, slot, is_write, now):
    prev, nxt, where, t1, t2, ghosts, b1, b2, meta, p = ps
    if where[slot] == T1:
        L.unlink(prev, nxt, t1, slot)
        L.push_head(prev, nxt, t2, slot)
        where[slot] = T2
    else:
        L.move_to_head(prev, nxt, t2, slot)


@njit(inline="always")
def _evictable_from_tail(prev, ends, bt):
    slot = ends[L.TAIL]
    while slot >= 0 and not evictable(bt, slot):
        slot = prev[slot]
    return slot


@njit
def victim(ps, bt, now):
    """REPLACE: the LRU end of T1 if T1 exceeds its target p, else of T2; the victim's
    id joins the head of the matching ghost list."""
    prev, nxt, where, t1, t2, ghosts, b1, b2, meta, p = ps
    meta[VICTIM_AT], meta[PRE_T1], meta[PRE_B1], meta[PRE_B2] = now, t1[L.LEN], b1[L.LEN], b2[L.LEN]
    meta[PRE_TOTAL] = t1[L.LEN] + t2[L.LEN] + b1[L.LEN] + b2[L.LEN]
    from_t1 = (t1[L.LEN] > 0 and t1[L.LEN] > p[0]) or t2[L.LEN] == 0
    slot = _evictable_from_tail(prev, t1 if from_t1 else t2, bt)
    if slot < 0:  # the preferred list is all pinned/busy
        slot = _evictable_from_tail(prev, t2 if from_t1 else t1, bt)
    if slot >= 0:
        meta[VICTIM_LIST] = where[slot]
        L.ghost_add(ghosts, b1 if where[slot] == T1 else b2, where[slot], bt.block[slot])
    return slot


@njit(inline="always")
def _drop(ghosts, ends, node):
    if node >= 0:
        L.ghost_drop(ghosts, ends, node)


@njit
def on_insert(ps, bt, slot, is_write, now):
    prev, nxt, where, t1, t2, ghosts, b1, b2, meta, p = ps
    evicted = meta[VICTIM_AT] == now
    n_b1 = meta[PRE_B1] if evicted else b1[L.LEN]
    n_b2 = meta[PRE_B2] if evicted else b2[L.LEN]
    node = L.ghost_find(ghosts, bt.block[slot])
    if node >= 0:  # ghost hit: adapt p, and the block has proven reuse
        if L.ghost_owner(ghosts, node) == T1:
            p[0] = min(p[0] + max(n_b2 / n_b1, 1.0), meta[C])
            L.ghost_drop(ghosts, b1, node)
        else:
            p[0] = max(p[0] - max(n_b1 / n_b2, 1.0), 0.0)
            L.ghost_drop(ghosts, b2, node)
        L.push_head(prev, nxt, t2, slot)
        where[slot] = T2
        return
    if evicted:  # keep |T1| + |B1| <= c and the four lists <= 2c
        if meta[PRE_T1] + meta[PRE_B1] + 1 > meta[C]:
            if meta[PRE_B1] > 0:
                _drop(ghosts, b1, b1[L.TAIL])
            elif meta[VICTIM_LIST] == T1:  # T1 alone filled DRAM: its victim is not remembered
                _drop(ghosts, b1, b1[L.HEAD])
        elif meta[PRE_TOTAL] >= 2 * meta[C] and meta[PRE_B2] > 0:
            _drop(ghosts, b2, b2[L.TAIL])
    L.push_head(prev, nxt, t1, slot)
    where[slot] = T1


@njit(inline="always")
def upcoming(ps, bt, block, slot):
    """A miss: on_insert looks the block up among the ghosts, victim reads the block of
    T1's or T2's tail slot, and trimming drops B1's or B2's tail entry."""
    if slot < 0:
        prev, nxt, where, t1, t2, ghosts, b1, b2, meta, p = ps
        L.ghost_prefetch(ghosts, block)
        for ends in (t1, t2):
            if ends[L.TAIL] >= 0:
                prefetch(bt.block.ctypes.data + ends[L.TAIL] * bt.block.strides[0])
        for ends in (b1, b2):
            if ends[L.TAIL] >= 0:
                prefetch(ghosts.entry.ctypes.data + ends[L.TAIL] * ghosts.entry.strides[0])


@njit
def on_evict(ps, bt, slot, now):
    prev, nxt, where, t1, t2, ghosts, b1, b2, meta, p = ps
    L.unlink(prev, nxt, t1 if where[slot] == T1 else t2, slot)
    where[slot] = 0


POLICY = Policy(
    name="arc",
    description="ARC: adaptive balance of recency (T1) and frequency (T2) lists steered by ghost hits",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
    upcoming=upcoming,
)
