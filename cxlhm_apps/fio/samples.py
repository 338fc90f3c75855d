"""The report's bandwidth and IOPS samples (fio's bw_avg_time / iops_avg_time): bytes
and I/Os are counted per direction over windows of `bwavgtime` and `iopsavgtime` ms
(500 each by default), and each window that closes while the job runs adds one sample
per direction that moved data in it - KiB/s to its bw statistics, I/Os per second to its
iops statistics, in fio's whole-number arithmetic over whole milliseconds.

As in fio, no sample is taken as the job ends: a job shorter than a window has none, and
a time_based job's last window, which closes as its run time does, adds none (fio's
helper thread finds the job stopped). A window closes at the first batch end at or past
its length (the runner ends batches there: next_due). fio's helper thread takes both
kinds at its own wake-ups (every 250 ms, and at the IOPS window's end), so where the two
windows differ fio's bandwidth samples come when it happens to wake; here each window
closes on its own.
"""
from __future__ import annotations

from cxlhm_apps.fio.options import READ, WRITE

_SLACK_MS = 1  # fio's LOG_MSEC_SLACK: a window this close to its length counts as closed


class _Window:
    __slots__ = ("length_ns", "start", "counts", "kind")

    def __init__(self, kind: str, length_ns: int, start: int):
        self.kind, self.length_ns = kind, length_ns  # kind: the DirStats field its samples go to
        self.start, self.counts = start, [0, 0]

    def due(self) -> int:
        return self.start + self.length_ns

    def take(self, now: int, dirs, run_end: int) -> None:
        spent_ms = (now - self.start) // 1_000_000
        if spent_ms < self.length_ns // 1_000_000 - _SLACK_MS or spent_ms <= 0 or self.due() >= run_end:
            return
        for d in (READ, WRITE):
            if self.counts[d]:  # (fio: no entry for a direction idle in the window)
                rate = self.counts[d] * 1000 // spent_ms
                getattr(dirs[d], self.kind).add(rate // 1024 if self.kind == "bw" else rate)
        self.start, self.counts = now, [0, 0]


class RateSamples:
    """One job clone's two sample windows."""
    __slots__ = ("bw", "iops")

    def __init__(self, job, now: int):
        self.bw = _Window("bw", job["bwavgtime"] * 1_000_000, now)
        self.iops = _Window("iops", job["iopsavgtime"] * 1_000_000, now)

    def restart(self, now: int) -> None:
        """Windows start again at `now`, empty (the measured part begins)."""
        for w in (self.bw, self.iops):
            w.start, w.counts = now, [0, 0]

    def add(self, d: int, nbytes: int, nios: int) -> None:
        self.bw.counts[d] += nbytes
        self.iops.counts[d] += nios

    def next_due(self) -> int:
        return min(self.bw.due(), self.iops.due())

    def take(self, now: int, dirs, run_end: int) -> None:
        """Close each window that is due at `now` into `dirs` (a JobStats' per-direction
        statistics), but for one that would close at or past `run_end`, the end of the
        job's run time (see above)."""
        self.bw.take(now, dirs, run_end)
        self.iops.take(now, dirs, run_end)
