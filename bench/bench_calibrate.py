"""Calibration against this machine's disk: measure a file on it (4 KiB random reads at
QD1/8/32, 1 MiB sequential reads), fit the timing model, and print how far the fitted
model is from what was measured (model/measured per point). The unit tests fit synthetic
measurements; whether a real disk is reproduced depends on the disk and on what else runs,
so it is measured here, with the machine printed beside the figures.

    python bench/bench_calibrate.py [--path /var/tmp/cxlhm-cal.img] [--size 256MiB] [--runtime 2]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine  # noqa: E402

from cxlhm.config import load_config  # noqa: E402
from cxlhm.timing import calibration as cal  # noqa: E402
from cxlhm.timing.params import parse_timing  # noqa: E402
from cxlhm.units import parse_size  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default=None, help="file to measure (default: a temporary file in /var/tmp)")
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--runtime", type=float, default=2.0, help="seconds per measurement point")
    args = parser.parse_args()
    size = parse_size(args.size)
    path = args.path or os.path.join(tempfile.mkdtemp(dir="/var/tmp"), "cal.img")
    qds = (1, 8, 32)
    measured = cal.measure(path, size, args.runtime, qds=qds, overwrite=args.path is None)
    fitted = cal.fit(measured, parse_timing(load_config("cmm-h").timing, "cmm-h"), size)
    model = cal.model_figures(fitted, size, qds=qds)
    print(f"command: {command()}")
    print(f"machine: {machine()}; {measured.machine}")
    print(f"{'point':<28} {'measured':>12} {'model':>12} {'model/measured':>15}")
    worst = 0.0
    for q in qds:
        ratio = model.iops[q] / measured.iops[q]
        worst = max(worst, abs(math.log(ratio)))
        print(f"{f'4 KiB randread QD{q} IOPS':<28} {measured.iops[q]:>12,.0f} {model.iops[q]:>12,.0f} {ratio:>15.3f}")
    ratio = model.seq_read_bw / measured.seq_read_bw
    print(f"{'1 MiB seqread GB/s':<28} {measured.seq_read_bw / 1e9:>12.3f} {model.seq_read_bw / 1e9:>12.3f} "
          f"{ratio:>15.3f}")
    print(f"worst point off by {math.exp(worst):.2f}x (QD1 and sequential are matched by construction; deeper "
          "queues show how far the disk is from independent dies)")
    if args.path is None:
        os.remove(path)
        os.rmdir(os.path.dirname(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
