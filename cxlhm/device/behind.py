"""Write-behind: a write of whole blocks of at least a chunk is handed to the SSD as soon
as its bytes are in device DRAM, and the host goes on without waiting for it to land.

A KV chunk is written once and read later, so its blocks can go to the SSD at once: when
they are evicted later they are clean and nothing waits for a write-back. The host's next
chunk is copied in and hashed while this one is on the SSD - the overlap across passes a
controller's write buffer gives. One write-behind is in flight at a time (the SSD has
one of the host's writes at a time, as a host writing synchronously gives it); it is settled (reaped, its checksums recorded, its blocks
marked clean) when the next starts, or first by anything that would touch its blocks or
their slots: an access to them, an access short of free slots, a stream's time slice,
hints, background work, a flush, close.

Its slots are BUSY while it is in flight, so no pass evicts them. Write-ahead holds as
for every write-back: the blocks' SUM records are in the integrity log before the writes
are submitted (after a crash a write that did not land reads as a checksum mismatch, not
as wrong bytes). A write that fails leaves its block dirty in device DRAM, written back
later like any dirty block.

The ring is the device's own (SsdBackend.shared_ring): whichever thread holds the device
lock settles what another thread started.
"""
from __future__ import annotations

import numpy as np

from cxlhm import copyengine, sumtable
from cxlhm import blocktable as btm
from cxlhm import firmware as fw
from cxlhm.jit import njit

# A write of whole blocks of at least this much goes to the SSD behind the host (a KV
# chunk; smaller writes may be rewritten soon, and writing them at once would cost the
# SSD writes a later rewrite makes useless).
BEHIND_MIN_BYTES = 1 << 20
# The most blocks one write-behind holds (and the shared ring's depth): a 32 MiB chunk
# of 64 KiB blocks. A longer write is not written behind.
MAX_BEHIND_BLOCKS = 512


class WriteBehind:
    """Device part: writes that go to the SSD behind the host (mixed into Device, which
    it reads the state of)."""

    def _init_behind(self) -> None:
        self._behind_ring = None  # made on first use
        self._behind: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (rows, sums, slots) in flight
        self._behind_span = (0, -1)  # their blocks: one extent's, first and last

    def _writes_behind(self, hpas, lens, k: int) -> bool:
        """Does this write pass (completed, its k blocks in DRAM) go to the SSD behind the
        host: whole blocks, one extent of at least BEHIND_MIN_BYTES, firmware.write_behind
        set, on the wall clock with data, write-back firmware (write-through writes them
        already; write-buffer keeps appended KV in DRAM on purpose) and a back end with
        split-phase I/O."""
        bs = self.block_size
        return (hpas.shape[0] == 1 and lens[0] >= BEHIND_MIN_BYTES and not hpas[0] % bs and not lens[0] % bs
                and k * bs == lens[0] and k <= MAX_BEHIND_BLOCKS and self.cfg.firmware.write_behind
                and self.model is None and self.moves_data
                and self._write_mode_code == fw.WRITE_BACK and self.ssd.caps.async_io)

    def _written(self, hpas, lens, slots: np.ndarray, k: int, *, dirty_logged: bool,
                 sums: np.ndarray | None = None) -> None:
        """A write pass completed (under the lock that planned it): its poison
        bookkeeping, and its blocks go to the SSD behind the host if the write qualifies.
        `dirty_logged`: the pass logged its blocks' DIRTY records already (else their SUM
        records stand for them, or they are logged here if the write does not go behind).
        `sums`: the blocks' checksums, if the pass's copy made them (_copy_in_hashed)."""
        self.media.note_written(hpas, lens)
        if self._writes_behind(hpas, lens, k):
            self._write_behind(slots[:k], dirty_logged, sums)

    def _long_copy(self, hpas, lens, slots, k: int, user_addr: int, is_write: bool, behind: bool):
        """A long DRAM hit's copy, on the copy engine's two threads (under the lock). A
        write that goes behind is checksummed as it is copied: returns its checksums (else
        None)."""
        if behind and sumtable.COMPILED_HASH:
            return self._copy_in_hashed(slots[:k], user_addr)
        copyengine.copy_extents(self.dram.base_address, self.block_size, slots, hpas, lens, user_addr, not is_write,
                                halves=True)
        return None

    def _copy_in_hashed(self, slots: np.ndarray, user_addr: int) -> np.ndarray:
        """Copy a write that goes behind (whole blocks, one extent) from the host's buffer
        into its slots and checksum each block right after its copy, while its bytes are
        in the CPU's cache, on the copy engine's two threads; returns the checksums. Made
        apart, the checksums read the blocks back from memory once more: a 32 MiB put
        spent ~3.4 ms of its ~14 on them."""
        jobs = copyengine.block_jobs(self.dram.base_address + slots * self.block_size, self.block_size,
                                     copy_from=user_addr, hashed=True)
        copyengine.copy_many(jobs)
        return jobs[:, copyengine.HASH].view(np.uint64)

    def _write_behind(self, slots: np.ndarray, dirty_logged: bool, sums: np.ndarray | None = None) -> None:
        """Under the lock, after the pass finished: hash the slots' new bytes (still in
        the CPU's caches; `sums` when the copy hashed them) and log their records, wait
        for the write-behind before this one to land, hand this one's writes to the SSD,
        then record the one that landed - so the SSD is idle only from one's landing to
        the next one's submission."""
        bs, base = self.block_size, self.dram.base_address
        blocks = self.bt.block[slots]
        if self._behind_ring is None:
            try:
                self._behind_ring = self.ssd.shared_ring(MAX_BEHIND_BLOCKS)
            except OSError:  # no ring for it (io_uring setup failed): the blocks stay dirty, written back later
                if not dirty_logged:
                    self.checksums.note_dirty_array(blocks)
                return
        rows = fw.new_io_rows(slots.shape[0])
        rows[:, 0] = base + slots * bs
        rows[:, 1] = bs
        rows[:, 2] = blocks * bs
        rows[:, 3] = 1
        sums = self.media.hash_slots(rows[:, 0]) if sums is None else sums
        # write-ahead: the SUM records before the writes are submitted - a block's SUM
        # covers the write that made it dirty, so no DIRTY record goes before it (the
        # blocks are disjoint from the write-behind in flight: a pass touching those
        # settled it first)
        self.checksums.intend(blocks, sums)
        landed = self._reap_behind()
        try:
            self.bt.flags[slots] |= btm.BUSY
            self._behind = (rows, sums, slots.copy())
            self._behind_span = (int(blocks.min()), int(blocks.max()))
            queued = self._behind_ring.queue(rows, np.arange(rows.shape[0], dtype=np.int64))
        finally:
            self._record_behind(landed)
        if queued != rows.shape[0]:  # the ring holds MAX_BEHIND_BLOCKS, and nothing else is in flight on it
            raise RuntimeError(f"a write-behind of {rows.shape[0]} blocks did not fit its ring ({queued} queued)")

    def drain(self) -> None:
        """Wait until the writes the device made behind the host have landed (on the SSD,
        not yet durable: flush() makes them so)."""
        with self._lock:
            self.settle_behind()

    def settle_behind(self) -> None:
        """Under the lock: wait for the write-behind in flight (if any) to land, and
        record it."""
        self._record_behind(self._reap_behind())

    def _reap_behind(self):
        """Wait for the write-behind in flight to land; returns (rows, sums, slots, results)
        for _record_behind, or None if none was in flight."""
        if self._behind is None:
            return None
        rows, sums, slots = self._behind
        self._behind, self._behind_span = None, (0, -1)
        tags, got = self._behind_ring.reap_all()
        res = np.zeros(rows.shape[0], np.int64)
        res[tags] = got
        return rows, sums, slots, res

    def _record_behind(self, landed) -> None:
        """A write-behind back from the SSD: its slots are no longer BUSY; the checksums
        of what landed are recorded and those blocks marked clean. A failed write leaves
        its block dirty (its DRAM copy is the newest) for a later write-back."""
        if landed is None:
            return
        rows, sums, slots, res = landed
        self.bt.flags[slots] &= ~btm.BUSY
        failed = self.media.record_writes(rows, res, sums, victims=False)
        ok = rows[~failed]
        fw.mark_clean(self.bt, self.dram.base_address, self.block_size, ok, ok.shape[0])
        self.media.count_writes(ok.shape[0])

    def _settle_behind_for(self, hpas, lens) -> None:
        """Before planning an access: settle the write-behind if the access touches one of
        its blocks (a write must not change bytes on their way to the SSD, and a pass
        must not plan over BUSY slots), or might be short of slots without its slots."""
        if self._behind is None:
            return
        first, last = self._behind_span
        blocks, touches = _blocks_and_overlap(hpas, lens, self.block_size, first, last)
        room = self.n_slots - int(self.bt.scalars[btm.N_PINNED]) - self._inflight_slots - self._behind[2].shape[0]
        if touches or blocks > room:
            self.settle_behind()


@njit
def _blocks_and_overlap(hpas, lens, block_size, first, last):
    """(blocks the extents touch, whether one of them is in [first, last])."""
    blocks = 0
    overlap = False
    for i in range(hpas.shape[0]):
        if lens[i] <= 0:
            continue
        lo, hi = hpas[i] // block_size, (hpas[i] + lens[i] - 1) // block_size
        blocks += hi - lo + 1
        overlap = overlap or (lo <= last and hi >= first)
    return blocks, overlap
