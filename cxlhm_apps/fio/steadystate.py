"""fio's steady-state detection (`steadystate`/`ss`, `ss_dur`, `ss_ramp`), as fio 3.33's
steadystate.c does it, and the "steadystate" object it adds to a job's JSON.

Once a second (fio's helper thread, STEADYSTATE_MSEC) each running job's IOPS and
bandwidth since the last look are taken (I/Os and bytes completed, over whole
milliseconds); under group_reporting the group's jobs are summed and the group's last
job holds the data. After `ss_ramp` plus one second, the samples go into a ring of
`ss_dur` seconds; once it is full, each new sample checks the criterion:

- `iops` / `bw`: the largest deviation of a sample from the ring's mean (in % of the mean
  with a `%` limit) below the limit;
- `iops_slope` / `bw_slope`: the least-squares slope of the ring (in % of the mean with
  a `%` limit) below the limit in absolute value.

A job (its whole group under group_reporting) that meets it ends there, as at its run
time. What differs: the counts a look sees are those of the engine batches completed by
then (a steady-state job's batches end every 50 ms), where fio counts every I/O.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from cxlhm_apps.fio import values as V

CHECK_NS = 1_000_000_000  # fio: STEADYSTATE_MSEC
BATCH_NS = 50_000_000  # the longest engine batch of a job with steady-state detection
_KINDS = {"iops": (True, False), "iops_slope": (True, True), "bw": (False, False), "bw_slope": (False, True)}


@dataclasses.dataclass(frozen=True)
class SteadySpec:
    """`ss=KIND:LIMIT[%]`: KIND iops, iops_slope, bw or bw_slope."""
    iops: bool
    slope: bool
    limit: float
    pct: bool

    def __str__(self) -> str:
        return self.text()

    def text(self) -> str:
        """fio's JSON "ss" string: iops:10.000000% (a C float printed with %f)."""
        return (f"{'iops' if self.iops else 'bw'}{'_slope' if self.slope else ''}:"
                f"{float(np.float32(self.limit)):f}{'%' if self.pct else ''}")


def parse_steadystate(text: str, kb_base: int) -> SteadySpec:
    kind, sep, limit_text = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in _KINDS:
        raise ValueError(f"the criterion must be one of {', '.join(_KINDS)}; got {kind!r}")
    if not sep or not limit_text.strip():
        raise ValueError(f"a threshold is needed after the criterion ({kind}:LIMIT or {kind}:LIMIT%)")
    iops, slope = _KINDS[kind]
    limit_text = limit_text.strip()
    pct = limit_text.endswith("%")
    if pct:
        limit = V.parse_float(limit_text[:-1].strip())
    elif iops:
        limit = V.parse_float(limit_text)
    else:  # a bandwidth: bytes per second, with fio's size suffixes
        limit = float(V.parse_size(limit_text, kb_base=kb_base))
    if not np.isfinite(limit) or limit < 0:
        raise ValueError(f"the threshold must be a finite number >= 0, got {limit_text!r}")
    return SteadySpec(iops, slope, limit, pct)


DEFAULT = SteadySpec(iops=True, slope=True, limit=0.01, pct=True)  # fio's "iops_slope:0.01%"


class SteadyState:
    """fio's steadystate_data of one job clone (or of a group's last clone)."""

    def __init__(self, spec: SteadySpec, dur_s: int, ramp_ns: int):
        self.spec, self.dur, self.ramp_ns = spec, int(dur_s), int(ramp_ns)
        self.iops_data = [0] * self.dur
        self.bw_data = [0] * self.dur
        self.head = self.tail = 0
        self.buffer_full = self.attained = False
        self.ramp_over = ramp_ns == 0
        self.slope = self.deviation = self.criterion = 0.0
        self.sum_y = self.sum_xy = self.oldest_y = 0
        self.sum_x = self.dur * (self.dur - 1) // 2
        self.sum_x_sq = (self.dur - 1) * self.dur * (2 * self.dur - 1) // 6
        self.prev_time: int | None = None
        self.prev_iops = self.prev_bytes = 0

    @classmethod
    def of_job(cls, job) -> "SteadyState | None":
        dur_s = job["steadystate_duration"] // 1_000_000_000
        if not dur_s:
            return None
        return cls(job["steadystate"], dur_s, job["steadystate_ramp_time"])

    def _value(self, iops: int, bw: int) -> int:
        return iops if self.spec.iops else bw

    def _advance(self) -> None:
        self.tail = (self.tail + 1) % self.dur
        if self.tail <= self.head:
            self.head = (self.head + 1) % self.dur

    def add(self, iops: int, bw: int) -> bool:
        """One sample (fio's steadystate_slope / steadystate_deviation); True when attained."""
        self.bw_data[self.tail], self.iops_data[self.tail] = bw, iops
        data = self.iops_data if self.spec.iops else self.bw_data
        new = self._value(iops, bw)
        if self.buffer_full or self.tail - self.head == self.dur - 1:
            if not self.buffer_full:
                self.sum_y = sum(data)
                if self.spec.slope:
                    self.sum_xy = sum(i * data[(self.head + i) % self.dur] for i in range(self.dur))
                self.buffer_full = True
            elif self.spec.slope:
                self.sum_y += new - self.oldest_y
                self.sum_xy = self.sum_xy - self.sum_y + self.dur * new
            else:
                self.sum_y += data[self.tail] - self.oldest_y
            self.oldest_y = data[self.head]
            mean = self.sum_y / self.dur
            if self.spec.slope:
                denom = self.sum_x_sq - self.sum_x * self.sum_x / self.dur
                self.slope = (self.sum_xy - self.sum_x * self.sum_y / self.dur) / denom if denom else 0.0
                int_mean = self.sum_y // self.dur  # (fio divides the integers here)
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
        return sum(self.bw_data) // self.dur, sum(self.iops_data) // self.dur

    def to_json(self) -> dict:
        # (fio prints the criterion and the limit through a C float, the others as doubles)
        criterion = float(np.float32(self.criterion if np.isfinite(self.criterion) else 0.0))
        start = self.head if self.attained or not self.buffer_full else (self.head - 1) % self.dur
        order = [(start + k) % self.dur for k in range(self.dur)]
        bw_mean, iops_mean = self.means()
        return {"ss": self.spec.text(), "duration": self.dur, "attained": int(self.attained),
                "criterion": f"{criterion:f}{'%' if self.spec.pct else ''}",
                "max_deviation": float(self.deviation), "slope": float(self.slope),
                "data": {"bw_mean": bw_mean, "iops_mean": iops_mean,
                         "iops": [self.iops_data[k] for k in order], "bw": [self.bw_data[k] for k in order]}}

    def text_line(self, num2str) -> str:
        """fio's `  steadystate  : attained=..., bw=... (...), iops=..., iops mean dev=...%` line."""
        bw_mean, iops_mean = self.means()
        kib = bw_mean // 1024  # (fio prints the KiB figure in both bases)
        return (f"  steadystate  : attained={'yes' if self.attained else 'no'}, "
                f"bw={num2str(kib * 1024, 4, 1, True, 'B/s')} ({num2str(kib * 1000, 4, 1, False, 'B/s')}), "
                f"iops={num2str(iops_mean, 4, 1, False)}, {'iops' if self.spec.iops else 'bw'}"
                f"{' slope' if self.spec.slope else ' mean dev'}="
                f"{float(np.float32(self.criterion if np.isfinite(self.criterion) else 0.0)):.3f}"
                f"{'%' if self.spec.pct else ''}\n")


class Monitor:
    """fio's helper-thread check, once a second, over every job clone of the run that
    sets `ss_dur` (workers expose .job, .plan.groupid, .state, .progress_ios/_bytes,
    ._wall_start, .steady and .stop())."""

    def __init__(self, workers, interval_ns: int = CHECK_NS):
        self.workers = [w for w in workers if w.steady is not None]
        self.interval_ns = interval_ns
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
        group_bw = group_iops = group_over = 0
        for w in self.workers:
            ss = w.steady
            if w.state in ("_", "D", "E") or ss.attained or not w._wall_start:
                continue
            grouped = w.job["group_reporting"]
            if not grouped or w.plan.groupid != prev_group:
                group_bw = group_iops = group_over = 0
            prev_group = w.plan.groupid
            if ss.ramp_ns and not ss.ramp_over and now - w._wall_start >= ss.ramp_ns + 1_000_000_000:
                ss.ramp_over = True
            ios, nbytes = sum(w.progress_ios), sum(w.progress_bytes)
            if ss.prev_time is None:
                ss.prev_time = w._wall_start
            rate_ms = max(1, (now - ss.prev_time) // 1_000_000)
            ss.prev_time = now
            if ss.ramp_over:
                group_bw += 1000 * (nbytes - ss.prev_bytes) // rate_ms
                group_iops += 1000 * (ios - ss.prev_iops) // rate_ms
                group_over += 1
            ss.prev_iops, ss.prev_bytes = ios, nbytes
            if grouped and self.holder.get(w.plan.groupid) is not w:
                continue
            if not group_over:
                continue
            if ss.add(group_iops, group_bw):
                ended = [o for o in self.workers if o.plan.groupid == w.plan.groupid] if grouped else [w]
                for other in ended:
                    other.steady.attained = True
                    other.stop()
