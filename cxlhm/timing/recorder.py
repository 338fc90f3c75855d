"""Per-access latency records for either clock, with fio-style percentiles and a CDF.

Records live in a fixed numpy array written by the compiled `record()`, so the trace
loop and the device record without the interpreter. Every k-th access is kept (k=1:
all); when the array fills up, every other kept record is dropped and k doubles, so
memory stays bounded and the kept records stay an evenly spaced sample. Count, min,
max, mean and standard deviation always cover every access, sampled or not.
"""
from __future__ import annotations

import numpy as np

from cxlhm.jit import njit

# fio's default completion-latency percentiles (17 of them)
FIO_PERCENTILES = (1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0,
                   99.0, 99.5, 99.9, 99.95, 99.99)

M_SEEN, M_STORED, M_EVERY, M_MIN, M_MAX, M_MEAN, M_M2, N_META = range(8)


@njit
def record(values, meta, latency_ns):
    """Account one latency (ns) and keep it if it is a sampled one."""
    seen = meta[M_SEEN]
    meta[M_SEEN] = seen + 1.0
    if seen == 0.0 or latency_ns < meta[M_MIN]:
        meta[M_MIN] = latency_ns
    if seen == 0.0 or latency_ns > meta[M_MAX]:
        meta[M_MAX] = latency_ns
    delta = latency_ns - meta[M_MEAN]  # Welford: stable mean and variance
    meta[M_MEAN] += delta / (seen + 1.0)
    meta[M_M2] += delta * (latency_ns - meta[M_MEAN])
    if seen % meta[M_EVERY] != 0.0:
        return
    stored = np.int64(meta[M_STORED])
    if stored == values.shape[0]:  # full: keep every other record, sample half as often
        kept = 0
        for j in range(0, stored, 2):
            values[kept] = values[j]
            kept += 1
        stored = kept
        meta[M_EVERY] *= 2.0
        meta[M_STORED] = stored
        if seen % meta[M_EVERY] != 0.0:
            return
    values[stored] = latency_ns
    meta[M_STORED] = stored + 1


class LatencyRecorder:
    """`capacity` records at most; keep every `every`-th access (1 = all)."""

    def __init__(self, capacity: int = 1 << 20, every: int = 1):
        if capacity < 2 or every < 1:
            raise ValueError("capacity must be >= 2 and every >= 1")
        self.values = np.zeros(capacity, np.float64)
        self.meta = np.zeros(N_META, np.float64)
        self.meta[M_EVERY] = every

    def record(self, latency_ns: float) -> None:
        record(self.values, self.meta, float(latency_ns))

    def record_many(self, latencies_ns) -> None:
        _record_many(self.values, self.meta, np.ascontiguousarray(latencies_ns, np.float64))

    def reset(self) -> None:
        every = self.meta[M_EVERY]
        self.meta[:] = 0.0
        self.meta[M_EVERY] = every

    @property
    def count(self) -> int:
        return int(self.meta[M_SEEN])

    @property
    def every(self) -> int:
        return int(self.meta[M_EVERY])

    @property
    def samples(self) -> np.ndarray:
        return self.values[:int(self.meta[M_STORED])]

    def percentiles(self, pcts=FIO_PERCENTILES) -> dict[float, float]:
        """{percentile: latency}: the smallest recorded latency with at least p% of the
        records at or below it (how fio reads its histogram)."""
        s = self.samples
        if s.size == 0:
            return {float(p): 0.0 for p in pcts}
        vals = np.percentile(s, list(pcts), method="inverted_cdf")
        return {float(p): float(v) for p, v in zip(pcts, vals)}

    def cdf(self, points=None):
        """Without points: (sorted latencies, fraction at or below each). With points:
        the fraction of records at or below each point."""
        s = np.sort(self.samples)
        if points is None:
            return s, np.arange(1, s.size + 1, dtype=np.float64) / max(s.size, 1)
        points = np.asarray(points, np.float64)
        return np.searchsorted(s, points, side="right") / max(s.size, 1)

    def summary(self, pcts=FIO_PERCENTILES) -> dict:
        """fio's clat_ns object: min, max, mean, stddev, N, percentile {"99.000000": ns}."""
        n = self.count
        return {
            "min": float(self.meta[M_MIN]) if n else 0.0,
            "max": float(self.meta[M_MAX]) if n else 0.0,
            "mean": float(self.meta[M_MEAN]) if n else 0.0,
            "stddev": float(np.sqrt(self.meta[M_M2] / (n - 1))) if n > 1 else 0.0,
            "N": n,
            "percentile": {f"{p:.6f}": v for p, v in self.percentiles(pcts).items()},
        }


@njit
def _record_many(values, meta, latencies):
    for x in latencies:
        record(values, meta, x)
