"""fio's options with fio's meaning, run on fio's own engines (no device): where files go,
which region each clone covers, how much I/O a job does, and what the run says."""
from __future__ import annotations

import os

import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.raw_engines import ENGINE_OPS, libaio_unavailable
from cxlhm_apps.fio.plan import plan_clones
from cxlhm_apps.fio.runner import run_jobs


def jobs_of(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    return jobs, globals_


def run(text: str):
    jobs, globals_ = jobs_of(text)
    said: list[str] = []
    result = run_jobs(jobs, log=said.append)
    return result, report.to_json(result, globals_), said


@pytest.mark.parametrize("engine", sorted(set(ENGINE_OPS) - {"ftruncate"}))  # (writes only: test_fio_ftruncate.py)
@pytest.mark.parametrize("direct", [0, 1])
def test_every_file_engine_runs_several_jobs_and_clones_on_one_file(tmp_path, engine, direct):
    if engine == "libaio" and libaio_unavailable():
        pytest.skip(libaio_unavailable())
    path = tmp_path / "shared.img"
    text = (f"[global]\nioengine={engine}\ndirect={direct}\nfilename={path}\nsize=256k\niodepth=4\n"
            "[w]\nrw=write\nbs=16k\nnumjobs=2\n[r]\nrw=randread\nbs=4k\n[m]\nstonewall\nrw=randrw\nbs=8k\n")
    result, out, _ = run(text)
    assert not result.failed, [j["error"] for j in out["jobs"]]
    per_job = [(j["jobname"], j["read"]["io_bytes"], j["write"]["io_bytes"]) for j in out["jobs"]]
    assert per_job[:3] == [("w", 0, 256 << 10), ("w", 0, 256 << 10), ("r", 256 << 10, 0)]
    assert per_job[3][0] == "m" and per_job[3][1] + per_job[3][2] == 256 << 10
    depth = out["jobs"][2]["iodepth_level"]
    if ENGINE_OPS[engine].sync:
        assert depth["1"] == 100.0  # fio caps sync engines at 1
    else:  # fio 3.33's row for these 64 I/Os at depth 4: in flight at each submission, 1, 2, 3, then 4
        assert (depth["1"], depth["2"], depth["4"]) == (1.5625, 3.125, 95.3125)


def test_a_synchronous_engine_with_a_queue_says_it_is_capped_at_one(tmp_path):
    _, _, said = run(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\niodepth=8\nrw=write\n")
    assert any("queue depth will be capped at 1" in line for line in said)


def test_offset_increment_moves_each_clone(tmp_path):
    jobs, _ = jobs_of(f"[j]\nfilename={tmp_path / 'f'}\nsize=1m\noffset=64k\noffset_increment=2m\nnumjobs=3\n"
                      "rw=write\n")
    plans = plan_clones(jobs)
    assert [p.region_start for p in plans] == [64 << 10, (64 << 10) + (2 << 20), (64 << 10) + (4 << 20)]


def test_directory_and_filename_format_place_the_files(tmp_path):
    jobs, _ = jobs_of(f"[global]\ndirectory={tmp_path}\nsize=64k\nrw=write\n[a]\nnumjobs=2\n"
                      "[b]\nfilename_format=b-$jobnum.dat\n[c]\nfilename=named\n")
    assert [p.filename for p in plan_clones(jobs)] == [
        str(tmp_path / "a.0.0"), str(tmp_path / "a.1.0"), str(tmp_path / "b-0.dat"), str(tmp_path / "named")]


def test_filesize_sizes_the_file_and_bounds_the_io(tmp_path):
    path = tmp_path / "f"
    result, out, _ = run(f"[j]\nfilename={path}\nfilesize=512k\nrw=write\nbs=64k\n")
    assert os.path.getsize(path) == 512 << 10 and out["jobs"][0]["write"]["io_bytes"] == 512 << 10


def test_loops_repeat_the_whole_io(tmp_path):
    _, out, _ = run(f"[j]\nfilename={tmp_path / 'f'}\nsize=128k\nrw=randwrite\nloops=3\n")
    assert out["jobs"][0]["write"]["io_bytes"] == 3 * (128 << 10)


def test_blockalign_aligns_random_offsets(tmp_path):
    from cxlhm_apps.fio.runner import Worker
    jobs, _ = jobs_of(f"[j]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=randread\nbs=4k\nblockalign=64k\n")
    worker = Worker(plan_clones(jobs)[0], None, 1)
    try:
        _, offsets, _ = worker.gen.next_chunk(64)
    finally:
        worker.arena.close()
    assert (offsets % (64 << 10) == 0).all() and len(set(offsets.tolist())) == 16


def test_buffered_is_the_inverse_of_direct_and_the_later_one_wins():
    jobs, _ = jobs_of("[a]\nbuffered=0\n[b]\nbuffered=0\ndirect=0\n[c]\ndirect=1\nbuffered=1\n[d]\n")
    assert [j["direct"] for j in jobs] == [True, False, False, False]


def test_numa_placement_is_accepted_and_said_to_be_not_modelled(tmp_path):
    _, _, said = run(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nnuma_cpu_nodes=0\n")
    assert any("numa_cpu_nodes is accepted but not modelled" in line and "t.fio:5" in line for line in said)


def test_job_options_are_the_sections_own_and_absent_when_it_has_none(tmp_path):
    _, out, _ = run(f"[global]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\n[a]\n[b]\nbs=8k\n")
    assert "job options" not in out["jobs"][0] and out["jobs"][1]["job options"] == {"bs": "8k"}


def test_group_reporting_sums_the_clones_job_runtime(tmp_path):
    result, out, _ = run(f"[j]\nfilename={tmp_path / 'f'}\nsize=2m\nrw=write\nnumjobs=3\ngroup_reporting\n")
    job = out["jobs"][0]
    clones = [c.stats for c in result.clones]
    assert len(out["jobs"]) == 1 and len(clones) == 3
    assert job["job_runtime"] == sum(c.run_ms for c in clones)  # fio sums job_runtime over the group
    assert job["write"]["runtime"] == max(c.dirs[1].runtime_ms for c in clones)  # and takes the longest here


def test_the_verify_phase_is_reported_apart_from_the_writes(tmp_path):
    """fio: write.runtime is the write phase, read.runtime the verify phase, job_runtime both."""
    _, out, _ = run(f"[v]\nfilename={tmp_path / 'f'}\nsize=4m\nrw=write\nbs=4k\nverify=crc32c\n")
    job = out["jobs"][0]
    read, write = job["read"]["runtime"], job["write"]["runtime"]
    assert job["read"]["io_bytes"] == job["write"]["io_bytes"] == 4 << 20 and read >= 1 and write >= 1
    assert abs(read + write - job["job_runtime"]) <= 2


def test_wait_for_starts_a_job_after_every_clone_of_the_one_it_names(tmp_path):
    # the readers check the writers' block headers: they pass only if every write landed first
    path = tmp_path / "f"
    result, out, _ = run(f"[global]\nfilename={path}\nsize=1m\nbs=4k\nverify=crc32c\n"
                         "[w]\nrw=randwrite\ndo_verify=0\nnumjobs=2\n[r]\nwait_for=w\nrw=read\n")
    assert not result.failed and out["jobs"][2]["read"]["io_bytes"] == 1 << 20
    assert {j["groupid"] for j in out["jobs"]} == {0}  # wait_for is no new group


def test_wait_for_must_name_an_earlier_job():
    from cxlhm_apps.fio.jobfile import JobFileError
    with pytest.raises(JobFileError, match="no job named 'later' is defined before job 'a'"):
        jobs_of("[a]\nwait_for=later\n[later]\n")


@pytest.mark.parametrize("what", ["group", "stonewall", "all"])
def test_exitall_ends_the_other_jobs(tmp_path, what):
    text = (f"[global]\nsize=256k\nrw=write\n[slow]\nfilename={tmp_path / 's'}\ntime_based\nruntime=20\n"
            f"[fast]\nfilename={tmp_path / 'f'}\nexitall\nexit_what={what}\n"
            f"[after]\nstonewall\nfilename={tmp_path / 'a'}\n")
    _, out, _ = run(text)
    slow, fast, after = out["jobs"]
    assert slow["job_runtime"] < 10_000 and fast["write"]["io_bytes"] == 256 << 10
    assert after["write"]["io_bytes"] == (0 if what == "all" else 256 << 10)  # all: no later phase runs


def test_exitall_of_group_leaves_other_groups_running(tmp_path):
    text = (f"[global]\nrw=write\nsize=256k\n[slow]\nfilename={tmp_path / 's'}\nsize=2m\nbs=4k\n"
            f"[fast]\nnew_group\nfilename={tmp_path / 'f'}\nexitall\n")
    _, out, _ = run(text)
    assert out["jobs"][0]["write"]["io_bytes"] == 2 << 20  # another group: it runs to its end


def test_logs_are_written_in_fios_format(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run(f"[a]\nfilename={tmp_path / 'f'}\nsize=256k\nrw=randrw\nbs=4k\nwrite_lat_log=x\nwrite_bw_log=x\n"
        "write_iops_log=x\n"
        f"[b]\nfilename={tmp_path / 'g'}\nsize=1m\nrw=write\nbs=4k\nlog_avg_msec=1\nwrite_lat_log=y\nwrite_iops_log=y\n")
    rows = [line.split(", ") for line in (tmp_path / "x_lat.1.log").read_text().splitlines()]
    assert len(rows) == 64 and all(len(r) == 5 and r[2] in ("0", "1") and r[3] == "4096" for r in rows)
    assert (tmp_path / "x_slat.1.log").read_text() == ""  # psync measures no submission latency, as fio's
    assert all(line.split(", ")[1] == "1" for line in (tmp_path / "x_iops.1.log").read_text().splitlines())
    bw = [int(line.split(", ")[1]) for line in (tmp_path / "x_bw.1.log").read_text().splitlines()]
    clat = [int(line.split(", ")[1]) for line in (tmp_path / "x_clat.1.log").read_text().splitlines()]
    assert bw == [4096 * 1_000_000 // max(c, 1) for c in clat]
    averaged = [line.split(", ") for line in (tmp_path / "y_iops.2.log").read_text().splitlines()]
    assert averaged and all(r[2] == "1" and r[3] == "0" for r in averaged)  # windows: size column 0
    assert not list(tmp_path.glob("*.0.log"))  # clones count from 1


def test_backwards_sequential_io_goes_down_the_file_as_fio_does(tmp_path):
    from cxlhm_apps.fio.runner import Worker
    jobs, _ = jobs_of(f"[b]\nfilename={tmp_path / 'f'}\nsize=64k\nbs=4k\nrw=read:-8k\n")
    worker = Worker(plan_clones(jobs)[0], None, 1)
    try:
        _, offsets, _ = worker.gen.next_chunk(32)
    finally:
        worker.arena.close()
    assert (offsets // 4096).tolist() == [0] + list(range(14, -1, -1))  # fio 3.33's order (the last block unread)


def test_a_device_image_is_not_shared_with_fios_engines_in_one_run(tmp_path):
    from cxlhm_apps.fio.jobfile import JobFileError
    jobs, _ = jobs_of(f"[global]\nfilename={tmp_path / 'dev.img'}\nsize=1m\n[d]\nioengine=cxlhm\n[raw]\nrw=write\n")
    with pytest.raises(JobFileError, match="is the image of the device job 'd' uses"):
        plan_clones(jobs)


def test_a_bare_log_option_names_the_log_after_the_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run(f"[myjob]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nwrite_bw_log\n")
    assert len((tmp_path / "myjob_bw.1.log").read_text().splitlines()) == 16


@pytest.mark.parametrize("iodepth, fios_row", [
    # fio 3.33, libaio, direct, 1024 random 4 KiB reads: IO depths counts as it reports them
    (3, [1, 1023, 0, 0, 0, 0, 0]),
    (48, [1, 2, 4, 8, 16, 993, 0]),
    (1, [1024, 0, 0, 0, 0, 0, 0]),
    (300, [1, 2, 4, 8, 16, 32, 961]),
])
def test_io_depths_count_what_was_in_flight_at_each_submission_in_fios_buckets(iodepth, fios_row):
    from cxlhm_apps.fio.stats import depth_counts
    assert depth_counts(1024, iodepth).tolist() == fios_row


def test_a_paced_batch_of_two_ios_reports_depths_one_and_two(tmp_path):
    if libaio_unavailable():
        pytest.skip(libaio_unavailable())
    # rate=300 B/s per direction: one read and one write go at once, then the runtime ends
    _, out, _ = run(f"[r]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=randrw\nioengine=libaio\niodepth=32\n"
                    "rate=300,300\nruntime=200ms\n")
    assert out["jobs"][0]["iodepth_level"]["1"] == 50.0 and out["jobs"][0]["iodepth_level"]["2"] == 50.0


def test_a_reported_group_shows_its_last_jobs_options_as_fio_does(tmp_path):
    _, out, _ = run(f"[global]\nfilename={tmp_path / 'f'}\nsize=64k\ngroup_reporting\n"
                    "[first]\nrw=read\nbs=8k\n[second]\nrw=write\nbs=16k\n")
    (group,) = out["jobs"]
    assert group["jobname"] == "first" and group["job options"] == {"rw": "write", "bs": "16k"}


def test_invalidate_drops_each_file_jobs_region_from_the_page_cache_as_fio_does(tmp_path, monkeypatch):
    """fio's invalidate (on by default): a buffered job's reads come from the disk, not
    from pages a layout or an earlier job left cached; invalidate=0 keeps them, and the
    device (no host page cache) is never asked."""
    dropped = []
    real = os.posix_fadvise

    def recording(fd, offset, length, advice):
        if advice == os.POSIX_FADV_DONTNEED and length:  # (the layout drops the whole file: length 0)
            dropped.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    path = tmp_path / "f"
    run(f"[global]\nfilename={path}\nsize=256k\nbs=4k\n[a]\nrw=randread\noffset=64k\nsize=128k\n"
        "[b]\nstonewall\nrw=read\ninvalidate=0\n[c]\nstonewall\nrw=read\nnumjobs=2\noffset_increment=64k\nsize=64k\n")
    assert dropped[0] == (str(path), 64 << 10, 128 << 10)  # job a; b keeps the cache; c's clones each their own
    assert sorted(dropped[1:]) == [(str(path), 0, 64 << 10), (str(path), 64 << 10, 64 << 10)]
    dropped.clear()
    run(f"[j]\nfilename={tmp_path / 'img'}\nioengine=cxlhm\ncxlhm_dram=4m\nsize=1m\nrw=read\n")
    assert not [d for d in dropped if d[0] == str(tmp_path / "img")]


def test_random_generator_is_accepted_and_a_non_default_one_is_said(tmp_path):
    """fio's latency-profile example asks for random_generator=lfsr: it runs, and the note
    says the offsets are cxlhm's (every block once per pass, not fio's LFSR sequence)."""
    _, _, said = run(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=randread\nrandom_generator=lfsr\n")
    assert any("random_generator=lfsr is accepted" in line for line in said)
    _, _, said = run(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=randread\nrandom_generator=tausworthe\n")
    assert not any("random_generator" in line for line in said)
    with pytest.raises(Exception, match="random_generator"):
        jobs_of(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrandom_generator=mt19937\n")


def test_io_submit_mode_offload_runs_the_same_io_and_says_so(tmp_path):
    """fio's fixed-rate and poisson-rate submission examples use io_submit_mode=offload: the
    same I/O runs, submitted from the job's own thread, and the note says so."""
    _, out, said = run(f"[j]\nfilename={tmp_path / 'f'}\nsize=256k\nrw=read\nio_submit_mode=offload\n")
    assert out["jobs"][0]["read"]["io_bytes"] == 256 << 10
    assert any("io_submit_mode=offload is accepted" in line for line in said)
    with pytest.raises(Exception, match="io_submit_mode"):
        jobs_of(f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nio_submit_mode=pool\n")
