"""fio's write_iolog: the job's I/O written down in fio's trace format v3, the one fio
3.31 and later write and read back with read_iolog:

    fio version 3 iolog
    <us> <file> add
    <us> <file> open
    <us> <file> read|write <offset> <length>
    <us> <file> sync|datasync <offset> 0
    <us> <file> close

<us> counts microseconds from the clone's start. As fio: the file is closed and opened
again at each new `loops` pass and before the verify phase, whose reads are logged
too; a sync names the offset of the last write before it; the log file is opened for
appending, so the clones of a job (and a later run) add to one file, each clone's
lines its own block.

What differs from fio: an engine hands back a batch of I/Os at once, so an I/O's time
is estimated from its batch (back from the batch's end by the latencies of the I/Os
after it on a synchronous engine, by its own latency on an asynchronous one); fio
writes each I/O's own issue time. fio appends its clones' lines in 8 KiB pieces as its
buffer fills, so theirs interleave in a long log; here each clone's come whole, as it
ends.
"""
from __future__ import annotations

import numpy as np

from cxlhm_apps.fio.logs import append_whole

VERSION_LINE = "fio version 3 iolog"


class IoLogWriter:
    """One job clone's trace (None of it unless the job names write_iolog)."""

    @classmethod
    def of_job(cls, job, filename: str, start_ns: int) -> "IoLogWriter | None":
        return cls(job["write_iolog"], filename, start_ns, one_at_a_time=job["iodepth"] == 1) \
            if job["write_iolog"] else None

    def __init__(self, path: str, filename: str, start_ns: int, *, one_at_a_time: bool = True):
        self.path, self.filename, self.start_ns = path, filename, start_ns
        self.lines = [VERSION_LINE]
        self.last_write = 0
        self.one_at_a_time = one_at_a_time
        self._file_event("add", start_ns)
        self._file_event("open", start_ns)

    def _us(self, ns) -> np.ndarray | int:
        return (ns - self.start_ns) // 1000

    def _file_event(self, action: str, now_ns: int) -> None:
        self.lines.append(f"{self._us(now_ns)} {self.filename} {action}")

    def _reopened(self, t_us: int) -> None:
        self.lines += [f"{t_us} {self.filename} close", f"{t_us} {self.filename} open"]

    def reopen(self, now_ns: int) -> None:
        """A new pass, or the verify phase: fio closes the file and opens it again."""
        self._reopened(self._us(now_ns))

    def batch(self, chunk, done, ios_done: int = 0, pass_starts=()) -> None:
        """An engine's batch (pattern.Chunk, ioengine.Completed); `ios_done`: the job's I/Os
        so far, this batch's among them; `pass_starts`: the I/O numbers passes begin at."""
        first = ios_done - done.count
        latency = np.asarray(done.clat, np.int64) + (0 if done.slat is None else np.asarray(done.slat, np.int64))
        self.record(chunk.direction, chunk.offset, chunk.size, latency, done.end_ns,
                    reopen_before=tuple(p - first for p in pass_starts if first <= p < ios_done))

    def record(self, direction, offset, size, latency, end_ns: int, *, reopen_before: tuple[int, ...] = ()) -> None:
        """A batch of I/Os that came back by `end_ns`; `reopen_before`: the indexes of the
        batch's I/Os a new pass begins with."""
        n = direction.shape[0]
        if n == 0:
            return
        if self.one_at_a_time:  # back-to-back: each began where the ones after it had not
            issued = end_ns - np.cumsum(latency[::-1])[::-1]
        else:
            issued = end_ns - latency
        stamps = self._us(np.maximum(issued, self.start_ns)).tolist()
        names = ("read", "write")
        name = self.filename
        for i, (t, d, o, s) in enumerate(zip(stamps, direction.tolist(), offset.tolist(), size.tolist())):
            if i in reopen_before:
                self._reopened(t)
            self.lines.append(f"{t} {name} {names[d]} {o} {s}")
        writes = np.flatnonzero(direction == 1)
        if writes.shape[0]:
            self.last_write = int(offset[writes[-1]])

    def sync(self, data_only: bool, now_ns: int) -> None:
        self.lines.append(f"{self._us(now_ns)} {self.filename} {'datasync' if data_only else 'sync'} "
                          f"{self.last_write} 0")

    def close(self, now_ns: int) -> None:
        """The clone's end: its lines appended to the log."""
        if self.lines is None:
            return
        self._file_event("close", now_ns)
        append_whole(self.path, "\n".join(self.lines) + "\n")
        self.lines = None
