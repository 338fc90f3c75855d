"""Statistics kept the way fio keeps them, so the numbers mean what fio's mean.

- LatencyStat: count/min/max/mean/stddev plus fio's log-linear histogram (64 buckets
  per power of two, <= 1/64 relative error), from which percentiles and json+ bins come.
- RateStat: bandwidth / IOPS samples (one per 500 ms window, fio's default).
- DirStats / JobStats: what one job clone (or a reporting group) did.
Updates are vectorised: one call per batch of I/Os, never one per I/O.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

PLAT_BITS = 6
PLAT_VAL = 1 << PLAT_BITS
PLAT_GROUPS = 29
PLAT_NR = PLAT_GROUPS * PLAT_VAL
DEFAULT_PERCENTILES = (1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0,
                       99.0, 99.5, 99.9, 99.95, 99.99)

# fio's latency distribution: bucket upper bounds per unit (value < bound), last msec one open
LAT_N_BOUNDS = (2, 4, 10, 20, 50, 100, 250, 500, 750, 1000)
LAT_U_BOUNDS = LAT_N_BOUNDS
LAT_M_BOUNDS = (2, 4, 10, 20, 50, 100, 250, 500, 750, 1000, 2000)
LAT_N_LABELS = tuple(str(b) for b in LAT_N_BOUNDS)
LAT_M_LABELS = tuple(str(b) for b in LAT_M_BOUNDS) + (">=2000",)
DEPTH_LABELS = ("1", "2", "4", "8", "16", "32", ">=64")
SUBMIT_LABELS = ("0", "4", "8", "16", "32", "64", ">=64")


def plat_index(values: np.ndarray) -> np.ndarray:
    """fio's bucket index of each latency (ns): exact below 128, then 64 buckets per octave."""
    v = np.asarray(values, np.int64).clip(0)
    _, exponent = np.frexp(v.astype(np.float64))  # exponent = bit length for v < 2**53
    msb = np.maximum(exponent.astype(np.int64) - 1, 0)
    error_bits = np.maximum(msb - PLAT_BITS, 0)
    index = ((error_bits + 1) << PLAT_BITS) + ((v >> error_bits) & (PLAT_VAL - 1))
    return np.where(msb <= PLAT_BITS, v, np.minimum(index, PLAT_NR - 1))


def plat_value(index: int) -> int:
    """The value a bucket stands for (the middle of its range), as fio reports it."""
    if index < (PLAT_VAL << 1):
        return index
    error_bits = (index >> PLAT_BITS) - 1
    base = 1 << (error_bits + PLAT_BITS)
    return int(base + ((index % PLAT_VAL) + 0.5) * (1 << error_bits))


class LatencyStat:
    def __init__(self):
        self.n = 0
        self.min = 0
        self.max = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations (Chan/Welford merge keeps it stable)
        self.hist = np.zeros(PLAT_NR, np.int64)

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, np.int64)
        k = values.shape[0]
        if k == 0:
            return
        vmin, vmax = int(values.min()), int(values.max())
        bmean = float(values.mean())
        bm2 = float(((values - bmean) ** 2).sum()) if k > 1 else 0.0
        self._merge(k, vmin, vmax, bmean, bm2)
        if k < 64:  # bincount over 1856 buckets costs more than it saves for small batches
            np.add.at(self.hist, plat_index(values), 1)
        else:
            self.hist += np.bincount(plat_index(values), minlength=PLAT_NR)[:PLAT_NR]

    def add_constant(self, value: int, count: int) -> None:
        """`count` samples of the same value (a batch that completed together)."""
        if count <= 0:
            return
        self._merge(count, value, value, float(value), 0.0)
        self.hist[int(plat_index(np.array([value]))[0])] += count

    def _merge(self, k: int, vmin: int, vmax: int, bmean: float, bm2: float) -> None:
        if self.n == 0:
            self.n, self.min, self.max, self.mean, self.m2 = k, vmin, vmax, bmean, bm2
            return
        total = self.n + k
        delta = bmean - self.mean
        self.mean += delta * k / total
        self.m2 += bm2 + delta * delta * self.n * k / total
        self.n = total
        self.min, self.max = min(self.min, vmin), max(self.max, vmax)

    def merge(self, other: "LatencyStat") -> None:
        if other.n:
            self._merge(other.n, other.min, other.max, other.mean, other.m2)
            self.hist += other.hist

    @property
    def stddev(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0

    def percentiles(self, plist=DEFAULT_PERCENTILES) -> list[tuple[float, int]]:
        """fio's rule: the first bucket where the running count reaches p% of all samples."""
        if self.n == 0:
            return []
        cumulative = np.cumsum(self.hist)
        out = []
        for p in sorted(plist):
            index = int(np.searchsorted(cumulative, p / 100.0 * self.n, side="left"))
            out.append((p, plat_value(min(index, PLAT_NR - 1))))
        return out

    def bins(self) -> dict[str, int]:
        nz = np.flatnonzero(self.hist)
        return {str(plat_value(int(i))): int(self.hist[i]) for i in nz}


class RateStat:
    """Samples of a rate (KiB/s or IOPS); summed across clones under group_reporting."""

    def __init__(self):
        self.samples: list[float] = []

    def add(self, value: float) -> None:
        self.samples.append(value)

    def summary(self) -> tuple[int, int, float, float, int]:
        """(min, max, mean, stddev, samples), fio-style (min/max integral)."""
        s = self.samples
        if not s:
            return 0, 0, 0.0, 0.0, 0
        arr = np.array(s, np.float64)
        dev = float(arr.std(ddof=1)) if arr.shape[0] > 1 else 0.0
        return int(arr.min()), int(arr.max()), float(arr.mean()), dev, arr.shape[0]

    def merge_sum(self, other: "RateStat") -> None:
        """group_reporting adds concurrent clones' rates window by window."""
        n = max(len(self.samples), len(other.samples))
        a = self.samples + [0.0] * (n - len(self.samples))
        b = other.samples + [0.0] * (n - len(other.samples))
        self.samples = [x + y for x, y in zip(a, b)]


def _bucket_counts(values_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    v = np.asarray(values_ns, np.int64)
    ns, us, ms = v[v < 1000], v[(v >= 1000) & (v < 1_000_000)] // 1000, v[v >= 1_000_000] // 1_000_000
    n_counts = np.bincount(np.searchsorted(LAT_N_BOUNDS, ns, side="right"), minlength=len(LAT_N_BOUNDS))
    u_counts = np.bincount(np.searchsorted(LAT_U_BOUNDS, us, side="right"), minlength=len(LAT_U_BOUNDS))
    m_counts = np.bincount(np.searchsorted(LAT_M_BOUNDS, ms, side="right"), minlength=len(LAT_M_BOUNDS) + 1)
    return n_counts[:10], u_counts[:10], m_counts[:12]


DEPTH_BOUNDS = (1, 2, 4, 8, 16, 32, 64)  # the first depth of each of fio's IO depths buckets


def depth_bucket(depth: int) -> int:
    """fio's IO depths row (io_u_mark_depth): a bucket holds the depths from its label up
    to the next one's: 1, 2-3 -> '2', 4-7 -> '4', ..., 32-63 -> '32', >= 64."""
    for i in range(6, 0, -1):
        if depth >= DEPTH_BOUNDS[i]:
            return i
    return 0


def depth_counts(ios: int, depth: int) -> np.ndarray:
    """fio's IO depths row for a batch of `ios` I/Os that an engine ran from empty with
    at most `depth` in flight: what was in flight at each submission, counting the one
    submitted (1, 2, ... up to depth while it fills, then depth)."""
    out = np.zeros(7, np.int64)
    filling = min(ios, depth)
    for i in range(7):  # submissions 1..filling fall into the buckets by their depth
        lo = DEPTH_BOUNDS[i]
        hi = DEPTH_BOUNDS[i + 1] - 1 if i < 6 else filling
        if lo <= filling:
            out[i] += min(hi, filling) - lo + 1
    out[depth_bucket(depth)] += ios - filling
    return out


def submit_bucket(n: int) -> int:
    """fio's submit/complete rows: 0, 1-4 -> '4', 5-8 -> '8', ... >64 -> '>=64'."""
    if n <= 0:
        return 0
    for i, bound in enumerate((4, 8, 16, 32, 64), start=1):
        if n <= bound:
            return i
    return 6


@dataclasses.dataclass
class DirStats:
    """One data direction (read or write)."""
    ios: int = 0
    bytes: int = 0
    short_ios: int = 0
    runtime_ms: int = 0
    slat: LatencyStat = dataclasses.field(default_factory=LatencyStat)
    clat: LatencyStat = dataclasses.field(default_factory=LatencyStat)
    lat: LatencyStat = dataclasses.field(default_factory=LatencyStat)
    bw: RateStat = dataclasses.field(default_factory=RateStat)  # KiB/s samples
    iops: RateStat = dataclasses.field(default_factory=RateStat)
    cache_hits: int = 0  # device-block hits/misses seen by this direction (cxlhm engine)
    cache_misses: int = 0
    slat_measured: bool = True
    prios: dict[int, LatencyStat] = dataclasses.field(default_factory=dict)  # priority tag -> clat (cmdprio.py)

    def merge(self, other: "DirStats") -> None:
        self.ios += other.ios
        self.bytes += other.bytes
        self.short_ios += other.short_ios
        self.runtime_ms = max(self.runtime_ms, other.runtime_ms)
        self.slat.merge(other.slat)
        self.clat.merge(other.clat)
        self.lat.merge(other.lat)
        self.bw.merge_sum(other.bw)
        self.iops.merge_sum(other.iops)
        self.cache_hits += other.cache_hits
        self.cache_misses += other.cache_misses
        self.slat_measured = self.slat_measured and other.slat_measured
        for tag, stat in other.prios.items():
            self.prios.setdefault(tag, LatencyStat()).merge(stat)

    @property
    def cachehit_percent(self) -> float | None:
        total = self.cache_hits + self.cache_misses
        return 100.0 * self.cache_hits / total if total else None


def unmeasured(job) -> frozenset[str]:
    """What fio's gtod_reduce and disable_* options leave unmeasured, of "lat", "clat"
    (with the latency distribution and the syncs' latencies), "slat", "bw" (the per-I/O
    bandwidth log) and "iops" (the per-I/O IOPS log: only with clat, slat and bw all off,
    fio's gtod_reduce()). The once-a-window bandwidth and IOPS samples stay, as in fio."""
    off = {kind for kind, option in (("lat", "disable_lat"), ("clat", "disable_clat"), ("slat", "disable_slat"),
                                     ("bw", "disable_bw_measurement")) if job["gtod_reduce"] or job[option]}
    if {"clat", "slat", "bw"} <= off:
        off.add("iops")
    return frozenset(off)


@dataclasses.dataclass
class JobStats:
    """What one job clone did; merged per group under group_reporting."""
    name: str
    groupid: int
    members: int = 1
    error: int = 0
    error_text: str = ""
    dirs: tuple[DirStats, DirStats] = dataclasses.field(default_factory=lambda: (DirStats(), DirStats()))
    depth_map: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(7, np.int64))
    submit_map: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(7, np.int64))
    complete_map: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(7, np.int64))
    lat_n: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(10, np.int64))
    lat_u: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(10, np.int64))
    lat_m: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(12, np.int64))
    run_ms: int = 0  # job_runtime
    elapsed_s: int = 0
    usr_s: float = 0.0
    sys_s: float = 0.0
    ctx: int = 0
    majf: int = 0
    minf: int = 0
    verify_errors: int = 0
    verified_blocks: int = 0  # blocks read back and checked (fio does not count them)
    cpu_wall_s: float = 0.0  # wall seconds the CPU figures are shares of (0: run_ms)
    iodepth: int = 1
    latency_depth: int = 0  # the depth fio's latency_target search found (0: no search)
    sync: LatencyStat = dataclasses.field(default_factory=LatencyStat)  # fsync=N / fdatasync=N syncs (syncs.py)
    syncs: int = 0  # every one of them, its latency kept or not
    fsyncs: int = 0  # of them, fsyncs (fio's sync total_ios)
    unmeasured: frozenset = frozenset()  # latencies the job does not keep (unmeasured())

    def record(self, direction: int, nbytes: int, ios: int, slat_ns, clat_ns, depth: int | None,
               prio_tags=None) -> None:
        """Account `ios` completed I/Os of one direction (vectorised latencies; `prio_tags`:
        each I/O's priority tag, whose completion latencies fio also keeps per priority)."""
        d = self.dirs[direction]
        d.ios += ios
        d.bytes += nbytes
        if depth is not None:  # (None: the caller marks the batch's depths with mark_depth)
            self.depth_map[depth_bucket(depth)] += ios
        clat = np.asarray(clat_ns, np.int64)
        off = self.unmeasured
        if d.slat_measured and slat_ns is not None:
            slat = np.asarray(slat_ns, np.int64)
            if "slat" not in off:
                d.slat.add(slat)
            if "lat" not in off:
                d.lat.add(clat + slat)
        elif "lat" not in off:
            d.lat.add(clat)
        if "clat" in off:
            return
        d.clat.add(clat)
        if prio_tags is not None:
            tags = np.asarray(prio_tags, np.int64)
            for tag in np.unique(tags).tolist():
                d.prios.setdefault(tag, LatencyStat()).add(clat[tags == tag])
        n, u, m = _bucket_counts(clat)
        self.lat_n += n
        self.lat_u += u
        self.lat_m += m

    def record_sync(self, latency_ns: int, fsync: bool) -> None:
        """One fsync=N / fdatasync=N sync (fio marks it in the depth histogram at depth 1)."""
        if "clat" not in self.unmeasured:
            self.sync.add(np.array([latency_ns], np.int64))
        self.syncs += 1
        self.fsyncs += fsync
        self.depth_map[0] += 1

    def mark_depth(self, ios: int, depth: int) -> None:
        """The IO depths of a batch the engine ran from empty (see depth_counts)."""
        self.depth_map += depth_counts(ios, depth)

    def merge(self, other: "JobStats") -> None:
        self.members += other.members
        if other.error and not self.error:
            self.error, self.error_text = other.error, other.error_text
        for mine, theirs in zip(self.dirs, other.dirs):
            mine.merge(theirs)
        for name in ("depth_map", "submit_map", "complete_map", "lat_n", "lat_u", "lat_m"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        # fio's group_reporting: job_runtime and the CPU figures' base are the clones'
        # sums (each direction's runtime is the longest, in DirStats.merge)
        self.run_ms += other.run_ms
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)
        self.usr_s += other.usr_s
        self.sys_s += other.sys_s
        self.ctx += other.ctx
        self.majf += other.majf
        self.minf += other.minf
        self.verify_errors += other.verify_errors
        self.verified_blocks += other.verified_blocks
        self.cpu_wall_s += other.cpu_wall_s
        self.sync.merge(other.sync)
        self.syncs += other.syncs
        self.fsyncs += other.fsyncs

    def cpu_percent(self) -> tuple[float, float]:
        """usr and sys CPU as percentages of the job's run time on the wall clock (a
        model-clock run time is not time the CPU could have been busy in)."""
        base = self.cpu_wall_s or self.run_ms / 1000.0
        if not base:
            return 0.0, 0.0
        return 100.0 * self.usr_s / base, 100.0 * self.sys_s / base

    @property
    def total_ios(self) -> int:
        return self.dirs[0].ios + self.dirs[1].ios


def percent_dist(counts: np.ndarray, total: int, floor: float) -> list[float]:
    """Counts as percentages of `total`, with fio's floor for non-zero buckets."""
    out = []
    for c in counts.tolist():
        pct = 100.0 * c / total if total else 0.0
        out.append(max(pct, floor) if c and pct < floor else pct)
    return out


# fio's unit codes (lib/num2str.h); its "unit_base differs" notice prints them
N2S_BYTEPERSEC, N2S_BITPERSEC = 4, 5


def num2str(num: int, maxlen: int = 4, base: int = 1, pow2: bool = True, unit: str = "") -> str:
    """fio's compact numbers: 24336 -> '24.3k', 199229440 bytes -> '190MiB'.
    Divides by 1000/1024 until the integer part has at most `maxlen` digits, then shows
    as many decimals as still fit. A unit of "bit" or "bit/s" counts a byte `num` in
    bits (x8), as fio's N2S_BIT and N2S_BITPERSEC do."""
    prefixes = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei") if pow2 else ("", "k", "M", "G", "T", "P", "E")
    thousand = 1024 if pow2 else 1000
    index = 0
    while base > 1:
        base //= thousand
        index += 1
    num = int(num)
    if unit in ("bit", "bit/s"):
        num *= 8
    modulo = None
    carry = False
    while index < len(prefixes) and len(str(num)) > maxlen:
        modulo = num % thousand
        num //= thousand
        carry = modulo >= thousand / 2
        index += 1
    if index >= len(prefixes):
        index = 0
    if modulo is None:
        return f"{num}{prefixes[index]}{unit}"
    decimals = maxlen - len(str(num)) - 1
    if decimals <= 0:
        return f"{num + (1 if carry else 0)}{prefixes[index]}{unit}"
    frac = f"{modulo / thousand:.{decimals}f}"
    if frac.startswith("1"):  # rounding carried into the integer part; fio keeps the ".0"
        num += 1
    return f"{num}.{frac[2:]}{prefixes[index]}{unit}"


@dataclasses.dataclass(frozen=True)
class TextUnits:
    """How fio's normal output writes a job's data quantities: `sig_figs` digits
    (significant_figures), binary (KiB) or decimal (kB) prefixes first by `kb_base`,
    and rates in bytes or in `bits` (unit_base=1). Sizes are always bytes, as in fio."""
    sig_figs: int = 4
    kb_base: int = 1024
    bits: bool = False

    @classmethod
    def of_job(cls, job) -> "TextUnits":
        # unit_base 0 asks fio to pick: bits only for its network engines, which
        # cxlhm fio has none of, so bytes
        return cls(job["significant_figures"], job["kb_base"], job["unit_base"] == "1")

    @property
    def pow2(self) -> bool:
        return self.kb_base & (self.kb_base - 1) == 0

    @property
    def n2s_code(self) -> int:
        return N2S_BITPERSEC if self.bits else N2S_BYTEPERSEC

    def rate(self, bytes_per_s: int, *, alt: bool = False) -> str:
        """A bandwidth; `alt` gives the other prefix family (fio's "(...)" figure)."""
        return num2str(bytes_per_s, self.sig_figs, 1, self.pow2 != alt, "bit/s" if self.bits else "B/s")

    def size(self, nbytes: int, *, alt: bool = False) -> str:
        return num2str(nbytes, self.sig_figs, 1, self.pow2 != alt, "B")

    def count(self, n: int) -> str:
        """A plain count such as IOPS: always decimal prefixes."""
        return num2str(n, self.sig_figs, 1, False)
