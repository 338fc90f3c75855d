"""S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO with
reinsertion, and a ghost FIFO of recently evicted block ids.

New blocks enter the small queue (or main, if the ghost remembers them). Evicting from
small promotes blocks hit at least `move_to_main_threshold` times to main and drops the
rest into the ghost; evicting from main reinserts blocks that were hit (a 2-bit CLOCK).
Small is evicted from while main is within its share. Follows libCacheSim's S3FIFO,
including its warm-up rule: before the first eviction, blocks arriving while small is
full go straight to main.
"""
import numpy as np

from cxlhm.blocktable import evictable
from cxlhm.jit import njit
from firmware_policies import lists as L
from firmware_policies.base import Param, Policy

SMALL, MAIN = 1, 2
SMALL_SIZE, MAIN_SIZE, GHOST_SIZE, THRESHOLD, HAS_EVICTED = range(5)


def make_state(n_slots, params):
    prev, nxt = L.new_links(n_slots)
    small_size = int(n_slots * params["small_ratio"])
    ghost_size = int(n_slots * params["ghost_ratio"])
    meta = np.array([small_size, n_slots - small_size, ghost_size, params["move_to_main_threshold"], 0], np.int64)
    # the ghost pool holds one id beyond its share between an eviction and the insert that follows
    return (prev, nxt, np.zeros(n_slots, np.int64), np.zeros(n_slots, np.int8),
            L.new_list(), L.new_list(), L.new_ghosts(ghost_size + 1), L.new_list(), meta)


@njit
def on_hit(ps, bt, slot, is_write, now):
    freq = ps[2]
    freq[slot] += 1


@njit
def on_insert(ps, bt, slot, is_write, now):
    prev, nxt, freq, where, small, main, ghosts, ghost, meta = ps
    freq[slot] = 0
    node = L.ghost_find(ghosts, bt.block[slot])
    if node >= 0:
        L.ghost_drop(ghosts, ghost, node)
        where[slot] = MAIN
    elif meta[HAS_EVICTED] == 0 and small[L.LEN] >= meta[SMALL_SIZE]:
        where[slot] = MAIN
    else:
        where[slot] = SMALL
    L.push_head(prev, nxt, main if where[slot] == MAIN else small, slot)
    while ghost[L.LEN] > meta[GHOST_SIZE]:
        L.ghost_drop(ghosts, ghost, ghost[L.TAIL])


@njit(inline="always")
def upcoming(ps, bt, block, slot):
    if slot < 0:  # a miss: on_insert looks the block up among the ghosts
        L.ghost_prefetch(ps[6], block)


@njit
def _evict_small(ps, bt):
    """Walk small from its tail: promote blocks hit often enough, evict the first other
    one (its id goes to the ghost). Pinned/busy blocks keep their place. -1: none left."""
    prev, nxt, freq, where, small, main, ghosts, ghost, meta = ps
    slot = small[L.TAIL]
    while slot >= 0:
        toward_head = prev[slot]
        if evictable(bt, slot):
            if freq[slot] < meta[THRESHOLD]:
                if meta[GHOST_SIZE] > 0:
                    L.ghost_add(ghosts, ghost, 0, bt.block[slot])
                return slot
            L.unlink(prev, nxt, small, slot)
            L.push_head(prev, nxt, main, slot)
            where[slot], freq[slot] = MAIN, 0
        slot = toward_head
    return -1


@njit
def _evict_main(ps, bt):
    """CLOCK over main: a block hit since it was last passed is reinserted at the head
    with its count decremented (capped at 3 first); the first at zero is evicted."""
    prev, nxt, freq, where, small, main, ghosts, ghost, meta = ps
    for _ in range(4 * main[L.LEN] + 1):  # after 4 rounds every evictable count is zero
        slot = main[L.TAIL]
        if slot < 0:
            break
        if evictable(bt, slot):
            if freq[slot] == 0:
                return slot
            freq[slot] = min(freq[slot], 3) - 1
        L.move_to_head(prev, nxt, main, slot)
    return -1


@njit
def victim(ps, bt, now):
    small, main, meta = ps[4], ps[5], ps[8]
    meta[HAS_EVICTED] = 1
    if main[L.LEN] > meta[MAIN_SIZE] or small[L.LEN] == 0:
        slot = _evict_main(ps, bt)
        return slot if slot >= 0 else _evict_small(ps, bt)
    slot = _evict_small(ps, bt)  # -1 once small is empty (all promoted) or all pinned
    return slot if slot >= 0 else _evict_main(ps, bt)


@njit
def on_evict(ps, bt, slot, now):
    prev, nxt, freq, where, small, main, ghosts, ghost, meta = ps
    L.unlink(prev, nxt, main if where[slot] == MAIN else small, slot)
    where[slot] = 0


POLICY = Policy(
    name="s3fifo",
    description="S3-FIFO: small probationary FIFO + main FIFO with reinsertion + ghost ids (SOSP'23)",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
    params={
        "small_ratio": Param(float, 0.1, "share of DRAM slots for the small FIFO", lambda v: 0 <= v < 1, "must be in [0, 1)"),
        "ghost_ratio": Param(float, 0.9, "ghost FIFO length as a share of DRAM slots", lambda v: 0 <= v <= 4, "must be in [0, 4]"),
        "move_to_main_threshold": Param(int, 2, "hits in the small FIFO that earn promotion to main",
                                        lambda v: v >= 1, "must be at least 1"),
    },
    upcoming=upcoming,
)
