"""How a job's file is set up before it runs, as fio 3.33 does it for a job that only
writes: `fallocate` (native by default on Linux), `overwrite`, `create_on_open`; and fio's
own --readonly and --eta-newline arguments on the command line."""
from __future__ import annotations

import os
import threading
import shutil
import subprocess

import pytest

from cxlhm_apps.cli import main
from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

FIO = shutil.which("fio")
SIZE = 1 << 20


def _run(path, lines: str, log=None):
    text = f"[j]\nfilename={path}\nsize=1m\nrw=randwrite\nbs=4k\nnumber_ios=1\nioengine=psync\n{lines}"
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=log or (lambda _: None))
    return report.to_json(result, globals_)["jobs"][0]


def _shape(path) -> tuple[bool, bool]:
    """(sized to the job's 1 MiB, its blocks allocated)"""
    st = os.stat(path)
    return st.st_size == SIZE, st.st_blocks * 512 >= SIZE


# fallocate mode -> (sized, allocated), as fio 3.33 leaves a new file before its one 4 KiB write
MODES = {"native": (True, True), "posix": (True, True), "1": (True, True), "keep": (False, True),
         "truncate": (True, False), "none": (False, False), "0": (False, False)}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fallocate_leaves_the_file_as_fio_does(tmp_path, mode):
    path = tmp_path / "f"
    job = _run(path, f"fallocate={mode}\n")
    assert job["error"] == 0 and job["write"]["total_ios"] == 1
    assert _shape(path) == MODES[mode]
    if FIO is not None:
        theirs = tmp_path / "fio"
        text = f"[j]\nfilename={theirs}\nsize=1m\nrw=randwrite\nbs=4k\nnumber_ios=1\nioengine=psync\nfallocate={mode}\n"
        subprocess.run([FIO, "--output-format=json", "-"], input=text, capture_output=True, text=True, timeout=60)
        assert _shape(theirs) == MODES[mode]


def test_fios_default_is_native(tmp_path):
    _run(tmp_path / "f", "")
    assert _shape(tmp_path / "f") == (True, True)


def test_overwrite_lays_the_file_out_before_a_writing_job(tmp_path):
    said = []
    _run(tmp_path / "f", "overwrite=1\nfallocate=none\n", log=said.append)
    assert any("Laying out IO file" in s for s in said)
    data = (tmp_path / "f").read_bytes()
    assert len(data) == SIZE and data.count(0) < SIZE // 2  # written whole, not a hole


def test_create_on_open_runs_the_same_job(tmp_path):
    assert _run(tmp_path / "f", "create_on_open=1\n")["write"]["total_ios"] == 1


def test_readonly_refuses_a_writing_job_and_runs_a_reading_one(tmp_path, capsys):
    words = ["--readonly", f"--filename={tmp_path / 'f'}", "--size=64k", "--eta-newline=1", "--name=w", "--rw=write"]
    assert main(["fio", *words]) == 2
    assert "--readonly: job(s) w write" in capsys.readouterr().err
    (tmp_path / "f").write_bytes(b"x" * (64 << 10))  # (a file that is there: read as it is)
    words[-1] = "--rw=read"
    assert main(["fio", *words, "--output-format=json"]) == 0


def test_completion_batching_is_taken_with_a_note_that_says_it_is_not_applied(tmp_path):
    said = []
    job = _run(tmp_path / "f", "iodepth_batch_complete_min=4\niodepth_batch_complete_max=8\n", log=said.append)
    assert job["error"] == 0
    assert any("iodepth_batch_complete_min is accepted, not applied" in s for s in said)
    assert any("iodepth_batch_complete_max is accepted, not applied" in s for s in said)


def test_posixaio_runs_one_files_requests_one_at_a_time_as_glibc(tmp_path, monkeypatch):
    # glibc queues a file's requests on one helper thread: at iodepth=8 no two overlap
    from cxlhm_apps.fio import raw_engines
    active, most = [0], [0]
    real = raw_engines.os.preadv

    def preadv(fd, bufs, offset):
        active[0] += 1
        most[0] = max(most[0], active[0])
        try:
            return real(fd, bufs, offset)
        finally:
            active[0] -= 1

    monkeypatch.setattr(raw_engines.os, "preadv", preadv)
    text = (f"[j]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=randread\nbs=4k\nioengine=posixaio\niodepth=8\n"
            "number_ios=200\n")
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    job = report.to_json(run_jobs(jobs, log=lambda _: None), globals_)["jobs"][0]
    assert job["read"]["total_ios"] == 200 and job["iodepth_level"]["8"] > 90  # 8 in flight, as fio reports
    assert most[0] == 1


def test_readonly_does_not_create_or_lay_out_a_file(tmp_path, capsys):
    words = ["--readonly", f"--filename={tmp_path / 'f'}", "--size=64k", "--name=r", "--rw=read"]
    assert main(["fio", *words]) == 2
    assert "under --readonly it is not created" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("sync", [0, 1])
def test_sync_opens_the_file_o_sync_as_fio(tmp_path, monkeypatch, sync):
    from cxlhm_apps.fio import raw_engines
    flags, real_open = [], raw_engines.os.open

    def open_(path, how, *rest):
        if str(path) == str(tmp_path / "f"):
            flags.append(how)
        return real_open(path, how, *rest)

    monkeypatch.setattr(raw_engines.os, "open", open_)
    job = _run(tmp_path / "f", f"sync={sync}\n")
    assert job["error"] == 0
    engine_opens = [f for f in flags if f & os.O_CLOEXEC]  # (the engine's; not the set-up's own opens)
    assert engine_opens and all(bool(f & os.O_SYNC) == bool(sync) for f in engine_opens)


def test_the_device_refuses_sync_and_says_what_to_use(tmp_path):
    text = f"[j]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=write\nioengine=cxlhm\nsync=1\n"
    with pytest.raises(Exception, match="does not model it: the device acknowledges a write once it is in its DRAM"):
        build_jobs([read_sections(text, "t.fio")])


def test_max_latency_ends_the_job_at_the_first_io_over_it_as_fio(tmp_path):
    text = f"[j]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=randread\nbs=4k\nioengine=psync\nmax_latency=1us\n"
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    job = report.to_json(result, globals_)["jobs"][0]
    assert job["error"] == 110 and job["read"]["total_ios"] == 1  # (ETIMEDOUT, at the first read, as fio)
    assert any(m.startswith("fio: latency of ") and "exceeds specified max (1000 nsec)" in m for m in result.messages)
    text = text.replace("max_latency=1us", "max_latency=10s,1us")  # (read,write: reads under 10 s pass)
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    assert report.to_json(run_jobs(jobs, log=lambda _: None), globals_)["jobs"][0]["error"] == 0


def test_unlink_removes_the_file_once_the_run_is_done(tmp_path):
    _run(tmp_path / "f", "unlink=1\n")
    assert not (tmp_path / "f").exists()
    text = f"[j]\nfilename={tmp_path / 'd'}\nsize=1m\nrw=write\nioengine=cxlhm\nunlink=1\n"
    with pytest.raises(Exception, match="the device's image, kept with its checksum sidecars"):
        build_jobs([read_sections(text, "t.fio")])


@pytest.mark.parametrize("lines,want", [
    ("cpus_allowed=0\n", [{0}, {0}]),
    ("cpumask=0x1\n", [{0}, {0}]),
    (f"cpus_allowed=0-{min(1, os.cpu_count() - 1)}\ncpus_allowed_policy=split\n",
     [{0}, {min(1, os.cpu_count() - 1)}]),  # (each clone one CPU of the set, in turn)
])
def test_cpus_allowed_pins_each_clones_thread(tmp_path, monkeypatch, lines, want):
    from cxlhm_apps.fio import placement
    pinned, real_pin = [], placement.pin

    def pin(job, thread_number):
        real_pin(job, thread_number)
        pinned.append((thread_number, os.sched_getaffinity(0)))

    monkeypatch.setattr(placement, "pin", pin)
    job = _run(tmp_path / "f", f"numjobs=2\n{lines}")
    assert job["error"] == 0
    assert [cpus for _, cpus in sorted(pinned)] == want


def test_a_cpu_the_machine_does_not_have_is_refused(tmp_path):
    text = f"[j]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=read\ncpus_allowed=0,{os.cpu_count() + 3}\n"
    with pytest.raises(Exception, match="names CPUs this machine does not have"):
        build_jobs([read_sections(text, "t.fio")])


def test_exec_prerun_and_postrun_run_around_the_job_with_their_output_saved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = _run(tmp_path / "f", "exec_prerun=echo before\nexec_postrun=echo after\nnice=3\n")
    assert job["error"] == 0 and job["write"]["total_ios"] == 1
    assert (tmp_path / "j.prerun.txt").read_text() == "before\n"
    assert (tmp_path / "j.postrun.txt").read_text() == "after\n"


def test_a_failed_prerun_means_no_io_and_no_postrun_as_fio(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = []
    job = _run(tmp_path / "f", "exec_prerun=exit 3\nexec_postrun=echo after\n", log=said.append)
    assert job["error"] == 0 and job["write"]["total_ios"] == 0
    assert not (tmp_path / "j.postrun.txt").exists()


def test_nice_sets_the_job_threads_nice_value(tmp_path, monkeypatch):
    from cxlhm_apps.fio import placement
    seen, real_pin = [], placement.pin

    def pin(job, thread_number):
        real_pin(job, thread_number)
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    monkeypatch.setattr(placement, "pin", pin)
    _run(tmp_path / "f", "nice=7\n")
    assert seen == [7]
