"""`--compare-fio`: run the same jobs through real fio (ioengine=io_uring, O_DIRECT) on
the same files - for ioengine=cxlhm that is the device's backing SSD image - and put
both summaries side by side with the ratios cxlhm / fio.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile

from cxlhm.fio.jobfile import JobSpec
from cxlhm.fio.options import DEVICE_OPTIONS
from cxlhm.fio.stats import num2str

INSTALL_HINT = ("real fio is not installed (no `fio` on PATH); install it with `apt-get install fio` "
                "(Debian/Ubuntu), `dnf install fio` (Fedora) or `brew install fio`, then rerun with --compare-fio")
# ours only, or meaningless for a raw file: never handed to fio
_NOT_FOR_FIO = set(DEVICE_OPTIONS) | {"ioengine", "direct", "verify", "do_verify", "verify_fatal", "verify_backlog"}
FIO_TIMEOUT_S = 3600


def fio_binary() -> str | None:
    return shutil.which("fio")


def fio_job_text(jobs: list[JobSpec]) -> str:
    """The jobs as a fio job file: every option as written, the device options dropped,
    io_uring + O_DIRECT on the same file names."""
    lines = []
    for job in jobs:
        lines.append(f"[{job.name}]")
        for name, raw in job.given.items():
            if name in _NOT_FOR_FIO or name == "name":
                continue
            lines.append(raw.as_written())
        lines += ["ioengine=io_uring", "direct=1", ""]
    return "\n".join(lines)


def run_fio(jobs: list[JobSpec], fio: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".fio", prefix="cxlhm-compare-") as f:
        f.write(fio_job_text(jobs))
        f.flush()
        proc = subprocess.run([fio, "--output-format=json", f.name], capture_output=True, text=True,
                              timeout=FIO_TIMEOUT_S)
    text = proc.stdout
    start = text.find("{")
    if proc.returncode != 0 or start < 0:
        raise RuntimeError(f"fio failed (exit {proc.returncode}): {(proc.stderr or text).strip()[:2000]}")
    return json.loads(text[start:])


def _summary(job: dict, direction: str) -> dict | None:
    d = job.get(direction) or {}
    if not d.get("total_ios"):
        return None
    clat = d.get("clat_ns", {})
    pct = clat.get("percentile", {})
    return {"iops": float(d["iops"]), "bw": float(d["bw_bytes"]), "clat_mean": float(clat.get("mean", 0.0)),
            "clat_p99": float(pct.get("99.000000", 0.0))}


def _fmt_lat(ns: float) -> str:
    return f"{ns / 1000:.1f}us" if ns < 10_000_000 else f"{ns / 1e6:.1f}ms"


def compare_text(ours: dict, theirs: dict) -> str:
    """Both summaries and the ratios, per job and direction."""
    out = [f"\nSide by side: cxlhm ({ours['fio version']}) vs real fio ({theirs.get('fio version', '?')}, "
           "ioengine=io_uring, direct=1, same files)\n"]
    header = f"  {'job':<20} {'dir':<5} {'':<7} {'IOPS':>10} {'BW':>12} {'clat avg':>10} {'clat p99':>10}\n"
    out.append(header)
    for a, b in zip(ours["jobs"], theirs.get("jobs", [])):
        for direction in ("read", "write"):
            sa, sb = _summary(a, direction), _summary(b, direction)
            if sa is None or sb is None:
                continue
            for label, s in (("cxlhm", sa), ("fio", sb)):
                out.append(f"  {a['jobname'][:20]:<20} {direction:<5} {label:<7} {s['iops']:>10.0f} "
                           f"{num2str(int(s['bw']), 4, 1, True, 'B/s'):>12} {_fmt_lat(s['clat_mean']):>10} "
                           f"{_fmt_lat(s['clat_p99']):>10}\n")

            def ratio(key):
                return f"{sa[key] / sb[key]:.2f}x" if sb[key] else "-"
            out.append(f"  {'':<20} {'':<5} {'ratio':<7} {ratio('iops'):>10} {ratio('bw'):>12} "
                       f"{ratio('clat_mean'):>10} {ratio('clat_p99'):>10}\n")
    return "".join(out)
