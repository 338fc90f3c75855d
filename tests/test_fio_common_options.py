"""Options common in job files people write, with fio 3.33's meaning: where a job's file
region starts (file_append), a job that only sets its file up (create_only), a failed job
ending the others (exitall_on_error), layout without a sync (create_fsync=0), and
options modelled only at the values that leave a job as it is (refused otherwise, with
what is accepted)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from cxlhm_apps.fio import files, report
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

FIO = shutil.which("fio")


def _run(text: str, log=None) -> dict:
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    return report.to_json(run_jobs(jobs, log=log or (lambda _: None)), globals_)


def _refusal(text: str) -> str:
    with pytest.raises(JobFileError) as exc:
        build_jobs([read_sections(text, "t.fio")])
    return str(exc.value)


@pytest.mark.parametrize("tool", ["cxlhm", "fio"])
def test_file_append_writes_after_the_files_end(tmp_path, tool):
    if tool == "fio" and FIO is None:
        pytest.skip("real fio is not installed (apt-get install fio)")
    path = tmp_path / "f"
    path.write_bytes(b"\1" * (1 << 20))
    text = f"[j]\nfilename={path}\nsize=1m\nrw=write\nbs=64k\nioengine=psync\nfile_append=1\n"
    if tool == "fio":
        subprocess.run([FIO, "--output-format=json", "-"], input=text, capture_output=True, text=True, timeout=60)
    else:
        assert _run(text)["jobs"][0]["write"]["io_bytes"] == 1 << 20
    data = path.read_bytes()
    assert len(data) == 2 << 20 and data[:1 << 20] == b"\1" * (1 << 20)  # the old bytes kept, the new after


def test_create_only_sets_the_file_up_and_does_no_io(tmp_path):
    out = _run(f"[j]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=read\nioengine=psync\ncreate_only=1\n")
    job = out["jobs"][0]
    assert job["error"] == 0 and job["read"]["io_bytes"] == 0 and job["read"]["total_ios"] == 0
    assert os.path.getsize(tmp_path / "f") == 1 << 20


def test_a_failed_job_with_exitall_on_error_ends_its_group(tmp_path):
    (tmp_path / "r").write_bytes(b"\0" * (1 << 20))
    text = (f"[bad]\nfilename={tmp_path / 'r'}\nsize=1m\nrw=read\nioengine=ftruncate\nexitall_on_error=1\n"
            f"[long]\nfilename={tmp_path / 'w'}\nsize=1m\nrw=write\nioengine=psync\nruntime=60\ntime_based\n"
            f"[next]\nstonewall\nfilename={tmp_path / 'w'}\nsize=64k\nrw=write\nioengine=psync\n")
    jobs = _run(text)["jobs"]
    assert jobs[0]["error"] and jobs[1]["job_runtime"] < 30_000  # (ended with its group, not after 60 s)
    assert jobs[2]["write"]["io_bytes"] == 64 << 10  # exit_what=group: the next phase still runs


def test_create_fsync_0_lays_out_without_a_sync(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    _run(f"[j]\nfilename={tmp_path / 'a'}\nsize=64k\nrw=read\nioengine=psync\n")
    assert synced  # fio's default: the layout synced
    synced.clear()
    _run(f"[j]\nfilename={tmp_path / 'b'}\nsize=64k\nrw=read\nioengine=psync\ncreate_fsync=0\n")
    assert not synced


@pytest.mark.parametrize("option, bad, accepted", [
    ("continue_on_error", "all", "none"), ("verify_async", "2", "0"), ("trim_percentage", "10", "0"),
    ("unified_rw_reporting", "mixed", "none"), ("lockmem", "1g", "0"), ("log_store_compressed", "1", "0")])
def test_an_option_modelled_at_its_default_refuses_other_values_with_what_it_accepts(tmp_path, option, bad,
                                                                                  accepted):
    base = f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nioengine=psync\n"
    why = _refusal(base + f"{option}={bad}\n")
    assert f"option '{option}'" in why and f"accepted: {accepted}" in why
    assert _run(base + f"{option}={accepted}\n")["jobs"][0]["write"]["io_bytes"] == 64 << 10


def test_iodepth_low_below_iodepth_is_refused_and_at_it_runs(tmp_path):
    base = f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nioengine=libaio\niodepth=8\n"
    assert "option 'iodepth_low'" in _refusal(base + "iodepth_low=2\n")
    assert _run(base + "iodepth_low=8\n")["jobs"][0]["write"]["io_bytes"] == 64 << 10


def test_log_compression_takes_fios_range():
    assert "from 1024 to 512m" in _refusal("[j]\nfilename=x\nsize=1m\nlog_compression=0\n")


def test_another_clocksource_runs_with_a_note_that_says_which_clock_times_it(tmp_path):
    said = []
    _run(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nioengine=psync\nclocksource=cpu\n", log=said.append)
    assert any("clocksource is accepted" in s and "CLOCK_MONOTONIC" in s for s in said)


def test_stats_0_runs_the_job_and_reports_none_of_it(tmp_path):
    path = tmp_path / "f"
    out = _run(f"[j]\nfilename={path}\nsize=64k\nrw=write\nbs=4k\nioengine=psync\nstats=0\nbuffer_pattern=0xab\n")
    job = out["jobs"][0]
    assert job["write"]["io_bytes"] == 0 and job["write"]["total_ios"] == 0 and job["job_runtime"] == 0
    assert job["usr_cpu"] == 0 and job["error"] == 0
    assert path.read_bytes() == b"\xab" * (64 << 10)  # (the job did write)


def test_stats_0_keeps_the_jobs_error(tmp_path):
    (tmp_path / "f").write_bytes(b"\0" * (64 << 10))
    job = _run(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=read\nioengine=ftruncate\nstats=0\n")["jobs"][0]
    assert job["error"] == 22


def test_stats_0_prints_no_block_for_the_job(tmp_path):
    text = (f"[global]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nioengine=psync\n"
            "[quiet]\nstats=0\n[loud]\n")
    jobs, _ = build_jobs([read_sections(text, "t.fio")])
    normal = report.format_normal(run_jobs(jobs, log=lambda _: None))
    assert "loud: (groupid=0" in normal and "quiet: (groupid=0" not in normal
    assert "Run status group 0 (all jobs):" in normal
