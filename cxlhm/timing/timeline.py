"""A resource's busy timeline with backfilling, in a slice of a float64 array.

A plain busy-until resource serves work in the order it is charged. The model charges
a whole access at its issue time, so a later-charged access often needs a resource
*earlier* than one charged before it (a hit's link transfer vs. a miss's transfer
1 ms later, after its NAND read). Busy-until would queue the hit behind the miss.
Instead each resource keeps its reserved future as sorted, disjoint busy intervals,
and a new reservation takes the first idle gap at or after its ready time that is
long enough. Reservations already made never move, so completions returned earlier
stay true (conservative backfilling).

Layout of one timeline (2 + 2 * SLOTS floats): [count, head, then SLOTS (start, end)
pairs used as a ring]: interval k (0 = earliest) lives in pair (head + k) % SLOTS.
Intervals that end at or before the horizon (the latest issue time charged: nothing
charged later is ready before it) are dropped from the front. When all SLOTS hold
live intervals, the two with the smallest gap between them are merged (the gap
counts as busy): a small pessimism instead of unbounded memory.
"""
from __future__ import annotations

import numpy as np

from cxlhm.jit import njit

SLOTS = 64  # a power of two: ring positions wrap with a mask
_MASK = SLOTS - 1
SIZE = 2 + 2 * SLOTS
_COUNT, _HEAD = 0, 1


@njit(inline="always")
def _at(state, base, k):
    """Index of interval k's start (its end is the next float)."""
    return base + 2 + 2 * ((np.int64(state[base + _HEAD]) + k) & _MASK)


@njit(inline="always")
def _move(state, base, dst, src):
    a = _at(state, base, dst)
    b = _at(state, base, src)
    state[a] = state[b]
    state[a + 1] = state[b + 1]


@njit
def _merge_closest(state, base, n):
    best = 0
    best_gap = np.inf
    for k in range(n - 1):
        gap = state[_at(state, base, k + 1)] - state[_at(state, base, k) + 1]
        if gap < best_gap:
            best_gap = gap
            best = k
    state[_at(state, base, best) + 1] = state[_at(state, base, best + 1) + 1]
    for k in range(best + 1, n - 1):
        _move(state, base, k, k + 1)
    state[base + _COUNT] = n - 1
    return n - 1


@njit
def reserve(state, base, horizon, ready, duration):
    """Hold the resource for `duration` ns in its first idle gap at or after `ready`;
    returns when that hold ends."""
    n = np.int64(state[base + _COUNT])
    head = np.int64(state[base + _HEAD])
    pairs = base + 2
    while n > 0 and state[pairs + 2 * head + 1] <= horizon:  # forget the past
        head = (head + 1) & _MASK
        n -= 1
    state[base + _HEAD] = head
    if n == SLOTS:  # make room first (the gap this reservation wants may be the one merged)
        n = _merge_closest(state, base, n)
    state[base + _COUNT] = n
    last = pairs + 2 * ((head + n - 1) & _MASK)
    if n == 0 or state[last + 1] <= ready:  # the common case: after everything
        end = ready + duration
        if n > 0 and state[last + 1] == ready:
            state[last + 1] = end
        else:
            i = pairs + 2 * ((head + n) & _MASK)
            state[i] = ready
            state[i + 1] = end
            state[base + _COUNT] = n + 1
        return end
    # first interval that ends after `ready` (ends are sorted: intervals are disjoint)
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if state[pairs + 2 * ((head + mid) & _MASK) + 1] <= ready:
            lo = mid + 1
        else:
            hi = mid
    k = lo
    t = ready
    while k < n:
        i = pairs + 2 * ((head + k) & _MASK)
        if state[i] >= t + duration:
            break
        t = max(t, state[i + 1])
        k += 1
    end = t + duration
    # place [t, end) between interval k-1 and interval k, merging where they touch
    prev = pairs + 2 * ((head + k - 1) & _MASK)
    nxt = pairs + 2 * ((head + k) & _MASK)
    joins_prev = k > 0 and state[prev + 1] == t
    joins_next = k < n and state[nxt] == end
    if joins_prev and joins_next:
        state[prev + 1] = state[nxt + 1]
        for j in range(k, n - 1):
            _move(state, base, j, j + 1)
        state[base + _COUNT] = n - 1
    elif joins_prev:
        state[prev + 1] = end
    elif joins_next:
        state[nxt] = t
    else:  # open a hole at k, moving whichever side of it is shorter
        if k < n - k:
            head = (head - 1) & _MASK
            state[base + _HEAD] = head
            for j in range(k):
                _move(state, base, j, j + 1)
            i = pairs + 2 * ((head + k) & _MASK)
        else:
            for j in range(n, k, -1):
                _move(state, base, j, j - 1)
            i = nxt
        state[i] = t
        state[i + 1] = end
        state[base + _COUNT] = n + 1
    return end


@njit
def busy_until(state, base):
    """End of the last reservation (0 when idle)."""
    n = np.int64(state[base + _COUNT])
    return state[_at(state, base, n - 1) + 1] if n else 0.0
