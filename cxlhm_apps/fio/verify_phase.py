"""The verify part of a job clone (runner.Worker inherits it): the history of what the
job wrote, the checks of what it reads back, and the verify phase that reads it all back
at the end, as fio 3.33's verify does (cxlhm_apps/fio/verify.py holds the headers and
checksums; docs/fio.md, Verification, the meaning)."""
from __future__ import annotations

import functools
import os

import numpy as np

from cxlhm_apps.fio import dry_run, files
from cxlhm_apps.fio import verify as VF
from cxlhm_apps.fio.engines import engine_of
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.pattern import Chunk

MAX_REPORTED_VERIFY_ERRORS = 10
NEVER = 2**62  # (a deadline that does not come)
# a batch of fewer I/Os has its statistics recorded on the job's own thread (Worker._record)
INLINE_IOS = 64


class VerifyPhase:
    """Worker's verify methods. They use the worker's job, plan, engine, arena, stats,
    messages, seed, vlog, verify_kind, check_seed, check_numberio, backlog_due,
    progress counters, _stop and _record."""

    def _before_verify(self) -> None:
        """As fio's verify phase begins: what the job wrote made durable (the engine's
        flush: an fsync, or the device's write-back), then the file's cached pages dropped
        so the reads come from the disk (fio does both whatever `invalidate` says; its time
        is the verify phase's)."""
        flush = getattr(self.engine, "flush", None)
        if flush is not None:
            flush()
        if engine_of(self.job).plain_file:
            files.drop_cached(self.plan.filename, self.plan.region_start, self.plan.region_len)

    @functools.cached_property
    def verify_each_pass(self) -> bool:
        """Whether each `loops` pass is verified before the next begins (fio's do_verify
        after every do_io of a job that writes); the last pass is the job's end."""
        return VF.verifies_each_pass(self.job)

    @functools.cached_property
    def _fake_io(self) -> bool:
        """A diskless engine moves no data: fio's verify passes it unchecked."""
        return engine_of(self.job).diskless

    def _verify_written(self) -> int | None:
        """fio's do_verify: what the job wrote since the last one, read back and checked.
        Returns the time the reads began (None: nothing to verify)."""
        if not (self.verify_each_pass and len(self.vlog)) or self._stop.is_set() or self.stats.error:
            return None
        self.state = "V"
        dry_run.end(self.engine)  # (verify_only: the job's own I/O was faked, its verify is not)
        start = self.engine.drain()
        if self.iolog is not None:
            self.iolog.reopen(start)
        self._before_verify()
        # fio draws the pass's write seeds again from their start for its verify phase
        blocks = self.vlog.take()
        first = min(b.numberio for b in blocks)  # (the pass's first write: its seeds began there)
        self._verify_pass(blocks, record=True, seeds_from=first if self.check_seed else None)
        self._side.settle()  # (its statistics are recorded on the side thread)
        return start

    def _after_verified_io(self, chunk: Chunk) -> None:
        """Log the chunk's writes (fio's history); check its reads where fio does: every
        read of a job that only reads (the header names its own seed). A job that also
        writes checks only what its verify phase or verify_backlog reads back."""
        is_write = chunk.direction == WRITE
        writes = np.flatnonzero(is_write)
        if writes.shape[0]:
            # on the side thread while the next batch is in flight (the history is read
            # only after a settle: a pass's verify, verify_backlog)
            self._record(len(chunk) < INLINE_IOS, self._log_writes, chunk.offset[writes], chunk.size[writes],
                         chunk.serial[writes])
            self.backlog_due += writes.shape[0]
        if not self.job["rw"].writes and not self._fake_io:
            reads = np.flatnonzero(~is_write)
            self.stats.verified_blocks += reads.shape[0]
            starts = chunk.slot[reads] * self.arena.slot_bytes
            for j, failure in VF.check_many(self.arena.data, starts, chunk.size[reads], self.verify_kind,
                                            chunk.offset[reads]):
                self._verify_failed(failure, self.arena.data, int(starts[j]), int(chunk.offset[reads[j]]))

    def _log_writes(self, offsets: np.ndarray, sizes: np.ndarray, serials: np.ndarray) -> None:
        add, written = self.vlog.add, VF.Written
        for offset, size, seed, serial in zip(offsets.tolist(), sizes.tolist(),
                                              VF.seeds_of(self.seed, serials).tolist(), serials.tolist()):
            add(written(offset, size, seed, serial))

    def _verify_failed(self, failure: VF.VerifyFailure, data: np.ndarray, start: int, io_offset: int) -> None:
        """A failed check of the I/O at `io_offset`, read into data[start:]."""
        self.stats.verify_errors += 1
        if self.stats.verify_errors <= MAX_REPORTED_VERIFY_ERRORS:
            self.messages.append(failure.message(self.plan.filename))
        if self.job["verify_dump"]:  # (fio's dump_buf: the failing header's span, in the working folder)
            kind = "hdr_fail" if failure.what.startswith("bad ") else "received"  # (a header field, or the data)
            name = f"{os.path.basename(self.plan.filename)}.{failure.offset}.{kind}"
            at = start + failure.offset - io_offset
            with open(name, "wb") as f:
                f.write(data[at:at + failure.length].tobytes())
            self.messages.append(f"       {kind} data dumped as {name}")
        if self.job["verify_fatal"]:
            self._stop.set()

    def _verify_pass(self, blocks: list[VF.Written], *, record: bool, seeds_from: int | None) -> None:
        """Read back `blocks` in order and check each one as fio does: the seed of the
        j-th block checked is the (seeds_from + j)-th write's seed (None: the header's
        own), its write number where fio checks it."""
        engine = self.engine
        arena = self.verify_arena
        step = arena.slots
        for start in range(0, len(blocks), step):
            part = blocks[start:start + step]
            n = len(part)
            chunk = Chunk(np.zeros(n, np.int8), np.array([b.offset for b in part], np.int64),
                          np.array([b.size for b in part], np.int64), np.arange(n, dtype=np.int64))
            pos = 0  # blocks of `part` already read back
            while len(chunk):
                done = engine.execute(chunk, arena, NEVER, keep_read_data=True)
                executed, chunk = chunk.take(0, done.count), chunk.take(done.count)
                if self.iolog is not None:
                    self.iolog.batch(executed, done)
                if record:  # (on the side thread, as the job's own I/O: the checks below need the job's)
                    stats = self.stats
                    slat = None if done.slat is None else np.array(done.slat, np.int64)  # (the side thread's own)
                    small = len(executed) < INLINE_IOS
                    self._record(small, stats.record, READ, int(executed.size.sum()), len(executed), slat,
                                      np.array(done.clat, np.int64), None)
                    self._record(small, stats.mark_depth, len(executed), done.depth)
                    stats.submit_map += done.submits
                    stats.complete_map += done.submits
                self.progress_bytes[READ] += int(executed.size.sum())
                self.progress_ios[READ] += len(executed)
                first = start + pos  # the history's index of executed's first block
                seeds = None
                if seeds_from is not None:
                    seeds = VF.seeds_of(self.seed, np.arange(seeds_from + first, seeds_from + first + len(executed)))
                numberios = None
                if self.check_numberio:
                    numberios = np.array([blocks[j].numberio for j in range(first, first + len(executed))], np.int64)
                failures = () if self._fake_io else VF.check_many(
                    arena.data, executed.slot * arena.slot_bytes, executed.size, self.verify_kind, executed.offset,
                    seeds, numberios)
                for i, failure in failures:
                    self._verify_failed(failure, arena.data, int(executed.slot[i]) * arena.slot_bytes,
                                        int(executed.offset[i]))
                    if self._stop.is_set():  # verify_fatal: what was checked ends at this block
                        self.stats.verified_blocks += i + 1
                        return
                self.stats.verified_blocks += len(executed)
                pos += len(executed)
