"""cxlhm-fio against real fio, on the same backing file, in one run.

    .venv/bin/python bench/bench_fio.py [--dir out/bench-fio] [--runtime 3] [--rounds 5] [--only NAME]

Each workload runs under real fio (ioengine=io_uring, direct=1) and under cxlhm-fio with
ioengine=cxlhm (device block = the I/O size, a device DRAM far smaller than the file;
wall clock), on the same file:
  4k randread QD32                 IOPS       (every read misses device DRAM)
  1M seqread  QD16                 bandwidth
  4k randrw 70/30 zipf:1.2 QD16    IOPS (read + write; hot blocks hit, writes are buffered)
  4k randwrite QD32                IOPS       (each write evicts a dirty block: one SSD write)
  1M seqwrite QD16                 bandwidth
Target for each: >= 0.95 x fio. Runs alternate fio / cxlhm for --rounds rounds (fio first in
even rounds, cxlhm first in odd ones); the ratio is the median of each round's ratio (the
disk's speed drifts by tens of percent between rounds on a shared machine, and a round's
fio and cxlhm runs are seconds apart), the IOPS and bandwidth columns are medians; each
cxlhm row also shows where its time went (the effective depth by Little's law, fio's and
ours, the device's SSD traffic per host I/O, and the whole machine's: how busy all cores
were, and the disk's own queue - on a small machine fio itself can be CPU-bound, and then
every cycle the device spends comes out of the kernel's I/O path). For random reads and writes each round
also runs the native io_uring closed loop (what the device's stream drives) on fio's reused
buffers and on slots rotating over a device-DRAM-sized arena (where fills land and victims
are written back from), so the gap to fio splits into the loop, where the bytes go through,
and the device's own work; and fio with fixedbufs=1 registerfiles=1, since the device's ring
sends its I/O on registered buffers (its DRAM) and a registered file: the ratio's target is
against fio's job as written, and this line shows what registration alone is worth here.
They also run fio's job while another process keeps a second core busy: whether the device
could take its own work off its thread onto the spare core (a queue or copy thread) without
slowing the disk. On the development VM it cannot: a busy second vCPU takes ~30% off the
virtio disk's rate (docs/fio.md).
The backing file must be on a disk (not tmpfs): O_DIRECT.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import paired_ratio, reach  # noqa: E402
from cxlhm_apps.fio import report  # noqa: E402
from cxlhm_apps.fio.jobfile import build_jobs, read_sections  # noqa: E402
from cxlhm_apps.fio.files import lay_out  # noqa: E402
from cxlhm_apps.fio.runner import run_jobs  # noqa: E402
from cxlhm_apps.fio.values import parse_size  # noqa: E402

WORKLOADS = (
    # name, rw, bs, iodepth, extra options, device block, device DRAM, metric, target
    ("4k randread QD32", "randread", "4k", 32, "", "4k", "16m", "iops", 0.95),
    ("1M seqread QD16", "read", "1m", 16, "", "1m", "64m", "bw_bytes", 0.95),
    ("4k randrw 70/30 QD16", "randrw", "4k", 16, "rwmixread=70\nrandom_distribution=zipf:1.2\n", "4k", "16m",
     "iops", 0.95),
    ("4k randwrite QD32", "randwrite", "4k", 32, "", "4k", "16m", "iops", 0.95),
    ("1M seqwrite QD16", "write", "1m", 16, "", "1m", "64m", "bw_bytes", 0.95),
)


def job_text(name: str, rw: str, bs: str, iodepth: int, extra: str, path: str, size: str, runtime: int,
             engine_lines: str) -> str:
    return (f"[{name.replace(' ', '-').replace('/', '-')}]\nfilename={path}\nsize={size}\nrw={rw}\nbs={bs}\n"
            f"iodepth={iodepth}\nruntime={runtime}\ntime_based\nrandseed=1\n{extra}{engine_lines}\n")


def both_directions(job: dict) -> dict:
    """One job's figures over reads and writes: IOPS and bandwidth add up; latency is
    the I/O-weighted mean of fio's lat (submission + completion); Little's law gives the
    depth the job really kept in flight."""
    r, w = job["read"], job["write"]
    ios = r["total_ios"] + w["total_ios"]
    lat = (r["lat_ns"]["mean"] * r["total_ios"] + w["lat_ns"]["mean"] * w["total_ios"]) / max(ios, 1)
    iops = r["iops"] + w["iops"]
    cpu_pct = job["usr_cpu"] + job["sys_cpu"]  # the job's threads, of wall time
    return {"iops": iops, "bw_bytes": r["bw_bytes"] + w["bw_bytes"], "lat_us": lat / 1000,
            "depth": iops * lat / 1e9, "cachehit": max(r.get("cachehit", 0.0), w.get("cachehit", 0.0)),
            "cpu_pct": cpu_pct, "cpu_us_per_io": 1e4 * cpu_pct / max(iops, 1e-9)}


def run_real_fio(text: str, fio: str) -> dict:
    proc = subprocess.run([fio, "--output-format=json", "-"], input=text, capture_output=True, text=True, check=True)
    return both_directions(json.loads(proc.stdout[proc.stdout.find("{"):])["jobs"][0])


def run_cxlhm(text: str) -> dict:
    jobs, globals_ = build_jobs([read_sections(text, "<bench>")])
    result = run_jobs(jobs, log=lambda _: None)
    if result.failed:
        raise RuntimeError(result.clones[0].stats.error_text)
    job = report.to_json(result, globals_)["jobs"][0]
    out = both_directions(job)
    counters = result.devices[0]["counters"]
    ios = max(1, result.clones[0].stats.total_ios)
    out["ssd_per_io"] = (counters.get("fill_reads", 0) + counters.get("writebacks", 0)) / ios
    out["wb_per_io"] = counters.get("writebacks", 0) / ios
    return out


def disk_of(path: str) -> tuple[int, int] | None:
    """(major, minor) of the block device holding `path`, if /proc/diskstats lists it."""
    dev = os.stat(path).st_dev
    wanted = (os.major(dev), os.minor(dev))
    try:
        for line in Path("/proc/diskstats").read_text().splitlines():
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == wanted:
                return wanted
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_now(disk: tuple[int, int] | None) -> tuple[int, int, int, int]:
    """(busy and total CPU time of all cores in jiffies, from /proc/stat; the disk's
    weighted milliseconds in queue, from /proc/diskstats, 0 without a disk; the time the
    hypervisor ran something else on our cores, steal, in jiffies)."""
    cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)  # idle + iowait
    steal = cpu[7] if len(cpu) > 7 else 0
    queued = 0
    if disk is not None:
        for line in Path("/proc/diskstats").read_text().splitlines():
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == disk:
                queued = int(fields[13])
    return sum(cpu) - idle, sum(cpu), queued, steal


def metered(run, disk: tuple[int, int] | None) -> dict:
    """run()'s figures, with the whole machine's over the run: `busy` - the share of all
    cores' time that was not idle (percent; fio's thread, the kernel's I/O workers,
    interrupts, and anything else on the machine), `disk_queue` - the disk's I/Os in
    flight on average (its weighted time in queue over the wall time), `steal` - the share
    of all cores' time the hypervisor gave to other guests (percent: on a shared VM the
    runs' noise)."""
    busy0, total0, queued0, steal0 = machine_now(disk)
    started = time.perf_counter()
    out = run()
    wall_ms = (time.perf_counter() - started) * 1000
    busy1, total1, queued1, steal1 = machine_now(disk)
    out["busy"] = 100 * (busy1 - busy0) / max(total1 - total0, 1)
    out["steal"] = 100 * (steal1 - steal0) / max(total1 - total0, 1)
    out["disk_queue"] = (queued1 - queued0) / wall_ms if disk is not None else float("nan")
    return out


def why_below(ratio: float, f_lat: float, c_lat: float, c_depth: float, qd: int, ssd: float, cpu: float,
              wb: float, f_busy: float = 0.0, c_busy: float = 0.0, f_at_disk: float = float("nan"),
              c_at_disk: float = float("nan")) -> str:
    """The measured reason a case is below target, in words. `f_at_disk` / `c_at_disk`: the
    us each I/O spent in the disk's own queue (NaN: not measured)."""
    if f_busy >= 90:
        return (f"the machine is CPU-bound: while fio alone ran, all {os.cpu_count()} cores were {f_busy:.0f}% busy "
                f"(its thread and the kernel's I/O path: io_uring's workers, interrupts), {c_busy:.0f}% under cxlhm - "
                "the device's own work per I/O (plan, copy between device DRAM and the host buffer, checksums, "
                "the integrity log) takes time those cores would give the kernel's I/O path; "
                f"{c_lat:.0f} us vs fio's {f_lat:.0f} us per I/O at the same depth")
    if cpu >= 90:
        return (f"CPU-bound: the job's thread used {cpu:.0f}% of a core (the device's planning, copies and "
                "checksums run on the submitting thread; fio spends none of that)")
    if c_depth < 0.85 * qd:
        return f"only {c_depth:.1f} of {qd} I/Os in flight on average (Little's law): the stream waited on the driver"
    if ssd > 1.05:
        return (f"{ssd:.2f} SSD operations per host I/O ({wb:.2f} of them write-backs of dirty victims): at the same "
                f"depth each I/O waits for more SSD work ({c_lat:.0f} us vs fio's {f_lat:.0f} us)")
    if c_at_disk == c_at_disk and f_at_disk == f_at_disk:  # (NaN: no disk figures)
        return (f"same depth and SSD work, {c_lat:.0f} us vs fio's {f_lat:.0f} us per I/O, of which "
                f"{c_lat - c_at_disk:.0f} us outside the disk's queue against fio's {f_lat - f_at_disk:.0f} "
                "(on its way from the job to the disk and back, and the device's steps: plan, copy between device "
                "DRAM and the host buffer, checksums)")
    return (f"same depth and SSD work, {c_lat:.0f} us vs fio's {f_lat:.0f} us per I/O: the device's extra steps "
            "(plan, copy between device DRAM and the host buffer, checksums) on the SSD's critical path")


def med(runs: list[dict], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)


def col(runs: list[dict], key: str) -> list[float]:
    return [r[key] for r in runs]


def raw_loops(path: str, region: int, bs: int, qd: int, dram: int, seconds: int, write: bool = False) -> dict:
    """The native io_uring closed loop (what cxlhm's raw engine and the device's stream
    use) at `qd` on random `bs` reads (or writes) of the region, on registered buffers
    as the device's are: into (from) `qd` reused buffers (fio's layout), and into (from)
    slots rotating over a device-DRAM-sized arena, in the order an all-miss LRU device
    reuses them (the device's fills land there, its victims are written back from
    there). IOPS of each. The two take turns in slices of a quarter second, in reverse
    order every other slice: the disk's speed drifts within seconds here, and a fixed
    order credits the drift to whoever runs second."""
    from cxlhm.media.dram import DeviceDram
    from cxlhm.media.ssd import SsdBackend

    backend = SsdBackend(path, region, qd)
    rng = np.random.default_rng(7)
    per_call = 2048  # (a call blocks until all of its I/Os are done: ~25 ms at 80k IOPS)
    # one memory for both sides, registered with io_uring as the device's DRAM is (its
    # fills and write-backs go on registered buffers): `qd` reused slots, then the arena
    n_spread = max(qd, dram // bs)
    memory = DeviceDram(qd + n_spread, bs)
    backend.register_memory(memory.base_address, memory.nbytes, bs)
    sides = {"reused": (memory.base_address, qd), "spread": (memory.base_address + qd * bs, n_spread)}
    done, spent, turns = dict.fromkeys(sides, 0), dict.fromkeys(sides, 0.0), dict.fromkeys(sides, 0)
    ops = np.zeros((per_call, 4), np.int64)
    ops[:, 1] = bs
    ops[:, 3] = int(write)
    piece = 0.25
    for i in range(max(1, round(seconds / piece))):
        for name in (("reused", "spread") if i % 2 == 0 else ("spread", "reused")):
            base, n_slots = sides[name]
            start = time.perf_counter()
            while time.perf_counter() - start < piece:
                turn = turns[name]
                ops[:, 0] = base + (np.arange(turn, turn + per_call) % n_slots) * bs
                ops[:, 2] = rng.integers(0, region // bs, per_call) * bs
                res, _ = backend.run_closed_loop(ops, qd)
                done[name] += int((res == bs).sum())
                turns[name] += per_call
            spent[name] += time.perf_counter() - start
    out = {name: done[name] / spent[name] for name in sides}
    backend.close()
    memory.close()
    return out


def cpu_budget(cx_runs: list[dict], fio_runs: list[dict], target: float) -> str:
    """The CPU per I/O the device's thread spends, fio's, and what `target` x fio's rate
    allows a thread that has one core to itself: 1 s of CPU over that many I/Os."""
    allowed = 1e6 / (target * med(fio_runs, "iops"))
    spent = med(cx_runs, "cpu_us_per_io")
    return (f"its threads spent {spent:.2f} us of CPU per I/O, fio's {med(fio_runs, 'cpu_us_per_io'):.2f} us "
            f"({med(fio_runs, 'cpu_pct'):.0f}% busy); {target:.2f}x of fio's rate on one core allows "
            f"{allowed:.2f} us, {spent - allowed:+.2f} us from here")


def with_a_core_busy(run):
    """run() while another process spins on the CPU (the scheduler puts it on a core the
    run leaves free): what the run loses when the machine's spare core is given work, as
    the device would give it a thread of its own (a queue thread, a copy engine)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # (the interpreter's start)
        return run()
    finally:
        spinner.kill()
        spinner.wait()


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, kernel {platform.release()}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="out/bench-fio", help="folder for the backing file (disk, not tmpfs)")
    parser.add_argument("--size", default="2g", help="backing file region (default 2g)")
    parser.add_argument("--runtime", type=int, default=3, help="seconds per run (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating fio/cxlhm rounds (default 5)")
    parser.add_argument("--only", help="run only the workloads whose name contains this text")
    args = parser.parse_args(argv)

    fio = shutil.which("fio")
    if fio is None:
        print("bench_fio: real fio is not installed; `apt-get install fio` and rerun", file=sys.stderr)
        return 2
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = str((folder / "bench-fio.img").resolve())
    fio_version = subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"command : {' '.join([sys.executable] + sys.argv)}")
    print(f"machine : {machine()}")
    print(f"fio     : {fio_version} (ioengine=io_uring, direct=1)")
    print(f"file    : {path}, region {args.size}, {args.runtime} s per run, {args.rounds} rounds, medians")
    print(f"started : {time.strftime('%Y-%m-%d %H:%M:%S')}, {load()}\n")
    lay_out(path, 0, parse_size(args.size), log=lambda text: print(f"(laying out {path})"))
    disk = disk_of(path)

    rows, decompositions, verdicts = [], [], []
    for name, rw, bs, qd, extra, block, dram, metric, target in WORKLOADS:
        if args.only and args.only.lower() not in name.lower():
            continue
        fio_text = job_text(name, rw, bs, qd, extra, path, args.size, args.runtime, "ioengine=io_uring\ndirect=1")
        cx_text = job_text(name, rw, bs, qd, extra, path, args.size, args.runtime,
                           f"ioengine=cxlhm\ncxlhm_block_size={block}\ncxlhm_dram={dram}\ncxlhm_clock=wall")
        # fio with registered buffers and file (fixedbufs, registerfiles): how the device's
        # ring sends its I/O from and into device DRAM (native/cxlhm_native.c)
        fixed_text = job_text(name, rw, bs, qd, extra, path, args.size, args.runtime,
                              "ioengine=io_uring\ndirect=1\nfixedbufs=1\nregisterfiles=1")
        fio_runs, cx_runs, raw_runs, fixed_runs, busy_core_runs = [], [], [], [], []
        def run_fio():
            fio_runs.append(metered(lambda: run_real_fio(fio_text, fio), disk))

        def run_raw():  # where a random read's or write's time goes, at the same moments
            if rw in ("randread", "randwrite"):
                raw_runs.append(raw_loops(path, parse_size(args.size), parse_size(bs), qd, parse_size(dram),
                                          args.runtime, write=rw == "randwrite"))
                fixed_runs.append(metered(lambda: run_real_fio(fixed_text, fio), disk))
                busy_core_runs.append(with_a_core_busy(lambda: run_real_fio(fio_text, fio)))

        def run_device():
            # fio wrote the file as a plain file: the device starts over on its bytes (its
            # sidecars' checksums describe the bytes it last wrote back, not fio's)
            for sidecar in Path(path).parent.glob(Path(path).name + ".cxlhm.*"):
                sidecar.unlink()
            cx_runs.append(metered(lambda: run_cxlhm(cx_text), disk))

        for r in range(args.rounds):  # every other round the other way round: whoever runs first gains nothing
            for step in ((run_fio, run_raw, run_device) if r % 2 == 0 else (run_device, run_raw, run_fio)):
                step()

        f_val, c_val = med(fio_runs, metric), med(cx_runs, metric)
        rows.append((name, metric, f_val, c_val, paired_ratio(col(cx_runs, metric), col(fio_runs, metric)), target,
                     med(fio_runs, "lat_us"), med(cx_runs, "lat_us"), med(fio_runs, "depth"), med(cx_runs, "depth"),
                     med(cx_runs, "cachehit"), med(cx_runs, "ssd_per_io"), med(cx_runs, "cpu_pct"),
                     med(cx_runs, "wb_per_io"), qd, med(fio_runs, "busy"), med(cx_runs, "busy"),
                     med(fio_runs, "disk_queue"), med(cx_runs, "disk_queue"), med(fio_runs, "steal"),
                     med(cx_runs, "steal")))
        if raw_runs:
            reused, spread = med(raw_runs, "reused"), med(raw_runs, "spread")
            fio_iops = col(fio_runs, "iops")
            into, where = (("from", "the device's victims are written back from") if rw == "randwrite" else
                           ("into", "the device's fills land"))
            decompositions.append(
                f"{name}: fio {f_val:,.0f} IOPS; the native io_uring closed loop {into} {qd} reused buffers "
                f"{reused:,.0f} ({paired_ratio(col(raw_runs, 'reused'), fio_iops):.2f}x fio: the loop itself); the same "
                f"{into} {bs} slots rotating over {dram} of device DRAM, where {where}, {spread:,.0f} "
                f"({paired_ratio(col(raw_runs, 'spread'), fio_iops):.2f}x); cxlhm {c_val:,.0f} "
                f"({paired_ratio(col(cx_runs, 'iops'), col(raw_runs, 'spread')):.2f}x of that: plan, copies, checksums, "
                f"the driver). fio with fixedbufs=1 registerfiles=1 (registered buffers and file, as the device's ring "
                f"sends its I/O on its DRAM) {med(fixed_runs, 'iops'):,.0f} IOPS "
                f"({paired_ratio(col(fixed_runs, 'iops'), fio_iops):.2f}x fio's job); cxlhm "
                f"{paired_ratio(col(cx_runs, 'iops'), col(fixed_runs, 'iops')):.2f}x of that. fio's job while another "
                f"process keeps a second core busy {med(busy_core_runs, 'iops'):,.0f} IOPS "
                f"({paired_ratio(col(busy_core_runs, 'iops'), fio_iops):.2f}x fio alone): what a thread of the "
                f"device's own on the spare core would cost the disk")
            ratio = paired_ratio(col(cx_runs, "iops"), fio_iops)
            if ratio < target:
                write = rw == "randwrite"
                verdicts.append(reach(
                    name, ratio, target, paired_ratio(col(raw_runs, "spread"), fio_iops),
                    f"the native io_uring loop with I/O {into} {bs} slots spread over device DRAM, where {where}",
                    f"the device's per-I/O work on its thread, {med(cx_runs, 'cpu_pct'):.0f}% busy: the firmware's "
                    f"plan, the copy {'in' if write else 'out'}, checksums{', the integrity log' if write else ''}; "
                    f"{cpu_budget(cx_runs, fio_runs, target)}; "
                    f"a thread of the device's own on the spare core would cost the disk: with that core busy "
                    f"fio itself ran at {paired_ratio(col(busy_core_runs, 'iops'), fio_iops):.2f}x",
                    paired_ratio(col(cx_runs, "iops"), col(raw_runs, "spread"))))
        print(f"  done: {name}", flush=True)

    print(f"\n{'workload':<22} {'metric':<9} {'fio':>12} {'cxlhm':>12} {'ratio':>7} {'target':>7}  "
          f"{'lat fio':>8} {'lat cxlhm':>9}  {'depth fio/cxlhm':>15}  {'hit%':>5} {'SSD/IO':>6} {'cpu%':>5} "
          f"{'wb/IO':>6}  {'busy% fio/cxlhm':>15}  {'disk q fio/cxlhm':>16}  {'steal% fio/cxlhm':>16}")
    notes = []
    for name, metric, f_val, c_val, ratio, target, f_lat, c_lat, f_depth, c_depth, hit, ssd, cpu, wb, qd, \
            f_busy, c_busy, f_queue, c_queue, f_steal, c_steal in rows:
        unit = (lambda v: f"{v:,.0f}") if metric == "iops" else (lambda v: f"{v / 2**20:,.0f} MiB/s")
        verdict = "ok" if ratio >= target else "BELOW"
        print(f"{name:<22} {'IOPS' if metric == 'iops' else 'bandwidth':<9} {unit(f_val):>12} {unit(c_val):>12} "
              f"{ratio:>6.2f}x {target:>6.2f}x  {f_lat:>6.0f}us {c_lat:>7.0f}us  {f_depth:>7.1f}/{c_depth:<7.1f}  "
              f"{hit:>5.1f} {ssd:>6.2f} {cpu:>5.0f} {wb:>6.2f}  {f_busy:>7.0f}/{c_busy:<7.0f}  "
              f"{f_queue:>8.1f}/{c_queue:<7.1f}  {f_steal:>8.1f}/{c_steal:<7.1f}  {verdict}")
        if ratio < target:
            f_at_disk = c_at_disk = float("nan")
            if metric == "iops":  # Little's law at the disk: its I/Os in flight over the rate
                f_at_disk, c_at_disk = 1e6 * f_queue / max(f_val, 1), 1e6 * c_queue / max(c_val, 1)
            note = why_below(ratio, f_lat, c_lat, c_depth, qd, ssd, cpu, wb, f_busy, c_busy, f_at_disk, c_at_disk)
            if metric == "iops" and f_queue == f_queue:  # (NaN: no disk figures)
                note += (f"; at the disk (its own accounting): {c_queue:.1f} I/Os in flight, each "
                         f"{c_at_disk:.0f} us in it, against fio's {f_queue:.1f} and {f_at_disk:.0f} us")
            notes.append(f"{name}: {note}")
    print("\nwhere the time goes (cxlhm columns): lat = fio's mean total latency (submission + completion);"
          "\ndepth = IOPS x lat, the I/Os really in flight; SSD/IO = the device's fills and write-backs per"
          "\nhost I/O (fio: 1.00); cpu% = the job's threads' CPU over its wall time (near 100: CPU-bound);"
          "\nwb/IO = dirty victims written back per host I/O (on the stream's ring, the I/O parked meanwhile);"
          "\nbusy% = all cores' time not idle during each side's runs (the whole machine: near 100, fio itself"
          "\nis CPU-bound); disk q = the disk's I/Os in flight on average (its own accounting, /proc/diskstats);"
          "\nsteal% = all cores' time the hypervisor gave to other guests during each side's runs (/proc/stat:"
          "\non a shared VM, where the runs' noise comes from).")
    if notes:
        print("\nwhy the cases below target stay there (from the figures above):")
        for note in notes:
            print(f"  {note}")
    if decompositions:
        print("\nrandom I/O, measured apart in the same rounds (medians; ratios paired by round):")
        for note in decompositions:
            print(f"  {note}")
    if verdicts:
        print("\nverdicts (a bound: the native loop with only the device's landing added, same rounds):")
        for verdict in verdicts:
            print(f"  {verdict}")
    print(f"\nload    : {load()} at the end (2 cores: above ~1 the figures are noisy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
