"""FIFO: evict the block that entered device DRAM first; hits change nothing.

The cheapest possible firmware (no work on a hit) and the usual lower baseline.
State: one intrusive list over DRAM slots in arrival order (newest at the head).
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
    return


@njit
def on_insert(ps, bt, slot, is_write, now):
    prev, nxt, queue = ps
    L.push_head(prev, nxt, queue, slot)


@njit
def victim(ps, bt, now):
    prev, nxt, queue = ps
    slot = queue[L.TAIL]
    while slot >= 0 and not evictable(bt, slot):  # pinned/busy blocks keep their place
        slot = prev[slot]
    return slot


@njit
def on_evict(ps, bt, slot, now):
    prev, nxt, queue = ps
    L.unlink(prev, nxt, queue, slot)


POLICY = Policy(
    name="fifo",
    description="first in, first out; hits do not reorder",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
)
