"""fio's steady-state detection (`steadystate`/`ss`, `ss_dur`, `ss_ramp`,
`steadystate_check_interval`/`ss_interval`), as fio's steadystate.c does it, and the
"steadystate" object it adds to a job's JSON. fio 3.33 has the iops and bw criteria and
a look once a second; fio at the examples' commit adds `lat` / `lat_slope` and the check
interval (both also here; with neither, what is computed is 3.33's).

Once per check interval (fio's helper thread; 1 s unless `ss_interval` says more) each
running job's IOPS and bandwidth since the last look are taken (I/Os and bytes
completed, over whole milliseconds), and its mean completion latency over the I/Os
completed since then (ns: the clat sums of the job's statistics); under group_reporting
the group's jobs are summed (latency: over all their I/Os) and the group's last job
holds the data. After `ss_ramp` plus one interval, the samples go into a ring of
`ss_dur` / interval entries; once it is full, each new sample checks the criterion:

- `iops` / `bw` / `lat`: the largest deviation of a sample from the ring's mean (in % of
  the mean with a `%` limit) below the limit;
- `iops_slope` / `bw_slope` / `lat_slope`: the least-squares slope of the ring (in % of
  the mean with a `%` limit) below the limit in absolute value.

An absolute `lat` limit is read as fio reads it: the number times fio's time-unit
multiplier in microseconds (bare or `us` 1, `ms` 1000, `s` 10^6), compared with samples in
nanoseconds. fio at the examples' commit scales a look's counts by rate_time / interval^2
(the same as per-second counts when the look comes on time); here it is counts per
second over the time since the last look, as 3.33's.

A job (its whole group under group_reporting) that meets it ends there, as at its run
time. What differs: the counts a look sees are those of the engine batches completed by
then (a steady-state job's batches end every 50 ms), where fio counts every I/O.
"""
from __future__ import annotations

import dataclasses
import re
import threading
import time

import numpy as np

from cxlhm_apps.fio import values as V

CHECK_NS = 1_000_000_000  # fio: STEADYSTATE_MSEC
BATCH_NS = 50_000_000  # the longest engine batch of a job with steady-state detection
_KINDS = {"iops": ("iops", False), "iops_slope": ("iops", True), "bw": ("bw", False), "bw_slope": ("bw", True),
          "lat": ("lat", False), "lat_slope": ("lat", True)}
# fio's get_mult_time for a time given without is_seconds: microseconds per unit
_LAT_UNIT_US = {"us": 1, "usec": 1, "ms": 1000, "msec": 1000, "s": 10**6, "m": 60 * 10**6, "h": 3600 * 10**6,
                "d": 86400 * 10**6}


@dataclasses.dataclass(frozen=True)
class SteadySpec:
    """`ss=KIND:LIMIT[%]`: KIND iops, iops_slope, bw, bw_slope, lat or lat_slope."""
    iops: bool
    slope: bool
    limit: float
    pct: bool
    lat: bool = False

    @property
    def metric(self) -> str:
        return "lat" if self.lat else ("iops" if self.iops else "bw")

    def __str__(self) -> str:
        return self.text()

    def text(self) -> str:
        """fio's JSON "ss" string: iops:10.000000% (a C float printed with %f)."""
        return (f"{self.metric}{'_slope' if self.slope else ''}:"
                f"{float(np.float32(self.limit)):f}{'%' if self.pct else ''}")


def parse_steadystate(text: str, kb_base: int) -> SteadySpec:
    kind, sep, limit_text = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in _KINDS:
        raise ValueError(f"the criterion must be one of {', '.join(_KINDS)}; got {kind!r}")
    if not sep or not limit_text.strip():
        raise ValueError(f"a threshold is needed after the criterion ({kind}:LIMIT or {kind}:LIMIT%)")
    metric, slope = _KINDS[kind]
    limit_text = limit_text.strip()
    pct = limit_text.endswith("%")
    if pct:
        limit = V.parse_float(limit_text[:-1].strip())
    elif metric == "iops":
        limit = V.parse_float(limit_text)
    elif metric == "lat":
        limit = float(parse_lat_limit(limit_text))
    else:  # a bandwidth: bytes per second, with fio's size suffixes
        limit = float(V.parse_size(limit_text, kb_base=kb_base))
    if not np.isfinite(limit) or limit < 0:
        raise ValueError(f"the threshold must be a finite number >= 0, got {limit_text!r}")
    return SteadySpec(metric == "iops", slope, limit, pct, lat=metric == "lat")


def parse_lat_limit(text: str) -> int:
    """An absolute latency limit as fio's check_str_time reads it (not in seconds): the
    integer before the unit times the unit's microseconds (no unit or an unknown one: 1)."""
    m = re.fullmatch(r"\s*(0[xX][0-9a-fA-F]+|[+-]?\d+)\s*([A-Za-z]*)\s*", text)
    if not m:
        raise ValueError(f"a latency threshold is a whole number with an optional unit (us, ms, s); got {text!r}")
    number, unit = m.groups()
    value = int(number, 16 if number.lower().startswith("0x") else 10)
    return value * _LAT_UNIT_US.get(unit.lower(), 1)


def interval_problems(jobs) -> list[tuple[object, str, str]]:
    """fio's rules for `steadystate_check_interval` (it is one for the whole run): the
    same in every job, at least 1 s, and a job's ss_dur a multiple of it, longer than it.
    (job, option, message) for each job that breaks one."""
    out = []
    first = jobs[0] if jobs else None
    for job in jobs:
        interval, dur = job["steadystate_check_interval"], job["steadystate_duration"]
        if interval != first["steadystate_check_interval"]:
            out.append((job, "steadystate_check_interval", f"must be the same for every job (fio checks steady "
                        f"state once for the run; job {first.name!r} has another)"))
        elif dur and interval < 1_000_000_000:
            out.append((job, "steadystate_check_interval", "must be at least 1s"))
        elif dur and (dur % interval or dur <= interval):
            out.append((job, "steadystate_duration", f"must be a multiple of steadystate_check_interval "
                        f"({interval // 10**9}s here) and longer than it"))
    return out


DEFAULT = SteadySpec(iops=True, slope=True, limit=0.01, pct=True)  # fio's "iops_slope:0.01%"


class SteadyState:
    """fio's steadystate_data of one job clone (or of a group's last clone): a ring of
    ss_dur / interval samples."""

    def __init__(self, spec: SteadySpec, dur_s: int, ramp_ns: int, interval_s: int = 1):
        self.spec, self.dur, self.ramp_ns = spec, int(dur_s), int(ramp_ns)
        self.interval_ns = int(interval_s) * 1_000_000_000
        n = self.n = max(1, self.dur // int(interval_s))
        self.iops_data = [0] * n
        self.bw_data = [0] * n
        self.lat_data = [0] * n
        self.head = self.tail = 0
        self.buffer_full = self.attained = False
        self.ramp_over = ramp_ns == 0
        self.slope = self.deviation = self.criterion = 0.0
        self.sum_y = self.sum_xy = self.oldest_y = 0
        self.sum_x = n * (n - 1) // 2
        self.sum_x_sq = (n - 1) * n * (2 * n - 1) // 6
        self.prev_time: int | None = None
        self.prev_iops = self.prev_bytes = 0
        self.prev_lat_sum, self.prev_lat_samples = 0.0, 0

    @classmethod
    def of_job(cls, job) -> "SteadyState | None":
        dur_s = job["steadystate_duration"] // 1_000_000_000
        if not dur_s:
            return None
        return cls(job["steadystate"], dur_s, job["steadystate_ramp_time"],
                   max(1, job["steadystate_check_interval"] // 1_000_000_000))

    def _data(self) -> list[int]:
        return {"iops": self.iops_data, "bw": self.bw_data, "lat": self.lat_data}[self.spec.metric]

    def _advance(self) -> None:
        self.tail = (self.tail + 1) % self.n
        if self.tail <= self.head:
            self.head = (self.head + 1) % self.n

    def add(self, iops: int, bw: int, lat: float = 0.0) -> bool:
        """One sample (fio's steadystate_slope / steadystate_deviation): IOPS, bytes per
        second and the mean completion latency in ns; True when attained."""
        self.bw_data[self.tail], self.iops_data[self.tail], self.lat_data[self.tail] = bw, iops, int(lat)
        data = self._data()
        new = data[self.tail]
        n = self.n
        if self.buffer_full or self.tail - self.head == n - 1:
            if not self.buffer_full:
                self.sum_y = sum(data)
                if self.spec.slope:
                    self.sum_xy = sum(i * data[(self.head + i) % n] for i in range(n))
                self.buffer_full = True
            elif self.spec.slope:
                self.sum_y += new - self.oldest_y
                self.sum_xy = self.sum_xy - self.sum_y + n * new
            else:
                self.sum_y += data[self.tail] - self.oldest_y
            self.oldest_y = data[self.head]
            mean = self.sum_y / n
            if self.spec.slope:
                denom = self.sum_x_sq - self.sum_x * self.sum_x / n
                self.slope = (self.sum_xy - self.sum_x * self.sum_y / n) / denom if denom else 0.0
                int_mean = self.sum_y // n  # (fio divides the integers here)
                self.criterion = 100.0 * self.slope / int_mean if self.spec.pct and int_mean else (
                    self.slope if not self.spec.pct else float("inf"))
                if abs(self.criterion) < self.spec.limit:
                    return True
            else:
                self.deviation = max(abs(v - mean) for v in data)
                self.criterion = 100.0 * self.deviation / mean if self.spec.pct and mean else (
                    self.deviation if not self.spec.pct else float("inf"))
                if self.criterion < self.spec.limit:
                    return True
        self._advance()
        return False

    def means(self) -> tuple[int, int]:
        """(bw_mean, iops_mean) over the ring, integer division as fio's."""
        return sum(self.bw_data) // self.n, sum(self.iops_data) // self.n

    def to_json(self) -> dict:
        # (fio prints the criterion and the limit through a C float, the others as doubles)
        criterion = float(np.float32(self.criterion if np.isfinite(self.criterion) else 0.0))
        start = self.head if self.attained or not self.buffer_full else (self.head - 1) % self.n
        order = [(start + k) % self.n for k in range(self.n)]
        bw_mean, iops_mean = self.means()
        data = {"bw_mean": bw_mean, "iops_mean": iops_mean}
        if self.spec.lat:  # (fio writes the latency ring only for a latency criterion)
            data["lat_mean"] = sum(self.lat_data) // self.n
            data["lat_ns"] = [self.lat_data[k] for k in order]
        data["iops"] = [self.iops_data[k] for k in order]
        data["bw"] = [self.bw_data[k] for k in order]
        return {"ss": self.spec.text(), "duration": self.dur, "attained": int(self.attained),
                "criterion": f"{criterion:f}{'%' if self.spec.pct else ''}",
                "max_deviation": float(self.deviation), "slope": float(self.slope), "data": data}

    def text_line(self, num2str) -> str:
        """fio's `  steadystate  : attained=..., bw=... (...), iops=..., iops mean dev=...%` line
        (a latency criterion adds `, lat=...nsec`: fio's unit step never fires there)."""
        bw_mean, iops_mean = self.means()
        kib = bw_mean // 1024  # (fio prints the KiB figure in both bases)
        lat = f", lat={num2str(sum(self.lat_data) // self.n, 4, 1, False)}nsec" if self.spec.lat else ""
        return (f"  steadystate  : attained={'yes' if self.attained else 'no'}, "
                f"bw={num2str(kib * 1024, 4, 1, True, 'B/s')} ({num2str(kib * 1000, 4, 1, False, 'B/s')}), "
                f"iops={num2str(iops_mean, 4, 1, False)}{lat}, {self.spec.metric}"
                f"{' slope' if self.spec.slope else ' mean dev'}="
                f"{float(np.float32(self.criterion if np.isfinite(self.criterion) else 0.0)):.3f}"
                f"{'%' if self.spec.pct else ''}\n")


def _latency_totals(worker) -> tuple[float, int]:
    """(sum of completion latencies in ns, their count) the worker's statistics hold so
    far (fio: clat mean x samples over the directions; 0 where a worker keeps none)."""
    stats = getattr(worker, "stats", None)
    if stats is None:
        return 0.0, 0
    total, count = 0.0, 0
    for d in stats.dirs:
        n = d.clat.n
        total += d.clat.mean * n
        count += n
    return total, count


class Monitor:
    """fio's helper-thread check, once per check interval, over every job clone of the
    run that sets `ss_dur` (workers expose .job, .plan.groupid, .state, .progress_ios/_bytes,
    ._wall_start, .steady, .stop() and, for a latency criterion, .stats)."""

    def __init__(self, workers, interval_ns: int | None = None):
        self.workers = [w for w in workers if w.steady is not None]
        # (one interval for the run: the job file's check refuses jobs that differ)
        self.interval_ns = interval_ns or (self.workers[0].steady.interval_ns if self.workers else CHECK_NS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cxlhm-fio-steadystate", daemon=True)
        holders: dict[int, object] = {}  # group -> the last clone of a reporting group (holds the data)
        for w in self.workers:
            if w.job["group_reporting"]:
                holders[w.plan.groupid] = w
        self.holder = holders

    @property
    def active(self) -> bool:
        return bool(self.workers)

    def start(self) -> None:
        if self.active:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        start = time.monotonic_ns()
        k = 1
        while not self._stop.wait(max(0.0, (start + k * self.interval_ns - time.monotonic_ns()) / 1e9)):
            self.check(time.monotonic_ns())
            k += 1

    def check(self, now: int) -> None:
        """One look (fio's steadystate_check)."""
        prev_group = None
        group_bw = group_iops = group_over = group_lat_n = 0
        group_lat_sum = 0.0
        for w in self.workers:
            ss = w.steady
            if w.state in ("_", "D", "E") or ss.attained or not w._wall_start:
                continue
            grouped = w.job["group_reporting"]
            if not grouped or w.plan.groupid != prev_group:
                group_bw = group_iops = group_over = group_lat_n = 0
                group_lat_sum = 0.0
            prev_group = w.plan.groupid
            if ss.ramp_ns and not ss.ramp_over and now - w._wall_start >= ss.ramp_ns + ss.interval_ns:
                ss.ramp_over = True
            ios, nbytes = sum(w.progress_ios), sum(w.progress_bytes)
            lat_sum, lat_n = _latency_totals(w) if ss.spec.lat else (0.0, 0)
            if ss.prev_time is None:
                ss.prev_time = w._wall_start
            rate_ms = max(1, (now - ss.prev_time) // 1_000_000)
            ss.prev_time = now
            if ss.ramp_over:
                group_bw += 1000 * (nbytes - ss.prev_bytes) // rate_ms
                group_iops += 1000 * (ios - ss.prev_iops) // rate_ms
                group_lat_sum += lat_sum - ss.prev_lat_sum
                group_lat_n += lat_n - ss.prev_lat_samples
                group_over += 1
            ss.prev_iops, ss.prev_bytes = ios, nbytes
            ss.prev_lat_sum, ss.prev_lat_samples = lat_sum, lat_n
            if grouped and self.holder.get(w.plan.groupid) is not w:
                continue
            if not group_over:
                continue
            if ss.add(group_iops, group_bw, group_lat_sum / group_lat_n if group_lat_n else 0.0):
                ended = [o for o in self.workers if o.plan.groupid == w.plan.groupid] if grouped else [w]
                for other in ended:
                    other.steady.attained = True
                    other.stop()
