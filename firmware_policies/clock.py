"""CLOCK (second chance): FIFO order, but a block referenced since the hand last
passed it gets another round instead of being evicted.

The slots form a ring in arrival order; the hand points at the oldest. A hit only bumps
the block's counter (no list surgery, which is why CLOCK is what real firmware uses).
On a miss the hand sweeps: a block with a non-zero counter is decremented and passed
over, the first block at zero is the victim, and the new block joins the ring just
behind the hand, i.e. as the newest. With ``n_bit_counter: 1`` this is classic
second chance; more bits remember up to 2^n - 1 references (libCacheSim's Clock-n).
"""
import numpy as np

from cxlhm.blocktable import evictable
from cxlhm.jit import njit
from firmware_policies import lists as L
from firmware_policies.base import Param, Policy

HAND, COUNT, MAX_FREQ = 0, 1, 2


def make_state(n_slots, params):
    prev, nxt = L.new_links(n_slots)
    freq = np.zeros(n_slots, np.int64)
    meta = np.array([-1, 0, (1 << params["n_bit_counter"]) - 1], np.int64)
    return (prev, nxt, freq, meta)


@njit
def on_hit(ps, bt, slot, is_write, now):
    prev, nxt, freq, meta = ps
    if freq[slot] < meta[MAX_FREQ]:
        freq[slot] += 1


@njit
def on_insert(ps, bt, slot, is_write, now):
    prev, nxt, freq, meta = ps
    freq[slot] = 0
    hand = meta[HAND]
    if hand < 0:
        prev[slot] = slot
        nxt[slot] = slot
        meta[HAND] = slot
    else:  # just behind the hand: the last block the sweep will reach
        p = prev[hand]
        prev[slot], nxt[slot] = p, hand
        nxt[p] = slot
        prev[hand] = slot
    meta[COUNT] += 1


@njit
def victim(ps, bt, now):
    prev, nxt, freq, meta = ps
    slot = meta[HAND]
    # after MAX_FREQ + 1 full sweeps every evictable block has reached zero
    for _ in range((meta[MAX_FREQ] + 1) * meta[COUNT] + 1):
        if slot < 0:
            break
        if evictable(bt, slot):
            if freq[slot] == 0:
                meta[HAND] = slot
                return slot
            freq[slot] -= 1
        slot = nxt[slot]
    return -1


@njit
def on_evict(ps, bt, slot, now):
    prev, nxt, freq, meta = ps
    p, n = prev[slot], nxt[slot]
    if n == slot:
        meta[HAND] = -1
    else:
        nxt[p] = n
        prev[n] = p
        if meta[HAND] == slot:
            meta[HAND] = n
    prev[slot] = nxt[slot] = -1
    meta[COUNT] -= 1


POLICY = Policy(
    name="clock",
    description="CLOCK / second chance: FIFO that spares blocks referenced since the hand last passed",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
    params={"n_bit_counter": Param(int, 1, "bits of the per-block reference counter (1 = classic second chance)",
                                   lambda v: 1 <= v <= 16, "must be from 1 to 16")},
)
