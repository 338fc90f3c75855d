"""Tuning knobs of the load/store window that the device config does not carry."""
from __future__ import annotations

import dataclasses

PAGE = 4096
MAX_GRANULES = 64  # the per-slot written-granule bitmap is one uint64


@dataclasses.dataclass(frozen=True)
class WindowOptions:
    # Dirty tracking: the first store to each granule of a clean block costs one
    # write-protect fault; eviction writes back only written granules. None: the
    # block size (one WP fault per block per write-back, whole-block write-backs,
    # as in explicit mode). Smaller granules trade faults for write-back bytes.
    dirty_granule: int | None = None
    # Blocks per install batch (one io_uring batch of SSD reads), i.e. the staging
    # buffers. None: min(DRAM slots, 32, 64 MiB / block size).
    staging_blocks: int | None = None
    # Recency sampler (docs/window.md): every interval, park one part of up to
    # max(1, DRAM slots x sample_fraction) blocks idle for sample_min_age_ms; an access
    # to the parked part faults once and reaches the policy's on_hit. The part rotates
    # through the block; None parks one page (cheapest), the block size parks it whole
    # (catches any access, costs a block copy per sampled access). 0 switches it off.
    sample_interval_ms: float = 50.0
    sample_fraction: float = 1 / 64
    sample_min_age_ms: float = 200.0
    sample_bytes: int | None = None
    # Prefetched blocks are not parked for this long after install, so a prefetched
    # range is read without faults.
    prefetch_grace_ms: float = 2000.0
    # Prefetched 2 MiB-aligned regions are rebuilt as transparent huge pages
    # (MADV_COLLAPSE, Linux 6.1+) by the service thread once the prefetch queue is
    # drained (1-3 ms of its time per region; wait_idle() waits for them), so reading
    # them costs what reading ordinary memory with huge pages does. Eviction, a first
    # store or a sampler park splits a region back into 4 KiB pages.
    huge_pages: bool = True

    def granule_for(self, block_size: int) -> int:
        granule = self.dirty_granule or block_size
        if granule % PAGE or block_size % granule or block_size // granule > MAX_GRANULES:
            raise ValueError(f"dirty_granule must be a multiple of 4 KiB that divides the block size {block_size} "
                             f"into at most {MAX_GRANULES} granules, got {granule}")
        return granule

    def staging_for(self, n_slots: int, block_size: int) -> int:
        if self.staging_blocks is not None:
            if self.staging_blocks < 1:
                raise ValueError(f"staging_blocks must be >= 1, got {self.staging_blocks}")
            return min(self.staging_blocks, n_slots)
        return max(1, min(n_slots, 32, (64 << 20) // block_size))

    def sample_bytes_for(self, block_size: int) -> int:
        n = self.sample_bytes or PAGE
        if n % PAGE or block_size % n:
            raise ValueError(f"sample_bytes must be a multiple of 4 KiB dividing the block size {block_size}, got {n}")
        return n

    def sample_blocks_for(self, n_slots: int) -> int:
        return max(1, int(n_slots * self.sample_fraction))
