"""Belady's MIN: evict the block whose next access lies farthest in the future.

Offline: it reads the trace's next-use array (`needs_future`), so it only runs in the
trace-driven simulator, where it is the lower bound on misses for any policy that, like
every cxlhm policy, places each missing block in DRAM (optimal for unit-size blocks).
State: a binary max-heap of resident slots keyed by their next use, with each slot's
heap position so a hit re-keys its slot in O(log n).
"""
import numpy as np

from cxlhm.blocktable import evictable
from cxlhm.jit import njit
from firmware_policies.base import NO_NEXT_USE, Policy, PolicyParamError


def make_state(n_slots, params, next_use=None):
    if next_use is None:
        raise PolicyParamError("belady is an offline policy: it needs the trace's future, so it only runs in "
                               "trace-driven simulation (cxlhm.sim.simulate, `cxlhm mrc`), not in a device")
    heap = np.full(n_slots, -1, np.int64)
    pos = np.full(n_slots, -1, np.int64)
    key = np.zeros(n_slots, np.int64)
    return (np.asarray(next_use, np.int64), heap, pos, key, np.zeros(1, np.int64))


@njit(inline="always")
def _next_use(next_use, now):
    return next_use[now] if now < next_use.shape[0] else NO_NEXT_USE


@njit(inline="always")
def _place(heap, pos, i, slot):
    heap[i] = slot
    pos[slot] = i


@njit
def _sift(heap, pos, key, size, i):
    """Restore the heap order around index i (its key may have moved either way)."""
    slot = heap[i]
    while i > 0 and key[heap[(i - 1) // 2]] < key[slot]:
        _place(heap, pos, i, heap[(i - 1) // 2])
        i = (i - 1) // 2
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and key[heap[child + 1]] > key[heap[child]]:
            child += 1
        if key[heap[child]] <= key[slot]:
            break
        _place(heap, pos, i, heap[child])
        i = child
    _place(heap, pos, i, slot)


@njit
def on_hit(ps, bt, slot, is_write, now):
    next_use, heap, pos, key, size = ps
    key[slot] = _next_use(next_use, now)
    _sift(heap, pos, key, size[0], pos[slot])


@njit
def on_insert(ps, bt, slot, is_write, now):
    next_use, heap, pos, key, size = ps
    key[slot] = _next_use(next_use, now)
    _place(heap, pos, size[0], slot)
    size[0] += 1
    _sift(heap, pos, key, size[0], size[0] - 1)


@njit
def victim(ps, bt, now):
    next_use, heap, pos, key, size = ps
    if size[0] > 0 and evictable(bt, heap[0]):
        return heap[0]
    best = -1  # the root is pinned or busy: scan for the farthest evictable block
    for i in range(size[0]):
        slot = heap[i]
        if evictable(bt, slot) and (best < 0 or key[slot] > key[best]):
            best = slot
    return best


@njit
def on_evict(ps, bt, slot, now):
    next_use, heap, pos, key, size = ps
    i = pos[slot]
    size[0] -= 1
    last = heap[size[0]]
    heap[size[0]] = -1
    pos[slot] = -1
    if last != slot:
        _place(heap, pos, i, last)
        _sift(heap, pos, key, size[0], i)


POLICY = Policy(
    name="belady",
    description="Belady's MIN (offline optimal): evict the block reused farthest in the future",
    make_state=make_state,
    on_hit=on_hit,
    on_insert=on_insert,
    victim=victim,
    on_evict=on_evict,
    needs_future=True,
)
