"""fio's latency histogram log: write_hist_log=NAME writes NAME_clat_hist.N.log (with
per_job_logs=0, NAME_clat_hist.log, shared as the other logs are), one line per direction
each log_hist_msec ms:

    time (ms since the job started), direction, block size, bin 0, bin 1, ...

The bins are the completion latencies counted since the direction's last line, in fio's
latency histogram (stats.plat_index: 1856 bins; log_hist_coarseness=C sums each 2^C
neighbours). As in fio, a line is written by the completion that finds log_hist_msec
passed since the direction's last one (its block size is that I/O's), and the next
window starts that much after the last (a late line does not push the others back).
Without log_hist_msec (fio's default 0) the file is made and stays empty. With
clat_percentiles=0 fio keeps no histogram, and every bin reads 0 (as here).
"""
from __future__ import annotations

import io

import numpy as np

from cxlhm_apps.fio.stats import PLAT_NR, plat_index


class HistLog:
    """One job clone's histogram log; `out` is the file (or, for a shared log, a buffer)."""

    def __init__(self, out, msec: int, coarseness: int, counted: bool):
        self.out, self.msec, self.stride = out, msec, 1 << coarseness
        self.counted = counted  # (fio's clat_percentiles: whether the histogram is kept at all)
        self._hist = np.zeros((2, PLAT_NR), np.int64)  # per direction, since the job's measured start
        self._logged = np.zeros((2, PLAT_NR), np.int64)  # as of the direction's last line
        self._last_ms = [0, 0]

    @classmethod
    def of_job(cls, job, number: int) -> tuple["HistLog | None", str | None]:
        """The job's histogram log, and the shared file's name where per_job_logs=0."""
        prefix = job["write_hist_log"]
        if not prefix:
            return None, None
        if prefix is True:  # written bare: fio names the log after the job
            prefix = job.name
        if job["per_job_logs"]:
            out, shared = open(f"{prefix}_clat_hist.{number}.log", "w"), None
        else:
            out, shared = io.StringIO(), f"{prefix}_clat_hist.log"
        counted = bool(job["clat_percentiles"]) and not (job["disable_clat"] or job["gtod_reduce"])
        return cls(out, job["log_hist_msec"], job["log_hist_coarseness"], counted), shared

    def record(self, direction: np.ndarray, size: np.ndarray, clat: np.ndarray, elapsed_ms: int) -> None:
        """A batch of I/Os that completed `elapsed_ms` into the job."""
        if not self.msec:
            return
        lines = []
        for d in (0, 1):
            ios = np.flatnonzero(direction == d)
            if ios.shape[0] == 0:
                continue
            bins = plat_index(clat[ios]) if self.counted else None
            if not self._last_ms[d]:
                self._last_ms[d] = elapsed_ms
            window = elapsed_ms - self._last_ms[d]
            # each of the batch's first window // msec completions writes a line (they all
            # find the same time; each line moves the window's start on by msec)
            due = min(ios.shape[0], max(window // self.msec, 0))
            done = 0
            for j in range(due):
                if bins is not None:
                    np.add.at(self._hist[d], bins[done:j + 1], 1)
                done = j + 1
                lines.append((int(ios[j]), self._line(elapsed_ms, d, int(size[ios[j]]))))
            if due:
                self._last_ms[d] = elapsed_ms - (window - due * self.msec)
            if bins is not None and done < bins.shape[0]:
                np.add.at(self._hist[d], bins[done:], 1)
        self.out.writelines(line for _, line in sorted(lines))

    def _line(self, elapsed_ms: int, d: int, bs: int) -> str:
        delta = (self._hist[d] - self._logged[d]).reshape(-1, self.stride).sum(axis=1)
        self._logged[d] = self._hist[d]
        return f"{elapsed_ms}, {d}, {bs}, " + ", ".join(map(str, delta.tolist())) + "\n"
