"""The device's media path: every I/O between device-DRAM slots and the back end, with
retries, checksum verification and poison.

`MediaPath` owns the back end, the checksum table and the poison table. Reads are
retried (`backend.retries`), checked against the checksum recorded when the block was
written back, and a block that cannot be read right is poisoned - never served.
Write-backs record the checksum of what they write (write-ahead in the integrity log).
The device calls it under its lock, except `read_verified`, which the access path runs
with the lock released (see its docstring).
"""
from __future__ import annotations

import os

import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm import sumtable
from cxlhm.device.stream import copyengine
from cxlhm.device.errors import MediaError, PoisonError
from cxlhm.integrity import BlockChecksums, PoisonTable, checksum


class MediaPath:
    def __init__(self, ssd, block_size: int, retries: int, counters: np.ndarray, dram,
                 checksums: BlockChecksums | None = None, poison: PoisonTable | None = None):
        self.ssd = ssd  # None: a device without data
        self.block_size, self.retries = block_size, retries
        self.counters, self.dram = counters, dram
        self.checksums = checksums if checksums is not None else BlockChecksums(None)
        self.poison = poison if poison is not None else PoisonTable()
        self.unclean = False  # the image was last closed uncleanly (its sidecars say)

    # ------------------------------------------------------------ poison
    def check_readable(self, hpas, lens) -> None:
        """Raise PoisonError if a byte of the extents is lost (a poisoned block's bytes
        not written since). Writes need no check: they replace what was lost."""
        if not self.poison:
            return
        bs = self.block_size
        for hpa, n in zip(np.atleast_1d(hpas).tolist(), np.atleast_1d(lens).tolist()):
            block = self.poison.unreadable(hpa, n, bs)
            if block >= 0:
                raise PoisonError(5, f"block {block} (HPA {block * bs:#x}, {bs} bytes) is poisoned: "
                                     f"{self.poison.describe(block)}")

    def note_written(self, hpas, lens) -> None:
        """After a write landed in device DRAM (under the lock that planned it, so no
        thread reads the bytes in between): the poison of the bytes it covered is gone."""
        if self.poison:
            for hpa, n in zip(np.atleast_1d(hpas).tolist(), np.atleast_1d(lens).tolist()):
                self.poison.written(hpa, n, self.block_size)

    def mismatch_reason(self) -> str:
        """Why a block read from the SSD may not match the checksum its last write-back
        recorded: a write-back the last unclean shutdown tore, or - after a clean close -
        a change made to the image by something other than the device (another program,
        fio on the same file), which the device cannot see."""
        why = ("a write-back torn by the unclean shutdown, or written outside the device?" if self.unclean
               else "written outside the device since its last close?")
        return f"checksum mismatch on SSD read: the image's bytes of the block are not the ones the device last wrote ({why})"

    def poison_block(self, block: int, reason: str) -> None:
        """The device cannot produce the block's bytes: reads fail until it is written.
        Its checksum goes (the back end's bytes of it are not the ones last written), so
        a later write that fills it from the back end first is not refused."""
        if block not in self.poison.blocks:
            self.counters[C.POISONED_BLOCKS] += 1
        self.checksums.sums.forget(block, None)
        self.poison.add(block, reason)

    # ------------------------------------------------------------ reads
    def submit_retrying(self, ops: np.ndarray, retries: int | None = None) -> tuple[np.ndarray, int]:
        """Submit, then resubmit failed or short ops up to `retries` (`backend.retries`)
        times. Returns the ops' final results (bytes, or -errno) and the number of
        retries (the caller counts them under the lock)."""
        res = self.ssd.submit(ops)
        if (res == ops[:, 1]).all():
            return res, 0
        res = res.copy()  # the back end reuses its result array
        retried = 0
        for _ in range(self.retries if retries is None else retries):
            failed = np.flatnonzero(res != ops[:, 1])
            if failed.size == 0:
                break
            retried += failed.size
            res[failed] = self.ssd.submit(ops[failed])
        return res, retried

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """Back end -> slot reads with retries and verification, under the lock. A block
        that cannot be read correctly is poisoned; returns the mask of such rows."""
        return self.settle_reads(rows, *self.read_verified(rows))

    def read_verified(self, rows: np.ndarray) -> tuple[np.ndarray, int, np.ndarray | None]:
        """Back end -> slot reads with retries, each read block checked against its
        recorded checksum: (results, retries, mask of checksum mismatches or None). Needs
        no lock: it touches only the rows' slots (BUSY, this thread's) and reads the
        checksum table, whose entries for these blocks cannot change meanwhile (only a
        write-back of a block records its sum, and a BUSY block is never written back)."""
        res, retries = self.submit_retrying(rows)
        if not self.checksums.sums:
            return res, retries, None  # the common case: nothing to verify
        found, expected = self.checksums.sums.lookup(rows[:, 2] // self.block_size)
        at = np.flatnonzero(found)
        if at.shape[0] == 0:
            return res, retries, None
        # one compiled hash over every checked slot (a call per row cost ~9 us a row)
        got = self.hash_slots(rows[at, 0])
        expected = expected[at]
        mismatch = np.zeros(rows.shape[0], bool)
        mismatch[at] = (res[at] == rows[at, 1]) & (got != expected)
        return res, retries, mismatch

    def fill_matches(self, row: np.ndarray) -> bool:
        expected = self.checksums.sums.get(int(row[2] // self.block_size))
        return expected is None or expected == int(self.hash_slots(row[0:1])[0])

    def settle_reads(self, rows: np.ndarray, res: np.ndarray, retries: int, mismatch) -> np.ndarray:
        """Under the lock: count the retries, poison each block that could not be read
        correctly; returns the mask of such rows."""
        self.counters[C.MEDIA_RETRIES] += retries
        bad = res != rows[:, 1]
        if mismatch is None and not bad.any():
            return bad
        for i in np.flatnonzero(bad if mismatch is None else bad | mismatch).tolist():
            block = int(rows[i, 2] // self.block_size)
            if bad[i]:
                self.poison_block(block, f"SSD read failed: {_why(res[i], 'short read')}")
            else:
                self.counters[C.CHECKSUM_MISMATCHES] += 1
                self.poison_block(block, self.mismatch_reason())
        return bad if mismatch is None else bad | mismatch

    def verify_slot(self, block: int, slot_bytes) -> bool:
        """A block just read into a slot: True if it matches its recorded checksum (or has
        none); a mismatch is counted and poisons the block."""
        if self.checksums.matches(block, slot_bytes):
            return True
        self.counters[C.CHECKSUM_MISMATCHES] += 1
        self.poison_block(block, self.mismatch_reason())
        return False

    # ------------------------------------------------------------ writes
    def write_rows(self, rows: np.ndarray, *, victims: bool) -> np.ndarray:
        """Slot -> back end writes with retries, recording each block's checksum (under
        the lock). Returns the mask of rows that failed. A failed victim's bytes are
        gone: it is poisoned."""
        sums = self._intend(rows)  # write-ahead
        res, retries = self.submit_retrying(rows)
        self.counters[C.MEDIA_RETRIES] += retries
        return self.record_writes(rows, res, sums, victims=victims)

    def write_back_in_waves(self, waves: list[np.ndarray], after_wave) -> None:
        """write_rows(victims=True) for victims cut in `waves` (row arrays), one wave on the
        SSD at a time, so the CPU's part of the next steps overlaps the SSD's: while wave
        w+1 is written, `after_wave(w)` runs (the caller copies new bytes into wave w's
        slots, free now) and wave w+2's checksums are computed and logged. Write-ahead
        holds per wave: its SUM records are in the log before it is submitted. A wave
        on its own is written as fast as a whole batch from a few MiB up (this disk
        completes a batch's writes together, so waves in flight at once would land
        together and nothing would overlap)."""
        sums: list[np.ndarray | None] = [None] * len(waves)
        sums[0] = self._intend(waves[0])
        self._queue_writes(waves[0])
        on_ssd = 0  # the wave queued and not reaped yet
        try:
            if len(waves) > 1:
                sums[1] = self._intend(waves[1])
            for w, rows in enumerate(waves):
                res = self._reap_writes(rows)
                on_ssd = None
                if w + 1 < len(waves):
                    self._queue_writes(waves[w + 1])
                    on_ssd = w + 1
                self._settle_writes(rows, res, sums[w])
                after_wave(w)
                if w + 2 < len(waves):
                    sums[w + 2] = self._intend(waves[w + 2])
        finally:
            if on_ssd is not None:  # an error: the wave on the SSD is still settled (its records, the ring)
                self._settle_writes(waves[on_ssd], self._reap_writes(waves[on_ssd]), sums[on_ssd])

    def _intend(self, rows: np.ndarray) -> np.ndarray:
        """Hash the slots of write-back rows and log their SUM records (before they are
        submitted: write-ahead). Returns the sums."""
        sums = self.hash_slots(rows[:, 0])
        self.checksums.intend(rows[:, 2] // self.block_size, sums)
        return sums

    def _queue_writes(self, rows: np.ndarray) -> None:
        if rows.shape[0]:
            queued = self.ssd.queue(rows, np.arange(rows.shape[0], dtype=np.int64))
            if queued != rows.shape[0]:  # the caller cuts waves to the ring's room
                raise RuntimeError(f"a wave of {rows.shape[0]} write-backs did not fit the ring ({queued} queued)")

    def _reap_writes(self, rows: np.ndarray) -> np.ndarray:
        """Wait for every row of a queued wave; results in row order."""
        res = np.zeros(rows.shape[0], np.int64)
        left = rows.shape[0]
        while left:
            tags, got = self.ssd.reap(left)
            res[tags] = got
            left -= tags.shape[0]
        return res

    def _settle_writes(self, rows: np.ndarray, res: np.ndarray, sums: np.ndarray) -> None:
        """Victims' write-backs back from the ring (`res`: bytes or -errno per row, their
        SUMs logged as `sums`): the checksums of what landed are recorded, the failed rows
        go through retry_writes."""
        failed = res != rows[:, 1]
        if failed.any():
            self.record_writes(rows[~failed], res[~failed], sums[~failed], victims=True)
            self.retry_writes(rows[failed], sums[failed])
        else:
            self.record_writes(rows, res, sums, victims=True)

    def retry_writes(self, rows: np.ndarray, sums: np.ndarray) -> None:
        """Victims' write-backs that failed once on a ring (their SUMs logged as `sums`):
        resubmitted synchronously (backend.retries in all), then their checksums recorded
        - or the victim poisoned, its bytes are gone."""
        res, retried = self.submit_retrying(rows, max(self.retries - 1, 0))
        self.counters[C.MEDIA_RETRIES] += retried + rows.shape[0]
        self.record_writes(rows, res, sums, victims=True)

    def record_writes(self, rows: np.ndarray, res: np.ndarray, sums: np.ndarray, *, victims: bool) -> np.ndarray:
        """After write-backs settled: the checksums of the rows that landed are recorded;
        a failed row's block has no checksum (the back end holds neither the old nor the
        new bytes), and is poisoned if it was a victim. Returns the mask of failed rows."""
        failed = res != rows[:, 1]
        blocks = rows[:, 2] // self.block_size
        self.checksums.sums.set_many(blocks[~failed], sums[~failed])
        for i in np.flatnonzero(failed).tolist():
            block = int(blocks[i])
            self.checksums.sums.pop(block, None)
            if victims:
                self.poison_block(block, f"write-back failed: {_why(res[i], 'short write')}")
        return failed

    def write_through(self, bt, slots: np.ndarray) -> None:
        """Write the slots' blocks to the back end now (write-through mode)."""
        unique = np.unique(slots)
        ops = fw.new_io_rows(unique.shape[0])
        ops[:, 0] = self.dram.base_address + unique * self.block_size
        ops[:, 1] = self.block_size
        ops[:, 2] = bt.block[unique] * self.block_size
        ops[:, 3] = 1
        failed = self.write_rows(ops, victims=False)
        if failed.any():
            bt.flags[unique[failed]] |= btm.DIRTY  # the DRAM copy is right: keep it for a later write-back
            block = int(ops[np.flatnonzero(failed)[0], 2] // self.block_size)
            raise MediaError(5, f"write-through of block {block} to the SSD failed; the data stays in device DRAM")
        self.count_writes(unique.shape[0])

    def count_writes(self, n: int) -> None:
        self.counters[C.WRITEBACKS] += n
        self.counters[C.SSD_WRITES] += n
        self.counters[C.SSD_WRITE_BYTES] += n * self.block_size

    def hash_slots(self, addrs: np.ndarray) -> np.ndarray:
        """xxh3-64 of the whole slot at each address (compiled when xxhash allows; a long
        run shared with the copy engine's helper thread)."""
        if not sumtable.COMPILED_HASH:
            slots = self.dram.slots
            return np.fromiter((checksum(slots[(a - self.dram.base_address) // self.block_size])
                                for a in addrs.tolist()), np.uint64, addrs.shape[0])
        if addrs.shape[0] * self.block_size < copyengine.HELPER_MIN_BYTES:
            sums = np.empty(addrs.shape[0], np.uint64)  # one compiled call costs less than the engine's
            sumtable.hash_blocks(np.ascontiguousarray(addrs), self.block_size, sums)
            return sums
        jobs = copyengine.block_jobs(addrs, self.block_size, hashed=True)
        copyengine.copy_many(jobs)
        return jobs[:, copyengine.HASH].view(np.uint64)

    def sync(self) -> None:
        """Make what was written durable: the back end, then the integrity log."""
        self.ssd.sync()
        self.checksums.sync()


def _why(result: int, short: str) -> str:
    return os.strerror(-int(result)) if result < 0 else short
