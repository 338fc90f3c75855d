"""`--compare-fio`: run the same jobs through real fio (ioengine=io_uring, O_DIRECT) and
put both summaries side by side with the ratios cxlhm / fio: IOPS, bandwidth and total
latency (fio's lat: submission plus completion; clat alone leaves out where an engine
spends its submission time).

Real fio never touches a device's image: a job with ioengine=cxlhm runs under fio on a
file of its own beside the image (<image>.fio-compare, same file system, so the same
disk), removed afterwards. The image's stored checksums stay true to its bytes. Jobs on
plain files (ioengine=io_uring) share their file with fio, as fio itself would.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

from cxlhm_apps.fio.jobfile import JobSpec
from cxlhm_apps.fio.engines import DEVICE_OPTIONS
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.stats import num2str

INSTALL_HINT = ("real fio is not installed (no `fio` on PATH); install it with `apt-get install fio` "
                "(Debian/Ubuntu), `dnf install fio` (Fedora) or `brew install fio`, then rerun with --compare-fio")
# ours only, or meaningless for a raw file: never handed to fio
_NOT_FOR_FIO = {opt.name for opt in DEVICE_OPTIONS} | {"ioengine", "direct", "buffered", "verify", "do_verify", "verify_fatal", "verify_backlog",
                                      "filename", "lat_percentiles"}
COMPARE_SUFFIX = ".fio-compare"
FIO_TIMEOUT_S = 3600


def fio_binary() -> str | None:
    return shutil.which("fio")


def fio_filename(job: JobSpec) -> str | None:
    """The file= line fio gets for the job (None: fio's default name, as ours)."""
    if job["ioengine"] != "cxlhm":
        return job["filename"]
    return (job["filename"] or "") + COMPARE_SUFFIX if job["filename"] else None


def fio_job_text(jobs: list[JobSpec]) -> str:
    """The jobs as a fio job file: every option as written, the device options dropped;
    a device job becomes io_uring + O_DIRECT on a file of fio's own, a job on one of
    fio's engines keeps its engine and its direct/buffered setting."""
    lines = []
    for job in jobs:
        lines.append(f"[{job.name}]")
        for name, raw in job.given.items():
            if name in _NOT_FOR_FIO or name == "name":
                continue
            lines.append(raw.as_written())
        filename = fio_filename(job)
        if filename:
            lines.append(f"filename={filename}")
        elif job["ioengine"] == "cxlhm":  # fio's default name, on a file of its own
            lines.append(f"filename_format=$jobname.$jobnum.$filenum{COMPARE_SUFFIX}")
        if job["ioengine"] == "cxlhm":
            lines += ["ioengine=io_uring", "direct=1"]
        else:
            lines += [f"ioengine={job['ioengine']}", f"direct={int(job['direct'])}"]
        lines += ["lat_percentiles=1", ""]
    return "\n".join(lines)


def _own_files(jobs: list[JobSpec]) -> list[str]:
    out = []
    for job in jobs:
        if job["ioengine"] != "cxlhm":
            continue
        if job["filename"]:
            out.append(fio_filename(job).replace("\\:", ":"))
        else:
            out += [f"{job.name}.{clone}.0{COMPARE_SUFFIX}" for clone in range(job["numjobs"])]
    return out


def run_fio(jobs: list[JobSpec], fio: str) -> dict:
    own = _own_files(jobs)
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".fio", prefix="cxlhm-compare-") as f:
            f.write(fio_job_text(jobs))
            f.flush()
            proc = subprocess.run([fio, "--output-format=json", f.name], capture_output=True, text=True,
                                  timeout=FIO_TIMEOUT_S)
    finally:
        for path in own:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    text = proc.stdout
    start = text.find("{")
    if proc.returncode != 0 or start < 0:
        raise RuntimeError(f"fio failed (exit {proc.returncode}): {(proc.stderr or text).strip()[:2000]}")
    return json.loads(text[start:])


def ours_summary(result) -> list[dict]:
    """Per reported job: {"jobname", "read"/"write": summary or None} from our own
    statistics (total latency percentiles whether or not the job asked for them)."""
    from cxlhm_apps.fio.report import build_units

    out = []
    for unit in build_units(result):
        entry = {"jobname": unit.job.name}
        for d, name in ((READ, "read"), (WRITE, "write")):
            s = unit.stats.dirs[d]
            if not s.ios or not s.runtime_ms:
                entry[name] = None
                continue
            p99 = dict(s.lat.percentiles([99.0])).get(99.0, 0)
            entry[name] = {"iops": 1000.0 * s.ios / s.runtime_ms, "bw": 1000.0 * s.bytes / s.runtime_ms,
                           "lat_mean": s.lat.mean, "lat_p99": float(p99)}
        out.append(entry)
    return out


def fio_summary(job: dict, direction: str) -> dict | None:
    d = job.get(direction) or {}
    if not d.get("total_ios"):
        return None
    lat = d.get("lat_ns", {})
    return {"iops": float(d["iops"]), "bw": float(d["bw_bytes"]), "lat_mean": float(lat.get("mean", 0.0)),
            "lat_p99": float(lat.get("percentile", {}).get("99.000000", 0.0))}


def _fmt_lat(ns: float) -> str:
    return f"{ns / 1000:.1f}us" if ns < 10_000_000 else f"{ns / 1e6:.1f}ms"


def compare_text(ours: list[dict], theirs: dict, version: str) -> str:
    """Both summaries and the ratios, per job and direction."""
    out = [f"\nSide by side: cxlhm ({version}) vs real fio ({theirs.get('fio version', '?')}, "
           "the jobs' own engines; device jobs as ioengine=io_uring, direct=1 on files of fio's own)\n",
           f"  {'job':<20} {'dir':<5} {'':<7} {'IOPS':>10} {'BW':>12} {'lat avg':>10} {'lat p99':>10}\n"]
    for a, b in zip(ours, theirs.get("jobs", [])):
        for direction in ("read", "write"):
            sa, sb = a[direction], fio_summary(b, direction)
            if sa is None or sb is None:
                continue
            for label, s in (("cxlhm", sa), ("fio", sb)):
                out.append(f"  {a['jobname'][:20]:<20} {direction:<5} {label:<7} {s['iops']:>10.0f} "
                           f"{num2str(int(s['bw']), 4, 1, True, 'B/s'):>12} {_fmt_lat(s['lat_mean']):>10} "
                           f"{_fmt_lat(s['lat_p99']):>10}\n")

            def ratio(key):
                return f"{sa[key] / sb[key]:.2f}x" if sb[key] else "-"
            out.append(f"  {'':<20} {'':<5} {'ratio':<7} {ratio('iops'):>10} {ratio('bw'):>12} "
                       f"{ratio('lat_mean'):>10} {ratio('lat_p99'):>10}\n")
    return "".join(out)
