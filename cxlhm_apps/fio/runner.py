"""Runs parsed jobs: files and devices, one thread per job clone, statistics.

Order of events, as in fio: every file a reading job needs is laid out first (a read
of a never-written, sparse region would never reach the disk); jobs run in phases
(`stonewall` starts a new one), all clones of a phase concurrently; each clone runs
ramp_time unrecorded, then until its runtime, byte or I/O budget ends; a writing job
with verify then reads back and checks what it wrote.

Planning (clones, regions, phases, seeds) is cxlhm_apps/fio/plan.py. Devices
(ioengine=cxlhm, cxlhm_apps/fio/devices.py) are shared by every clone whose filename is
the same backing file, opened before the first phase and closed (dirty DRAM
flushed) after the last.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import resource
import sys
import threading
import time

import numpy as np

from cxlhm_apps.fio import buffers, clocks, cmdprio, files, fiorand, flow, minrate, pacing, schedule, sprandom, steadystate
from cxlhm_apps.fio import dry_run, hooks, iolog_replay, placement, syncs, warmup
from cxlhm_apps.fio import verify as VF
from cxlhm_apps.fio.latency_target import DepthSearch, after_batch, max_latency_exceeded, set_engine_depth
from cxlhm_apps.fio.devices import describe_device, open_devices
from cxlhm_apps.fio.notes import notes
from cxlhm_apps.fio.engines import DeviceShare, EngineError, IoArena, engine_of, open_engine
from cxlhm_apps.fio.jobfile import JobSpec
from cxlhm_apps.fio.logs import JobLogs
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.plan import (ClonePlan, blockalign, loop_budget, loop_pass_bytes, plan_clones, seed_for,
                                 zone_file_size)
from cxlhm_apps.fio.pattern import Chunk, IoGenerator, size_choices
from cxlhm_apps.fio.samples import RateSamples
from cxlhm_apps.fio.progress import Progress
from cxlhm_apps.fio.sidework import SideWork
from cxlhm_apps.fio.stats import JobStats, unmeasured
from cxlhm_apps.fio.iolog import IoLogWriter
from cxlhm_apps.fio.pass_boundaries import PassBoundaries
from cxlhm_apps.fio.verify_phase import INLINE_IOS, NEVER, VerifyPhase

# I/Os generated per chunk (bounded by memory when verifying). A chunk's reads are one
# stream that drains at its end (~1.4 ms with no read in flight while the next chunk is
# made), so chunks are long; at low depth shorter (CHUNK_IOS_PER_DEPTH per unit of
# iodepth), so progress and rate limits still see a chunk end every fraction of a second.
CHUNK_IOS = 16384
CHUNK_IOS_PER_DEPTH = 512
VERIFY_ARENA_BYTES = 64 << 20
# I/Os a job with flow control runs between two looks at its share (fio looks before
# every I/O; one I/O per batch costs the interpreter's turn per I/O, and jobs that wait
# for each other in turn would run at a fraction of their speed)
FLOW_BATCH = 64


@dataclasses.dataclass
class CloneResult:
    plan: ClonePlan
    stats: JobStats
    engine: str
    device: dict | None  # device summary for ioengine=cxlhm
    steady: steadystate.SteadyState | None = None  # its steady-state detection (ss_dur)


@dataclasses.dataclass
class RunResult:
    clones: list[CloneResult]
    started: float  # time.time() when the first job started
    devices: list[dict]
    messages: list[str]

    @property
    def failed(self) -> bool:
        return any(c.stats.error for c in self.clones)


# ---------------------------------------------------------------- one clone

class Worker(VerifyPhase, PassBoundaries):
    """Runs one job clone in its own thread."""

    def __init__(self, plan: ClonePlan, share: DeviceShare | None, seed: int, thread_number: int = 1,
                 threads: int = 1):
        self.plan, self.share, self.job = plan, share, plan.job
        self.thread_number = thread_number  # (fio's: 1 up, over every job and clone of the run)
        job = self.job
        self.stats = self._fresh_stats()
        self.verify_kind = VF.spec_of(job, thread_number)
        sizes = size_choices(job.values)
        self.seed = seed
        rw = job["rw"]
        budget = None
        loop_bytes = None
        if not job["time_based"]:
            budget = loop_budget(job, plan)
        loop_bytes = loop_pass_bytes(job, plan)
        fio_seeds = fiorand.FioSeeds.of_job(job, thread_number, seed)  # randseed and the job's number
        file_size = zone_file_size(job, plan)  # (where passes end and strided zones wrap)
        self.gen = IoGenerator(rw=rw, sequencer=job["rw_sequencer"], rwmixread=job["rwmixread"], sizes=sizes,
                               region_start=plan.region_start, region_len=plan.region_len,
                               distribution=job["random_distribution"], randommap=not job["norandommap"],
                               seed=seed, bytes_budget=budget, ios_budget=job["number_ios"],
                               blockalign=blockalign(job), fio=fio_seeds, loop_bytes=loop_bytes,
                               reseed_loops=fio_seeds.reseed_passes, file_size=file_size,
                               zones=((job["zonesize"], job["zonerange"], job["zoneskip"], file_size)
                                      if job["zonemode"] == "strided" else None))
        sprandom.attach(self.gen, job, plan.region_len, fio_seeds)  # (sprandom: its offsets and io_size)
        # fio drops a file's cached pages again as it opens it for a new pass, and, buffered,
        # at each time_based restart (the device has no host page cache)
        page_cache = job["invalidate"] and engine_of(job).plain_file
        self.gen.drop_at_passes, self.gen.drop_at_restarts = page_cache, page_cache and not job["direct"]
        self._ios_done = self._drops_done = self._passes_done = 0  # I/Os the job ran; of gen's marks, those behind
        qd = job["iodepth"]
        # dedupe / compression: every write's bytes made for it (None: the arena's as they are)
        self.buffers = buffers.JobBuffers.of_job(job, thread_index=thread_number - 1, threads=threads,
                                                 region_len=plan.region_len, min_write_bs=sizes[WRITE].min,
                                                 seed=seed + 7)
        # With verify the arena's slots hold the stamped writes until they are issued: it is
        # cut in two halves, so the next chunk is stamped into one on the side thread while
        # the engine runs the current one from the other (fio stamps each block just before
        # it submits it, while the others are in flight).
        self._halves, self._half = 1, 0
        if self.verify_kind or self.buffers is not None:  # (each I/O of a chunk its own slot)
            arena = self.buffers.arena_bytes(qd, self.gen.max_bs) if self.buffers else VERIFY_ARENA_BYTES
            slots = max(qd, min(CHUNK_IOS // 4, arena // self.gen.max_bs))
            self.chunk_ios = slots - slots % qd if slots >= qd else qd
            if job["verify_fatal"]:  # check after every batch, to stop at the first bad block
                self.chunk_ios = qd
            elif slots >= 4 * qd and (self.verify_kind or self.buffers.ahead):
                self._halves = 2
                half = slots // 2
                self.chunk_ios = half - half % qd
        else:
            slots = qd
            most = min(CHUNK_IOS, CHUNK_IOS_PER_DEPTH * qd)
            self.chunk_ios = max(qd, most - most % qd)
        if job["flow"]:  # flow control weighs the jobs' counts batch by batch
            self.chunk_ios = min(self.chunk_ios, max(qd, FLOW_BATCH))
        self.flow = None  # its FlowTicket, where the job sets flow (run_jobs hands them out)
        self.arena = IoArena(slots, self.gen.max_bs, seed)
        # the verify phase's read buffers: the main arena may hold stamped, unissued writes
        # (made here, as fio allocates its buffers before the job starts, not in its time)
        reads_back = VF.verifies_each_pass(job) or (self.verify_kind and job["verify_backlog"])
        self.verify_arena = IoArena(self.arena.slots, self.arena.slot_bytes, seed + 1) if reads_back else None
        self.state = "_"
        self.progress_bytes = [0, 0]
        self.progress_ios = [0, 0]
        # fio's write history and which header fields its verify checks (see VF.VerifyLog)
        uniform = job["random_distribution"] is None or job["random_distribution"].kind == "random"
        self.vlog = VF.VerifyLog(ordered_by_offset=not (rw.random and uniform and not job["norandommap"]),
                                 max_bs=self.gen.max_bs, align=self.gen.align)
        self.check_seed = rw.reads and rw.writes and not job["verify_backlog"]
        fixed_bs = min(c.min for c in sizes) == max(c.max for c in sizes)
        self.check_numberio = rw.writes and fixed_bs and not job["time_based"]
        self.backlog_due = 0  # writes logged since the last backlog verify
        self.writes_done = 0
        self.messages: list[str] = []
        self.engine = None
        self._t_start = 0
        self._wall_start = 0
        self._budget_total = budget
        self._stop = threading.Event()
        # fio's thinktime and rate: which of a chunk's I/Os go when (None: all, at once)
        same_sizes = sizes[READ] == sizes[WRITE] and not self.verify_kind
        pacer = pacing.Pacer(job, (sizes[READ].min, sizes[WRITE].min), same_sizes, seed, self._stop)
        self.pacer = pacer if pacer.paced else None
        self.minrate = minrate.MinRate.of_job(job)  # rate_min / rate_iops_min (None: no minimum)
        self.syncs = syncs.SyncSchedule.of(job, self.gen.pass_starts)  # fsync=N / fdatasync=N (None: none)
        self.steady = steadystate.SteadyState.of_job(job)  # ss_dur: sampled by the run's steadystate.Monitor
        self.logs = JobLogs()  # none; run_jobs gives the clone its own (numbered) where the job asks
        self.iolog: IoLogWriter | None = None  # write_iolog's, from the job's start
        self._side = SideWork(f"cxlhm-fio-{job.name}.{plan.clone}-side")
        self._ahead_bytes = 0  # bytes of the chunk made ahead and not taken yet
        iolog_replay.attach(self, plan.replay)  # read_iolog: the log's I/O, syncs and timing instead

    # -------------------------------------------------------- control from outside
    def stop(self) -> None:
        """End the job early (another job's exitall): what it did so far is reported."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def wait_stopped(self, timeout_s: float) -> bool:
        """Sleep up to `timeout_s`, waking early if the job is ended meanwhile (True then)."""
        return self._stop.wait(timeout_s)

    # -------------------------------------------------------- progress helpers
    def fraction_done(self) -> float | None:
        job = self.job
        if self.state == "_":
            return 0.0
        if self.state in ("E", "D"):
            return 1.0
        if job["runtime"]:
            elapsed = self.engine.now_ns() - self._t_start  # the job's clock: runtime is in it
            frac = elapsed / (job["runtime"] + job["ramp_time"])
            if job["time_based"]:
                return min(frac, 1.0)
        else:
            frac = 0.0
        if self._budget_total:
            frac = max(frac, 1.0 - ((self.gen.bytes_left or 0) + self._ahead_bytes) / self._budget_total)
        return min(frac, 1.0)

    def eta_s(self) -> float | None:
        frac = self.fraction_done()
        if not frac or self._wall_start == 0:
            return None
        elapsed = (time.monotonic_ns() - self._wall_start) / 1e9
        return elapsed * (1 - frac) / frac

    # -------------------------------------------------------- the run
    def open_engine(self) -> None:
        self.engine = dry_run.wrap(open_engine(self), self.job)  # the job's ioengine (verify_only: faked)

    def run(self) -> None:
        ru0 = resource.getrusage(resource.RUSAGE_THREAD)
        wall0 = time.monotonic_ns()
        try:
            try:
                placement.pin(self.job, self.thread_number)
                if hooks.run(self.job, "prerun", self.messages.append):
                    self._run()
                    hooks.run(self.job, "postrun", self.messages.append)
            finally:
                self._side.close()
        except Exception as exc:  # noqa: BLE001 - a job that dies is an error of that job, never a silent end
            code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
            text = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
            self.stats.error, self.stats.error_text = code, text
            self.messages.append(f"fio: job {self.job.name!r}: {text}")
            self.state = "E"
        finally:
            if self.flow is not None:
                self.flow.leave()
            if self.engine is not None:
                try:  # on the model clock, other jobs on the device stop waiting for this one
                    self.engine.drain()
                except Exception:  # noqa: BLE001 - the run's own error, if any, is what counts
                    pass
            ru1 = resource.getrusage(resource.RUSAGE_THREAD)
            helper_usr, helper_sys = self.engine.helper_cpu  # its submitter threads
            self.stats.usr_s = ru1.ru_utime - ru0.ru_utime + helper_usr + self._side.usr_s
            self.stats.sys_s = ru1.ru_stime - ru0.ru_stime + helper_sys + self._side.sys_s
            self.stats.ctx = (ru1.ru_nvcsw + ru1.ru_nivcsw) - (ru0.ru_nvcsw + ru0.ru_nivcsw)
            self.stats.majf = ru1.ru_majflt - ru0.ru_majflt
            self.stats.minf = ru1.ru_minflt - ru0.ru_minflt
            self.stats.cpu_wall_s = (time.monotonic_ns() - wall0) / 1e9  # what the CPU times are shares of
            if not self.job["stats"]:  # fio's stats=0: the job ran, and none of it but its error is reported
                error = self.stats.error, self.stats.error_text
                self.stats = self._fresh_stats()
                self.stats.error, self.stats.error_text = error
            if self.state != "E":
                self.state = "D"

    def _run(self) -> None:
        job, engine = self.job, self.engine
        if job["pre_read"] and engine_of(job).plain_file:  # (which turned invalidate off, as in fio)
            files.pre_read(self.plan.filename, self.plan.region_start, self.plan.region_len, self.gen.max_bs)
        if job["invalidate"] and engine_of(job).plain_file:
            files.drop_cached(self.plan.filename, self.plan.region_start, self.plan.region_len)
        rw = job["rw"]
        self.state = "m" if rw.mixed else ("w" if rw.writes else "r")
        self._wall_start = time.monotonic_ns()
        t0 = self._t_start = engine.now_ns()
        self.logs.start(t0)
        self.iolog = IoLogWriter.of_job(job, self.plan.filename, t0)
        if self.flow is not None:
            self.flow.join()
        pacer = self.pacer
        if pacer is not None:
            if isinstance(getattr(engine, "clock", None), clocks.ModelTimeScheduler):
                raise EngineError(f"{pacer.needs} needs wall time (the model clock never sleeps); "
                                  "use cxlhm_clock=wall")
            pacer.restart(t0)
        if self.minrate is not None:
            self.minrate.restart(t0)
        if self.syncs is not None or job["end_fsync"] or job["fsync_on_close"]:
            syncs.check_can_sync(job, engine)
        search = DepthSearch.of_job(job, engine, t0)  # latency_target
        if search is not None:
            set_engine_depth(engine, search.depth)
        ramp_end = t0 + job["ramp_time"]
        job_end = ramp_end + job["runtime"] if job["runtime"] else NEVER
        measuring = job["ramp_time"] == 0
        self._measure_start = t0
        self._rates = RateSamples(job, t0)  # bwavgtime / iopsavgtime windows
        pending: Chunk | None = None
        ahead = None  # the chunk after `pending`, made on the side thread while the engine runs
        now = t0
        while not self._stop.is_set():
            if pending is None or len(pending) == 0:
                pending = ahead.result() if ahead is not None else self._next_chunk()
                ahead, self._ahead_bytes = None, 0
                if len(pending) == 0:  # (a sync may be due still: SyncSchedule.due_at_end)
                    if self.syncs is not None and self.syncs.due_at_end(self.gen.bytes_left):
                        self._sync(self.syncs.due(), measuring)
                    break
            if now >= job_end:
                break
            next_drop = self._next_boundary()
            if next_drop == self._ios_done:
                self._at_boundary()
                continue
            if self.syncs is not None and self.syncs.due():
                now = self._sync(self.syncs.due(), measuring)
                continue  # (the run time may have ended meanwhile)
            if ahead is None and (not (self.verify_kind or self.buffers) or self._halves == 2):  # (the other half)
                ahead = self._side.submit(self._chunk_ahead)
            deadline = min(job_end, self._rates.next_due(), NEVER if measuring else ramp_end)
            allowed = None  # I/Os flow control lets the job issue before it is ahead again (None: any)
            if self.flow is not None:
                allowed = self.flow.wait_turn(job_end, len(pending), engine.now_ns)
            batch = pending
            if pacer is not None:
                admitted = pacer.admit(pending, engine.now_ns, job_end)
                if admitted == 0:
                    break
                batch = pending.take(0, admitted)
                deadline = min(deadline, pacer.deadline())
            if allowed is not None and len(batch) > allowed:
                batch = batch.take(0, max(1, allowed))
            if self.syncs is not None:
                batch = batch.take(0, self.syncs.run_length(batch.direction))
            if next_drop is not None:
                batch = batch.take(0, min(len(batch), next_drop - self._ios_done))
            if any(job["max_latency"]):  # (fio checks each I/O as it completes: a batch is a queue's worth)
                batch = batch.take(0, min(len(batch), max(1, getattr(engine, "iodepth", 1))))
            if self.minrate is not None and measuring:
                deadline = min(deadline, max(self.minrate.next_check_ns(), engine.now_ns() + 1))
            if self.steady is not None:  # (the once-a-second samples see counts at most this old)
                deadline = min(deadline, engine.now_ns() + steadystate.BATCH_NS)
            if search is not None and measuring:  # (a batch ends where the search's window does)
                deadline = min(deadline, search.batch_deadline(engine.now_ns()))
            done = engine.execute(batch, self.arena, deadline, keep_read_data=bool(self.verify_kind))
            if self.flow is not None:
                self.flow.did(done.count)
            executed, pending = pending.take(0, done.count), pending.take(done.count)
            self._ios_done += done.count
            if self.syncs is not None:
                self.syncs.did_ios(executed.direction)
            if pacer is not None:
                pacer.did(executed)
            now = done.end_ns
            self._account(executed, done, measuring)
            if measuring and any(job["max_latency"]) and "lat" not in self.stats.unmeasured:
                over = max_latency_exceeded(job, self.plan.filename, executed, done)
                if over:  # fio: the job fails with ETIMEDOUT (lat_fatal)
                    self.messages.append(over)
                    self.stats.error, self.stats.error_text = errno.ETIMEDOUT, "max latency exceeded"
                    break
            if self.minrate is not None and measuring:
                self.minrate.did(executed.direction, executed.size)
                below = self.minrate.check(now)
                if below:  # fio: the job fails (EIO, check_min_rate) and ends here
                    self.messages.append(below)
                    self.stats.error, self.stats.error_text = errno.EIO, "check_min_rate: " + below
                    break
            if search is not None and measuring and done.count:
                event, text = after_batch(search, engine, done, now)
                if event == "fatal":  # fio: the job fails with ETIMEDOUT
                    self.messages.append("fio: " + text)
                    self.stats.error, self.stats.error_text = errno.ETIMEDOUT, "max latency exceeded"
                if event == "final":  # converged: statistics only from the depth found
                    self._side.settle()
                    self._reset_stats(now)
                if event in ("fatal", "done"):
                    break
            if not measuring and now >= ramp_end:
                measuring = True
                self._reset_stats(now)
                if pacer is not None:  # (fio's counters start again with the measured part)
                    pacer.restart(now)
                if self.minrate is not None:
                    self.minrate.restart(now)
                if search is not None:
                    search.restart(now)
            self._rates.take(now, self.stats.dirs, job_end)
            if self.verify_kind and job["verify_backlog"] and self.backlog_due >= job["verify_backlog"]:
                self._side.settle()  # (the pass records into the same statistics)
                self._verify_pass(self.vlog.take(self.backlog_due), record=measuring, seeds_from=None)
                self.backlog_due = 0
        self._side.settle()
        if job["end_fsync"] and not self.stats.error:  # (fio: as its I/O ends, inside the run time, not counted)
            engine.drain()
            engine.flush()
        if self.flow is not None:  # (run() also lets go of it when the job fails)
            self.flow.leave()
        main_ios = [d.ios for d in self.stats.dirs]  # what the job's own phase did, per direction
        main_end = verify_start = engine.now_ns()
        verified_from = None if job["time_based"] else self._verify_written()  # (fio: the run time ended it)
        if verified_from is not None:
            main_end = verify_start = verified_from
        end = engine.drain()  # the job's last I/O has completed
        stats = self.stats  # a new object if ramp_time reset it
        sprandom.settle(self.gen, stats, getattr(engine, "iodepth", 1))  # (fio's report of its end)
        run_ms = max(1, (end - self._measure_start) // 1_000_000)
        stats.run_ms = run_ms
        stats.latency_depth = search.depth if search is not None else 0
        stats.elapsed_s = max(1, round((end - t0) / 1e9))
        # fio's runtime per direction: the job's phase for the directions it did, and the
        # verify phase's time added to the reads (job_runtime covers both)
        main_ms = max(1, (main_end - self._measure_start) // 1_000_000)
        verify_ms = (end - verify_start) // 1_000_000
        timed = dry_run.timed_directions(engine, main_ios)
        for d, dir_stats in enumerate(stats.dirs):
            dir_stats.runtime_ms = (main_ms if timed[d] else 0) + (verify_ms if d == READ else 0)
            if (timed[d] or d == READ) and dir_stats.ios and not dir_stats.runtime_ms:
                dir_stats.runtime_ms = 1
            if not dir_stats.ios:
                dir_stats.runtime_ms = 0
            dir_stats.slat_measured = engine_of(job).measures_slat
        if stats.verify_errors:
            stats.error = errno.EILSEQ
            stats.error_text = f"{stats.verify_errors} verification failure(s)"
        if job["fsync_on_close"] and not stats.error:  # (fio: as the file closes, after the run time)
            engine.flush()

    def _record(self, small: bool, fn, *args) -> None:
        """Statistics work: on the side thread while the engine runs the next batch, or,
        after a batch of a few I/Os, here: a side task would hold the interpreter's lock
        through the next I/O's measured time (fsync=1 made each write read 3x fio's)."""
        if small:
            self._side.settle()
            fn(*args)
        else:
            self._side.submit(fn, *args)

    def _sync(self, kind: int, measuring: bool) -> int:
        """A sync fsync=N / fdatasync=N made due: the I/Os in flight complete, then the
        engine's flush; its latency goes to the sync statistics. Returns its end."""
        engine = self.engine
        start = engine.drain()
        end = engine.flush(data_only=kind == syncs.FDATASYNC)
        self.syncs.did_sync()
        if self.iolog is not None:
            self.iolog.sync(kind == syncs.FDATASYNC, end)
        if measuring:
            self._record(True, self.stats.record_sync, end - start, kind == syncs.FSYNC)
        return end

    def _chunk_ahead(self) -> Chunk:
        """The next chunk, made before the current one ran: progress counts its bytes as
        still to do (the generator's budget already has them spent)."""
        chunk = self._next_chunk()
        self._ahead_bytes = int(chunk.size.sum())
        return chunk

    def _next_chunk(self) -> Chunk:
        direction, offset, size = self.gen.next_chunk(self.chunk_ios)
        n = offset.shape[0]
        per_half = self.arena.slots // self._halves
        slot = np.arange(n, dtype=np.int64) % per_half + self._half * per_half
        self._half = (self._half + 1) % self._halves
        chunk = Chunk(direction, offset, size, slot)
        if self.buffers is not None:
            writes = np.flatnonzero(direction == WRITE)
            self.buffers.fill(self.arena.data, slot[writes] * self.arena.slot_bytes, size[writes], offset[writes])
        if self.verify_kind:
            chunk.serial = np.full(n, -1, np.int64)
            writes = np.flatnonzero(direction == WRITE)
            serials = np.arange(self.writes_done, self.writes_done + writes.shape[0], dtype=np.int64)
            chunk.serial[writes] = serials
            self.writes_done += writes.shape[0]
            VF.stamp_many(self.arena.data, slot[writes] * self.arena.slot_bytes, size[writes], self.verify_kind,
                          offset[writes], VF.seeds_of(self.seed, serials), serials)
        return chunk

    def _account(self, chunk: Chunk, done, measuring: bool) -> None:
        if done.count == 0:
            return
        if self.iolog is not None:
            self.iolog.batch(chunk, done, self._ios_done, self.gen.pass_starts)
        if measuring and self.logs.active:
            tags = getattr(done, "prio", None)  # (an engine's command priorities, cmdprio.py)
            self.logs.record(chunk.direction, chunk.size, done.slat, done.clat, done.end_ns, chunk.offset,
                             None if tags is None else cmdprio.ioprio_of(tags))
        stats = self.stats
        small = done.count < INLINE_IOS
        for d in (READ, WRITE):
            mask = chunk.direction == d
            if not mask.any():
                continue
            nbytes, nios = int(chunk.size[mask].sum()), int(mask.sum())
            self.progress_bytes[d] += nbytes
            self.progress_ios[d] += nios
            self._rates.add(d, nbytes, nios)
            if measuring:
                slat = done.slat[mask] if done.slat is not None else None  # (copies: the side thread's own)
                prio = getattr(done, "prio", None)  # (an engine's command priorities, cmdprio.py)
                self._record(small, stats.record, d, nbytes, nios, slat, done.clat[mask], None,
                                  None if prio is None else prio[mask])
                stats.dirs[d].cache_hits += int(done.cache[d][0])
                stats.dirs[d].cache_misses += int(done.cache[d][1])
        if measuring:
            self._record(small, stats.mark_depth, done.count, done.depth)
            stats.submit_map += done.submits
            stats.complete_map += done.submits
        if self.verify_kind:
            self._after_verified_io(chunk)

    def _fresh_stats(self) -> JobStats:
        return JobStats(self.job.name, self.plan.groupid, iodepth=self.job["iodepth"], unmeasured=unmeasured(self.job))

    def _reset_stats(self, now: int) -> None:
        self.stats = self._fresh_stats()
        self._measure_start = now
        self._rates.restart(now)

    def close(self) -> None:
        self.logs.close(self.engine.now_ns() if self.engine is not None else None)
        if self.iolog is not None:
            self.iolog.close(self.engine.now_ns())
        if self.engine is not None:
            self.engine.close()
        self.arena.close()
        if self.verify_arena is not None:
            self.verify_arena.close()


# ---------------------------------------------------------------- the whole run

def run_jobs(jobs: list[JobSpec], *, progress: bool = False, log=None, readonly: bool = False) -> RunResult:
    """Run every job; raises JobFileError for problems found while setting up. `readonly`
    (fio's --readonly): no file is created, extended or laid out."""
    log = log or (lambda text: print(text, file=sys.stderr))
    plans = plan_clones(jobs)
    for note in notes(jobs) + iolog_replay.notes(plans):  # (and fio's words for the lines of a log it skips)
        log(note)
    for plan in plans:
        files.set_up(plan, engine_of(plan.job), log, readonly=readonly)
    shares = open_devices(plans, log)
    warmup.warm_up(plans)  # (compiled kernels loaded now, not inside a job's run time)
    workers: list[Worker] = []
    started = time.time()
    try:
        for plan in plans:
            share = shares.get(os.path.realpath(plan.filename)) if engine_of(plan.job).uses_device else None
            worker = Worker(plan, share, seed_for(plan.job, plan.clone), thread_number=len(workers) + 1,
                            threads=len(plans))
            workers.append(worker)
            worker.logs = JobLogs(plan.job, len(workers))  # (fio numbers the logs by clone, from 1)
            worker.open_engine()
        flow_tickets = flow.tickets(workers)
        for worker in workers:
            worker.flow = flow_tickets.get(id(worker))
        meter = Progress(workers) if progress else None
        if meter:
            meter.start()
        steady = steadystate.Monitor(workers)
        steady.start()
        genesis_ns = time.monotonic_ns()  # (fio's genesis: what startdelay counts from)
        try:
            ended = False  # (a job with exitall and exit_what=all finished: no later phase runs)
            for phase in sorted({p.phase for p in plans}):
                if ended:
                    for w in workers:
                        if w.plan.phase == phase:
                            w.state = "D"
                    continue
                ended = schedule.run_phase([w for w in workers if w.plan.phase == phase], genesis_ns)
                for w in workers:
                    if w.plan.phase == phase and w.state not in ("D", "E"):  # its thread died past run()'s guard
                        w.stats.error, w.stats.error_text = errno.EIO, "the job's thread ended without finishing"
                        w.messages.append(f"fio: job {w.job.name!r}: {w.stats.error_text}")
                        w.state = "E"
        finally:
            steady.stop()
            if meter:
                meter.stop()
    finally:
        for worker in workers:
            worker.close()
        devices = []
        for share in shares.values():
            info = describe_device(share)
            info["counters"] = share.handle.stats()
            devices.append(info)
            share.handle.close()
    for plan in plans:  # (fio's unlink: its file goes once the job is done; here once the run is)
        if plan.job["unlink"] and engine_of(plan.job).plain_file:
            files.remove(plan.filename)
    messages = [m for w in workers for m in w.messages]
    device_by_path = {d["backing_file"]: d for d in devices}
    clones = [CloneResult(w.plan, w.stats, w.job["ioengine"],
                          device_by_path.get(os.path.realpath(w.plan.filename)) if engine_of(w.job).uses_device
                          else None, w.steady)
              for w in workers]
    return RunResult(clones, started, devices, messages)
