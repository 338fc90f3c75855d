"""A fio ioengine for `cxlhm fio` in one file: `ioengine=datasync`, pread(2)/pwrite(2)
on the job's file with fdatasync(2) after every `datasync_every` writes (the write that
triggers one waits for it, and its latency includes it).

Register it and a job file names it:

    from cxlhm_apps.fio.ioengine import ENGINES
    ENGINES.register("datasync", "examples.extending.fio_engine:OPS")   # or an entry point:
    # [project.entry-points."cxlhm.fio_engines"]  datasync = "mypkg.fio_engine:OPS"

    [j]
    ioengine=datasync
    datasync_every=8
    rw=randwrite
    size=64m

tests/test_example_fio_engine.py runs it through the shipped conformance suite
(cxlhm_apps.fio.testing.IOEngineConformance).
"""
from __future__ import annotations

import os
import time

import numpy as np

from cxlhm_apps.fio.ioengine import IOENGINE_VERSION, Completed, EngineFlags, EngineJob, IOEngineOps
from cxlhm_apps.fio.options import Option
from cxlhm_apps.fio.stats import submit_bucket


def _count(text: str, kb_base: int) -> int:
    """An option's parser: the text as written and the job's kb_base; ValueError says
    what is wrong (the job file's line is added by the parser)."""
    n = int(text, 0)
    if n < 0:
        raise ValueError(f"must be an integer >= 0, got {text!r}")
    return n


DATASYNC_EVERY = Option("datasync_every", "int", _count, 1,
                        "ioengine=datasync: fdatasync(2) after this many writes (0: never)", group="engine")


class DatasyncEngine:
    """One job clone's open file. execute() runs a chunk's I/Os one at a time, in order."""
    helper_cpu = (0.0, 0.0)  # no threads of its own

    def __init__(self, job: EngineJob):
        self.every = job.options["datasync_every"]
        self.writes = 0
        flags = (os.O_RDWR if job.writes else os.O_RDONLY) | (os.O_DIRECT if job.direct else 0)
        try:
            self.fd = os.open(job.filename, flags | os.O_CLOEXEC)
        except OSError as exc:
            raise job.error("filename", f"ioengine=datasync: cannot open {job.filename}: {exc.strerror}") from None

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def execute(self, chunk, arena, deadline_ns: int, *, keep_read_data: bool) -> Completed:
        n = len(chunk)
        clat = np.zeros(n, np.int64)
        done = 0
        for i in range(n):
            start = time.monotonic_ns()
            if start >= deadline_ns:
                break
            offset, size, write = int(chunk.offset[i]), int(chunk.size[i]), bool(chunk.direction[i])
            buf = arena.view(int(chunk.slot[i]), size)  # reads land in the slot whether verify reads it or not
            got = os.pwrite(self.fd, buf, offset) if write else os.preadv(self.fd, [buf], offset)
            if got != size:
                raise OSError(5, f"{'write' if write else 'read'} at offset {offset}: {got} of {size} bytes")
            if write:
                self.writes += 1
                if self.every and self.writes % self.every == 0:
                    os.fdatasync(self.fd)
            clat[i] = time.monotonic_ns() - start
            done += 1
        submits = np.zeros(7, np.int64)
        submits[submit_bucket(1)] = done  # one I/O per submission
        return Completed(done, None, clat[:done], time.monotonic_ns(), 1, submits, np.zeros((2, 2), np.int64))

    def drain(self) -> int:
        return time.monotonic_ns()  # every I/O completed inside execute()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


OPS = IOEngineOps(
    name="datasync",
    version=IOENGINE_VERSION,
    open=DatasyncEngine,
    flags=EngineFlags.SYNC,  # one I/O at a time: fio caps the job's iodepth at 1 and says so
    options=(DATASYNC_EVERY,),
    refused={"datasync_range": "sync_file_range(2) is not modelled (fdatasync syncs the whole file)"},
    help="pread(2)/pwrite(2) with fdatasync(2) every datasync_every writes",
)
