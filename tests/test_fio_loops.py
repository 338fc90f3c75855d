"""`loops` passes where a pass ends short of the job's bytes (plan.loop_pass_bytes,
loop_budget): a synchronous engine's pass ends where its random map is full, a queued
engine's at `size`; fio 3.33 runs `loops` passes, then more while the bytes done fall
short of `io_size`. Golden byte counts are real fio 3.33's for the same job; where fio
is installed each is also checked against it live."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

FIO = shutil.which("fio")

# (engine, job lines, (read bytes, write bytes) fio 3.33 moved)
GOLDEN = [
    ("psync", "rw=randread\nloops=3\n", (3 << 20, 0)),  # the map fills each pass: three passes
    ("psync", "rw=randread\nloops=3\nbssplit=4k/50:64k/50\n", (3 << 20, 0)),
    ("psync", "rw=randrw\nloops=3\n", (1622016, 1523712)),  # each pass's directions drawn again
    ("psync", "rw=randrw\nloops=3\nrwmixread=30\n", (1019904, 2125824)),
    ("psync", "rw=randwrite\nloops=2\nbsrange=4k-64k\n", (0, 2 << 20)),
    ("pvsync", "rw=randread\nloops=3\nio_size=6m\n", (6 << 20, 0)),  # more passes, up to io_size
    ("psync", "rw=randread\nloops=3\nio_size=3584k\n", (4 << 20, 0)),
    ("psync", "rw=randread\nloops=3\nio_size=512k\n", (1536 << 10, 0)),  # io_size x loops in all
    ("psync", "rw=read\nloops=3\nio_size=3584k\n", (4 << 20, 0)),
    ("mmap", "rw=randwrite\nloops=2\n", (0, 2 << 20)),
    ("libaio", "rw=randread\nloops=3\nio_size=6m\n", (6 << 20, 0)),
    ("libaio", "rw=randread\nloops=3\nio_size=3584k\n", (4 << 20, 0)),
    ("libaio", "rw=randread\nloops=3\nio_size=512k\n", (1536 << 10, 0)),
    ("psync", "rw=randread\nloops=3\nnorandommap=1\n", (3 << 20, 0)),  # one pass: no map to fill
]


def _job(path, engine: str, lines: str) -> str:
    return f"[j]\nfilename={path}\nioengine={engine}\nsize=1m\n{lines}"


def _bytes(job: dict) -> tuple[int, int]:
    return job["read"]["io_bytes"], job["write"]["io_bytes"]


@pytest.mark.parametrize("engine,lines,want", GOLDEN)
def test_loops_move_the_bytes_fio_moves(tmp_path, engine, lines, want):
    text = _job(tmp_path / "f", engine, lines)
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    out = report.to_json(result, globals_)["jobs"][0]
    assert out["error"] == 0, result.messages
    assert _bytes(out) == want


@pytest.mark.skipif(FIO is None, reason="real fio is not installed")
@pytest.mark.parametrize("engine,lines,want", GOLDEN[:1] + GOLDEN[5:9])
def test_the_golden_counts_are_real_fios(tmp_path, engine, lines, want):
    (tmp_path / "t.fio").write_text(_job(tmp_path / "f", engine, lines))
    proc = subprocess.run([FIO, "--output-format=json", "t.fio"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _bytes(json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"][0]) == want
