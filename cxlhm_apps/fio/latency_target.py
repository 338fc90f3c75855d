"""fio's latency-target queue-depth search (latency_target, latency_window,
latency_percentile, latency_run), with fio 3.33's rule (io_u.c, lat_target_*).

The job starts at depth 1. An I/O whose latency (submission to completion, fio's `lat`)
exceeds latency_target counts as failed. At the end of each latency_window the share
of I/Os that met the target is compared with latency_percentile: met, the depth goes
up (doubled while nothing failed yet, else halfway to the lowest depth that failed);
missed, it goes down (halfway to the highest depth that met it). With
latency_percentile=100 one failed I/O lowers the depth at once, and at depth 1 it is
fatal (ETIMEDOUT), as in fio. When a success leaves the depth where it was the search
has converged: the statistics start again and the job runs one more window at that
depth; a success there ends the job. With latency_run=1 none of that: the search goes
on to the end of the run, and, as fio's, after three successes in a row just below the
lowest failing depth it tries that depth again (the ceiling moves up by one).

The depth caps how many I/Os the job keeps in flight (fio's queue_full); the engine was
opened at the job's iodepth, the search's maximum, and keeps at most the search's depth
in flight from its next batch on (`set_engine_depth`).

What differs from fio: fio looks at every completion; here the runner looks after
each batch of I/Os an engine ran (a batch ends at the window's end), so a failure at
latency_percentile=100 lowers the depth at the end of its batch, not at that I/O.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cxlhm_apps.fio.options import READ, WRITE


LATE_WINDOW_NS = 1_000_000  # a batch after a window's end runs this long before the window is judged


@dataclasses.dataclass
class SearchState:
    """fio's td->latency_qd, latency_qd_low, latency_qd_high, latency_end_run."""
    depth: int
    low: int
    high: int
    max_depth: int
    end_run: bool = False
    stable: int = 0  # fio's latency_stable_count: successes in a row just below the ceiling


def start(max_depth: int) -> SearchState:
    """lat_target_init: depth 1, searching 1..iodepth."""
    return SearchState(depth=1, low=1, high=max_depth, max_depth=max_depth)


def on_success(s: SearchState, keep_running: bool = False) -> str:
    """lat_target_success; returns "" (go on), "final" (converged: start the final
    window with fresh statistics) or "done" (the final window met the target).
    `keep_running` (latency_run): never converged, the search goes on."""
    before = s.depth
    s.low = s.depth
    if s.depth + 1 == s.high:  # stuck below the ceiling: after 3 successes in a row, raise it
        s.stable += 1
        if s.stable >= 3:
            s.high += 1
            s.stable = 0
    if s.high != s.max_depth:
        s.depth = (s.depth + s.high) // 2
    else:
        s.depth *= 2
    s.depth = min(s.depth, s.max_depth)
    if s.depth == before and not keep_running:
        if s.end_run:
            return "done"
        s.end_run = True
        return "final"
    return ""


def on_failure(s: SearchState) -> bool:
    """__lat_target_failed; False at depth 1 (nothing lower to try), else lowers the depth."""
    if s.depth == 1:
        return False
    s.high = s.depth
    if s.depth == s.low:
        s.low -= 1
    s.depth = (s.depth + s.low) // 2
    s.stable = 0
    return True


class DepthSearch:
    """One job clone's search, fed the latencies of each batch of completions."""

    def __init__(self, target_ns: int, window_ns: int, percentile: float, max_depth: int, keep_running: bool,
                 now_ns: int):
        self.target_ns, self.window_ns, self.percentile = target_ns, window_ns, percentile
        self.keep_running = keep_running
        self.state = start(max_depth)
        self._new_cycle(now_ns)

    @classmethod
    def of_job(cls, job, engine, now_ns: int) -> DepthSearch | None:
        """The job's search (None without latency_target), up to the depth `engine` was
        opened with (its `iodepth`, which the search then lowers and raises); an engine
        that keeps no adjustable depth is refused."""
        if not job["latency_target"]:
            return None
        if not isinstance(getattr(engine, "iodepth", None), int):
            raise ValueError(f"latency_target: the queue-depth search needs an engine whose depth can change "
                             f"(an `iodepth` it keeps in flight), not ioengine={job['ioengine']}")
        return cls(job["latency_target"], job["latency_window"], job["latency_percentile"], engine.iodepth,
                   bool(job["latency_run"]), now_ns)

    @property
    def depth(self) -> int:
        return self.state.depth

    def _new_cycle(self, now_ns: int) -> None:
        self.window_start, self.ios, self.failed = now_ns, 0, 0

    def window_end(self) -> int:
        return self.window_start + self.window_ns

    def batch_deadline(self, now_ns: int) -> int:
        """Where the engine's next batch ends: at the window's end, or, when that has passed
        unjudged (the last batch ended before it, this one starts after), a moment later -
        a deadline already past would run no I/O, and the window is judged only after a
        batch that ran some."""
        end = self.window_end()
        return end if end > now_ns else now_ns + LATE_WINDOW_NS

    def restart(self, now_ns: int) -> None:
        """The measured part begins (after ramp_time): a fresh window."""
        self._new_cycle(now_ns)

    def observe(self, lat_ns: np.ndarray, now_ns: int) -> str:
        """Take a batch's latencies; returns "", "final", "done" or "fatal" (a failed
        I/O at depth 1 with latency_percentile=100)."""
        over = int(np.count_nonzero(lat_ns > self.target_ns))
        if self.percentile == 100.0 and over:
            if not on_failure(self.state):
                return "fatal"
            self._new_cycle(now_ns)
            return ""
        self.ios += int(lat_ns.shape[0])
        self.failed += over
        if now_ns - self.window_start < self.window_ns or self.ios == 0:
            return ""
        met = (self.ios - self.failed) / self.ios * 100.0
        if met >= self.percentile:
            event = on_success(self.state, self.keep_running)
            self._new_cycle(now_ns)
            return event
        if on_failure(self.state):
            self._new_cycle(now_ns)
        return ""


def set_engine_depth(engine, depth: int) -> None:
    """Let an engine keep `depth` I/Os in flight from its next batch on (at most the
    iodepth it was opened with, which sized its queues; the device engine checks that)."""
    engine.iodepth = depth
    opened_batch = engine.__dict__.setdefault("_opened_submit_batch", getattr(engine, "submit_batch", None))
    if opened_batch is not None:  # (io_uring's SQEs per submit: never more than are in flight)
        engine.submit_batch = max(1, min(opened_batch, depth))


def after_batch(search: DepthSearch, engine, done, now_ns: int) -> tuple[str, str]:
    """Feed a batch's latencies (slat + clat) to the search and give the engine the
    depth it chose; returns (event, fio's error text for "fatal")."""
    lat = np.asarray(done.clat[:done.count], np.int64)
    if done.slat is not None:
        lat = lat + np.asarray(done.slat[:done.count], np.int64)
    event = search.observe(lat, now_ns)
    set_engine_depth(engine, search.depth)
    if event == "fatal":
        return event, f"latency of {int(lat.max())} nsec exceeds specified max ({search.target_ns} nsec)"
    return event, ""


def max_latency_exceeded(job, filename: str, chunk, done) -> str | None:
    """fio's max_latency (its lat_fatal line) for the first I/O of a batch whose total
    latency exceeds the job's max_latency for its direction, or None."""
    lat = np.asarray(done.clat, np.int64) + (np.asarray(done.slat, np.int64) if done.slat is not None else 0)
    limit = np.where(chunk.direction == WRITE, job["max_latency"][WRITE], job["max_latency"][READ])
    over = np.flatnonzero((limit > 0) & (lat > limit))
    if not over.shape[0]:
        return None
    i = int(over[0])
    return (f"fio: latency of {int(lat[i])} nsec exceeds specified max ({int(limit[i])} nsec): "
            f"{filename} {'write' if chunk.direction[i] == WRITE else 'read'} {int(chunk.offset[i])} {int(chunk.size[i])}")
