"""A fresh clone's first `make run`, and a warm `cxlhm run --requests 5`.

    python bench/bench_first_run.py [--source REPO] [--keep]

Clones the repository (its committed HEAD) into a temporary folder and times `make run`
there, in two parts (the install, then the run): a new .venv with only what the main job needs (pip's download cache is used
as on any developer's machine), the native build, the firmware compiled into an
empty compile cache (CXLHM_CACHE_DIR, as on a fresh machine), and the 1,000-request main
job. Then times `cxlhm run --requests 5` three times with that cache warm (the median).
Both are wall times on this machine, printed beside the goals (90 s, 3 s), with the
load average: on a shared machine they move with the load, so the CPU time (user+sys of
the children) is printed too.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine  # noqa: E402

GOAL_FIRST_S = 90.0
GOAL_WARM_S = 3.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], cwd: Path, env: dict) -> tuple[float, float, str]:
    """(wall s, CPU s of the children, output tail) of one command; a failure stops the bench."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"bench_first_run: {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, cpu, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=str(Path(__file__).resolve().parent.parent), help="repository to clone")
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cxlhm-first-run-"))
    clone, cache = root / "clone", root / "compile-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env["CXLHM_CACHE_DIR"] = str(cache)
    env["CXLHM_OUT_DIR"] = str(root / "out")
    load_before = os.getloadavg()
    try:
        subprocess.run(["git", "clone", "-q", args.source, str(clone)], check=True)
        head = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        install_wall, install_cpu, _ = timed(["make", ".venv/.installed-run"], clone, env)
        run_wall, run_cpu, out = timed(["make", "run"], clone, env)
        first_wall, first_cpu = install_wall + run_wall, install_cpu + run_cpu
        compiled = out.count("cxlhm: compiling")
        warm = [timed([str(clone / ".venv" / "bin" / "cxlhm"), "run", "--requests", "5", "--no-plot"], clone, env)
                for _ in range(3)]
        warm_wall = statistics.median(w for w, _, _ in warm)
        warm_cpu = statistics.median(c for _, c, _ in warm)
        torch = (clone / ".venv" / "lib").glob("python3*/site-packages/torch")
        print(f"command  {command()} (clone of {args.source} at {head})")
        print(f"machine  {machine()}; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
        print(f"fresh clone `make run`:            {first_wall:6.1f} s wall, {first_cpu:6.1f} s CPU "
              f"(goal {GOAL_FIRST_S:.0f} s: {first_wall / GOAL_FIRST_S:.2f}x of it; {compiled} compile notices; "
              f"torch installed: {'yes' if any(torch) else 'no'})")
        print(f"  install (venv, package, native build): {install_wall:6.1f} s wall, {install_cpu:6.1f} s CPU")
        print(f"  first `cxlhm run` (compile + 1000 requests): {run_wall:6.1f} s wall, {run_cpu:6.1f} s CPU")
        print(f"warm `cxlhm run --requests 5`:     {warm_wall:6.1f} s wall, {warm_cpu:6.1f} s CPU "
              f"(goal {GOAL_WARM_S:.0f} s: {warm_wall / GOAL_WARM_S:.2f}x of it; median of 3)")
    finally:
        if args.keep:
            print(f"clone kept: {clone}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
