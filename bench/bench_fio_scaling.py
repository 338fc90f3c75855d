"""cxlhm fio with several jobs on one device, and fio's verify, against real fio in the same run.

    .venv/bin/python bench/bench_fio_scaling.py [--dir out/bench-fio] [--size 1g] [--runtime 3]
                                                [--rounds 3] [--only scaling|verify]

scaling: 4 KiB random writes and reads at iodepth=16 on one file, as one job and as
  numjobs=4 clones sharing it (one device under ioengine=cxlhm, the file itself under fio's
  io_uring, direct=1). Each round runs fio x1, fio x4, cxlhm x1, cxlhm x4 (reversed every
  other round); ratios are medians of the rounds' ratios. Target: cxlhm x4 >= 1.6 x
  cxlhm x1 - reachable only where the disk itself gives more to 4 x 16 I/Os in flight than
  to 16: fio's own x4 / x1 in the same rounds is the reference.
verify: a 4 KiB randwrite job with verify=crc32c (write the region, then read back and check
  every block), the whole job's runtime (both phases) under real fio and under cxlhm fio
  with fio's io_uring engine and with ioengine=cxlhm. Target: >= 0.8 x fio's speed.
The backing file must be on a disk (not tmpfs): O_DIRECT.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import paired_ratio  # noqa: E402
from bench_fio import load, machine  # noqa: E402
from cxlhm_apps.fio import report  # noqa: E402
from cxlhm_apps.fio import runner as fio_runner  # noqa: E402
from cxlhm_apps.fio.files import lay_out  # noqa: E402
from cxlhm_apps.fio.jobfile import build_jobs, read_sections  # noqa: E402
from cxlhm_apps.fio.runner import run_jobs  # noqa: E402
from cxlhm_apps.fio.values import parse_size  # noqa: E402

SCALING_TARGET = 1.6
VERIFY_TARGET = 0.8
FIO_ENGINE = "ioengine=io_uring\ndirect=1\n"
DEVICE_ENGINE = "ioengine=cxlhm\ncxlhm_block_size=4k\ncxlhm_dram=16m\ncxlhm_clock=wall\n"


def scaling_job(rw: str, path: str, size: str, runtime: int, numjobs: int, engine: str) -> str:
    return (f"[{rw}]\nfilename={path}\nsize={size}\nrw={rw}\nbs=4k\niodepth=16\nruntime={runtime}\ntime_based\n"
            f"randseed=1\nnumjobs={numjobs}\n{engine}")


def verify_job(path: str, size: str, engine: str) -> str:
    return (f"[verify]\nfilename={path}\nsize={size}\nrw=randwrite\nbs=4k\niodepth=16\nverify=crc32c\n"
            f"randseed=1\n{engine}")


# Each cxlhm job thread's time on a CPU, runnable but waiting for one (the scheduler's
# run delay), and wall time, of the last run: on a small machine shared with other work a
# job's threads queue for a CPU at every completion, and more threads queue more.
_THREADS: list[tuple[int, int, int]] = []


def _schedstat() -> tuple[int, int]:
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return 0, 0


def _timed_run(run):
    def timed(self):
        cpu0, wait0 = _schedstat()
        start = time.monotonic_ns()
        try:
            run(self)
        finally:
            cpu1, wait1 = _schedstat()
            _THREADS.append((cpu1 - cpu0, wait1 - wait0, time.monotonic_ns() - start))
    return timed


fio_runner.Worker.run = _timed_run(fio_runner.Worker.run)


def cpu_wait() -> float:
    """The share of its wall time the last cxlhm run's job threads spent waiting for a CPU."""
    return sum(t[1] for t in _THREADS) / max(1, sum(t[2] for t in _THREADS))


def total_iops(doc: dict, direction: str) -> float:
    return sum(job[direction]["iops"] for job in doc["jobs"])


def run_fio(text: str, fio: str, folder: Path) -> dict:
    proc = subprocess.run([fio, "--output-format=json", "-"], input=text, capture_output=True, text=True,
                          check=True, cwd=folder)  # (its verify state files land in the folder)
    return json.loads(proc.stdout[proc.stdout.find("{"):])


def run_cxlhm(text: str, image: str) -> dict:
    # fio wrote the file as a plain file: the device starts over on its bytes (its sidecars'
    # checksums describe the bytes it last wrote back, not fio's)
    for sidecar in Path(image).parent.glob(Path(image).name + ".cxlhm.*"):
        sidecar.unlink()
    jobs, globals_ = build_jobs([read_sections(text, "<bench>")])
    _THREADS.clear()
    result = run_jobs(jobs, log=lambda _: None)
    if result.failed:
        raise RuntimeError("; ".join(c.stats.error_text for c in result.clones if c.stats.error))
    return report.to_json(result, globals_)


def alternate(rounds: int, runs: dict) -> dict[str, list]:
    """Each named run once per round, in reverse order every other round (a disk whose
    speed drifts favours whoever runs last)."""
    out: dict[str, list] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(runs[name]())
    return out


def scaling(args, fio: str, folder: Path, path: str) -> list[str]:
    lines = []
    for rw, direction in (("randwrite", "write"), ("randread", "read")):
        waits: dict[int, list[float]] = {1: [], 4: []}

        def case(numjobs: int, device: bool):
            text = scaling_job(rw, path, args.size, args.runtime, numjobs, DEVICE_ENGINE if device else FIO_ENGINE)
            if device:
                def run():
                    iops = total_iops(run_cxlhm(text, path), direction)
                    waits[numjobs].append(cpu_wait())
                    return iops
                return run
            return lambda: total_iops(run_fio(text, fio, folder), direction)
        got = alternate(args.rounds, {"fio x1": case(1, False), "fio x4": case(4, False),
                                      "cxlhm x1": case(1, True), "cxlhm x4": case(4, True)})
        fio_scale = paired_ratio(got["fio x4"], got["fio x1"])
        cx_scale = paired_ratio(got["cxlhm x4"], got["cxlhm x1"])
        med = {name: statistics.median(values) for name, values in got.items()}
        verdict = "ok" if cx_scale >= SCALING_TARGET else "BELOW"
        lines.append(
            f"4k {rw} QD16: fio {med['fio x1']:,.0f} -> {med['fio x4']:,.0f} IOPS ({fio_scale:.2f}x), "
            f"cxlhm {med['cxlhm x1']:,.0f} -> {med['cxlhm x4']:,.0f} IOPS ({cx_scale:.2f}x; target "
            f"{SCALING_TARGET:.1f}x: {verdict}; {cx_scale / fio_scale:.2f} of fio's own scaling); cxlhm/fio "
            f"{paired_ratio(got['cxlhm x1'], got['fio x1']):.2f}x at 1 job, "
            f"{paired_ratio(got['cxlhm x4'], got['fio x4']):.2f}x at 4; cxlhm's job threads runnable but waiting "
            f"for a CPU {100 * statistics.median(waits[1]):.0f}% of their time at 1 job, "
            f"{100 * statistics.median(waits[4]):.0f}% at 4")
        print(f"  done: {rw}", flush=True)
    return lines


def verify(args, fio: str, folder: Path, path: str) -> list[str]:
    def case(engine: str, real: bool):
        text = verify_job(path, args.verify_size, engine)
        if real:
            return lambda: run_fio(text, fio, folder)["jobs"][0]["job_runtime"]
        return lambda: run_cxlhm(text, path)["jobs"][0]["job_runtime"]
    got = alternate(args.rounds, {"fio": case(FIO_ENGINE, True), "cxlhm io_uring": case(FIO_ENGINE, False),
                                  "cxlhm device": case(DEVICE_ENGINE, False)})
    blocks = 2 * parse_size(args.verify_size) // 4096  # written, then read back and checked
    lines = []
    for name in ("cxlhm io_uring", "cxlhm device"):
        speed = paired_ratio(got["fio"], got[name])  # runtime: fio's over ours is our speed over fio's
        verdict = "ok" if speed >= VERIFY_TARGET else "BELOW"
        engine = "fio's io_uring engine" if name == "cxlhm io_uring" else "ioengine=cxlhm"
        lines.append(f"verify=crc32c 4k randwrite {args.verify_size}, {engine}: "
                     f"{blocks / statistics.median(got[name]) * 1000:,.0f} blocks/s against fio's "
                     f"{blocks / statistics.median(got['fio']) * 1000:,.0f} ({speed:.2f}x; target "
                     f"{VERIFY_TARGET:.1f}x: {verdict})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="out/bench-fio", help="folder for the backing file (disk, not tmpfs)")
    parser.add_argument("--size", default="1g", help="region of the scaling jobs (default 1g)")
    parser.add_argument("--verify-size", default="64m", help="region the verify job writes and checks (default 64m)")
    parser.add_argument("--runtime", type=int, default=3, help="seconds per scaling run (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--only", choices=("scaling", "verify"), help="run one of the two")
    args = parser.parse_args(argv)

    fio = shutil.which("fio")
    if fio is None:
        print("bench_fio_scaling: real fio is not installed; `apt-get install fio` and rerun", file=sys.stderr)
        return 2
    folder = Path(args.dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / "bench-fio-scaling.img")
    print(f"command : {' '.join([sys.executable] + sys.argv)}")
    print(f"machine : {machine()}")
    print(f"fio     : {subprocess.run([fio, '--version'], capture_output=True, text=True).stdout.strip()}")
    print(f"file    : {path}, {args.rounds} rounds, medians of per-round ratios")
    print(f"started : {time.strftime('%Y-%m-%d %H:%M:%S')}, {load()}\n")
    lay_out(path, 0, max(parse_size(args.size), parse_size(args.verify_size)), log=lambda text: None)
    lines = []
    if args.only in (None, "scaling"):
        lines += scaling(args, fio, folder, path)
    if args.only in (None, "verify"):
        lines += verify(args, fio, folder, path)
    print()
    for line in lines:
        print(line)
    print(f"\nload    : {load()} at the end (2 cores: above ~1 the figures are noisy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
