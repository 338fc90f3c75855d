"""What the fio tests run a job-file text through: cxlhm fio, in this process, and real
fio (FIO: None where it is not installed)."""
from __future__ import annotations

import json
import shutil
import subprocess

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import RunResult, run_jobs

FIO = shutil.which("fio")


def run_ours(text: str, log=None) -> tuple[RunResult, dict]:
    """The run, and its first job's JSON."""
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=log or (lambda _: None))
    return result, report.to_json(result, globals_)["jobs"][0]


def real_fio_job(text: str, timeout: int = 120) -> dict:
    """Real fio's JSON of the first job of `text`."""
    proc = subprocess.run([FIO, "--output-format=json", "-"], input=text, capture_output=True, text=True,
                          timeout=timeout)
    return json.loads(proc.stdout[proc.stdout.find("{"):])["jobs"][0]


def iolog_ios(path) -> list[tuple[int, int, int]]:
    """The (direction, offset, length) of each read and write in fio's I/O log (write_iolog)."""
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[2] in ("read", "write"):
            out.append((0 if parts[2] == "read" else 1, int(parts[3]), int(parts[4])))
    return out
