"""fio's minimum rates: `rate_min` (bytes/s) and `rate_iops_min` (I/Os per second), per
direction, checked over windows of `rate_cycle` ms; a job that falls below one fails
(fio 3.33's check_min_rate, backend.c).

As in fio: nothing is checked in the first 2 s of the job's measured run (its settle
time) or during ramp_time; a direction is checked once it has completed some I/O; the
first check after the settle time only notes the counts, each later one at least
`rate_cycle` ms after the last compares what completed since with the minimum (bytes
per second or I/Os per second, integer division by whole milliseconds, as fio's). A
job below its minimum stops with err=5 (EIO, fio's "check_min_rate"), says
`JOB: rate_min=NB/s not met, got MB/s` (or `rate_iops_min=N not met, got M IOPS`),
runs no verify phase, and with `exitall` ends the others as any finished job does.
What differs: fio checks after every I/O, the runner after each batch (an engine batch
ends by the next check's time, so a check is late by at most one I/O's completion).
"""
from __future__ import annotations

import numpy as np

SETTLE_NS = 2_000_000_000  # fio: "allow a 2 second settle period in the beginning"
NEVER = 2**62


class MinRate:
    """The minimum-rate check of one job clone."""

    def __init__(self, name: str, rate_min: tuple, rate_iops_min: tuple, cycle_ms: int):
        self.name = name
        self.bytes_min = tuple(int(x or 0) for x in rate_min)
        self.iops_min = tuple(int(x or 0) for x in rate_iops_min)
        self.cycle_ms = int(cycle_ms)
        self.restart(0)

    @classmethod
    def of_job(cls, job) -> "MinRate | None":
        """The job's check, or None when it sets no minimum."""
        if not (any(job["rate_min"]) or any(job["rate_iops_min"])):
            return None
        return cls(job.name, job["rate_min"], job["rate_iops_min"], job["rate_cycle"])

    def restart(self, now_ns: int) -> None:
        """The measured run starts (the job's start, or the end of its ramp)."""
        self.start_ns = now_ns
        self.done_bytes = [0, 0]
        self.done_ios = [0, 0]
        self.last: list[tuple[int, int, int] | None] = [None, None]  # (bytes, ios, time) at the last check

    def did(self, direction: np.ndarray, size: np.ndarray) -> None:
        """Count completed I/Os (direction 0 read, 1 write; sizes in bytes)."""
        for d in (0, 1):
            mask = direction == d
            n = int(mask.sum())
            if n:
                self.done_ios[d] += n
                self.done_bytes[d] += int(size[mask].sum())

    def next_check_ns(self) -> int:
        """When the next check is due (a batch should end by then): the end of the settle
        time, then `rate_cycle` after each direction's last check. A direction with no
        completed I/O yet waits for its first (checked after the batch that brings it)."""
        due = []
        for d in (0, 1):
            if not (self.bytes_min[d] or self.iops_min[d]):
                continue
            last = self.last[d]
            if last is None:
                if self.done_bytes[d]:
                    due.append(self.start_ns + SETTLE_NS)
            else:
                due.append(max(self.start_ns + SETTLE_NS, last[2] + self.cycle_ms * 1_000_000))
        return min(due) if due else NEVER

    def check(self, now_ns: int) -> str | None:
        """fio's words if a direction is below its minimum at `now_ns`, else None."""
        if now_ns - self.start_ns < SETTLE_NS:
            return None
        for d in (0, 1):
            if not (self.bytes_min[d] or self.iops_min[d]) or not self.done_bytes[d]:
                continue
            last = self.last[d]
            if last is not None and (last[0] or last[1]):
                spent_ms = (now_ns - last[2]) // 1_000_000
                if spent_ms < self.cycle_ms or spent_ms == 0:
                    continue
                if self.bytes_min[d]:
                    got = (self.done_bytes[d] - last[0]) * 1000 // spent_ms
                    if got < self.bytes_min[d]:
                        return f"{self.name}: rate_min={self.bytes_min[d]}B/s not met, got {got}B/s"
                else:
                    got = (self.done_ios[d] - last[1]) * 1000 // spent_ms
                    if got < self.iops_min[d]:
                        return f"{self.name}: rate_iops_min={self.iops_min[d]} not met, got {got} IOPS"
            self.last[d] = (self.done_bytes[d], self.done_ios[d], now_ns)
        return None
