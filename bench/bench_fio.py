"""cxlhm-fio against real fio, on the same backing file, in one run.

    .venv/bin/python bench/bench_fio.py [--dir out/bench-fio] [--runtime 5] [--rounds 3]

Two workloads, each run by real fio (ioengine=io_uring, direct=1) and by cxlhm-fio with
ioengine=cxlhm (device block = the I/O size, a device DRAM far smaller than the file,
so every read misses; wall clock):
  4k randread QD32   target: cxlhm IOPS >= 0.85 x fio's
  1M seqread  QD16   target: cxlhm bandwidth >= 0.9 x fio's
Runs alternate fio / cxlhm for --rounds rounds and report medians, because this
machine is shared and noisy. The backing file must be on a disk (not tmpfs): O_DIRECT.
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

from cxlhm.fio import report
from cxlhm.fio.jobfile import build_jobs, read_sections
from cxlhm.fio.runner import lay_out, run_jobs

WORKLOADS = (
    # name, rw, bs, iodepth, device block, device DRAM, metric, target
    ("4k randread QD32", "randread", "4k", 32, "4k", "16m", "iops", 0.85),
    ("1M seqread QD16", "read", "1m", 16, "1m", "64m", "bw_bytes", 0.90),
)


def job_text(name: str, rw: str, bs: str, iodepth: int, path: str, size: str, runtime: int, engine_lines: str) -> str:
    return (f"[{name.replace(' ', '-')}]\nfilename={path}\nsize={size}\nrw={rw}\nbs={bs}\niodepth={iodepth}\n"
            f"runtime={runtime}\ntime_based\n{engine_lines}\n")


def run_real_fio(text: str, fio: str) -> dict:
    proc = subprocess.run([fio, "--output-format=json", "-"], input=text, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout[proc.stdout.find("{"):])["jobs"][0]["read"]


def run_cxlhm(text: str) -> dict:
    jobs, globals_ = build_jobs([read_sections(text, "<bench>")])
    result = run_jobs(jobs, log=lambda _: None)
    out = report.to_json(result, globals_)["jobs"][0]["read"]
    if result.failed:
        raise RuntimeError(result.clones[0].stats.error_text)
    return out


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
    parser.add_argument("--runtime", type=int, default=5, help="seconds per run (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating fio/cxlhm rounds (default 3)")
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
    print(f"started : {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    from cxlhm.fio.values import parse_size
    lay_out(path, 0, parse_size(args.size), log=lambda text: print(f"(laying out {path})"))

    rows = []
    for name, rw, bs, qd, block, dram, metric, target in WORKLOADS:
        fio_text = job_text(name, rw, bs, qd, path, args.size, args.runtime, "ioengine=io_uring\ndirect=1")
        cx_text = job_text(name, rw, bs, qd, path, args.size, args.runtime,
                           f"ioengine=cxlhm\ncxlhm_block_size={block}\ncxlhm_dram={dram}\ncxlhm_clock=wall")
        fio_runs, cx_runs, hits = [], [], []
        for _ in range(args.rounds):
            fio_runs.append(run_real_fio(fio_text, fio))
            cx_runs.append(run_cxlhm(cx_text))
            hits.append(cx_runs[-1].get("cachehit", 0.0))
        f_val = statistics.median(float(r[metric]) for r in fio_runs)
        c_val = statistics.median(float(r[metric]) for r in cx_runs)
        f_lat = statistics.median(r["clat_ns"]["mean"] for r in fio_runs) / 1000
        c_lat = statistics.median(r["clat_ns"]["mean"] for r in cx_runs) / 1000
        rows.append((name, metric, f_val, c_val, c_val / f_val, target, f_lat, c_lat, max(hits)))

    print(f"{'workload':<18} {'metric':<9} {'fio':>12} {'cxlhm':>12} {'ratio':>7} {'target':>7}  "
          f"{'clat fio':>9} {'clat cxlhm':>10}  cachehit")
    for name, metric, f_val, c_val, ratio, target, f_lat, c_lat, hit in rows:
        unit = (lambda v: f"{v:,.0f}") if metric == "iops" else (lambda v: f"{v / 2**20:,.0f} MiB/s")
        verdict = "ok" if ratio >= target else "BELOW"
        print(f"{name:<18} {'IOPS' if metric == 'iops' else 'bandwidth':<9} {unit(f_val):>12} {unit(c_val):>12} "
              f"{ratio:>6.2f}x {target:>6.2f}x  {f_lat:>7.0f}us {c_lat:>8.0f}us  {hit:.2f}%  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
