"""fio's verify_only: a job that writes does not perform its workload; its I/Os are made
and counted as done without reaching the file (fio's do_dry_run), so the write history
is the one the same job left last time, and the verify phase reads back and checks
what is there. A job that only reads runs as it would, checking what it reads.

What fio 3.33 reports for the dry run, and so this: every I/O of the job (a mixed job's
reads too) counted as done at depth 1 and no latency, the writes with no run time."""
from __future__ import annotations

import numpy as np

from cxlhm_apps.fio.ioengine import Completed
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.stats import submit_bucket


class DryRunEngine:
    """The job's engine, with its I/Os faked until the verify phase begins (`dry` off);
    everything else is the engine's own."""

    def __init__(self, engine):
        self._engine = engine
        self.dry = True

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def execute(self, chunk, arena, deadline_ns: int, *, keep_read_data: bool) -> Completed:
        if not self.dry:
            return self._engine.execute(chunk, arena, deadline_ns, keep_read_data=keep_read_data)
        n = len(chunk)
        submits = np.zeros(7, np.int64)
        submits[submit_bucket(1)] = n
        return Completed(n, None, np.zeros(n, np.int64), self._engine.now_ns(), 1, submits,
                         np.zeros((2, 2), np.int64))


def wrap(engine, job):
    """The engine a job runs its own I/O on: faked under verify_only where it writes."""
    return DryRunEngine(engine) if job["verify_only"] and job["rw"].writes else engine


def end(engine) -> None:
    """The verify phase begins: its reads are real."""
    if isinstance(engine, DryRunEngine):
        engine.dry = False


def timed_directions(engine, main_ios) -> list[bool]:
    """The directions whose run time counts the job's own phase: those it did, less the
    writes of a dry run."""
    dry = isinstance(engine, DryRunEngine)
    return [main_ios[d] > 0 and not (dry and d == WRITE) for d in (READ, WRITE)]
