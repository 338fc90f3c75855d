"""Building blocks shared by the baseline policies: intrusive lists and ghost lists.

Slot lists: doubly linked lists whose nodes are DRAM slots. The links live in shared
`prev`/`nxt` arrays, so several lists can thread through the same slots (ARC's T1 and
T2, S3-FIFO's small and main queues); each list is its own `ends = [head, tail, length]`
array. The head is the newest end. Every operation is O(1).

Ghost lists remember block ids that are no longer in DRAM (ARC's B1/B2, S3-FIFO's ghost
FIFO). They are lists over a fixed pool of ghost entries plus an open-addressing index
block -> entry (linear probing, backward-shift deletion). An entry's fields, and an
index bucket's key and value, are stored side by side so each touches one cache line:
ghost traffic is several index and list operations per miss and dominated ARC's cost
until laid out this way.

Everything here is inlined into the hooks (``inline="always"``): the policy state is a
tuple of arrays, and passing it through real calls costs more than the work.
"""
from collections import namedtuple

import numpy as np
from cxlhm.jit import njit, prefetch

HEAD, TAIL, LEN = 0, 1, 2
EMPTY = -1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

# entry[e] = (block, owner, prev, next): one cache line per ghost; table[bucket] = (block, e)
Ghosts = namedtuple("Ghosts", "entry free n_free table")
BLOCK, OWNER, PREV, NEXT = range(4)


def new_links(n: int) -> tuple:
    return np.full(n, -1, np.int64), np.full(n, -1, np.int64)


def new_list() -> np.ndarray:
    return np.array([-1, -1, 0], np.int64)


@njit(inline="always")
def push_head(prev, nxt, ends, node):
    prev[node] = -1
    nxt[node] = ends[HEAD]
    if ends[HEAD] >= 0:
        prev[ends[HEAD]] = node
    else:
        ends[TAIL] = node
    ends[HEAD] = node
    ends[LEN] += 1


@njit(inline="always")
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


@njit(inline="always")
def move_to_head(prev, nxt, ends, node):
    if ends[HEAD] != node:
        unlink(prev, nxt, ends, node)
        push_head(prev, nxt, ends, node)


def new_ghosts(capacity: int) -> Ghosts:
    capacity = max(1, capacity)
    buckets = 1 << max(4, int(2 * capacity - 1).bit_length())  # load factor <= 1/2
    return Ghosts(entry=np.full((capacity, 4), -1, np.int64), free=np.arange(capacity - 1, -1, -1, dtype=np.int64),
                  n_free=np.array([capacity], np.int64), table=np.full((buckets, 2), EMPTY, np.int64))


@njit(inline="always")
def _home(table, block):
    return np.int64((np.uint64(block) * _GOLDEN >> np.uint64(17)) & np.uint64(table.shape[0] - 1))


@njit(inline="always")
def ghost_prefetch(g, block):
    """Ask the CPU for the index bucket ghost_find(g, block) starts at (a policy's
    `upcoming` hook, ahead of a miss)."""
    table = g.table
    prefetch(table.ctypes.data + _home(table, block) * table.strides[0])


@njit(inline="always")
def ghost_find(g, block):
    """The ghost entry remembering `block`, or -1."""
    table = g.table
    mask = table.shape[0] - 1
    i = _home(table, block)
    while table[i, 0] != block:
        if table[i, 0] == EMPTY:
            return -1
        i = (i + 1) & mask
    return table[i, 1]


@njit(inline="always")
def _index_put(table, block, node):
    mask = table.shape[0] - 1
    i = _home(table, block)
    while table[i, 0] != EMPTY:
        i = (i + 1) & mask
    table[i, 0] = block
    table[i, 1] = node


@njit(inline="always")
def _index_delete(table, block):
    mask = table.shape[0] - 1
    i = _home(table, block)
    while table[i, 0] != block:
        i = (i + 1) & mask
    j = i
    while True:  # pull later members of the probe run back over the hole
        j = (j + 1) & mask
        if table[j, 0] == EMPTY:
            break
        home = _home(table, table[j, 0])
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            table[i, 0] = table[j, 0]
            table[i, 1] = table[j, 1]
            i = j
    table[i, 0] = EMPTY
    table[i, 1] = EMPTY


@njit(inline="always")
def ghost_owner(g, node):
    return g.entry[node, OWNER]


@njit(inline="always")
def ghost_add(g, ends, owner, block):
    """Remember `block` at the head of the ghost list `ends` (tagged `owner`).
    Returns False when the pool is exhausted (the caller trims before adding)."""
    n = g.n_free[0]
    if n == 0:
        return False
    node = g.free[n - 1]
    g.n_free[0] = n - 1
    g.entry[node, BLOCK] = block
    g.entry[node, OWNER] = owner
    _index_put(g.table, block, node)
    push_head(g.entry[:, PREV], g.entry[:, NEXT], ends, node)
    return True


@njit(inline="always")
def ghost_drop(g, ends, node):
    """Forget the ghost entry `node` (a ghost hit, or trimming the list's tail)."""
    unlink(g.entry[:, PREV], g.entry[:, NEXT], ends, node)
    _index_delete(g.table, g.entry[node, BLOCK])
    g.entry[node, BLOCK] = -1
    g.free[g.n_free[0]] = node
    g.n_free[0] += 1
