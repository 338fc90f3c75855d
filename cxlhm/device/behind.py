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

from cxlhm import sumtable
from cxlhm.device.stream import copyengine
from cxlhm import blocktable as btm
from cxlhm import firmware as fw
from cxlhm.device.state import DeviceState
from cxlhm.jit import njit

# A write of whole blocks of at least this much goes to the SSD behind the host (a KV
# chunk; smaller writes may be rewritten soon, and writing them at once would cost the
# SSD writes a later rewrite makes useless).
BEHIND_MIN_BYTES = 1 << 20
# The most blocks one write-behind holds (and the shared ring's depth): a 32 MiB chunk
# of 64 KiB blocks. A longer write is not written behind.
MAX_BEHIND_BLOCKS = 512


class WriteBehind:
    """Device part: writes that go to the SSD behind the host. Owns the write-behind in
    flight (its rows, checksums and slots, and the span of its blocks) and the ring it
    goes on; the device state's lock guards them."""

    def __init__(self, state: DeviceState):
        self.state = state
        self._ring = None  # made on first use
        self._in_flight: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (rows, sums, slots)
        self._span = (0, -1)  # their blocks: one extent's, first and last

    def qualifies(self, hpas, lens, k: int) -> bool:
        """Does this write pass (completed, its k blocks in DRAM) go to the SSD behind the
        host: whole blocks, one extent of at least BEHIND_MIN_BYTES, firmware.write_behind
        set, on the wall clock with data, write-back firmware (write-through writes them
        already; write-buffer keeps appended KV in DRAM on purpose) and a back end with
        split-phase I/O."""
        state = self.state
        bs = state.block_size
        return (hpas.shape[0] == 1 and lens[0] >= BEHIND_MIN_BYTES and not hpas[0] % bs and not lens[0] % bs
                and k * bs == lens[0] and k <= MAX_BEHIND_BLOCKS and state.cfg.firmware.write_behind
                and state.model_clock is None and state.moves_data
                and state.write_mode_code == fw.WRITE_BACK and state.media.ssd.caps.async_io)

    def written(self, hpas, lens, slots: np.ndarray, k: int, *, dirty_logged: bool,
                 sums: np.ndarray | None = None) -> None:
        """A write pass completed (under the lock that planned it): its poison
        bookkeeping, and its blocks go to the SSD behind the host if the write qualifies.
        `dirty_logged`: the pass logged its blocks' DIRTY records already (else their SUM
        records stand for them, or they are logged here if the write does not go behind).
        `sums`: the blocks' checksums, if the pass's copy made them (_copy_in_hashed)."""
        self.state.media.note_written(hpas, lens)
        if self.qualifies(hpas, lens, k):
            self._start(slots[:k], dirty_logged, sums)

    def long_copy(self, hpas, lens, slots, k: int, user_addr: int, is_write: bool, behind: bool):
        """A long DRAM hit's copy, on the copy engine's two threads (under the lock). A
        write that goes behind is checksummed as it is copied: returns its checksums (else
        None)."""
        if behind and sumtable.COMPILED_HASH:
            return self._copy_in_hashed(slots[:k], user_addr)
        copyengine.copy_extents(self.state.dram.base_address, self.state.block_size, slots, hpas, lens, user_addr,
                                not is_write, halves=True)
        return None

    def _copy_in_hashed(self, slots: np.ndarray, user_addr: int) -> np.ndarray:
        """Copy a write that goes behind (whole blocks, one extent) from the host's buffer
        into its slots and checksum each block right after its copy, while its bytes are
        in the CPU's cache, on the copy engine's two threads; returns the checksums. Made
        apart, the checksums read the blocks back from memory once more: a 32 MiB put
        spent ~3.4 ms of its ~14 on them."""
        bs = self.state.block_size
        jobs = copyengine.block_jobs(self.state.dram.base_address + slots * bs, bs, copy_from=user_addr, hashed=True)
        copyengine.copy_many(jobs)
        return jobs[:, copyengine.HASH].view(np.uint64)

    def _start(self, slots: np.ndarray, dirty_logged: bool, sums: np.ndarray | None = None) -> None:
        """Under the lock, after the pass finished: hash the slots' new bytes (still in
        the CPU's caches; `sums` when the copy hashed them) and log their records, wait
        for the write-behind before this one to land, hand this one's writes to the SSD,
        then record the one that landed - so the SSD is idle only from one's landing to
        the next one's submission."""
        state = self.state
        bs, base = state.block_size, state.dram.base_address
        blocks = state.bt.block[slots]
        if self._ring is None:
            try:
                self._ring = state.media.ssd.shared_ring(MAX_BEHIND_BLOCKS)
            except OSError:  # no ring for it (io_uring setup failed): the blocks stay dirty, written back later
                if not dirty_logged:
                    state.media.checksums.note_dirty_array(blocks)
                return
        rows = fw.new_io_rows(slots.shape[0])
        rows[:, 0] = base + slots * bs
        rows[:, 1] = bs
        rows[:, 2] = blocks * bs
        rows[:, 3] = 1
        sums = state.media.hash_slots(rows[:, 0]) if sums is None else sums
        # write-ahead: the SUM records before the writes are submitted - a block's SUM
        # covers the write that made it dirty, so no DIRTY record goes before it (the
        # blocks are disjoint from the write-behind in flight: a pass touching those
        # settled it first)
        state.media.checksums.intend(blocks, sums)
        landed = self._reap()
        try:
            state.bt.flags[slots] |= btm.BUSY
            self._in_flight = (rows, sums, slots.copy())
            self._span = (int(blocks.min()), int(blocks.max()))
            queued = self._ring.queue(rows, np.arange(rows.shape[0], dtype=np.int64))
        finally:
            self._record(landed)
        if queued != rows.shape[0]:  # the ring holds MAX_BEHIND_BLOCKS, and nothing else is in flight on it
            raise RuntimeError(f"a write-behind of {rows.shape[0]} blocks did not fit its ring ({queued} queued)")

    def drain(self) -> None:
        """Wait until the writes the device made behind the host have landed (on the SSD,
        not yet durable: flush() makes them so)."""
        with self.state.lock:
            self.settle()

    def settle(self) -> None:
        """Under the lock: wait for the write-behind in flight (if any) to land, and
        record it."""
        self._record(self._reap())

    def _reap(self):
        """Wait for the write-behind in flight to land; returns (rows, sums, slots, results)
        for _record, or None if none was in flight."""
        if self._in_flight is None:
            return None
        rows, sums, slots = self._in_flight
        self._in_flight, self._span = None, (0, -1)
        tags, got = self._ring.reap_all()
        res = np.zeros(rows.shape[0], np.int64)
        res[tags] = got
        return rows, sums, slots, res

    def _record(self, landed) -> None:
        """A write-behind back from the SSD: its slots are no longer BUSY; the checksums
        of what landed are recorded and those blocks marked clean. A failed write leaves
        its block dirty (its DRAM copy is the newest) for a later write-back."""
        state = self.state
        if landed is None:
            return
        rows, sums, slots, res = landed
        state.bt.flags[slots] &= ~btm.BUSY
        failed = state.media.record_writes(rows, res, sums, victims=False)
        ok = rows[~failed]
        fw.mark_clean(state.bt, state.dram.base_address, state.block_size, ok, ok.shape[0])
        state.media.count_writes(ok.shape[0])

    def settle_for(self, hpas, lens) -> None:
        """Before planning an access: settle the write-behind if the access touches one of
        its blocks (a write must not change bytes on their way to the SSD, and a pass
        must not plan over BUSY slots), or might be short of slots without its slots."""
        if self._in_flight is None:
            return
        first, last = self._span
        state = self.state
        blocks, touches = _blocks_and_overlap(hpas, lens, state.block_size, first, last)
        room = state.n_slots - int(state.bt.scalars[btm.N_PINNED]) - state.inflight_slots - self._in_flight[2].shape[0]
        if touches or blocks > room:
            self.settle()


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
