"""fio's ftruncate engine: each write sets the file's length to its offset; its bytes are
counted, none moved; a read fails the job with EINVAL (22), as fio 3.33's."""
from __future__ import annotations

import errno
import os

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs


def _run(path, rw: str) -> dict:
    text = f"[j]\nfilename={path}\nsize=1m\nbs=64k\nrw={rw}\nioengine=ftruncate\n"
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    return report.to_json(run_jobs(jobs, log=lambda _: None), globals_)["jobs"][0]


def test_a_sequential_write_job_leaves_the_file_at_its_last_offset(tmp_path):
    job = _run(tmp_path / "f", "write")
    assert job["error"] == 0 and job["write"]["io_bytes"] == 1 << 20 and job["write"]["total_ios"] == 16
    assert os.path.getsize(tmp_path / "f") == (1 << 20) - (64 << 10)  # fio's too: 983040


def test_a_read_fails_the_job_with_einval(tmp_path):
    (tmp_path / "f").write_bytes(b"\0" * (1 << 20))
    job = _run(tmp_path / "f", "read")
    assert job["error"] == errno.EINVAL and job["read"]["io_bytes"] == 0
