"""fio's per-job logs: write_lat_log=NAME writes NAME_lat.N.log, NAME_clat.N.log and
NAME_slat.N.log, write_bw_log=NAME NAME_bw.N.log, write_iops_log=NAME NAME_iops.N.log
(write_hist_log=NAME: NAME_clat_hist.N.log, histlog.py),
N the job clone's number counted from 1 over the whole run, in fio's line format

    time (ms since the job started), value, direction (0 read, 1 write), block size, priority

With per_job_logs=0 the number is left out (NAME_bw.log): every job and clone that names
NAME shares the file, each appending its lines as it ends, as fio does (a file an
earlier run left is appended to, not replaced).

With log_offset=1 the I/O's offset in bytes before the priority (0 in averaged lines).
The priority column, as fio writes it: 1 for an I/O of the realtime class, else 0; with
log_prio=1 the I/O's priority value (class << 13 | level) in hex (0x2000); 0 (0x0000)
in averaged lines.

Latencies in ns, bandwidth in KiB/s, IOPS as counts. Without log_avg_msec there is one
line per I/O (bandwidth: its bytes x 10^6 over its completion latency in ns, as fio
computes it; IOPS: 1); with it, one
line per direction and window of log_avg_msec: the mean latency, the bandwidth and the
IOPS of the I/Os of the window, block size 0.

What differs from fio: the engines hand back a batch of I/Os at once, so an I/O's time is
when its batch came back, not its own completion (a batch holds at most iodepth I/Os on
fio's file engines; on the device a stream of up to a chunk). Submission latency is
logged only where the engine measures it (the slat log is otherwise empty, as fio's is
for its synchronous engines).
"""
from __future__ import annotations

import io
import threading

import numpy as np

from cxlhm_apps.fio.cmdprio import IOPRIO_CLASS_SHIFT
from cxlhm_apps.fio.histlog import HistLog
from cxlhm_apps.fio.stats import unmeasured

REALTIME = 1  # the realtime ioprio class, the one fio's log marks with 1
_SHARED_APPEND = threading.Lock()  # (one clone's lines at a time into a file clones share)

KINDS = ("lat", "clat", "slat", "bw", "iops")
OPTION_OF = {"lat": "write_lat_log", "clat": "write_lat_log", "slat": "write_lat_log",
             "bw": "write_bw_log", "iops": "write_iops_log"}


def append_whole(path: str, text: str) -> None:
    """A clone's lines added to a file other clones (and later runs) add to, in one piece,
    as fio appends to a log that jobs share."""
    with _SHARED_APPEND, open(path, "a") as out:
        out.write(text)


class JobLogs:
    """The log files of one job clone (none open when the job asks for no log)."""

    def __init__(self, job=None, number: int = 0, start_ns: int = 0):
        self.files = {}
        self.avg_ns = (job["log_avg_msec"] or 0) * 1_000_000 if job is not None else 0
        self.offsets = bool(job["log_offset"]) if job is not None else False  # fio's log_offset column
        self.prio_values = bool(job["log_prio"]) if job is not None else False  # fio's log_prio
        self.start_ns = start_ns
        self.shared = {}  # kind -> the file name jobs share (per_job_logs=0); its lines gather in memory
        self.unmeasured = unmeasured(job) if job is not None else frozenset()  # (no per-I/O entries of those)
        for kind in KINDS if job is not None else ():
            prefix = job[OPTION_OF[kind]]
            if prefix is True:  # written bare: fio names the log after the job
                prefix = job.name
            if prefix and job["per_job_logs"]:
                self.files[kind] = open(f"{prefix}_{kind}.{number}.log", "w")
            elif prefix:
                self.shared[kind] = f"{prefix}_{kind}.log"
                self.files[kind] = io.StringIO()
        self._window_start = None
        self._acc = {}  # (kind, direction) -> [sum, count] in the current window
        self.hist, self.hist_shared = HistLog.of_job(job, number) if job is not None else (None, None)

    @property
    def active(self) -> bool:
        return bool(self.files) or self.hist is not None

    def start(self, now_ns: int) -> None:
        self.start_ns = self._window_start = now_ns

    def record(self, direction: np.ndarray, size: np.ndarray, slat: np.ndarray | None, clat: np.ndarray,
               end_ns: int, offset: np.ndarray | None = None, ioprio: np.ndarray | None = None) -> None:
        """A batch of I/Os that came back at `end_ns` (`offset`: where each was, for
        log_offset; `ioprio`: each one's priority value, None when all ran at 0)."""
        if not self.active or direction.shape[0] == 0:
            return
        if self.hist is not None:
            self.hist.record(direction, size, clat, int((end_ns - self.start_ns) // 1_000_000))
        lat = clat + (slat if slat is not None else 0)
        values = {"lat": lat, "clat": clat, "slat": slat}
        for kind in self.unmeasured & values.keys():
            values[kind] = None
        if self.avg_ns:
            self._average(direction, size, values, end_ns)
            return
        t = (end_ns - self.start_ns) // 1_000_000
        if self.prio_values:  # fio writes the value in hex, 0x%04x
            prio = [f"0x{p:04x}" for p in (ioprio.tolist() if ioprio is not None else [0] * direction.shape[0])]
        elif ioprio is None:
            prio = [0] * direction.shape[0]
        else:
            prio = (ioprio >> IOPRIO_CLASS_SHIFT == REALTIME).astype(np.int64).tolist()
        for kind, f in self.files.items():
            if kind in self.unmeasured or values.get(kind, 0) is None:
                continue
            if kind == "bw":  # (fio: the I/O's bytes over its completion latency in us, x1000)
                column = size * 1_000_000 // np.maximum(clat, 1)
            elif kind == "iops":
                column = np.ones_like(size)
            else:
                column = values[kind]
            if self.offsets:
                where = offset.tolist() if offset is not None else [0] * direction.shape[0]
                f.writelines(f"{t}, {int(v)}, {int(d)}, {int(s)}, {int(o)}, {p}\n"
                             for v, d, s, o, p in zip(column.tolist(), direction.tolist(), size.tolist(), where, prio))
            else:
                f.writelines(f"{t}, {int(v)}, {int(d)}, {int(s)}, {p}\n"
                             for v, d, s, p in zip(column.tolist(), direction.tolist(), size.tolist(), prio))

    def _average(self, direction, size, values, end_ns) -> None:
        while end_ns - self._window_start >= self.avg_ns:
            self._flush(self._window_start + self.avg_ns)
        for d in (0, 1):
            mask = direction == d
            if not mask.any():
                continue
            for kind in ("lat", "clat", "slat"):
                if values[kind] is not None:
                    acc = self._acc.setdefault((kind, d), [0, 0])
                    acc[0] += int(values[kind][mask].sum())
                    acc[1] += int(mask.sum())
            acc = self._acc.setdefault(("bytes", d), [0, 0])
            acc[0] += int(size[mask].sum())
            acc[1] += int(mask.sum())

    def _flush(self, window_end: int) -> None:
        t = (window_end - self.start_ns) // 1_000_000
        seconds = self.avg_ns / 1e9
        for d in (0, 1):
            moved = self._acc.get(("bytes", d))
            if not moved or not moved[1]:
                continue
            for kind, f in self.files.items():
                if kind in ("lat", "clat", "slat"):
                    acc = self._acc.get((kind, d))
                    if not acc or not acc[1]:
                        continue
                    value = acc[0] // acc[1]
                elif kind == "bw":
                    value = int(moved[0] / seconds / 1024)
                else:
                    value = int(moved[1] / seconds)
                prio = "0x0000" if self.prio_values else "0"
                f.write(f"{t}, {value}, {d}, 0, 0, {prio}\n" if self.offsets else f"{t}, {value}, {d}, 0, {prio}\n")
        self._acc = {}
        self._window_start = window_end

    def close(self, end_ns: int | None = None) -> None:
        if self.avg_ns and self._window_start is not None and self._acc and end_ns is not None:
            self._flush(max(end_ns, self._window_start + 1))
        for kind, f in self.files.items():
            if kind in self.shared:
                append_whole(self.shared[kind], f.getvalue())
            f.close()
        self.files = {}
        if self.hist is not None:
            if self.hist_shared:
                append_whole(self.hist_shared, self.hist.out.getvalue())
            self.hist.out.close()
            self.hist = None
