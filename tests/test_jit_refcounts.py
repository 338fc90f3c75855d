"""cxlhm.jit.njit compiles the firmware without numba's reference counting: a call that
unpacks a table of arrays does no incref/decref (atomic operations) of them; a function
that allocates must ask for the counting, and one that cannot have it says why; a
closure is compiled in memory, never looked for in the cache."""
from __future__ import annotations

from collections import namedtuple

import numba
import numpy as np
import pytest
from numba.core import caching
from numba.core.errors import NumbaError

from cxlhm.jit import njit

Table = namedtuple("Table", "block flags owner stamp")


def _table(n: int) -> Table:
    return Table(np.full(n, -1, np.int64), np.zeros(n, np.uint8), np.zeros(n, np.int64), np.zeros(n, np.int64))


def _chain(**options):
    """Two firmware-like functions: `touch` is called once per block by `plan`."""
    @njit(cache=False, **options)
    def touch(t, slot, block, now):
        t.block[slot] = block
        t.flags[slot] |= 1
        t.stamp[slot] = now

    @njit(cache=False, **options)
    def plan(t, blocks, now):
        for i in range(blocks.shape[0]):
            touch(t, i % t.block.shape[0], blocks[i], now + i)
        return t.block.shape[0]

    return touch, plan


def _refcount_calls(dispatcher) -> int:
    return sum(ir.count("NRT_incref") + ir.count("NRT_decref") for ir in dispatcher.inspect_llvm().values())


def test_the_firmware_chain_does_no_reference_counting():
    touch, plan = _chain()
    t = _table(8)
    assert plan(t, np.arange(100, 120, dtype=np.int64), 5) == 8
    assert t.block.tolist() == list(range(116, 120)) + list(range(112, 116))  # the last writes win
    assert (t.flags == 1).all() and t.stamp[0] == 5 + 16
    assert _refcount_calls(plan) == 0 and _refcount_calls(touch) == 0


def test_asking_for_reference_counts_gets_them():
    # the same chain with numba's counting: the check above is one that can fail
    touch, plan = _chain(refcounts=True)
    plan(_table(8), np.arange(4, dtype=np.int64), 0)
    assert _refcount_calls(plan) + _refcount_calls(touch) > 0


def test_a_function_that_allocates_must_ask_for_reference_counts():
    @njit(cache=False)
    def scratch(n):
        return np.zeros(n).sum()

    with pytest.raises(NumbaError, match="zeros"):
        scratch(3)

    @njit(cache=False, refcounts=True)
    def counted(n):
        return np.ones(n).sum()

    assert counted(3) == 3.0


def test_a_closure_is_compiled_in_memory_and_a_module_function_cached():
    offset = 7

    @njit
    def shifted(x):
        return x + offset

    assert shifted(1) == 8
    assert isinstance(shifted._cache, caching.NullCache)
    from cxlhm import blocktable
    assert not isinstance(blocktable.lookup._cache, caching.NullCache)
    assert isinstance(blocktable.lookup, numba.core.registry.CPUDispatcher)
