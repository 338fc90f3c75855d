"""fio's null engine: no file and no data, every I/O done as soon as it is queued. fio's
users run it to measure fio itself and to check a job's pattern (offsets, sizes, mix,
distributions) without a disk; fio's own regression jobs lean on it.

As fio's engines/null.c:
- No file: nothing is created, laid out, opened, cached or unlinked (FIO_DISKLESSIO), so
  a job needs size=; filename= only names it.
- No data (FIO_FAKEIO): reads leave their buffers as they are and a verify passes
  without a check, as fio's verify_io_u does for a fake-I/O engine.
- iodepth=1 is synchronous (fio marks the engine FIO_SYNCIO then): no submission
  latency, no submit/complete histogram. With iodepth > 1 a queued batch
  (iodepth_batch_submit I/Os, one by default) is committed as one set of events, and
  the next queue waits until they are reaped: that many I/Os are in flight at a time,
  the depth fio's report shows.
- A sync (fsync=, end_fsync, the verify phase's start) completes at once.

What differs: the per-I/O cost is this loop's (a few hundred nanoseconds against fio's
tens), so the IOPS measure this tool, as fio's null measures fio.
"""
from __future__ import annotations

import time

import numpy as np

from cxlhm_apps.fio.ioengine import IOENGINE_VERSION, Completed, EngineFlags, EngineJob, IOEngineOps
from cxlhm_apps.fio.stats import submit_bucket


class NullEngine:
    helper_cpu = (0.0, 0.0)

    def __init__(self, iodepth: int, batch: int):
        self.asynchronous = iodepth > 1
        self.batch = max(1, min(batch or iodepth, iodepth)) if self.asynchronous else 1

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def drain(self) -> int:
        return time.monotonic_ns()

    def flush(self, data_only: bool = False) -> int:
        return time.monotonic_ns()

    def execute(self, chunk, arena, deadline_ns: int, *, keep_read_data: bool) -> Completed:
        n = len(chunk)
        slat = np.zeros(n, np.int64)
        clat = np.zeros(n, np.int64)
        clock = time.monotonic_ns
        step = self.batch
        done = 0
        while done < n:
            prepared = clock()
            if prepared >= deadline_ns:
                break
            k = min(step, n - done)
            queued = clock()  # the batch queued and committed
            reaped = clock()  # its events reaped
            slat[done:done + k] = queued - prepared
            clat[done:done + k] = reaped - queued
            done += k
        submits = np.zeros(7, np.int64)
        if self.asynchronous and done:
            whole, rest = divmod(done, step)
            submits[submit_bucket(step)] += whole
            if rest:
                submits[submit_bucket(rest)] += 1
        return Completed(done, slat[:done] if self.asynchronous else None, clat[:done], clock(), self.batch,
                         submits, np.zeros((2, 2), np.int64))

    def close(self) -> None:
        pass


def _open(job: EngineJob) -> NullEngine:
    return NullEngine(job.iodepth, int(job.options.get("iodepth_batch_submit") or 1))


NULL = IOEngineOps("null", IOENGINE_VERSION, _open, EngineFlags.DISKLESS | EngineFlags.MEASURES_SLAT, (), {},
                   "no file and no data: each I/O completes as it is queued (measures the tool itself, "
                   "checks a job's pattern)")
