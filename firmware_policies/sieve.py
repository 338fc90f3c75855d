"""SIEVE (Zhang et al., NSDI'24): FIFO order with a visited bit and a hand that
remembers where it stopped.

New blocks enter at the head; a hit only sets the visited bit. On a miss the hand
moves from where it last stopped toward the head (wrapping to the tail), clearing
visited bits, and evicts the first unvisited block. Unlike CLOCK, survivors are not
moved, so new blocks stay near the head and one-hit wonders leave quickly.
"""
import numpy as np

from cxlhm.blocktable import evictable
from cxlhm.jit import njit
from firmware_policies import lists as L
from firmware_policies.base import Policy


def make_state(n_slots, params):
    prev, nxt = L.new_links(n_slots)
    visited = np.zeros(n_slots, np.uint8)
    hand = np.array([-1], np.int64)  # -1: start from the tail
    return (prev, nxt, L.new_list(), visited, hand)


@njit
def on_hit(ps, bt, slot, is_write, now):
    prev, nxt, queue, visited, hand = ps
    visited[slot] = 1


@njit
def on_insert(ps, bt, slot, is_write, now):
    prev, nxt, queue, visited, hand = ps
    visited[slot] = 0
    L.push_head(prev, nxt, queue, slot)


@njit
def victim(ps, bt, now):
    prev, nxt, queue, visited, hand = ps
    slot = hand[0]
    for _ in range(2 * queue[L.LEN] + 2):  # two sweeps clear every bit
        if slot < 0:
            slot = queue[L.TAIL]
            if slot < 0:
                break
        if evictable(bt, slot):
            if visited[slot] == 0:
                hand[0] = slot
                return slot
            visited[slot] = 0
        slot = prev[slot]
    return -1


@njit
def on_evict(ps, bt, slot, now):
    prev, nxt, queue, visited, hand = ps
    if hand[0] == slot:  # the hand continues toward the head from here
        hand[0] = prev[slot]
    L.unlink(prev, nxt, queue, slot)


POLICY = Policy(
    name="sieve",
    description="SIEVE: FIFO with a visited bit and a lazily moving hand (NSDI'24)",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
)
