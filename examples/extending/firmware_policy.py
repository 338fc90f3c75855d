"""MRU: evict the most recently used block.

The right choice for a working set that is scanned in a loop larger than DRAM, where
LRU misses on every access: MRU keeps the older part of the loop resident and loses
only the newest blocks.

State: an intrusive doubly linked list over DRAM slots, most recent at the head (the
same list LRU keeps); the victim is taken from the head instead of the tail, walking
towards older blocks past pinned or busy slots.
"""
from cxlhm.blocktable import evictable
from cxlhm.jit import njit
from firmware_policies import lists as L
from firmware_policies.base import Policy


def make_state(n_slots, params):
    prev, nxt = L.new_links(n_slots)
    return (prev, nxt, L.new_list())


@njit
def on_hit(ps, bt, slot, is_write, now):
    prev, nxt, recency = ps
    L.move_to_head(prev, nxt, recency, slot)


@njit
def on_insert(ps, bt, slot, is_write, now):
    prev, nxt, recency = ps
    L.push_head(prev, nxt, recency, slot)


@njit
def victim(ps, bt, now):
    prev, nxt, recency = ps
    slot = recency[L.HEAD]
    while slot >= 0 and not evictable(bt, slot):  # the newest block this access may evict
        slot = nxt[slot]
    return slot


@njit
def on_evict(ps, bt, slot, now):
    prev, nxt, recency = ps
    L.unlink(prev, nxt, recency, slot)


POLICY = Policy(
    name="mru",
    description="most recently used: for loops larger than DRAM",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
)
