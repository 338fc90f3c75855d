"""Extent allocator: hypothesis state machine (alloc / free / evict / reopen) checked
against a model - no overlap, no leak, bounded metadata and fragmentation."""
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from host_runtime.allocator import AllocatorError, ExtentAllocator

GRAIN = 4096


def test_best_fit_reuses_exact_holes_and_coalesces():
    a = ExtentAllocator(64 * GRAIN, GRAIN)
    x, y, z = a.allocate(4 * GRAIN), a.allocate(2 * GRAIN), a.allocate(4 * GRAIN)
    a.free(y)
    assert a.allocate(2 * GRAIN) == y  # the exact-size hole, not the big tail
    a.free(x), a.free(y), a.free(z)
    assert a.free_list() == [(0, 64 * GRAIN)] and a.free_extents == 1


def test_rounding_alignment_and_errors():
    a = ExtentAllocator(10 * GRAIN + 100, GRAIN, base=8 * GRAIN)
    assert a.capacity == 10 * GRAIN  # a partial grain is never handed out
    hpa = a.allocate(1)
    assert hpa == 8 * GRAIN and a.extent_bytes(hpa) == GRAIN
    assert a.allocate(11 * GRAIN) is None
    with pytest.raises(AllocatorError):
        a.free(hpa + 1)
    with pytest.raises(AllocatorError):
        a.free(9 * GRAIN)
    with pytest.raises(ValueError):
        a.allocate(0)
    with pytest.raises(AllocatorError, match="overlaps"):
        ExtentAllocator.restore(10 * GRAIN, GRAIN, [(0, 2 * GRAIN), (GRAIN, GRAIN)])


def test_uniform_churn_never_fragments():
    """One chunk size (one model): an allocation fails only when less than one chunk of
    free space exists anywhere."""
    rng = random.Random(3)
    chunk = 8 * GRAIN
    a = ExtentAllocator(1000 * GRAIN, GRAIN)
    live = []
    for _ in range(20000):
        if live and (rng.random() < 0.45 or a.free_bytes < chunk):
            a.free(live.pop(rng.randrange(len(live))))
        else:
            hpa = a.allocate(chunk)
            assert hpa is not None, "a uniform-size allocation failed with room left"
            live.append(hpa)
        assert a.free_extents <= len(live) + 1


def test_metadata_is_bounded_by_live_extents_not_capacity():
    a = ExtentAllocator(1 << 40, 64 * 1024)  # a 1 TiB window
    assert a.free_extents == 1 and a.live_extents == 0
    hpas = [a.allocate(32 << 20) for _ in range(100)]
    assert a.free_extents == 1 and a.live_extents == 100
    for hpa in hpas[::2]:
        a.free(hpa)
    assert a.free_extents <= a.live_extents + 1


SIZES = st.sampled_from([1, 3, 8, 8, 8, 16, 20])  # grains; mostly one size, as a store is


class AllocatorMachine(RuleBasedStateMachine):
    """The allocator against a dict model. 'evict' frees the oldest extent (what the
    store does when an allocation fails); 'reopen' rebuilds it from the live extents."""

    def __init__(self):
        super().__init__()
        self.capacity = 256 * GRAIN
        self.alloc = ExtentAllocator(self.capacity, GRAIN)
        self.model: dict[int, int] = {}  # hpa -> bytes, in allocation order

    @rule(grains=SIZES)
    def allocate(self, grains):
        nbytes = grains * GRAIN - (GRAIN // 2 if grains > 1 else 0)  # not always grain-multiple
        hpa = self.alloc.allocate(nbytes)
        rounded = -(-nbytes // GRAIN) * GRAIN
        if hpa is None:
            # bounded fragmentation: failing means no free extent is large enough
            assert self.alloc.largest_free() < rounded
            return
        assert hpa % GRAIN == 0
        self.model[hpa] = rounded

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data):
        hpa = data.draw(st.sampled_from(sorted(self.model)))
        assert self.alloc.free(hpa) == self.model.pop(hpa)

    @rule(grains=SIZES)
    def evict_until_fits(self, grains):
        need = grains * GRAIN
        while self.alloc.largest_free() < need and self.model:
            oldest = next(iter(self.model))
            self.alloc.free(oldest)
            del self.model[oldest]
        hpa = self.alloc.allocate(need)
        assert hpa is not None, "evicting everything must make room"
        self.model[hpa] = need

    @rule()
    def reopen(self):
        self.alloc = ExtentAllocator.restore(self.capacity, GRAIN, list(self.model.items()))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def double_free_is_rejected(self, data):
        hpa = data.draw(st.sampled_from(sorted(self.model)))
        self.alloc.free(hpa)
        with pytest.raises(AllocatorError):
            self.alloc.free(hpa)
        del self.model[hpa]

    @invariant()
    def no_overlap_no_leak(self):
        extents = self.alloc.extents()
        assert dict(extents) == self.model
        free = self.alloc.free_list()
        spans = sorted(extents + free)
        cursor = 0
        for hpa, n in spans:  # live + free tile the window exactly: no overlap, no leak
            assert hpa == cursor
            cursor += n
        assert cursor == self.capacity
        assert self.alloc.free_bytes == self.capacity - sum(self.model.values())

    @invariant()
    def coalesced_and_bounded(self):
        free = self.alloc.free_list()
        for (h1, n1), (h2, _) in zip(free, free[1:]):
            assert h1 + n1 < h2, "two free extents touch: coalescing failed"
        assert len(free) <= len(self.model) + 1


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)
