"""LRU: evict the least recently used block. The generic firmware's default guess.

State: an intrusive doubly linked list over DRAM slots (most recent at the head),
so hit, insert and evict are O(1); the victim walk skips pinned/busy slots.
"""
import numba
import numpy as np

from cxlhm.blocktable import evictable
from firmware_policies.base import Policy

HEAD, TAIL = 0, 1


def make_state(n_slots, params):
    prev = np.full(n_slots, -1, np.int64)
    nxt = np.full(n_slots, -1, np.int64)
    ends = np.array([-1, -1], np.int64)  # head (MRU), tail (LRU)
    return (prev, nxt, ends)


@numba.njit(nogil=True)
def _unlink(ps, slot):
    prev, nxt, ends = ps
    p, n = prev[slot], nxt[slot]
    if p >= 0:
        nxt[p] = n
    else:
        ends[HEAD] = n
    if n >= 0:
        prev[n] = p
    else:
        ends[TAIL] = p
    prev[slot] = -1
    nxt[slot] = -1


@numba.njit(nogil=True)
def _push_head(ps, slot):
    prev, nxt, ends = ps
    prev[slot] = -1
    nxt[slot] = ends[HEAD]
    if ends[HEAD] >= 0:
        prev[ends[HEAD]] = slot
    ends[HEAD] = slot
    if ends[TAIL] < 0:
        ends[TAIL] = slot


@numba.njit(nogil=True)
def on_hit(ps, bt, slot, is_write, now):
    _unlink(ps, slot)
    _push_head(ps, slot)


@numba.njit(nogil=True)
def on_insert(ps, bt, slot, is_write, now):
    _push_head(ps, slot)


@numba.njit(nogil=True)
def victim(ps, bt, now):
    prev, nxt, ends = ps
    slot = ends[TAIL]
    while slot >= 0 and not evictable(bt, slot):
        slot = prev[slot]
    return slot


@numba.njit(nogil=True)
def on_evict(ps, bt, slot, now):
    _unlink(ps, slot)


POLICY = Policy(
    name="lru",
    description="least recently used; the generic firmware default",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
)
