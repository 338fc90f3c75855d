"""LRU: evict the least recently used block. The generic firmware's default guess.

State: an intrusive doubly linked list over DRAM slots (most recent at the head),
so hit, insert and evict are O(1); the victim walk skips pinned/busy slots.
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
    slot = recency[L.TAIL]
    while slot >= 0 and not evictable(bt, slot):
        slot = prev[slot]
    return slot


@njit
def on_evict(ps, bt, slot, now):
    prev, nxt, recency = ps
    L.unlink(prev, nxt, recency, slot)


POLICY = Policy(
    name="lru",
    description="least recently used; the generic firmware default",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
)
