"""fio's null engine (cxlhm_apps/fio/null_engine.py): no file, no data, fio's depth and
submission figures; and what fio's regression jobs (t/jobs) brought in with it: logs a
whole run shares (per_job_logs=0), verify after every `loops` pass and between the
cycles of a time_based job, fio's reading of a pattern such as "abcd"-120xdeadface.
Real fio's figures where it is installed; its rules otherwise."""
from __future__ import annotations

import os

import pytest

from cxlhm_apps.fio.jobfile import JobFileError
from fio_helpers import FIO, real_fio_job, run_ours

needs_fio = pytest.mark.skipif(FIO is None, reason="real fio is not installed (apt-get install fio)")


def _counts(job: dict) -> tuple:
    return tuple((job[d]["io_bytes"], job[d]["total_ios"]) for d in ("read", "write"))


def test_no_file_is_created_and_every_io_completes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, job = run_ours("[j]\nioengine=null\nfilename=never\nsize=1m\nrw=randrw\nbs=4k\n")
    assert os.listdir(tmp_path) == []
    assert job["error"] == 0
    assert job["read"]["io_bytes"] + job["write"]["io_bytes"] == 1 << 20
    assert job["read"]["total_ios"] + job["write"]["total_ios"] == 256


def test_a_job_without_size_is_refused_naming_the_engine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(JobFileError, match="size= is needed: ioengine=null has no file"):
        run_ours("[j]\nioengine=null\nrw=read\n")


@pytest.mark.parametrize("iodepth,batch,depth_key,submit_key", [(1, None, "1", None), (8, None, "1", "4"),
                                                                   (8, 8, "8", "8")])
def test_depth_and_submissions_are_fios(tmp_path, monkeypatch, iodepth, batch, depth_key, submit_key):
    """iodepth=1 is synchronous (no submissions counted, no slat); above it, a batch of
    iodepth_batch I/Os is in flight at once (one by default)."""
    monkeypatch.chdir(tmp_path)
    text = f"[j]\nioengine=null\nsize=2m\nrw=read\niodepth={iodepth}\n" + (f"iodepth_batch={batch}\n" if batch else "")
    _, job = run_ours(text)
    assert job["iodepth_level"][depth_key] > 98  # (the first batch's ramp marks a few below it)
    if submit_key is None:
        assert not any(job["iodepth_submit"].values())
        assert job["read"]["slat_ns"]["max"] == 0
    else:
        assert job["iodepth_submit"][submit_key] == 100.0
        assert job["read"]["slat_ns"]["max"] > 0
    if FIO:
        theirs = real_fio_job(text)
        assert _counts(theirs) == _counts(job)
        assert max(theirs["iodepth_level"], key=theirs["iodepth_level"].get) == depth_key
        assert bool(any(theirs["iodepth_submit"].values())) == (submit_key is not None)


def test_a_verify_passes_unchecked_as_fios_fake_io(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, job = run_ours("[j]\nioengine=null\nsize=256k\nrw=write\nverify=md5\ndo_verify=1\n")
    assert job["error"] == 0 and job["read"]["total_ios"] == job["write"]["total_ios"] == 64


@needs_fio
@pytest.mark.parametrize("job_text", [
    "rw=randread\nbsrange=512-4k\nsize=20000\n",  # fio's t0001
    "rw=randrw\nbssplit=512/25:1k/:2k/:4k/\nsize=1m\n",
    "rw=read:512k\nbs=1m\nsize=128m\nnorandommap\n",  # t0007's holes
    "rw=randwrite\nrandom_distribution=zipf:1.2\nsize=4m\nnorandommap\n",
])
def test_the_pattern_is_fios(tmp_path, monkeypatch, job_text):
    monkeypatch.chdir(tmp_path)
    text = "[j]\nioengine=null\n" + job_text
    _, ours = run_ours(text)
    theirs = real_fio_job(text)
    assert _counts(ours) == _counts(theirs)


def test_shared_logs_gather_every_clone_and_grow_across_runs(tmp_path, monkeypatch):
    """per_job_logs=0: NAME_iops.log, appended by each clone as it ends; a second run adds to it."""
    monkeypatch.chdir(tmp_path)
    text = "[j]\nioengine=null\nsize=64k\nrw=read\nnumjobs=3\nwrite_iops_log=x\nper_job_logs=0\n"
    run_ours(text)
    assert sorted(os.listdir(tmp_path)) == ["x_iops.log"]
    lines = (tmp_path / "x_iops.log").read_text().splitlines()
    assert len(lines) == 3 * 16 and all(line.split(", ")[1:4] == ["1", "0", "4096"] for line in lines)
    run_ours(text)
    assert len((tmp_path / "x_iops.log").read_text().splitlines()) == 2 * 3 * 16


@pytest.mark.parametrize("engine", ["psync", "libaio"])
def test_each_loops_pass_is_verified_before_the_next(tmp_path, monkeypatch, engine):
    """fio verifies after every do_io: eight passes over the same blocks pass their checks
    (checking all eight at the end would find the first pass's headers overwritten)."""
    monkeypatch.chdir(tmp_path)
    text = (f"[j]\nioengine={engine}\nfilename=f\nsize=256k\nrw=randwrite\nloops=8\nverify=md5\ndo_verify=1\n")
    _, job = run_ours(text)
    assert job["error"] == 0
    assert job["write"]["total_ios"] == job["read"]["total_ios"] == 8 * 64
    if FIO:
        assert _counts(real_fio_job(text)) == _counts(job)


@pytest.mark.parametrize("engine,verifies", [("libaio", True), ("psync", False)])
def test_a_time_based_verify_job_runs_in_cycles_of_its_size(tmp_path, monkeypatch, engine, verifies):
    """With verify, fio ends a time_based job's do_io once `size` bytes are issued,
    verifies them and begins again; a synchronous engine never counts a byte as issued,
    so it never verifies; the cycle the run time ends is not verified."""
    monkeypatch.chdir(tmp_path)
    text = (f"[j]\nioengine={engine}\nfilename=f\nsize=256k\nrw=randrw\ntime_based\nruntime=1\nverify=md5\n"
            "do_verify=1\n")
    _, job = run_ours(text)
    reads, writes = job["read"]["total_ios"], job["write"]["total_ios"]
    assert job["error"] == 0 and writes > 64
    if verifies:  # each cycle: half its I/Os reads, half writes, then each write read back
        assert 1.6 * writes < reads < 2.4 * writes
    else:
        assert 0.7 * writes < reads < 1.3 * writes


def test_experimental_verify_runs_for_one_pass_and_is_refused_for_several(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = "[j]\nioengine=psync\nfilename=f\nsize=128k\nrw=randwrite\nverify=md5\ndo_verify=1\nexperimental_verify=1\n"
    _, job = run_ours(base)
    assert job["error"] == 0 and job["read"]["total_ios"] == job["write"]["total_ios"] == 32
    with pytest.raises(JobFileError, match="experimental_verify.*loops > 1"):
        run_ours(base + "loops=2\n")


def _trace(path) -> list[tuple]:
    """A v3 I/O log without its times: (file, action, offset, length) per line, versions too."""
    return [tuple(line.split()[1:]) if line[0].isdigit() else (line,) for line in path.read_text().splitlines()]


def _clone_blocks(trace: list[tuple]) -> list[list[str]]:
    """Each clone's actions (from its version line on), in no particular order of clones."""
    blocks: list[list[str]] = []
    for line in trace:
        if len(line) == 1:
            blocks.append([])
        else:
            blocks[-1].append(line[1])
    return sorted(blocks)


@pytest.mark.parametrize("job_text", [
    "rw=write\nbs=8k\nsize=32k\nfsync=2\nverify=crc32c\n",  # a sync, then the verify phase's reopen and reads
    "rw=read\nbs=8k\nsize=32k\nloops=2\n",  # each pass opens the file again
    "rw=randrw\nbs=4k\nsize=64k\nnumjobs=2\n",  # both clones append to the one log
])
def test_write_iolog_is_fios_trace(tmp_path, monkeypatch, job_text):
    monkeypatch.chdir(tmp_path)
    text = "[j]\nioengine=psync\nfilename=f\nwrite_iolog=trace.log\n" + job_text
    run_ours(text)
    ours = _trace(tmp_path / "trace.log")
    assert ours[0] == ("fio version 3 iolog",) and ours[1:3] == [("f", "add"), ("f", "open")]
    assert ours[-1] == ("f", "close")
    times = [int(line.split()[0]) for line in (tmp_path / "trace.log").read_text().splitlines() if line[0].isdigit()]
    if "numjobs" not in job_text:
        assert times == sorted(times)
    if FIO:
        os.remove(tmp_path / "trace.log")
        real_fio_job(text)
        theirs = _trace(tmp_path / "trace.log")
        if "numjobs" in job_text:  # (the clones' random offsets are each their own; the shape is fio's,
            # each clone's lines a block from its add, the blocks in the order the clones ended)
            assert _clone_blocks(ours) == _clone_blocks(theirs)
        else:
            assert ours == theirs
