"""When a job starts (startdelay), what its report samples (bwavgtime, iopsavgtime), what
its buffers come from (mem) and whether its file may be created (allow_file_create), as
fio 3.33 has them."""
from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from hypothesis import given, settings, strategies as st

from cxlhm_apps.fio import files, report, schedule
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

FIO = shutil.which("fio")


def _jobs(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    return jobs, globals_


def _run(text: str) -> dict:
    jobs, globals_ = _jobs(text)
    return report.to_json(run_jobs(jobs, log=lambda _: None), globals_)


# startdelay=1-4 with numjobs=4 after two jobs: fio (3.42, whose JSON has job_start) started
# the clones 2708, 2708, 2106 and 1203 ms after a job without delay; its run loop looks every
# ~100 ms, so each start is the draw rounded up to the next look
FIO_DRAWS_MS = (2678.5, 2677.396, 2060.42, 1061.852)


def test_a_delay_range_draws_fios_delay_for_each_clone():
    jobs, _ = _jobs("[a]\nfilename=x\nsize=1m\n[b]\nfilename=x\nsize=1m\n"
                    "[c]\nfilename=x\nsize=1m\nstartdelay=1-4\nnumjobs=4\n")
    c = jobs[2]
    draws = [schedule.start_delay_ns(c, number, seed=0) / 1e6 for number in (3, 4, 5, 6)]
    assert draws == pytest.approx(FIO_DRAWS_MS)


@given(low=st.integers(0, 10_000), span=st.integers(0, 10_000), number=st.integers(1, 64),
       generator=st.sampled_from(["tausworthe", "tausworthe64"]))
@settings(max_examples=60, deadline=None)
def test_a_drawn_delay_stays_in_its_range(low, span, number, generator):
    jobs, _ = _jobs(f"[a]\nfilename=x\nsize=1m\nstartdelay={low}ms-{low + span}ms\nrandom_generator={generator}\n")
    delay = schedule.start_delay_ns(jobs[0], number, seed=0)
    assert low * 1_000_000 <= delay <= (low + span) * 1_000_000


def test_a_delayed_job_starts_after_its_delay_and_keeps_it_out_of_its_run_time(tmp_path):
    start = time.monotonic()
    out = _run(f"[a]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nioengine=psync\nstartdelay=400ms\n")
    assert time.monotonic() - start >= 0.4
    job = out["jobs"][0]
    assert job["write"]["io_bytes"] == 64 << 10 and job["job_runtime"] < 400


def test_a_job_ended_by_exitall_while_it_waits_for_its_delay_does_no_io(tmp_path):
    start = time.monotonic()
    out = _run(f"[global]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nioengine=psync\n"
               "[quick]\nexitall\n[late]\nstartdelay=60\n")
    assert time.monotonic() - start < 30
    late = out["jobs"][1]
    assert late["jobname"] == "late" and late["write"]["total_ios"] == 0


def test_startdelay_on_the_model_clock_is_refused_by_name():
    with pytest.raises(JobFileError, match="startdelay"):
        _jobs("[a]\nfilename=x\nsize=1m\nioengine=cxlhm\ncxlhm_clock=model\nstartdelay=1\n")


def _device_job(path, extra: str) -> str:
    return (f"[a]\nfilename={path}\nsize=64m\nrw=randread\nbs=1m\nioengine=cxlhm\ncxlhm_clock=model\n"
            f"cxlhm_block_size=64k\ncxlhm_dram=16m\n{extra}")


def test_samples_follow_each_window_and_none_is_taken_as_the_run_time_ends(tmp_path):
    # the model clock makes the batch ends exact: 1 s in windows of 125 ms and 250 ms
    job = _run(_device_job(tmp_path / "d", "runtime=1\ntime_based\nbwavgtime=125\niopsavgtime=250\n"))
    job = job["jobs"][0]["read"]
    assert (job["bw_samples"], job["iops_samples"]) == (7, 3)
    assert job["bw_min"] <= job["bw_mean"] <= job["bw_max"] and job["bw_min"] > 0


def test_a_job_shorter_than_a_window_has_no_sample(tmp_path):
    job = _run(_device_job(tmp_path / "d", "io_size=1m\n"))["jobs"][0]["read"]
    assert job["total_ios"] == 1 and job["bw_samples"] == job["iops_samples"] == 0


@pytest.mark.skipif(FIO is None, reason="real fio is not installed (apt-get install fio)")
@pytest.mark.parametrize("windows", ["", "bwavgtime=250\niopsavgtime=250\n", "bwavgtime=1000\n"])
def test_sample_counts_equal_fios(tmp_path, windows):
    def text(name):
        return (f"[j]\nfilename={tmp_path / name}\nsize=8m\nrw=randread\nbs=4k\nioengine=psync\nruntime=1\n"
                f"time_based\n{windows}")
    fio = subprocess.run([FIO, "--output-format=json", "-"], input=text("fio"), capture_output=True, text=True,
                         timeout=60)
    import json
    theirs = json.loads(fio.stdout)["jobs"][0]["read"]
    ours = _run(text("ours"))["jobs"][0]["read"]
    for key in ("bw_samples", "iops_samples"):  # (fio's helper may wake a few ms late: one window at most)
        assert abs(ours[key] - theirs[key]) <= 1, (key, ours[key], theirs[key])


def test_every_buffer_memory_type_runs_the_same_io(tmp_path):
    for mem in ("malloc", "shm", "mmap", "mmapshared", f"mmap:{tmp_path / 'buf'}"):
        out = _run(f"[a]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nioengine=psync\niomem={mem}\n")
        assert out["jobs"][0]["write"]["io_bytes"] == 64 << 10, mem


@pytest.mark.parametrize("mem", ["shmhuge", "mmaphuge", "mmaphuge:/dev/hugepages/x"])
def test_huge_page_buffers_need_free_huge_pages(monkeypatch, mem):
    text = f"[a]\nfilename=x\nsize=1m\nmem={mem}\n"
    monkeypatch.setattr(files, "huge_pages_free", lambda: 0)
    with pytest.raises(JobFileError, match="huge pages"):
        _jobs(text)
    monkeypatch.setattr(files, "huge_pages_free", lambda: 8)
    assert _jobs(text)[0][0]["mem"] == mem


@pytest.mark.parametrize("mem", ["malloc:/x", "mmap:", "hugetlb", "shm:/x"])
def test_a_memory_type_fio_does_not_have_is_refused_with_the_accepted_ones(mem):
    with pytest.raises(JobFileError, match="malloc, shm, shmhuge, mmap"):
        _jobs(f"[a]\nfilename=x\nsize=1m\nmem={mem}\n")


def test_allow_file_create_0_refuses_a_missing_file_and_runs_on_one_that_is_there(tmp_path):
    path = tmp_path / "f"
    text = f"[a]\nfilename={path}\nsize=64k\nrw=read\nioengine=psync\nallow_file_create=0\n"
    with pytest.raises(JobFileError, match="file creation disallowed by allow_file_create=0"):
        _run(text)
    assert not path.exists()
    path.write_bytes(b"\1" * (64 << 10))
    assert _run(text)["jobs"][0]["read"]["io_bytes"] == 64 << 10
