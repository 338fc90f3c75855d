"""rate_min / rate_iops_min / rate_cycle with fio 3.33's meaning (cxlhm_apps/fio/minrate.py):
the 2 s settle time, the first check noting the counts, the rate_cycle window, the job
failing with err=5, and the rules fio applies between the options."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.minrate import SETTLE_NS, MinRate
from cxlhm_apps.fio.runner import run_jobs

MS = 1_000_000


def _reads(check: MinRate, n: int, size: int = 4096) -> None:
    check.did(np.zeros(n, np.int8), np.full(n, size, np.int64))


def test_nothing_is_checked_in_the_settle_time_and_the_first_check_only_notes_the_counts():
    check = MinRate("j", (None, None), (1000, None), 1000)
    _reads(check, 10)  # 10 I/Os: far below 1000 IOPS
    assert check.check(SETTLE_NS - 1) is None
    assert check.check(SETTLE_NS) is None  # notes the counts
    _reads(check, 10)
    assert check.check(SETTLE_NS + 999 * MS) is None  # within the cycle
    assert check.check(SETTLE_NS + 1000 * MS) == "j: rate_iops_min=1000 not met, got 10 IOPS"


def test_a_job_at_its_minimum_passes_and_bytes_count_per_direction():
    check = MinRate("j", (None, 4096 * 100), (None, None), 500)
    check.did(np.array([0] * 5 + [1] * 10, np.int8), np.full(15, 4096, np.int64))
    assert check.check(SETTLE_NS) is None
    check.did(np.ones(50, np.int8), np.full(50, 4096, np.int64))  # 50 writes in 500 ms: exactly 100/s
    assert check.check(SETTLE_NS + 500 * MS) is None
    check.did(np.ones(49, np.int8), np.full(49, 4096, np.int64))
    assert check.check(SETTLE_NS + 1000 * MS) == "j: rate_min=409600B/s not met, got 401408B/s"


def test_a_direction_without_io_is_not_checked():
    check = MinRate("j", (None, None), (5, 5), 100)
    _reads(check, 1)
    assert check.check(SETTLE_NS) is None
    _reads(check, 1)
    # reads: 1 I/O in 200 ms = 5 IOPS, not below; writes did nothing and are never checked
    assert check.check(SETTLE_NS + 200 * MS) is None
    check2 = MinRate("k", (None, None), (6, 1000), 100)
    _reads(check2, 1)
    check2.check(SETTLE_NS)
    _reads(check2, 1)
    assert check2.check(SETTLE_NS + 200 * MS) == "k: rate_iops_min=6 not met, got 5 IOPS"


def test_the_next_check_is_due_after_the_settle_time_then_every_cycle():
    check = MinRate("j", (None, None), (1, None), 250)
    assert check.next_check_ns() > 2**60  # no I/O yet: nothing to check
    _reads(check, 1)
    assert check.next_check_ns() == SETTLE_NS
    check.check(SETTLE_NS + 7)
    assert check.next_check_ns() == SETTLE_NS + 7 + 250 * MS


def _jobs(text: str):
    return build_jobs([read_sections(text, "t.fio")])


def test_rules_between_the_options_are_fios_and_name_the_line():
    with pytest.raises(JobFileError) as err:
        _jobs("[j]\nsize=1m\nrate_min=1k\nrate_iops_min=10\n")
    assert "t.fio:4: option 'rate_iops_min': rate_min and rate_iops_min are mutually exclusive" in str(err.value)
    with pytest.raises(JobFileError) as err:
        _jobs("[j]\nsize=1m\nrw=randrw\nrate_iops=100,50\nrate_iops_min=10,60\n")
    assert "t.fio:5: option 'rate_iops_min': the write minimum (60) exceeds rate_iops (50)" in str(err.value)
    with pytest.raises(JobFileError) as err:
        _jobs("[j]\nsize=1m\nrate_cycle=-1\n")
    assert "t.fio:3: option 'rate_cycle'" in str(err.value)
    jobs, _ = _jobs("[j]\nsize=1m\nratemin=1m,2m\nratecycle=250\n")
    assert jobs[0]["rate_min"] == (1 << 20, 2 << 20) and jobs[0]["rate_cycle"] == 250


def _summary(out: dict) -> tuple[int, int]:
    job = out["jobs"][0]
    return job["error"], job["job_runtime"]


@pytest.mark.slow
def test_a_job_below_its_minimum_fails_after_the_settle_time_as_under_fio(tmp_path):
    text = (f"[j]\nfilename={tmp_path / 'f.dat'}\nrw=randread\nbs=4k\nsize=4m\nruntime=4\ntime_based\n"
            "rate_iops_min=100000000\nrate_cycle=200\n")
    jobs, globals_ = _jobs(text)
    result = run_jobs(jobs, log=lambda _: None)
    error, runtime_ms = _summary(report.to_json(result, globals_))
    assert error == 5 and 2200 <= runtime_ms < 2600  # settle (2 s), then one cycle of 200 ms
    assert any("rate_iops_min=100000000 not met" in m for m in result.messages)
    if shutil.which("fio"):
        job = tmp_path / "t.fio"
        job.write_text(text)
        done = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True, timeout=60)
        error, runtime_ms = _summary(json.loads(done.stdout[done.stdout.index("{"):]))
        assert error == 5 and 2200 <= runtime_ms < 2600
