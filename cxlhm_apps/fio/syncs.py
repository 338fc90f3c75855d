"""fio's syncs of a job's file: `fsync=N`, `fdatasync=N`, `end_fsync`, `fsync_on_close`.

`fsync=N` / `fdatasync=N`: fio decides before every I/O (get_rw_ddir, fio 3.33 io_u.c)
whether a sync comes first: when the writes issued so far are a non-zero multiple of N
and the last thing done was not a sync - fsync's N checked first, then fdatasync's. So
64 writes at fsync=4 sync 15 times (after the 64th write no I/O follows), and a job that
reads on after its N-th write syncs again before each of those reads (the count of
writes stays a multiple of N). Where a pass ends (loops, io_size) with a sync due, fio
syncs as it looks for the next I/O, then again before the next pass's first I/O (a new
pass forgets the last sync: clear_io_state); where the last pass ends with bytes left
that no block fits in, it syncs once more as it looks. Each sync's latency is fio's `sync` statistics; only
fsyncs count in its `total_ios` (fio's total_io_u[DDIR_SYNC]), every sync in its `N`.
fio marks each sync in the IO depth histogram at depth 1 on top of the reads and writes
(so a write job at fsync=4 shows depth 1 at 123.4%): so does the report.

On an engine with one I/O at a time this is fio's sequence exactly. On an asynchronous
engine fio queues the sync beside the writes in flight and, until it completes, issues
more (the count depends on completion timing: 13 to 69 syncs for the same 64 writes at
depth 16 across libaio, io_uring and posixaio here); here the sync waits for the I/Os in
flight and runs alone, once per due point - the count of the one-at-a-time case.

`end_fsync`: one sync as the job's I/O ends, inside its run time, not counted in the
sync statistics (fio syncs in its TD_FSYNCING state, which it leaves out); likewise
`fsync_on_close`, after the run time, as the file closes.

A sync is the engine's flush() (cxlhm_apps.fio.ioengine): an fsync or fdatasync of the
file, or the device's write-back of its dirty DRAM.
"""
from __future__ import annotations

import errno

import numpy as np

from cxlhm_apps.fio.options import WRITE

FSYNC, FDATASYNC = 1, 2


class SyncSchedule:
    """Where a job's fsync=N / fdatasync=N syncs fall in its stream of I/Os."""

    def __init__(self, fsync_every: int, fdatasync_every: int, pass_starts: list[int] | None = None):
        self.fsync_every, self.fdatasync_every = fsync_every, fdatasync_every
        self.writes = 0  # writes issued so far
        self.ios = 0  # I/Os issued so far
        self.just_synced = False  # the last thing done was a sync
        # the I/O numbers later passes begin at (the generator's list, appended as it makes them)
        self.pass_starts = pass_starts if pass_starts is not None else []
        self._passes_seen = 0  # of them, those behind us

    @classmethod
    def of(cls, job, pass_starts: list[int] | None = None) -> "SyncSchedule | None":
        """The job's schedule, or None where it syncs only at its end (or never)."""
        if not (job["fsync"] or job["fdatasync"]):
            return None
        return cls(job["fsync"], job["fdatasync"], pass_starts)

    def _at_pass_start(self) -> bool:
        while self._passes_seen < len(self.pass_starts) and self.pass_starts[self._passes_seen] < self.ios:
            self._passes_seen += 1
        return self._passes_seen < len(self.pass_starts) and self.pass_starts[self._passes_seen] == self.ios

    def _kind_at(self, writes):
        """FSYNC, FDATASYNC or 0 for each count of writes issued (a scalar or an array)."""
        writes = np.asarray(writes, np.int64)
        kind = np.zeros(writes.shape, np.int8)
        for every, k in ((self.fdatasync_every, FDATASYNC), (self.fsync_every, FSYNC)):  # fsync wins: last
            if every:
                kind[(writes > 0) & (writes % every == 0)] = k
        return kind

    def due(self) -> int:
        """The sync due before the next I/O: FSYNC, FDATASYNC or 0 (none)."""
        if self.just_synced and not self._at_pass_start():
            return 0
        return int(self._kind_at(self.writes))

    def due_at_end(self, bytes_left: int | None) -> int:
        """The sync due once no I/O is left to make: fio looks for one more I/O while bytes
        of the size are left that no block fits in, and its sync comes first."""
        return self.due() if (bytes_left or 0) > 0 else 0

    def run_length(self, direction: np.ndarray) -> int:
        """How many of the next I/Os (their directions) run before a sync is due: the
        sync comes before I/O j when the writes issued before it make a due count."""
        n = direction.shape[0]
        if n <= 1:
            return n
        after = self.writes + np.cumsum(direction[:-1] == WRITE)  # writes issued before I/O 1, 2, ...
        hits = np.flatnonzero(self._kind_at(after))
        return int(hits[0]) + 1 if hits.shape[0] else n

    def did_ios(self, direction: np.ndarray) -> None:
        if direction.shape[0]:
            self.writes += int(np.count_nonzero(direction == WRITE))
            self.ios += direction.shape[0]
            self.just_synced = False

    def did_sync(self) -> None:
        if self.just_synced:  # the second sync where a pass began: the pass start is behind us
            self._passes_seen += 1
        self.just_synced = True


def check_can_sync(job, engine) -> None:
    """fsync, fdatasync, end_fsync and fsync_on_close need the engine's flush, and on the
    device the wall clock (a sync's time on the model clock is not modelled)."""
    from cxlhm_apps.fio.clocks import ModelTimeScheduler
    from cxlhm_apps.fio.engines import EngineError
    if getattr(engine, "flush", None) is None:
        raise EngineError(errno.EINVAL, f"ioengine={job['ioengine']} cannot sync its file (it has no flush()): "
                                        "fsync, fdatasync, end_fsync and fsync_on_close need one")
    if isinstance(getattr(engine, "clock", None), ModelTimeScheduler):
        raise EngineError(errno.EINVAL, "fsync, fdatasync, end_fsync and fsync_on_close need wall time (a sync's "
                                        "time is not modelled on the model clock); use cxlhm_clock=wall")
