"""Device DRAM: one mmap'd arena of equally sized slots, aligned for O_DIRECT."""
from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20


def _ask_for_huge_pages(arena: mmap.mmap) -> None:
    """Back the arena with transparent huge pages where the kernel allows it (THP
    `madvise` mode is common). Besides fewer TLB misses on copies, a huge page is
    physically contiguous, so an O_DIRECT fill into a slot is one DMA segment, not one
    per 4 KiB page: slots faulted in one by one between other allocations end up
    scattered, and SSD reads into them measured ~1.5x slower than into a linearly
    touched buffer on a virtio disk (bench/bench_kvstore.py)."""
    try:
        arena.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):  # no THP on this kernel or platform: 4 KiB pages work too
        pass


class DeviceDram:
    """`n_slots` slots of `block_size` bytes. mmap gives page alignment, and slots are
    multiples of 4 KiB, so every slot is a valid O_DIRECT buffer. With `data=False`
    (timing-only devices) no memory is reserved at all."""

    def __init__(self, n_slots: int, block_size: int, *, data: bool = True):
        self.n_slots, self.block_size = n_slots, block_size
        self.nbytes = n_slots * block_size if data else 0
        if data:
            # mmap places the arena at any 4 KiB boundary; THP backs only whole 2 MiB-aligned
            # extents, so an arena of a few MiB could get none: map 2 MiB more and start
            # the slots at the first 2 MiB boundary
            pad = HUGE_PAGE if self.nbytes >= HUGE_PAGE else 0
            self._map = mmap.mmap(-1, self.nbytes + pad, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            _ask_for_huge_pages(self._map)
            whole = np.frombuffer(self._map, np.uint8)
            start = -whole.ctypes.data % HUGE_PAGE if pad else 0
            self.slots = whole[start:start + self.nbytes].reshape(n_slots, block_size)
            self.base_address = self.slots.ctypes.data
        else:
            self._map = None
            self.slots = None
            self.base_address = 0

    def close(self) -> None:
        self.slots = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a caller still holds a view; the GC frees it later
                pass
            self._map = None
