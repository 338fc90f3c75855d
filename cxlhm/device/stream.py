"""Streamed reads: many reads in flight in one compiled loop (cxlhm/readstream.py) that
plans, queues, reaps and copies out block by block, with the device lock taken once
per time slice. Used by the fio engine and by multi-block reads of the access path
(`_read_streamed`). Needs a back end with `caps.async_io`.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from cxlhm import copyengine
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm import readstream as rs
from cxlhm import sumtable
from cxlhm.device.errors import DeviceClosed, DeviceFull, MediaError
from cxlhm.timing.recorder import record as record_latency

STREAM_PASSES = 8  # passes of a wide streamed read on the SSD at once (_read_streamed)
_NO_BLOCKS, _NO_SUMS = np.zeros(0, np.int64), np.zeros(0, np.uint64)  # an empty sum table: verify nothing
# the loop records no landed write-back itself (readstream's `record`; the driver does)
_NO_RECORD = (_NO_BLOCKS, _NO_SUMS, np.zeros(0, np.int64), _NO_BLOCKS, _NO_SUMS, np.zeros(0, np.int64))
# where the stream's loop logs its victims' checksums, without an integrity log (readstream's LOG_*)
_LOG_NONE, _LOG_IN_DRIVER = np.array([rs.LOG_NONE], np.int64), np.array([rs.LOG_IN_DRIVER], np.int64)


class _StreamJob(NamedTuple):
    """One stream_io call: its compiled kernels and state, its reads and their
    outputs, the thread's ring, and the owner its blocks are placed for."""
    run: Callable
    complete: Callable
    state: rs.StreamState
    hpas: np.ndarray
    lens: np.ndarray
    addrs: np.ndarray
    kinds: np.ndarray  # uint8 per extent: 1 = a write
    slat: np.ndarray
    clat: np.ndarray
    failed: np.ndarray
    ring: int
    fd: int
    owner: int


@dataclasses.dataclass(frozen=True)
class StreamResult:
    """What Device.stream_io ran: reads[:count] (complete), and their device-block
    hits and misses."""
    count: int
    hits: int
    misses: int
    submits: np.ndarray | None = None  # reads per submission, in fio's 7 buckets (cxlhm_apps.fio.stats.submit_bucket)
    peak_in_flight: int = 0  # the most reads it had at the SSD at once
    write_hits: int = 0  # of hits and misses, those of its writes
    write_misses: int = 0


class StreamReads:
    """Device part: stream_io (mixed into Device, which it reads the state of)."""

    def _read_streamed(self, hpa: int, n: int, user_addr: int, owner: int) -> float:
        """One multi-block read through stream_io, counted as one host read. Up to
        1/STREAM_PASSES of the SSD queue's depth in blocks it is one stream read:
        planned as one firmware pass, like access(), its blocks copied out as they
        land. A wider read is cut in such passes (like _access_split), STREAM_PASSES
        on the SSD at once: a pass's blocks tend to land together (the block layer
        merges adjacent reads into one request), and the stream holds twice as many
        tags, so the next pass goes out as soon as a reap frees its room on the
        ring, while the landed one is copied out."""
        started = time.perf_counter_ns()
        bs = self.block_size
        with self._lock:
            piece = max(1, min(self._batch_limit(), self.ssd.queue_depth // STREAM_PASSES))
        # the passes' starts: the read's, then every piece-th block boundary (Python ints:
        # a few passes, where numpy's small-array calls cost more than the arithmetic)
        cuts = [hpa, *range((hpa // bs + piece) * bs, hpa + n, piece * bs)]
        ends = cuts[1:] + [hpa + n]
        starts = np.array(cuts, np.int64)
        lens = np.array([end - start for start, end in zip(cuts, ends)], np.int64)
        addrs = starts + (user_addr - hpa)
        ran = self.stream_io(starts, lens, addrs, 2 * STREAM_PASSES, owner=owner)
        extra = ran.count - (ran.count == starts.shape[0])  # the pieces' host reads beyond this one
        if extra:
            with self._lock:
                self.counters[C.HOST_READS] -= extra
        if ran.count < starts.shape[0]:  # it stopped before a poisoned block: the erroring path
            rest = int(starts[ran.count])
            self.access_one(rest, hpa + n - rest, user_addr + rest - hpa, False, owner, stream=False)
        latency = time.perf_counter_ns() - started
        if self.latency is not None:
            with self._lock:
                record_latency(self.latency.values, self.latency.meta, float(latency))
        return latency

    def stream_io(self, ext_hpa, ext_len, addrs, depth: int, *, deadline_ns: int = 0, slat=None, clat=None,
                    owner: int = 0, writes=None) -> StreamResult:
        """Read extent i into the host buffer at addrs[i], in order, keeping up to `depth`
        of them in flight, the per-read work compiled (cxlhm/readstream.py). Stops early
        at CLOCK_MONOTONIC `deadline_ns` (if > 0), and before the first read touching a
        poisoned block (those take the erroring
        path): the result says how many ran. Their submission and
        completion latencies (ns) go to `slat` and `clat` when given. Every read that
        ran is complete on return, its bytes in its buffer, or raised: a read whose
        fill failed is read again through access(), which retries and poisons.
        `writes` (uint8 per extent, 1 = write the buffer to the extent; not on a
        write-through device) makes it a stream of reads and writes in issue order, an
        I/O waiting while an earlier one in flight holds one of its blocks."""
        ext_hpa, ext_len, addrs, _ = self._extents(ext_hpa, ext_len, addrs)
        n = ext_hpa.shape[0]
        slat = np.zeros(n, np.int64) if slat is None else slat
        clat = np.zeros(n, np.int64) if clat is None else clat
        kinds = np.zeros(n, np.uint8) if writes is None else np.ascontiguousarray(writes, np.uint8)
        if writes is not None and self._write_mode_code == fw.WRITE_THROUGH and kinds.any():
            raise ValueError("a write-through device runs writes through access(), not a stream")
        if not self.can_stream or n == 0 or depth < 1:
            return StreamResult(0, 0, 0)
        # the most blocks a stream read holds; wider reads run through access(), which splits them
        max_blocks = min(max(1, int(rs.blocks_per_read(ext_hpa, ext_len, self.block_size))), self._batch,
                         self.ssd.queue_depth)
        complete, run = rs.kernels_for(self.policy)
        state = self._stream_state(min(depth, self.ssd.queue_depth), max_blocks, complete)
        st = state.st
        state.reset()
        reads_total = int(ext_len.sum()) if writes is None else int(ext_len[kinds == 0].sum())
        st[rs.BYPASS_CACHES] = copyengine.bypasses_caches(reads_total)
        failed = np.zeros(n, np.int64)
        job = _StreamJob(run, complete, state, ext_hpa, ext_len, addrs, kinds, slat, clat, failed,
                         *self.ssd.stream_ring(), owner)
        stop, version = self._stream_stop(ext_hpa, ext_len, n)
        self.checksums.unrecorded = self._stream_unrecorded_sums  # what a compaction must keep of the streams' logs
        hits0, misses0 = self.thread_hits_misses()
        counted = held = 0  # fills the back end was told of, slots the device was told of
        joined = False  # counted in self._streams (the streams running on the device)
        try:
            while True:
                with self._lock:
                    if not joined:
                        self._streams[0] += 1
                        joined = True
                    if self.closed:
                        raise DeviceClosed("the device is closed")
                    if len(self.media.poison.blocks) != version:  # new poison records: stop here
                        stop = min(stop, int(st[rs.NEXT]))
                    self._sync_time()  # once per time slice: the policy's deadlines and ages read it
                    try:
                        status = self._stream_run(job, stop, deadline_ns, counted, held)
                        if status == rs.DEVICE_FULL:  # before any thread misses on them
                            self.media.write_rows(state.writebacks[:int(st[rs.PARKED_WBS])], victims=True)
                        self._stream_settle(job, status)
                    finally:  # even after an error: what the slice took or gave back is counted
                        counted, held = self._stream_account(st, counted, held)
                        self._idle.notify_all()  # reads of this stream may have ended: threads waiting for their slots
                    if status == rs.DEVICE_FULL:
                        raise DeviceFull("no evictable device-DRAM slot: every slot is pinned or in use")
                    alone = not self._inflight
                    if status == rs.BLOCKED and not alone:  # another thread's access holds what it needs
                        i = int(st[rs.NEXT])
                        self._wait_for_slots(ext_hpa[i:i + 1], ext_len[i:i + 1])
                    elif status == rs.FINISHED:
                        break
                shared = self._streams[0] > 1
                if status == rs.REAP_UNLOCKED or (status == rs.SLICE and shared and st[rs.RING] > 0):
                    # other streams run while this one waits at the SSD; at the end of a slice
                    # cut short for a thread blocked on the lock, that thread takes it meanwhile
                    self._reap_unlocked(job)
                    continue
                if self._lock.waiting[1]:  # a thread waits for the device: it goes first
                    if shared:  # (streams take turns: one of them, not all)
                        self._lock.let_one_in()
                    else:
                        self._lock.let_waiters_in()
                if status == rs.WIDE or (status == rs.BLOCKED and alone):  # access() splits it over passes
                    i = int(st[rs.NEXT])
                    begin = time.monotonic_ns()
                    self.access_one(int(ext_hpa[i]), int(ext_len[i]), int(addrs[i]), bool(kinds[i]), owner,
                                    stream=False)
                    clat[i], slat[i] = time.monotonic_ns() - begin, 0
                    st[rs.NEXT] = i + 1
        finally:
            try:
                if st[rs.IN_FLIGHT] or st[rs.N_PARKED] or st[rs.WB_USED] or st[rs.REAPED]:
                    # an error: collect what is in flight, or its slots stay BUSY
                    self._stream_drain(job, counted, held)
            finally:
                if joined:
                    with self._lock:
                        self._streams[0] -= 1
        s = self._scratch()
        s.hits += int(st[rs.HITS])
        s.misses += int(st[rs.MISSES])
        for i in failed[:int(st[rs.FAILED])].tolist():  # again, through the path that retries and poisons
            self.access_one(int(ext_hpa[i]), int(ext_len[i]), int(addrs[i]), bool(kinds[i]), owner, stream=False)
        return StreamResult(int(st[rs.NEXT]), s.hits - hits0, s.misses - misses0, state.submits.copy(),
                            int(st[rs.PEAK]), int(st[rs.W_HITS]), int(st[rs.W_MISSES]))

    def _reap_unlocked(self, job: "_StreamJob") -> None:
        """Without the lock: wait for a completion of the stream's own ring (the loop found
        none in and another stream shares the device); the loop completes what this took
        when it runs next."""
        wide = self.block_size >= rs.WIDE_BLOCK and job.state.max_blocks > 1
        state = job.state
        got = rs.reap_unlocked(job.ring, state.st, state.reaped_tags, state.reaped_res, wide)
        if got < 0:
            raise MediaError(-got, f"io_uring reap failed: {os.strerror(-got)}")

    def _stream_settle(self, job: "_StreamJob", status: int) -> None:
        """Under the lock, after each time slice: what the compiled loop leaves to the
        driver (write-backs to log, record or retry, written blocks to log, a reap to
        verify)."""
        state = job.state
        self._stream_count_logged(state)
        self._stream_log(state)
        self._stream_writebacks(state)
        if status == rs.VERIFY:
            self._stream_verify(state, job.complete, job.hpas, job.lens, job.addrs, job.kinds, job.clat, job.failed)

    def _stream_log(self, state: rs.StreamState) -> None:
        """The integrity log's records of the slice the loop left to the driver, in one
        write(2): the blocks the stream wrote (dirty: their bytes are newer than the
        SSD's, logged before the stream returns their completion), then the staged
        victims' checksums (write-ahead: logged before the next slice queues their
        write-backs). Until its checksum is recorded a victim's row stays in the
        stream's table: no thread misses on its block meanwhile (_touches_victims)."""
        st = state.st
        if st[rs.WB_STAGED] == st[rs.WB_LOGGED] and st[rs.WRITTEN] == st[rs.WRITTEN_LOGGED]:
            st[rs.WRITTEN] = st[rs.WRITTEN_LOGGED] = 0  # the loop logged all of it (the common case)
            return
        staged = state.staged_rows()
        written = state.wblocks[int(st[rs.WRITTEN_LOGGED]):int(st[rs.WRITTEN])]
        if staged.shape[0]:
            rows = state.wb_rows[staged]
            sums = self.media.hash_slots(rows[:, 0])
            state.wb_sum[staged] = sums
            self.checksums.intend(rows[:, 2] // self.block_size, sums, written)
            st[rs.WB_LOGGED] = st[rs.WB_STAGED]
        elif written.shape[0]:
            self.checksums.note_dirty_array(written)
        st[rs.WRITTEN] = st[rs.WRITTEN_LOGGED] = 0

    def _stream_count_logged(self, state: rs.StreamState) -> None:
        """The records the loop wrote to the integrity log itself (see run's log_ctl;
        it put their DIRTY blocks in the dirty set itself) are counted, and the log
        compacted when that is due. A short write of it fails the stream, as one of the
        driver's would."""
        st = state.st
        if st[rs.LOG_SHORT]:
            written, st[rs.LOG_SHORT] = int(st[rs.LOG_SHORT]) - 1, 0
            raise OSError(f"{self.checksums.log.path}: short write of the integrity log ({written} bytes of a "
                          "frame of write-back checksums)")
        if st[rs.LOG_RECORDS]:
            records, st[rs.LOG_RECORDS] = int(st[rs.LOG_RECORDS]), 0
            self.checksums.logged_elsewhere(records)

    def _stream_log_ctl(self) -> np.ndarray:
        """Under the lock: where the loop logs the checksums of the victims it stages
        (readstream's LOG_*; the integrity log's own descriptor while it takes records)."""
        if not rs.COMPILED_LOG:
            return _LOG_IN_DRIVER
        log = self.checksums.log
        return _LOG_NONE if log is None else log.ctl

    def _stream_record(self, state: rs.StreamState, log_ctl: np.ndarray) -> tuple:
        """Under the lock: the tables the loop keeps in step itself (readstream's
        `record`) - the checksums, and the dirty set - grown first to hold what one slice
        adds (the loop cannot grow them: past that it leaves the recording to the
        driver). _NO_RECORD where the driver logs the loop's records (its `pending` sums
        must see every landing)."""
        if log_ctl[0] == rs.LOG_IN_DRIVER:
            return _NO_RECORD
        sums, dirty = self.checksums.sums.table, self.checksums.dirty
        sums.reserve(state.wb_rows.shape[0])
        dirty.reserve(state.wblocks.shape[0])
        return (*sums.compiled(), *dirty.compiled())

    def _stream_unrecorded_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """Under the lock: the blocks and sums of the streams' write-backs out or landed,
        their checksums not recorded yet (what their SUM records say)."""
        blocks, sums = [_NO_BLOCKS], [_NO_SUMS]
        for state in self._streams_but(None):
            out = (state.wb_state == rs.WB_RING) | (state.wb_state == rs.WB_LAND) | (state.wb_state == rs.WB_FAIL)
            blocks.append(state.wb_rows[out, 2] // self.block_size)
            sums.append(state.wb_sum[out])
        return np.concatenate(blocks), np.concatenate(sums)

    def _stream_writebacks(self, state: rs.StreamState) -> None:
        """The stream's dirty victims that left its ring: landed ones get their checksums
        recorded; failed ones are retried here (a victim that cannot be written is
        poisoned, its bytes are gone)."""
        st = state.st
        n = int(st[rs.WB_FAILED_N])
        if n:
            rows_at = state.wb_failed[:n].copy()
            rows = state.wb_rows[rows_at]
            self.checksums.summed(rows[:, 2] // self.block_size)
            self.media.retry_writes(rows, state.wb_sum[rows_at])
            st[rs.WB_FAILED_N] = 0
            rs.settle_writebacks(state.arrays(), rows_at, True)
        n = int(st[rs.WB_LANDED])
        if n:
            landed = state.wb_landed[:n]
            blocks = state.wb_rows[landed, 2] // self.block_size
            self.checksums.sums.set_many(blocks, state.wb_sum[landed])
            self.checksums.summed(blocks)
            st[rs.WB_LANDED] = 0
            state.free_landed(landed)

    def victim_blocks(self, but: rs.StreamState | None = None) -> np.ndarray:
        """Under the lock: the blocks the device's streams (but `but`) are writing back,
        sorted: their bytes are not on the SSD (or their checksums not recorded) yet."""
        held = [state.victim_blocks(self.block_size) for state in self._streams_but(but) if state.st[rs.WB_USED]]
        return np.unique(np.concatenate(held)) if held else _NO_BLOCKS

    def _streams_but(self, but: rs.StreamState | None) -> list[rs.StreamState]:
        """The threads' stream states but `but` (through the weak references: the
        dictionary's own iteration costs more than the rest of a round trip's look-ups)."""
        return [state for state in (ref() for ref in self._stream_states.valuerefs())
                if state is not None and state is not but]

    def _touches_victims(self, hpas, lens) -> bool:
        """Under the lock: whether an access touches a block a stream is writing back
        (a miss on it must wait)."""
        victims = self.victim_blocks()
        if victims.shape[0] == 0:
            return False
        return rs.clean_prefix(np.atleast_1d(np.asarray(hpas, np.int64)), np.atleast_1d(np.asarray(lens, np.int64)),
                               self.block_size, victims) < np.atleast_1d(hpas).shape[0]

    def _stream_state(self, depth: int, max_blocks: int, complete) -> rs.StreamState:
        state = self._local.stream
        if state is None or state.depth != depth or state.max_blocks < max_blocks:
            state = self._local.stream = rs.StreamState(depth, max_blocks)
            self._stream_states[threading.get_ident()] = state  # (a thread's state replaces its last one)
            # compile the verifying completion now, not in the middle of a timed stream
            empty = np.zeros(0, np.int64)
            complete(self.bt, self.ps, self.clock, self.dram.base_address, self.block_size, empty, empty, empty,
                     state.bad[:0], empty, empty, state.arrays(), empty, empty, state.bad[:0], 0, empty, _NO_SUMS,
                     _NO_RECORD)
        return state

    def _stream_stop(self, hpas, lens, n: int) -> tuple[int, int]:
        """Where the stream must stop (the reads before it touch no poisoned block), and
        the poison table's size it was computed for."""
        if not self.media.poison.blocks:  # (unlocked: a record added after this stops the stream's first slice)
            return n, 0
        with self._lock:
            poisoned = np.array(sorted(self.media.poison.blocks), np.int64)
        return rs.clean_prefix(hpas, lens, self.block_size, poisoned), poisoned.shape[0]

    def _stream_verify_mode(self, record: tuple) -> tuple[int, np.ndarray, np.ndarray]:
        """Under the lock: how a stream verifies its reaped blocks (readstream's VERIFY_*),
        and the sum table it reads (its arrays change when it grows). A loop that records
        its landed write-backs verifies even when the table starts the slice empty: a
        block it wrote back may be read again in the same slice."""
        table = self.media.checksums.sums.table
        if table.count == 0 and record is _NO_RECORD:
            return rs.VERIFY_NONE, table.keys, table.values
        return (rs.VERIFY_HERE if sumtable.COMPILED_HASH else rs.VERIFY_ALL), table.keys, table.values

    def _stream_verify(self, state, complete, hpas, lens, addrs, kinds, clat, failed) -> None:
        """Under the lock: the stream's last reap, checked against the blocks' checksum
        records (a mismatch poisons the block; its read fails over to access()), then
        completed."""
        st = state.st
        if st[rs.ERRNO]:
            err, st[rs.ERRNO] = int(-st[rs.ERRNO]), 0
            raise MediaError(err, f"io_uring reap failed: {os.strerror(err)}")
        n = int(st[rs.REAPED])
        tags, res, bad, blocks = state.reaped_tags[:n], state.reaped_res[:n], state.bad[:n], state.blocks[:n]
        bad[:] = 0
        rs.reaped_blocks(state.arrays(), self.block_size, hpas, tags, n, blocks)
        found, _ = self.media.checksums.sums.lookup(blocks)
        for j in np.flatnonzero(found).tolist():
            if res[j] == self.block_size:
                block = int(blocks[j])
                if not self.media.verify_slot(block, self.dram.slots[rs.slot_of_reaped(state.arrays(), tags[j])]):
                    bad[j] = 1
        complete(self.bt, self.ps, self.clock, self.dram.base_address, self.block_size, hpas, lens, addrs, kinds,
                 clat, failed, state.arrays(), tags, res, bad, n, _NO_BLOCKS, _NO_SUMS, _NO_RECORD)
        st[rs.REAPED] = 0

    def _stream_account(self, st, counted: int, held: int) -> tuple[int, int]:
        """Under the lock: tell the back end how many fills the stream has out on its ring,
        and the device how many slots it holds BUSY (other threads plan around them, and
        count it as an access in flight while it holds any). Returns both for next time."""
        fills, slots = int(st[rs.FILLS]), int(st[rs.SLOTS])
        self.ssd.note_queued(fills - counted)
        self._inflight_slots += slots - held
        self._inflight += (slots > 0) - (held > 0)
        return fills, slots

    def _stream_run(self, job: "_StreamJob", stop: int, deadline_ns: int, counted: int, held: int) -> int:
        """Under the lock: one time slice of the stream's compiled loop (readstream.run)."""
        self.settle_behind()  # its slots are BUSY: no stream plans over them
        log_ctl = self._stream_log_ctl()
        record = self._stream_record(job.state, log_ctl)  # (first: it may grow the sum table)
        return job.run(self.bt, self.ps, self.counters, self.clock, self._write_mode_code, self.dram.base_address,
                       self.block_size, job.hpas, job.lens, job.addrs, job.kinds, stop, deadline_ns, job.slat, job.clat,
                       job.failed, job.state.arrays(), job.ring, job.fd, self.ssd.async_room() + counted,
                       self._inflight_slots - held, self.n_slots, job.owner, *self._stream_verify_mode(record),
                       self.victim_blocks(but=job.state), log_ctl, record, self._lock.waiting, self._t0_ns,
                       self._streams)

    def _stream_drain(self, job: "_StreamJob", counted: int, held: int) -> None:
        """After an error: issue nothing more, wait for the stream's fills in flight and
        complete them (their slots must not stay BUSY). An error of the driver's part of a
        slice here is raised once everything has landed."""
        st = job.state.st
        error = None
        while st[rs.IN_FLIGHT] or st[rs.N_PARKED] or st[rs.WB_USED] or st[rs.REAPED]:
            with self._lock:
                try:
                    status = self._stream_run(job, int(st[rs.NEXT]), 0, counted, held)
                    try:
                        self._stream_settle(job, status)
                    except Exception as exc:  # the rest still lands first: its slots are BUSY until then
                        error = error or exc
                finally:
                    counted, held = self._stream_account(st, counted, held)
                    self._idle.notify_all()
            if status == rs.REAP_UNLOCKED:
                try:
                    self._reap_unlocked(job)
                except MediaError as exc:
                    error = error or exc
                    break  # the ring failed: what is on it cannot be collected
        if error is not None:
            raise error
