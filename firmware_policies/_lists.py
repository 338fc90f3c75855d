"""Building blocks shared by the baseline policies: intrusive lists and ghost lists.

Slot lists: doubly linked lists whose nodes are DRAM slots. The links live in shared
`prev`/`nxt` arrays, so several lists can thread through the same slots (ARC's T1 and
T2, S3-FIFO's small and main queues); each list is its own `ends = [head, tail, length]`
array. The head is the newest end. Every operation is O(1).

Ghost lists remember block ids that are no longer in DRAM (ARC's B1/B2, S3-FIFO's ghost
FIFO). They are slot-style lists over a fixed pool of ghost entries plus an
open-addressing index block -> entry. The index reuses the block table's hash functions
(same field names), so it needs no code of its own.
"""
from collections import namedtuple

import numba
import numpy as np

from cxlhm import blocktable as btm

HEAD, TAIL, LEN = 0, 1, 2

Ghosts = namedtuple("Ghosts", "block owner prev nxt free n_free index_keys index_slots")


def new_links(n: int) -> tuple:
    return np.full(n, -1, np.int64), np.full(n, -1, np.int64)


def new_list() -> np.ndarray:
    return np.array([-1, -1, 0], np.int64)


@numba.njit(nogil=True, inline="always")
def push_head(prev, nxt, ends, node):
    prev[node] = -1
    nxt[node] = ends[HEAD]
    if ends[HEAD] >= 0:
        prev[ends[HEAD]] = node
    else:
        ends[TAIL] = node
    ends[HEAD] = node
    ends[LEN] += 1


@numba.njit(nogil=True, inline="always")
def unlink(prev, nxt, ends, node):
    p, n = prev[node], nxt[node]
    if p >= 0:
        nxt[p] = n
    else:
        ends[HEAD] = n
    if n >= 0:
        prev[n] = p
    else:
        ends[TAIL] = p
    prev[node] = -1
    nxt[node] = -1
    ends[LEN] -= 1


@numba.njit(nogil=True, inline="always")
def move_to_head(prev, nxt, ends, node):
    if ends[HEAD] != node:
        unlink(prev, nxt, ends, node)
        push_head(prev, nxt, ends, node)


def new_ghosts(capacity: int) -> Ghosts:
    capacity = max(1, capacity)
    buckets = 1 << max(4, int(2 * capacity - 1).bit_length())
    prev, nxt = new_links(capacity)
    return Ghosts(block=np.full(capacity, -1, np.int64), owner=np.zeros(capacity, np.int8),
                  prev=prev, nxt=nxt, free=np.arange(capacity - 1, -1, -1, dtype=np.int64),
                  n_free=np.array([capacity], np.int64),
                  index_keys=np.full(buckets, -1, np.int64), index_slots=np.full(buckets, -1, np.int64))


@numba.njit(nogil=True)
def ghost_find(g, block):
    """The ghost entry remembering `block`, or -1."""
    return btm.lookup(g, block)


@numba.njit(nogil=True)
def ghost_add(g, ends, owner, block):
    """Remember `block` at the head of the ghost list `ends` (tagged `owner`).
    Returns False when the pool is exhausted (the caller trims before adding)."""
    n = g.n_free[0]
    if n == 0:
        return False
    node = g.free[n - 1]
    g.n_free[0] = n - 1
    g.block[node] = block
    g.owner[node] = owner
    btm._index_put(g, block, node)
    push_head(g.prev, g.nxt, ends, node)
    return True


@numba.njit(nogil=True)
def ghost_drop(g, ends, node):
    """Forget the ghost entry `node` (a ghost hit, or trimming the list's tail)."""
    unlink(g.prev, g.nxt, ends, node)
    btm._index_delete(g, g.block[node])
    g.block[node] = -1
    g.free[g.n_free[0]] = node
    g.n_free[0] += 1
