"""Extent allocator over the HDM window: best fit with immediate coalescing.

The window is cut into grains (the device block size by default), and every extent
starts and ends on a grain boundary. That keeps each device block owned by one extent,
so a hint or a pin for one chunk never touches a neighbour's bytes (and never another
tenant's), and the device moves whole blocks per chunk.

Why best fit + coalescing: KV chunks of one model all have one size, and a store
usually serves one or a few models, so the free space splits into few distinct sizes.
Best fit reuses an exact-size hole whenever one exists (no splinters), and coalescing
on every free keeps free extents from ever lying next to each other. Consequences the
tests check under random churn:

* free extents <= live extents + 1 (metadata is bounded by the live data, never by
  capacity: a 1 TiB window costs nothing until used);
* with one extent size, an allocation fails only when fewer than one extent's worth
  of free grains exist anywhere - no fragmentation at all;
* with mixed sizes, an allocation fails only if no free extent is large enough (the
  store then evicts, and coalescing merges what it frees).

Costs: allocate and free are O(1) dict work plus a bisect over the distinct free-extent
sizes (few in practice). The untouched tail of the window is one free extent, so a
fresh window is one entry.

Persistence: the allocator holds no state of its own worth saving; the store persists
its index (key -> extent), and ``ExtentAllocator.restore`` rebuilds the free space from
the live extents in O(live log live).
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable


class AllocatorError(ValueError):
    """An inconsistent request: freeing an unknown extent, overlapping restore input."""


class ExtentAllocator:
    def __init__(self, capacity: int, grain: int, *, base: int = 0):
        if grain <= 0 or grain & (grain - 1):
            raise ValueError(f"grain must be a positive power of two, got {grain}")
        if capacity < grain:
            raise ValueError(f"capacity {capacity} is smaller than one grain ({grain})")
        if base % grain:
            raise ValueError(f"base {base:#x} is not grain-aligned")
        self.grain = grain
        self.base = base
        self.total_grains = capacity // grain  # a partial last grain is never handed out
        self._live: dict[int, int] = {}        # start grain -> length in grains
        self._free_start: dict[int, int] = {}  # start grain -> length
        self._free_end: dict[int, int] = {}    # end grain (exclusive) -> start
        self._bins: dict[int, dict[int, None]] = {}  # length -> starts (insertion-ordered set)
        self._sizes: list[int] = []            # sorted distinct free lengths
        self.free_grains = 0
        self._add_free(0, self.total_grains)

    # ------------------------------------------------------------ sizes
    def grains_for(self, nbytes: int) -> int:
        return -(-nbytes // self.grain)

    @property
    def capacity(self) -> int:
        return self.total_grains * self.grain

    @property
    def free_bytes(self) -> int:
        return self.free_grains * self.grain

    @property
    def used_bytes(self) -> int:
        return (self.total_grains - self.free_grains) * self.grain

    @property
    def live_extents(self) -> int:
        return len(self._live)

    @property
    def free_extents(self) -> int:
        return len(self._free_start)

    def largest_free(self) -> int:
        """Bytes in the largest free extent."""
        return self._sizes[-1] * self.grain if self._sizes else 0

    # ------------------------------------------------------------ allocate / free
    def allocate(self, nbytes: int) -> int | None:
        """HPA of a fresh extent of at least `nbytes` (rounded up to grains), or None
        when no free extent is large enough."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"an extent needs a positive byte count, got {nbytes!r}")
        need = self.grains_for(nbytes)
        i = bisect.bisect_left(self._sizes, need)
        if i == len(self._sizes):
            return None
        size = self._sizes[i]
        start = next(iter(self._bins[size]))
        self._remove_free(start, size)
        if size > need:
            self._add_free(start + need, size - need)
        self._live[start] = need
        return self.base + start * self.grain

    def free(self, hpa: int) -> int:
        """Free the extent starting at `hpa`; returns its length in bytes."""
        start = self._grain_of(hpa)
        length = self._live.pop(start, None)
        if length is None:
            raise AllocatorError(f"no live extent starts at {hpa:#x}")
        end = start + length
        # Coalesce with the free neighbours on both sides.
        left_start = self._free_end.get(start)
        if left_start is not None:
            self._remove_free(left_start, start - left_start)
            start = left_start
        right_len = self._free_start.get(end)
        if right_len is not None:
            self._remove_free(end, right_len)
            end += right_len
        self._add_free(start, end - start)
        return length * self.grain

    def extent_bytes(self, hpa: int) -> int | None:
        """Length in bytes of the live extent at `hpa`, or None."""
        length = self._live.get(self._grain_of(hpa))
        return None if length is None else length * self.grain

    def extents(self) -> list[tuple[int, int]]:
        """Live (hpa, length in bytes), in address order."""
        return [(self.base + s * self.grain, n * self.grain) for s, n in sorted(self._live.items())]

    def free_list(self) -> list[tuple[int, int]]:
        """Free (hpa, length in bytes), in address order (for tests and stats)."""
        return [(self.base + s * self.grain, n * self.grain) for s, n in sorted(self._free_start.items())]

    def check(self) -> None:
        """Check the invariants (tests, and KVStore.check after a recovery): live and free
        extents tile the window exactly, no two free extents touch (coalesced), and the
        size bins and the free-grain count agree with the free list. Raises AllocatorError."""
        pieces = sorted([(s, n, "live") for s, n in self._live.items()] +
                        [(s, n, "free") for s, n in self._free_start.items()])
        cursor, prev = 0, None
        for start, length, kind in pieces:
            if length <= 0 or start != cursor:
                raise AllocatorError(f"{kind} extent at grain {start} (+{length}) "
                                     f"{'overlaps' if start < cursor else 'leaves a hole after'} grain {cursor}")
            if kind == "free" and prev == "free":
                raise AllocatorError(f"free extents meet at grain {start} (not coalesced)")
            cursor, prev = start + length, kind
        if cursor != self.total_grains:
            raise AllocatorError(f"extents end at grain {cursor}, the window has {self.total_grains}")
        if {e: s for s, e in ((s, s + n) for s, n in self._free_start.items())} != self._free_end:
            raise AllocatorError("the free list's start and end maps disagree")
        binned = {(n, s) for n, starts in self._bins.items() for s in starts}
        if binned != {(n, s) for s, n in self._free_start.items()} or self._sizes != sorted(self._bins):
            raise AllocatorError("the size bins disagree with the free list")
        if self.free_grains != sum(self._free_start.values()):
            raise AllocatorError(f"free_grains {self.free_grains} != {sum(self._free_start.values())}")

    # ------------------------------------------------------------ restore
    @classmethod
    def restore(cls, capacity: int, grain: int, extents: Iterable[tuple[int, int]], *, base: int = 0) -> "ExtentAllocator":
        """An allocator whose live extents are exactly `extents` ((hpa, nbytes) pairs);
        raises AllocatorError if they overlap, are misaligned or leave the window."""
        alloc = cls(capacity, grain, base=base)
        alloc._remove_free(0, alloc.total_grains)
        cursor = 0
        for hpa, nbytes in sorted(extents):
            start = alloc._grain_of(hpa)
            length = alloc.grains_for(nbytes)
            if nbytes <= 0 or start < cursor or start + length > alloc.total_grains:
                raise AllocatorError(f"extent [{hpa:#x}, +{nbytes}) overlaps another or leaves the window")
            if start > cursor:
                alloc._add_free(cursor, start - cursor)
            alloc._live[start] = length
            cursor = start + length
        if cursor < alloc.total_grains:
            alloc._add_free(cursor, alloc.total_grains - cursor)
        return alloc

    # ------------------------------------------------------------ internals
    def _grain_of(self, hpa: int) -> int:
        offset = hpa - self.base
        if offset < 0 or offset % self.grain:
            raise AllocatorError(f"{hpa:#x} is not a grain-aligned address of this window")
        return offset // self.grain

    def _add_free(self, start: int, length: int) -> None:
        if length <= 0:
            return
        self._free_start[start] = length
        self._free_end[start + length] = start
        bin_ = self._bins.get(length)
        if bin_ is None:
            bin_ = self._bins[length] = {}
            bisect.insort(self._sizes, length)
        bin_[start] = None
        self.free_grains += length

    def _remove_free(self, start: int, length: int) -> None:
        del self._free_start[start]
        del self._free_end[start + length]
        bin_ = self._bins[length]
        del bin_[start]
        if not bin_:
            del self._bins[length]
            del self._sizes[bisect.bisect_left(self._sizes, length)]
        self.free_grains -= length
