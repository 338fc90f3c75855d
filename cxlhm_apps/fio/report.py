"""fio's output formats from a RunResult: the normal text report, JSON and json+.

Layout, key names and number formats follow fio 3.33's stat.c (read, not copied), so
tools that read fio output (fio-plot, fio2gnuplot-style scripts, dashboards) read
ours. Additions are marked: `cachehit` per direction (fio's own key, filled from the
device's DRAM hits), `cxlhm_verify` per job (blocks checked, failures) and a top-level
`cxlhm_devices` list.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import numpy as np

from cxlhm_apps.fio import options as O
from cxlhm_apps.fio.cmdprio import split_tag
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.runner import CloneResult, RunResult
from cxlhm_apps.fio.stats import (
    DEFAULT_PERCENTILES, DEPTH_LABELS, LAT_M_LABELS, LAT_N_LABELS, SUBMIT_LABELS, DirStats, JobStats,
    LatencyStat, TextUnits, num2str, percent_dist,
)



def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("cxlhm")
    except PackageNotFoundError:
        return "0+unknown"


VERSION = f"cxlhm-fio-{_package_version()}"
DIR_NAMES = ("read", "write")


class Unit:
    """One reported job: a clone, or a whole group under group_reporting."""

    def __init__(self, clones: list[CloneResult], stats: JobStats):
        self.clones, self.stats = clones, stats
        self.job = clones[0].plan.job
        self.engine = clones[0].engine
        self.device = clones[0].device
        # steady-state detection: a group's last clone holds the group's (fio's steadystate_setup)
        self.steady = next((c.steady for c in reversed(clones) if c.steady is not None), None)
        # a group's figures follow its first job's significant_figures, kb_base and unit_base
        self.units = TextUnits.of_job(self.job)

    @property
    def percentiles(self) -> tuple[float, ...]:
        return self.job["percentile_list"] or DEFAULT_PERCENTILES


def _copy_stats(stats: JobStats) -> JobStats:
    fresh = JobStats(stats.name, stats.groupid, members=0, iodepth=stats.iodepth, unmeasured=stats.unmeasured)
    fresh.merge(stats)
    fresh.latency_depth = stats.latency_depth
    return fresh


def build_units(result: RunResult) -> list[Unit]:
    units: list[Unit] = []
    groups: dict[int, list[CloneResult]] = {}
    for clone in result.clones:
        groups.setdefault(clone.plan.groupid, []).append(clone)
    for gid in sorted(groups):
        members = groups[gid]
        if any(c.plan.job["group_reporting"] for c in members):
            merged = _copy_stats(members[0].stats)
            for c in members[1:]:
                merged.merge(c.stats)
            units.append(Unit(members, merged))
        else:
            units.extend(Unit([c], c.stats) for c in members)
    return units


class GroupSummary:
    """fio's `Run status group` numbers for one direction."""

    def __init__(self, units: list[Unit], direction: int):
        dirs = [u.stats.dirs[direction] for u in units if u.stats.dirs[direction].runtime_ms]
        self.active = bool(dirs)
        self.io_bytes = sum(d.bytes for d in dirs)
        runs = [d.runtime_ms for d in dirs] or [0]
        self.min_run, self.max_run = min(runs), max(runs)
        rates = [1000 * d.bytes // d.runtime_ms for d in dirs] or [0]
        self.min_bw, self.max_bw = min(rates), max(rates)
        self.agg = 1000 * self.io_bytes // self.max_run if self.max_run else 0


def agg_percent(bw_mean_kib: float, group_agg: int) -> float:
    """A job's mean bandwidth sample as a share of its group's aggregate (fio's
    per= and bw_agg). fio passes the mean as an int, so its fraction is dropped."""
    if group_agg <= 1024:
        return 100.0
    return min(100.0, int(bw_mean_kib) * 100.0 / (group_agg / 1024.0))


def group_summaries(units: list[Unit]) -> dict[int, tuple[GroupSummary, GroupSummary]]:
    by_gid: dict[int, list[Unit]] = {}
    for u in units:
        by_gid.setdefault(u.stats.groupid, []).append(u)
    return {gid: (GroupSummary(us, READ), GroupSummary(us, WRITE)) for gid, us in by_gid.items()}


# ---------------------------------------------------------------- JSON

def _lat_json(stat: LatencyStat, plist, *, bins: bool, percentiles: bool) -> dict:
    """fio's latency object; percentiles (and json+ bins) only where the job asked for
    them (slat_percentiles, clat_percentiles - on by default - or lat_percentiles)."""
    out = {"min": stat.min if stat.n else 0, "max": stat.max if stat.n else 0,
           "mean": stat.mean if stat.n else 0.0, "stddev": stat.stddev, "N": stat.n}
    if percentiles and stat.n:
        out["percentile"] = {f"{p:f}": v for p, v in stat.percentiles(plist)}
        if bins:
            out["bins"] = stat.bins()
    return out


def _prios_with_samples(d: DirStats) -> list:
    """((index, class, level), completion latencies) per priority with samples, in fio's
    order; none unless two priorities or more have samples (fio shows them only then)."""
    prios = sorted((split_tag(tag), stat) for tag, stat in d.prios.items() if stat.n)
    return prios if len(prios) >= 2 else []


def _dir_json(d: DirStats, group_agg: int, plist, job, *, bins: bool) -> dict:
    runt = d.runtime_ms
    bw_bytes = 1000 * d.bytes // runt if runt else 0
    out = {
        "io_bytes": d.bytes, "io_kbytes": d.bytes >> 10, "bw_bytes": bw_bytes, "bw": bw_bytes // 1024,
        "iops": 1000.0 * d.ios / runt if runt else 0.0, "runtime": runt, "total_ios": d.ios,
        "short_ios": d.short_ios, "drop_ios": 0,
        "slat_ns": _lat_json(d.slat, plist, bins=bins, percentiles=job["slat_percentiles"]),
        "clat_ns": _lat_json(d.clat, plist, bins=bins, percentiles=job["clat_percentiles"]),
        "lat_ns": _lat_json(d.lat, plist, bins=bins, percentiles=job["lat_percentiles"]),
    }
    prios = _prios_with_samples(d)
    if prios:
        which = "lat_ns" if job["lat_percentiles"] else "clat_ns"
        out["prios"] = [{"prioclass": klass, "prio": level,
                         which: _lat_json(stat, plist, bins=bins,
                                          percentiles=job["clat_percentiles"] or job["lat_percentiles"])}
                        for (_index, klass, level), stat in prios]
    bmin, bmax, bmean, bdev, bn = d.bw.summary()
    agg_pct = agg_percent(bmean, group_agg) if bn else 0.0
    imin, imax, imean, idev, inn = d.iops.summary()
    out.update({"bw_min": bmin, "bw_max": bmax, "bw_agg": agg_pct, "bw_mean": bmean, "bw_dev": bdev, "bw_samples": bn,
                "iops_min": imin, "iops_max": imax, "iops_mean": imean, "iops_stddev": idev, "iops_samples": inn})
    if d.cachehit_percent is not None:
        out["cachehit"] = d.cachehit_percent
    return out


def _latency_search(s: JobStats, job) -> dict:
    """fio's latency-target keys: the depth its search found (the job's iodepth when it
    searched none); as fio 3.33, the target in nanoseconds and the window in microseconds."""
    return {"latency_depth": s.latency_depth or job["iodepth"], "latency_target": job["latency_target"],
            "latency_percentile": float(job["latency_percentile"]), "latency_window": job["latency_window"] // 1000}


def _empty_dir_json() -> dict:
    zero = {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}
    return {"io_bytes": 0, "io_kbytes": 0, "bw_bytes": 0, "bw": 0, "iops": 0.0, "runtime": 0, "total_ios": 0,
            "short_ios": 0, "drop_ios": 0, "slat_ns": dict(zero), "clat_ns": dict(zero), "lat_ns": dict(zero),
            "bw_min": 0, "bw_max": 0, "bw_agg": 0.0, "bw_mean": 0.0, "bw_dev": 0.0, "bw_samples": 0,
            "iops_min": 0, "iops_max": 0, "iops_mean": 0.0, "iops_stddev": 0.0, "iops_samples": 0}


def job_options(unit: Unit) -> dict[str, str]:
    """fio's "job options": the options the job's own section gives a value, as written
    (fio lists no bare flag such as `stonewall`, and leaves the key out when nothing is
    left). A group under group_reporting shows its last job's, as fio does (each member
    it adds replaces the list)."""
    last = unit.clones[-1].plan.job
    return {_fio_name(raw): raw.text for raw in last.job_options if raw.text is not None}


def _fio_name(raw) -> str:
    """The name fio reports an option by: its own name, whichever alias was written."""
    return O.FIO_NAME.get(raw.canonical, raw.canonical)


def _depth_json(counts: np.ndarray, labels, total: int | None = None) -> dict:
    total = int(counts.sum()) if total is None else total
    return dict(zip(labels, percent_dist(counts, total, 0.1)))


def _depth_total(s) -> int:
    """What fio's IO depths are shares of: the reads and writes, though its syncs are
    marked in them too (a write job at fsync=4 shows depth 1 at 123.4%)."""
    return int(s.depth_map.sum()) - s.syncs


def unit_json(unit: Unit, groups, *, bins: bool) -> dict:
    s = unit.stats
    job = unit.job
    plist = unit.percentiles
    read_g, write_g = groups[s.groupid]
    out = {"jobname": job.name, "groupid": s.groupid, "error": s.error, "eta": 0, "elapsed": s.elapsed_s}
    if job_options(unit):
        out["job options"] = job_options(unit)
    for d, name, g in ((READ, "read", read_g), (WRITE, "write", write_g)):
        out[name] = _dir_json(s.dirs[d], g.agg, plist, job, bins=bins) if s.dirs[d].ios else _empty_dir_json()
    out["trim"] = _empty_dir_json()
    out["sync"] = {"total_ios": s.fsyncs, "lat_ns": _lat_json(s.sync, plist, bins=bins, percentiles=True)}
    total = s.total_ios
    usr, sys_ = s.cpu_percent()
    out.update({"job_runtime": s.run_ms, "usr_cpu": usr, "sys_cpu": sys_,
                "ctx": s.ctx, "majf": s.majf, "minf": s.minf,
                "iodepth_level": _depth_json(s.depth_map, DEPTH_LABELS, _depth_total(s)),
                "iodepth_submit": _depth_json(s.submit_map, SUBMIT_LABELS),
                "iodepth_complete": _depth_json(s.complete_map, SUBMIT_LABELS),
                "latency_ns": dict(zip(LAT_N_LABELS, percent_dist(s.lat_n, total, 0.01))),
                "latency_us": dict(zip(LAT_N_LABELS, percent_dist(s.lat_u, total, 0.01))),
                "latency_ms": dict(zip(LAT_M_LABELS, percent_dist(s.lat_m, total, 0.01))),
                **_latency_search(s, job)})
    if unit.steady is not None:
        out["steadystate"] = unit.steady.to_json()
    if job["description"]:
        out["desc"] = job["description"]
    if job["verify"] not in ("0", "null"):
        out["cxlhm_verify"] = {"blocks_checked": s.verified_blocks, "failures": s.verify_errors}
    return out


def to_json(result: RunResult, global_options, *, plus: bool = False) -> dict:
    units = build_units(result)
    groups = group_summaries(units)
    started = result.started
    out = {"fio version": VERSION, "timestamp": int(started), "timestamp_ms": int(started * 1000),
           "time": time.ctime(started),
           "global options": {raw.key: ("1" if raw.text is None else raw.text) for raw in global_options},
           "jobs": [unit_json(u, groups, bins=plus) for u in units]}
    if result.devices:
        out["cxlhm_devices"] = result.devices
    return out


def format_json(result: RunResult, global_options, *, plus: bool = False) -> str:
    return json.dumps(to_json(result, global_options, plus=plus), indent=2) + "\n"


# ---------------------------------------------------------------- normal text

# fio is built with -ffast-math, which makes its floating divisions multiplications by
# the reciprocal; the two differ in the last bit, enough to move a printed x.xx5 up or down
def _fio_divide(value: float, divisor: float) -> float:
    return value * (1.0 / divisor)


def _scale_lat(mn: int, mx: int, mean: float, dev: float):
    if mn > 2_000_000 and mx > 99_999_999 and dev > 1_000_000.0:
        return "msec", mn // 1_000_000, mx // 1_000_000, _fio_divide(mean, 1e6), _fio_divide(dev, 1e6)
    if mn > 2000 and mx > 99_999 and dev > 1000.0:
        return "usec", mn // 1000, mx // 1000, _fio_divide(mean, 1e3), _fio_divide(dev, 1e3)
    return "nsec", mn, mx, mean, dev


def _lat_line(name: str, stat: LatencyStat) -> str:
    unit, mn, mx, mean, dev = _scale_lat(stat.min, stat.max, stat.mean, stat.stddev)
    return (f"    {name} ({unit}): min={num2str(mn, 6, 1, False)}, max={num2str(mx, 6, 1, False)}, "
            f"avg={mean:5.02f}, stdev={dev:5.02f}\n")


def _percentile_block(name: str, stat: LatencyStat, plist) -> str:
    values = stat.percentiles(plist)
    if not values:
        return ""
    vals = [v for _, v in values]
    mn, mx = min(vals), max(vals)
    if mn > 2_000_000 and mx > 99_999_999:
        unit, divisor, steps = "msec", 1_000_000, 2
    elif mn > 2000 and mx > 99_999:
        unit, divisor, steps = "usec", 1000, 1
    else:
        unit, divisor, steps = "nsec", 1, 0
    width = max(5, int(math.log10(max(mx // divisor, 1)) + 1))
    per_line = (80 - 7) // (2 + 10 + width)
    out = [f"    {name} percentiles ({unit}):\n     |"]
    for j, (p, v) in enumerate(values):
        if j and j % per_line == 0:
            out.append("     |")
        for _ in range(steps):
            v = (v + 999) // 1000
        last = j == len(values) - 1
        out.append(f" {p:5.2f}th=[{v:{width}d}]{chr(10) if last else ','}")
        if not last and j % per_line == per_line - 1:
            out.append("\n")
    return "".join(out)


def _bw_stat_unit(mean_kib: float, group_units: TextUnits) -> tuple[str, float]:
    """The label and divisor of the bw samples line, from the group's kb_base. fio
    3.33 means to switch to Kibit/Mibit at unit_base=1, but compares its unit code
    (N2S_BITPERSEC) with 1, so the samples always show in bytes; we print what it prints."""
    kb = float(group_units.kb_base)
    if mean_kib > kb * kb:
        return "MiB", kb
    return ("KiB" if group_units.pow2 else "kB"), 1.0


def _rate_lines(d: DirStats, group_agg: int, group_units: TextUnits) -> str:
    out = []
    bmin, bmax, bmean, bdev, bn = d.bw.summary()
    if bn:
        pct = agg_percent(bmean, group_agg)
        unit, scale = _bw_stat_unit(bmean, group_units)
        mn, mx, mean, dev = (_fio_divide(v, scale) for v in (bmin, bmax, bmean, bdev))
        out.append(f"   bw ({unit:>5}/s): min={int(mn):5d}, max={int(mx):5d}, per={pct:3.2f}%, "
                   f"avg={mean:5.02f}, stdev={dev:5.02f}, samples={bn}\n")
    imin, imax, imean, idev, inn = d.iops.summary()
    if inn:
        out.append(f"   iops        : min={imin:5d}, max={imax:5d}, avg={imean:5.02f}, stdev={idev:5.02f}, samples={inn}\n")
    return "".join(out)


def _dir_summary(unit: Unit, direction: int, group_units: TextUnits) -> str:
    """The `  read: IOPS=..., BW=... (...)(.../...msec)` line: the job's significant
    figures and unit_base, but the group's kb_base picks the prefixes (as fio does)."""
    d = unit.stats.dirs[direction]
    units = dataclasses.replace(unit.units, kb_base=group_units.kb_base)
    runt = d.runtime_ms
    bw = 1000 * d.bytes // runt
    iops = 1000 * d.ios // runt
    extra = ""
    if direction == READ and d.cachehit_percent is not None:
        extra = f"; Cachehit={d.cachehit_percent:0.2f}%"
    return (f"  {DIR_NAMES[direction]}: IOPS={units.count(iops)}, BW={units.rate(bw)} "
            f"({units.rate(bw, alt=True)})({units.size(d.bytes)}/{runt}msec){extra}\n")


def _dir_text(unit: Unit, direction: int, group_agg: int, group_units: TextUnits) -> str:
    d = unit.stats.dirs[direction]
    job = unit.job
    out = [_dir_summary(unit, direction, group_units)]
    if d.slat.n:
        out.append(_lat_line("slat", d.slat))
    if d.clat.n:
        out.append(_lat_line("clat", d.clat))
    if d.lat.n:
        out.append(_lat_line(" lat", d.lat))
    prios = _prios_with_samples(d)
    kind = "lat" if job["lat_percentiles"] else "clat"
    for (_i, klass, level), stat in prios:
        out.append(_lat_line(f"{kind} prio {klass}/{level}", stat))
    plist = unit.percentiles
    if job["slat_percentiles"] and d.slat.n:
        out.append(_percentile_block("slat", d.slat, plist))
    if job["clat_percentiles"] and d.clat.n:
        out.append(_percentile_block("clat", d.clat, plist))
    if job["lat_percentiles"] and d.lat.n:
        out.append(_percentile_block("lat", d.lat, plist))
    if job["clat_percentiles"] or job["lat_percentiles"]:
        samples = d.lat.n if job["lat_percentiles"] else d.clat.n
        for (_i, klass, level), stat in prios:
            out.append(_percentile_block(f"{kind} prio {klass}/{level} ({100.0 * stat.n / samples:.2f}% of IOs)",
                                         stat, plist))
    out.append(_rate_lines(d, group_agg, group_units))
    return "".join(out)


def _lat_dist_text(counts: np.ndarray, labels, unit: str, total: int) -> str:
    pcts = percent_dist(counts, total, 0.01)
    entries = [f"{label}={pct:3.2f}%" for label, pct in zip(labels, pcts) if pct > 0]
    lines = [f"  lat ({unit})   : " + ", ".join(entries[i:i + 5]) + "\n" for i in range(0, len(entries), 5)]
    return "".join(lines)


def _device_text(device: dict) -> str:
    c = device.get("counters", {})
    return (f"  cxlhm device : {device['backing_file']}: profile={device['profile']}, policy={device['policy']}, "
            f"dram={num2str(device['dram_bytes'], 4, 1, True, 'B')}, block={num2str(device['block_size'], 4, 1, True, 'B')}, "
            f"clock={device['clock']}\n"
            f"     counters  : hits={c.get('hits', 0)}, misses={c.get('misses', 0)}, fill_reads={c.get('fill_reads', 0)}, "
            f"evictions={c.get('evictions', 0)}, writebacks={c.get('writebacks', 0)}\n")


def _steady_num2str(units: TextUnits):
    """The num2str steadystate's line is written with: fio writes all its figures with
    the job's significant figures, and its bandwidth in bits at unit_base=1."""
    def fmt(num: int, _maxlen: int = 4, base: int = 1, pow2: bool = True, unit: str = "") -> str:
        if unit == "B/s" and units.bits:
            unit = "bit/s"
        return num2str(num, units.sig_figs, base, pow2, unit)
    return fmt


def unit_text(unit: Unit, groups, group_units: dict[int, TextUnits]) -> str:
    s = unit.stats
    when = time.ctime()
    err = f"err={s.error:2d}" + (f" ({s.error_text})" if s.error else "")
    out = [f"{unit.job.name}: (groupid={s.groupid}, jobs={s.members}): {err}: pid={os.getpid()}: {when}\n"]
    if unit.job["description"]:
        out.append(f"  Description  : [{unit.job['description']}]\n")
    read_g, write_g = groups[s.groupid]
    for d, g in ((READ, read_g), (WRITE, write_g)):
        if s.dirs[d].ios and s.dirs[d].runtime_ms:
            out.append(_dir_text(unit, d, g.agg, group_units[s.groupid]))
    total = s.total_ios
    out.append(_lat_dist_text(s.lat_n, LAT_N_LABELS, "nsec", total))
    out.append(_lat_dist_text(s.lat_u, LAT_N_LABELS, "usec", total))
    out.append(_lat_dist_text(s.lat_m, LAT_M_LABELS, "msec", total))
    if s.sync.n:
        out.append("  fsync/fdatasync/sync_file_range:\n" + _lat_line("sync", s.sync) +
                   _percentile_block("sync", s.sync, unit.percentiles))
    usr, sys_ = s.cpu_percent()
    out.append(f"  cpu          : usr={usr:3.2f}%, sys={sys_:3.2f}%, ctx={s.ctx}, majf={s.majf}, minf={s.minf}\n")
    depth = percent_dist(s.depth_map, _depth_total(s), 0.1)
    out.append("  IO depths    : " + ", ".join(f"{k}={v:3.1f}%" for k, v in zip(DEPTH_LABELS, depth)) + "\n")
    for name, counts in (("submit", s.submit_map), ("complete", s.complete_map)):
        dist = percent_dist(counts, int(counts.sum()), 0.1)
        out.append(f"     {name:<10}: " + ", ".join(f"{k}={v:3.1f}%" for k, v in zip(SUBMIT_LABELS, dist)) + "\n")
    out.append(f"     issued rwts: total={s.dirs[0].ios},{s.dirs[1].ios},0,{s.fsyncs} short={s.dirs[0].short_ios},"
               f"{s.dirs[1].short_ios},0,0 dropped=0,0,0,0\n")
    lat = _latency_search(s, unit.job)
    out.append(f"     latency   : target={lat['latency_target']}, window={lat['latency_window']}, "
               f"percentile={lat['latency_percentile']:.2f}%, depth={lat['latency_depth']}\n")
    if unit.steady is not None:
        out.append(unit.steady.text_line(_steady_num2str(unit.units)))
    if unit.job["verify"] not in ("0", "null"):
        out.append(f"  verify       : {s.verified_blocks} blocks checked, {s.verify_errors} failed\n")
    if unit.device:
        out.append(_device_text(unit.device))
    return "".join(out)


def header_text(result: RunResult) -> str:
    """The lines fio prints before running: one per job (plus '...' for clones)."""
    out = []
    seen = set()
    for clone in result.clones:
        job = clone.plan.job
        if job.index in seen:
            continue
        seen.add(job.index)
        out.append(job_header(job, clone.plan.groupid) + "\n")
        if job["numjobs"] > 1:
            out.append("...\n")
    out.append(f"{VERSION}\n")
    n = len(result.clones)
    out.append(f"Starting {n} thread{'s' if n != 1 else ''}\n")
    return "".join(out)


def job_header(job, groupid: int = 0) -> str:
    from cxlhm_apps.fio.pattern import size_choices
    r, w = size_choices(job.values)
    units = TextUnits.of_job(job)  # fio writes the block sizes with the job's own figures

    def rng(c):
        return f"{units.size(c.min)}-{units.size(c.max)}"
    return (f"{job.name}: (g={groupid}): rw={job['rw'].name}, bs=(R) {rng(r)}, (W) {rng(w)}, "
            f"(T) {rng(w)}, ioengine={job['ioengine']}, iodepth={job['iodepth']}")


def group_text_units(units: list[Unit]) -> dict[int, TextUnits]:
    """Each group's `Run status group` units: fio sets them from each reported job of
    the group in turn, so its last one's hold."""
    return {u.stats.groupid: u.units for u in units}


def group_notices(units: list[Unit]) -> str:
    """fio's notices for a group_reporting group whose jobs disagree on kb_base or
    unit_base (each shown once a run; the group keeps its first job's). Jobs that
    disagree on significant_figures get none."""
    out = []
    warned = set()
    for unit in units:
        first = unit.units
        for clone in unit.clones[1:]:
            other = TextUnits.of_job(clone.plan.job)
            if other.kb_base != first.kb_base and "kb_base" not in warned:
                out.append(f"fio: kb_base differs for jobs in group, using {first.kb_base} as the base\n")
                warned.add("kb_base")
            elif other.bits != first.bits and "unit_base" not in warned:
                out.append(f"fio: unit_base differs for jobs in group, using {first.n2s_code} as the base\n")
                warned.add("unit_base")
    return "".join(out)


def group_text(gid: int, summaries: tuple[GroupSummary, GroupSummary], units: TextUnits) -> str:
    out = [f"\nRun status group {gid} (all jobs):\n"]
    for g, label in zip(summaries, ("   READ", "  WRITE")):
        if not g.active:
            continue
        out.append(f"{label}: bw={units.rate(g.agg)} ({units.rate(g.agg, alt=True)}), "
                   f"{units.rate(g.min_bw)}-{units.rate(g.max_bw)} "
                   f"({units.rate(g.min_bw, alt=True)}-{units.rate(g.max_bw, alt=True)}), "
                   f"io={units.size(g.io_bytes)} ({units.size(g.io_bytes, alt=True)}), "
                   f"run={g.min_run}-{g.max_run}msec\n")
    return "".join(out)


def format_normal(result: RunResult) -> str:
    units = build_units(result)
    groups = group_summaries(units)
    text_units = group_text_units(units)
    out = [header_text(result), group_notices(units), "\n"]
    for unit in units:
        if unit.clones[0].plan.job["stats"]:  # (fio prints no block for a job with stats=0)
            out.append(unit_text(unit, groups, text_units))
    for gid in sorted(groups):
        out.append(group_text(gid, groups[gid], text_units[gid]))
    return "".join(out)
