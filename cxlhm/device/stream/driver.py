"""Streamed I/O, the device part: many reads and writes in flight in one compiled loop
(loop.py) that plans, queues, reaps and copies out block by block, with the device lock
taken once per time slice. Used by the fio engine and by multi-block reads of the
access path (`read_streamed`). Needs a back end with `caps.async_io`.

`Streams` gets the device state, the stream registry (where each thread's stream state
is registered, so the other parts see its victims), the write-behind (settled before a
slice: its slots are BUSY) and the access path (the erroring path for what a stream
cannot run: wide reads, blocked ones, failed fills).
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm import sumtable
from cxlhm.device.access import AccessPath
from cxlhm.device.behind import WriteBehind
from cxlhm.device.errors import DeviceClosed, DeviceFull, MediaError
from cxlhm.device.state import DeviceState
from cxlhm.device.stream import copyengine, loop
from cxlhm.device.stream import state as ss  # the stream's state names (status codes, scalars)
from cxlhm.device.stream.registry import NO_BLOCKS, NO_SUMS, StreamRegistry
from cxlhm.timing.recorder import record as record_latency

STREAM_PASSES = 8  # passes of a wide streamed read on the SSD at once (read_streamed)
# the loop records no landed write-back itself (the loop's `record`; the driver does)
_NO_RECORD = (NO_BLOCKS, NO_SUMS, np.zeros(0, np.int64), NO_BLOCKS, NO_SUMS, np.zeros(0, np.int64))
# where the stream's loop logs its victims' checksums, without an integrity log (state.py's LOG_*)
_LOG_NONE, _LOG_IN_DRIVER = np.array([ss.LOG_NONE], np.int64), np.array([ss.LOG_IN_DRIVER], np.int64)


class _StreamJob(NamedTuple):
    """One stream_io call: its compiled kernels and state, its reads and their
    outputs, the thread's ring, and the owner its blocks are placed for."""
    run: Callable
    complete: Callable
    state: ss.StreamState
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
    head: tuple  # run's first arguments, the same every slice: the device's tables and the I/Os
    fixed: tuple  # and those after its `stop` and `deadline_ns`: outputs, the stream's arrays, its ring


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


class Streams:
    """Device part: streamed I/O (stream_io) and the multi-block reads of the access path
    that go through it. Owns nothing between calls but what it registers: each thread's
    stream state (in the registry, where the other parts see its victims)."""

    def __init__(self, state: DeviceState, registry: StreamRegistry, behind: WriteBehind, access: AccessPath):
        self.state, self.registry, self.behind, self.access = state, registry, behind, access

    def _hits_misses(self) -> tuple[int, int]:
        s = self.state.scratch()
        return s.hits, s.misses

    def read_streamed(self, hpa: int, n: int, user_addr: int, owner: int) -> float:
        """One multi-block read through stream_io, counted as one host read. Up to
        1/STREAM_PASSES of the SSD queue's depth in blocks it is one stream read:
        planned as one firmware pass, like access(), its blocks copied out as they
        land. A wider read is cut in such passes (like _access_split), STREAM_PASSES
        on the SSD at once: a pass's blocks tend to land together (the block layer
        merges adjacent reads into one request), and the stream holds twice as many
        tags, so the next pass goes out as soon as a reap frees its room on the
        ring, while the landed one is copied out."""
        started = time.perf_counter_ns()
        bs = self.state.block_size
        with self.state.lock:
            piece = max(1, min(self.state.batch_limit(), self.state.media.ssd.queue_depth // STREAM_PASSES))
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
            with self.state.lock:
                self.state.counters[C.HOST_READS] -= extra
        if ran.count < starts.shape[0]:  # it stopped before a poisoned block: the erroring path
            rest = int(starts[ran.count])
            self.access.access_one(rest, hpa + n - rest, user_addr + rest - hpa, False, owner)
        latency = time.perf_counter_ns() - started
        if self.state.latency is not None:
            with self.state.lock:
                record_latency(self.state.latency.values, self.state.latency.meta, float(latency))
        return latency

    def stream_io(self, ext_hpa, ext_len, addrs, depth: int, *, deadline_ns: int = 0, slat=None, clat=None,
                    owner: int = 0, writes=None) -> StreamResult:
        """Read extent i into the host buffer at addrs[i], in order, keeping up to `depth`
        of them in flight, the per-read work compiled (cxlhm/device/stream/loop.py). Stops early
        at CLOCK_MONOTONIC `deadline_ns` (if > 0), and before the first read touching a
        poisoned block (those take the erroring
        path): the result says how many ran. Their submission and
        completion latencies (ns) go to `slat` and `clat` when given. Every read that
        ran is complete on return, its bytes in its buffer, or raised: a read whose
        fill failed is read again through access(), which retries and poisons.
        `writes` (uint8 per extent, 1 = write the buffer to the extent; not on a
        write-through device) makes it a stream of reads and writes in issue order, an
        I/O waiting while an earlier one in flight holds one of its blocks."""
        ext_hpa, ext_len, addrs, _ = self.access.extents(ext_hpa, ext_len, addrs)
        n = ext_hpa.shape[0]
        slat = np.zeros(n, np.int64) if slat is None else slat
        clat = np.zeros(n, np.int64) if clat is None else clat
        kinds = np.zeros(n, np.uint8) if writes is None else np.ascontiguousarray(writes, np.uint8)
        if writes is not None and self.state.write_mode_code == fw.WRITE_THROUGH and kinds.any():
            raise ValueError("a write-through device runs writes through access(), not a stream")
        if not self.state.can_stream or n == 0 or depth < 1:
            return StreamResult(0, 0, 0)
        # the most blocks a stream read holds; wider reads run through access(), which splits them
        max_blocks = min(max(1, int(loop.blocks_per_read(ext_hpa, ext_len, self.state.block_size))), self.state.batch,
                         self.state.media.ssd.queue_depth)
        complete, run = loop.kernels_for(self.state.policy)
        state = self._state(min(depth, self.state.media.ssd.queue_depth), max_blocks, complete)
        st = state.st
        state.reset()
        reads_total = int(ext_len.sum()) if writes is None else int(ext_len[kinds == 0].sum())
        st[ss.BYPASS_CACHES] = copyengine.bypasses_caches(reads_total)
        failed = np.zeros(n, np.int64)
        ring, fd = self.state.media.ssd.stream_ring()
        dev = self.state
        job = _StreamJob(run, complete, state, ext_hpa, ext_len, addrs, kinds, slat, clat, failed, ring, fd, owner,
                         (dev.bt, dev.ps, dev.counters, dev.ticks, dev.write_mode_code, dev.dram.base_address,
                          dev.block_size, ext_hpa, ext_len, addrs, kinds),
                         (slat, clat, failed, state.arrays(), ring, fd))
        stop, version = self._stop(ext_hpa, ext_len, n)
        self.state.media.checksums.unrecorded = self.registry.unrecorded_sums  # what a compaction must keep of the streams' logs
        hits0, misses0 = self._hits_misses()
        counted = held = 0  # fills the back end was told of, slots the device was told of
        joined = False  # counted in self._streams (the streams running on the device)
        try:
            while True:
                with self.state.lock:
                    if not joined:
                        self.registry.running[0] += 1
                        joined = True
                    if self.state.closed:
                        raise DeviceClosed("the device is closed")
                    if len(self.state.media.poison.blocks) != version:  # new poison records: stop here
                        stop = min(stop, int(st[ss.NEXT]))
                    self.state.sync_time()  # once per time slice: the policy's deadlines and ages read it
                    try:
                        status = self._run(job, stop, deadline_ns, counted, held)
                        if status == ss.DEVICE_FULL:  # before any thread misses on them
                            self.state.media.write_rows(state.writebacks[:int(st[ss.PARKED_WBS])], victims=True)
                        self._settle(job, status)
                    finally:  # even after an error: what the slice took or gave back is counted
                        counted, held = self._account(st, counted, held)
                        state.note_victims(self.state.block_size)  # (its table changed only in this turn)
                        self.state.idle.notify_all()  # reads of this stream may have ended: threads waiting for their slots
                    if status == ss.DEVICE_FULL:
                        raise DeviceFull("no evictable device-DRAM slot: every slot is pinned or in use")
                    alone = not self.state.inflight
                    if status == ss.BLOCKED and not alone:  # another thread's access holds what it needs
                        i = int(st[ss.NEXT])
                        self.access.wait_for_slots(ext_hpa[i:i + 1], ext_len[i:i + 1])
                    elif status == ss.FINISHED:
                        break
                shared = self.registry.running[0] > 1
                if status == ss.REAP_UNLOCKED or (status == ss.SLICE and shared and st[ss.RING] > 0):
                    # other streams run while this one waits at the SSD; at the end of a slice
                    # cut short for a thread blocked on the lock, that thread takes it meanwhile
                    self._reap_unlocked(job)
                    continue
                # (a thread blocked on the lock had it handed over as it was released: this
                # one queues behind it when it asks again, cxlhm/device/lock.py)
                if status == ss.WIDE or (status == ss.BLOCKED and alone):  # access() splits it over passes
                    i = int(st[ss.NEXT])
                    begin = time.monotonic_ns()
                    self.access.access_one(int(ext_hpa[i]), int(ext_len[i]), int(addrs[i]), bool(kinds[i]), owner)
                    clat[i], slat[i] = time.monotonic_ns() - begin, 0
                    st[ss.NEXT] = i + 1
        finally:
            try:
                if st[ss.IN_FLIGHT] or st[ss.N_PARKED] or st[ss.WB_USED] or st[ss.REAPED]:
                    # an error: collect what is in flight, or its slots stay BUSY
                    self._drain(job, counted, held)
            finally:
                if joined:
                    with self.state.lock:
                        self.registry.running[0] -= 1
        s = self.state.scratch()
        s.hits += int(st[ss.HITS])
        s.misses += int(st[ss.MISSES])
        for i in failed[:int(st[ss.FAILED])].tolist():  # again, through the path that retries and poisons
            self.access.access_one(int(ext_hpa[i]), int(ext_len[i]), int(addrs[i]), bool(kinds[i]), owner)
        return StreamResult(int(st[ss.NEXT]), s.hits - hits0, s.misses - misses0, state.submits.copy(),
                            int(st[ss.PEAK]), int(st[ss.W_HITS]), int(st[ss.W_MISSES]))

    def _reap_unlocked(self, job: "_StreamJob") -> None:
        """Without the lock: wait for a completion of the stream's own ring (the loop found
        none in and another stream shares the device); the loop completes what this took
        when it runs next."""
        state = job.state
        got = loop.reap_unlocked(job.ring, job.fd, state.st, state.reaped_tags, state.reaped_res, state.pend_rows,
                                 state.pend_tags)
        if got < 0:
            raise MediaError(-got, f"io_uring reap failed: {os.strerror(-got)}")

    def _settle(self, job: "_StreamJob", status: int) -> None:
        """Under the lock, after each time slice: what the compiled loop leaves to the
        driver (write-backs to log, record or retry, written blocks to log, a reap to
        verify)."""
        state = job.state
        st = state.st
        if st[ss.LOG_RECORDS] or st[ss.LOG_SHORT]:
            self._count_logged(state)
        if st[ss.WB_STAGED] != st[ss.WB_LOGGED] or st[ss.WRITTEN]:
            self._log(state)
        if st[ss.WB_FAILED_N] or st[ss.WB_LANDED]:
            self._writebacks(state)
        if status == ss.VERIFY:
            self._verify(state, job.complete, job.hpas, job.lens, job.addrs, job.kinds, job.clat, job.failed)

    def _log(self, state: ss.StreamState) -> None:
        """The integrity log's records of the slice the loop left to the driver, in one
        write(2): the blocks the stream wrote (dirty: their bytes are newer than the
        SSD's, logged before the stream returns their completion), then the staged
        victims' checksums (write-ahead: logged before the next slice queues their
        write-backs). Until its checksum is recorded a victim's row stays in the
        stream's table: no thread misses on its block meanwhile (StreamRegistry.touches_victims)."""
        st = state.st
        if st[ss.WB_STAGED] == st[ss.WB_LOGGED] and st[ss.WRITTEN] == st[ss.WRITTEN_LOGGED]:
            st[ss.WRITTEN] = st[ss.WRITTEN_LOGGED] = 0  # the loop logged all of it (the common case)
            return
        staged = state.staged_rows()
        written = state.wblocks[int(st[ss.WRITTEN_LOGGED]):int(st[ss.WRITTEN])]
        if staged.shape[0]:
            rows = state.wb_rows[staged]
            sums = self.state.media.hash_slots(rows[:, 0])
            state.wb_sum[staged] = sums
            self.state.media.checksums.intend(rows[:, 2] // self.state.block_size, sums, written)
            st[ss.WB_LOGGED] = st[ss.WB_STAGED]
        elif written.shape[0]:
            self.state.media.checksums.note_dirty_array(written)
        st[ss.WRITTEN] = st[ss.WRITTEN_LOGGED] = 0

    def _count_logged(self, state: ss.StreamState) -> None:
        """The records the loop wrote to the integrity log itself (see run's log_ctl;
        it put their DIRTY blocks in the dirty set itself) are counted, and the log
        compacted when that is due. A short write of it fails the stream, as one of the
        driver's would."""
        st = state.st
        if st[ss.LOG_SHORT]:
            written, st[ss.LOG_SHORT] = int(st[ss.LOG_SHORT]) - 1, 0
            raise OSError(f"{self.state.media.checksums.log.path}: short write of the integrity log ({written} bytes of a "
                          "frame of write-back checksums)")
        if st[ss.LOG_RECORDS]:
            records, st[ss.LOG_RECORDS] = int(st[ss.LOG_RECORDS]), 0
            self.state.media.checksums.logged_elsewhere(records)

    def _log_ctl(self) -> np.ndarray:
        """Under the lock: where the loop logs the checksums of the victims it stages
        (state.py's LOG_*; the integrity log's own descriptor while it takes records)."""
        if not ss.COMPILED_LOG:
            return _LOG_IN_DRIVER
        log = self.state.media.checksums.log
        return _LOG_NONE if log is None else log.ctl

    def _record(self, state: ss.StreamState, log_ctl: np.ndarray) -> tuple:
        """Under the lock: the tables the loop keeps in step itself (the loop's
        `record`) - the checksums, and the dirty set - grown first to hold what one slice
        adds (the loop cannot grow them: past that it leaves the recording to the
        driver). _NO_RECORD where the driver logs the loop's records (its `pending` sums
        must see every landing)."""
        if log_ctl[0] == ss.LOG_IN_DRIVER:
            return _NO_RECORD
        checksums = self.state.media.checksums
        sums, dirty = checksums.sums.table, checksums.dirty
        more = state.wb_rows.shape[0]
        if 2 * (sums.meta[0] + more) > sums.keys.shape[0]:  # (SumTable.reserve's test, without its calls)
            sums.reserve(more)
        more = state.wblocks.shape[0]
        if 2 * (dirty.meta[0] + more) > dirty.keys.shape[0]:
            dirty.reserve(more)
        return sums.keys, sums.values, sums.meta, dirty.keys, dirty.values, dirty.meta

    def _writebacks(self, state: ss.StreamState) -> None:
        """The stream's dirty victims that left its ring: landed ones get their checksums
        recorded; failed ones are retried here (a victim that cannot be written is
        poisoned, its bytes are gone)."""
        st = state.st
        n = int(st[ss.WB_FAILED_N])
        if n:
            rows_at = state.wb_failed[:n].copy()
            rows = state.wb_rows[rows_at]
            self.state.media.checksums.summed(rows[:, 2] // self.state.block_size)
            self.state.media.retry_writes(rows, state.wb_sum[rows_at])
            st[ss.WB_FAILED_N] = 0
            ss.settle_writebacks(state.arrays(), rows_at, True)
        n = int(st[ss.WB_LANDED])
        if n:
            landed = state.wb_landed[:n]
            blocks = state.wb_rows[landed, 2] // self.state.block_size
            self.state.media.checksums.sums.set_many(blocks, state.wb_sum[landed])
            self.state.media.checksums.summed(blocks)
            st[ss.WB_LANDED] = 0
            state.free_landed(landed)

    def _state(self, depth: int, max_blocks: int, complete) -> ss.StreamState:
        state = self.state.threads.stream
        if state is None or state.depth != depth or state.max_blocks < max_blocks:
            state = self.state.threads.stream = ss.StreamState(depth, max_blocks)
            self.registry.register(state)  # (a thread's state replaces its last one)
            # compile the verifying completion now, not in the middle of a timed stream
            empty = np.zeros(0, np.int64)
            complete(self.state.bt, self.state.ps, self.state.ticks, self.state.dram.base_address, self.state.block_size, empty, empty, empty,
                     state.bad[:0], empty, empty, state.arrays(), empty, empty, state.bad[:0], 0, empty, NO_SUMS,
                     _NO_RECORD)
        return state

    def _stop(self, hpas, lens, n: int) -> tuple[int, int]:
        """Where the stream must stop (the reads before it touch no poisoned block), and
        the poison table's size it was computed for."""
        if not self.state.media.poison.blocks:  # (unlocked: a record added after this stops the stream's first slice)
            return n, 0
        with self.state.lock:
            poisoned = np.array(sorted(self.state.media.poison.blocks), np.int64)
        return loop.clean_prefix(hpas, lens, self.state.block_size, poisoned), poisoned.shape[0]

    def _verify_mode(self, record: tuple) -> tuple[int, np.ndarray, np.ndarray]:
        """Under the lock: how a stream verifies its reaped blocks (state.py's VERIFY_*),
        and the sum table it reads (its arrays change when it grows). A loop that records
        its landed write-backs verifies even when the table starts the slice empty: a
        block it wrote back may be read again in the same slice."""
        table = self.state.media.checksums.sums.table
        if table.count == 0 and record is _NO_RECORD:
            return ss.VERIFY_NONE, table.keys, table.values
        return (ss.VERIFY_HERE if sumtable.COMPILED_HASH else ss.VERIFY_ALL), table.keys, table.values

    def _verify(self, state, complete, hpas, lens, addrs, kinds, clat, failed) -> None:
        """Under the lock: the stream's last reap, checked against the blocks' checksum
        records (a mismatch poisons the block; its read fails over to access()), then
        completed."""
        st = state.st
        if st[ss.ERRNO]:
            err, st[ss.ERRNO] = int(-st[ss.ERRNO]), 0
            raise MediaError(err, f"io_uring reap failed: {os.strerror(err)}")
        n = int(st[ss.REAPED])
        tags, res, bad, blocks = state.reaped_tags[:n], state.reaped_res[:n], state.bad[:n], state.blocks[:n]
        bad[:] = 0
        loop.reaped_blocks(state.arrays(), self.state.block_size, hpas, tags, n, blocks)
        found, _ = self.state.media.checksums.sums.lookup(blocks)
        for j in np.flatnonzero(found).tolist():
            if res[j] == self.state.block_size:
                block = int(blocks[j])
                if not self.state.media.verify_slot(block, self.state.dram.slots[loop.slot_of_reaped(state.arrays(), tags[j])]):
                    bad[j] = 1
        complete(self.state.bt, self.state.ps, self.state.ticks, self.state.dram.base_address, self.state.block_size, hpas, lens, addrs, kinds,
                 clat, failed, state.arrays(), tags, res, bad, n, NO_BLOCKS, NO_SUMS, _NO_RECORD)
        st[ss.REAPED] = 0

    def _account(self, st, counted: int, held: int) -> tuple[int, int]:
        """Under the lock: tell the back end how many fills the stream has out on its ring,
        and the device how many slots it holds BUSY (other threads plan around them, and
        count it as an access in flight while it holds any). Returns both for next time."""
        fills, slots = int(st[ss.FILLS]), int(st[ss.SLOTS])
        self.state.media.ssd.note_queued(fills - counted)
        self.state.inflight_slots += slots - held
        self.state.inflight += (slots > 0) - (held > 0)
        return fills, slots

    def _run(self, job: "_StreamJob", stop: int, deadline_ns: int, counted: int, held: int) -> int:
        """Under the lock: one time slice of the stream's compiled loop (loop_kernels.run)."""
        self.behind.settle()  # its slots are BUSY: no stream plans over them
        log_ctl = self._log_ctl()
        record = self._record(job.state, log_ctl)  # (first: it may grow the sum table)
        dev = self.state
        return job.run(*job.head, stop, deadline_ns, *job.fixed, dev.media.ssd.async_room() + counted,
                       dev.inflight_slots - held, dev.n_slots, job.owner, *self._verify_mode(record),
                       job.state.victim_row.arrays, log_ctl, record, dev.lock.waiting, dev.t0_ns, self.registry.running)

    def _drain(self, job: "_StreamJob", counted: int, held: int) -> None:
        """After an error: issue nothing more, wait for the stream's fills in flight and
        complete them (their slots must not stay BUSY). An error of the driver's part of a
        slice here is raised once everything has landed."""
        st = job.state.st
        error = None
        while st[ss.IN_FLIGHT] or st[ss.N_PARKED] or st[ss.WB_USED] or st[ss.REAPED]:
            with self.state.lock:
                try:
                    status = self._run(job, int(st[ss.NEXT]), 0, counted, held)
                    try:
                        self._settle(job, status)
                    except Exception as exc:  # the rest still lands first: its slots are BUSY until then
                        error = error or exc
                finally:
                    counted, held = self._account(st, counted, held)
                    job.state.note_victims(self.state.block_size)
                    self.state.idle.notify_all()
            if status == ss.REAP_UNLOCKED:
                try:
                    self._reap_unlocked(job)
                except MediaError as exc:
                    error = error or exc
                    break  # the ring failed: what is on it cannot be collected
        if error is not None:
            raise error
