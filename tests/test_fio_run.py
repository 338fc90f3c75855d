"""Small real runs of cxlhm-fio on both engines: amounts, clones, stop conditions,
offset patterns, data verification (a corrupted block is caught) and the CLI."""
from __future__ import annotations

import io
import os
import shutil
import threading

import numpy as np
import pytest

from cxlhm_apps.cli import main as cli_main
from cxlhm.config import load_config
from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.options import parse_rw
from cxlhm_apps.fio.pattern import IoGenerator, SizeChoice
from cxlhm_apps.fio.runner import run_jobs
from cxlhm.timing import TimingModel

DEVICE = "ioengine=cxlhm\ncxlhm_dram=1m\ncxlhm_block_size=4k\n"


def run(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return result, report.to_json(result, globals_)


def engine_lines(engine: str) -> str:
    return f"ioengine={engine}\n" + (DEVICE if engine == "cxlhm" else "")


@pytest.mark.parametrize("engine", ["cxlhm", "io_uring"])
def test_sequential_read_covers_the_region_once(tmp_path, engine):
    result, out = run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=2m\nbs=64k\nrw=read\niodepth=4\n{engine_lines(engine)}")
    read = out["jobs"][0]["read"]
    assert read["io_bytes"] == 2 << 20 and read["total_ios"] == 32 and not result.failed
    assert read["clat_ns"]["N"] == 32 and read["clat_ns"]["min"] > 0
    assert (read["slat_ns"]["N"] == 32) == (engine == "cxlhm")  # the raw closed loop has no separate submit step
    assert ("cachehit" in read) == (engine == "cxlhm")


@pytest.mark.parametrize("engine", ["cxlhm", "io_uring"])
def test_write_then_verify_passes_on_intact_data(tmp_path, engine):
    text = (f"[w]\nfilename={tmp_path / 'f.img'}\nsize=1m\nrw=randwrite\nbssplit=4k/50:16k/50\niodepth=8\n"
            f"verify=crc32c\n{engine_lines(engine)}")
    result, out = run(text)
    job = out["jobs"][0]
    assert job["error"] == 0 and job["write"]["io_bytes"] == 1 << 20
    assert job["read"]["total_ios"] > 0  # the verify phase read the blocks back
    assert not result.messages


@pytest.mark.parametrize("kind", ["md5", "xxhash"])
def test_other_checksums(tmp_path, kind):
    result, out = run(f"[w]\nfilename={tmp_path / 'f.img'}\nsize=256k\nrw=write\nverify={kind}\nverify_backlog=8\n{DEVICE}")
    assert out["jobs"][0]["error"] == 0 and out["jobs"][0]["read"]["total_ios"] == 64


@pytest.mark.parametrize("engine", ["cxlhm", "io_uring"])
def test_verify_catches_a_block_with_wrong_bytes(tmp_path, engine):
    image = tmp_path / "f.img"
    base = f"[global]\nfilename={image}\nsize=256k\nbs=4k\nverify=crc32c\n{engine_lines(engine)}"
    result, out = run(base + "[w]\nrw=write\ndo_verify=0\n")
    assert out["jobs"][0]["error"] == 0
    # the block at 64 KiB is overwritten, through the same engine, by bytes with no header
    result, out = run(base + "[stray]\nrw=write\noffset=64k\nsize=4k\nverify=0\n")
    assert out["jobs"][0]["error"] == 0
    result, out = run(base + "[r]\nrw=read\n")
    assert out["jobs"][0]["error"] == 84 and result.failed
    assert len(result.messages) == 1 and "bad magic header" in result.messages[0] and "offset 65536" in result.messages[0]
    result, out = run(base + "[r]\nrw=randread\nverify_fatal=1\n")
    assert out["jobs"][0]["error"] == 84 and out["jobs"][0]["read"]["total_ios"] < 64


def test_verify_catches_a_flipped_bit_in_the_file(tmp_path):
    image = tmp_path / "f.img"
    base = f"[global]\nfilename={image}\nsize=256k\nbs=4k\nverify=md5\nioengine=io_uring\n"
    run(base + "[w]\nrw=write\ndo_verify=0\n")
    with open(image, "r+b") as f:  # flip one payload byte of the block at 128 KiB
        f.seek(131072 + 1000)
        byte = f.read(1)
        f.seek(131072 + 1000)
        f.write(bytes([byte[0] ^ 0x01]))
        f.flush()
        os.fsync(f.fileno())
    result, out = run(base + "[r]\nrw=read\n")
    assert out["jobs"][0]["error"] == 84
    assert any("offset 131072" in m and "md5: verify failed" in m for m in result.messages)


def test_numjobs_group_reporting_and_number_ios(tmp_path):
    text = (f"[global]\nfilename={tmp_path / 'f.img'}\nsize=4m\nbs=4k\nrw=randread\niodepth=2\n{DEVICE}"
            "[a]\nnumjobs=3\nnumber_ios=50\ngroup_reporting\n")
    result, out = run(text)
    assert len(result.clones) == 3 and len(out["jobs"]) == 1
    assert out["jobs"][0]["read"]["total_ios"] == 150
    assert report.format_normal(result).count("(groupid=0, jobs=3)") == 1


def test_clones_without_group_reporting_are_reported_separately(tmp_path):
    text = f"[global]\nfilename={tmp_path / 'f.img'}\nsize=1m\nrw=read\n{DEVICE}[a]\nnumjobs=2\n"
    _, out = run(text)
    assert [j["jobname"] for j in out["jobs"]] == ["a", "a"]


def test_time_based_runs_for_the_runtime_and_samples_bandwidth(tmp_path):
    text = f"[t]\nfilename={tmp_path / 'f.img'}\nsize=1m\nrw=randread\nruntime=1200ms\ntime_based\n{DEVICE}"
    _, out = run(text)
    read = out["jobs"][0]["read"]
    assert 1150 <= read["runtime"] <= 1600
    assert read["io_bytes"] > 1 << 20  # wrapped around the 1 MiB region
    assert read["bw_samples"] >= 2 and read["iops_samples"] == read["bw_samples"]


def test_stonewall_starts_a_new_group(tmp_path):
    text = (f"[global]\nfilename={tmp_path / 'f.img'}\nsize=512k\n{DEVICE}"
            "[w]\nrw=write\n[r]\nstonewall\nrw=read\n")
    result, out = run(text)
    assert [j["groupid"] for j in out["jobs"]] == [0, 1]
    assert "Run status group 1 (all jobs):" in report.format_normal(result)


def _generator(rw: str, **kw) -> IoGenerator:
    args = dict(rw=parse_rw(rw, 1024), sequencer="sequential", rwmixread=50,
                sizes=(SizeChoice(fixed=4096), SizeChoice(fixed=4096)), region_start=1 << 20, region_len=1 << 20,
                distribution=None, randommap=True, seed=1, bytes_budget=None, ios_budget=None)
    args.update(kw)
    return IoGenerator(**args)


def test_random_map_covers_every_block_once_per_pass():
    gen = _generator("randread")
    _, offsets, _ = gen.next_chunk(256)
    assert sorted(offsets.tolist()) == list(range(1 << 20, 2 << 20, 4096))


def test_rw_suffix_patterns():
    _, offsets, _ = _generator("randread:4").next_chunk(8)
    rel = offsets - (1 << 20)  # runs of 4 continue sequentially, wrapping at the region end
    assert (np.diff(rel[:4]) % (1 << 20) == 4096).all() and (np.diff(rel[4:]) % (1 << 20) == 4096).all()
    _, offsets, _ = _generator("randread:4", sequencer="identical").next_chunk(8)
    assert len(set(offsets[:4].tolist())) == 1
    _, offsets, _ = _generator("read:4k").next_chunk(4)
    assert offsets.tolist() == [(1 << 20) + i * 8192 for i in range(4)]


def test_rwmix_and_bssplit_shares():
    gen = _generator("randrw", rwmixread=70, sizes=(SizeChoice(split_sizes=(4096, 65536), split_p=(0.25, 0.75)),
                                                    SizeChoice(fixed=8192)), region_len=64 << 20, randommap=False)
    direction, offsets, sizes = gen.next_chunk(20000)
    assert abs((direction == 0).mean() - 0.70) < 0.02
    reads = sizes[direction == 0]
    assert abs((reads == 4096).mean() - 0.25) < 0.02 and (sizes[direction == 1] == 8192).all()
    assert (offsets % 4096 == 0).all() and (offsets + sizes <= (1 << 20) + (64 << 20)).all()


def test_mixed_sizes_under_the_random_map_shrink_to_the_free_stretch():
    """fio's random map: I/Os of one pass never overlap, cover the region exactly once,
    and a block is cut to the free stretch at its offset, so the mean size falls below
    the split's mean as the map fills (fio's iometer example: 5.9 KB against 11.2 KB)."""
    split = SizeChoice(split_sizes=(4096, 65536), split_p=(0.5, 0.5))
    gen = _generator("randwrite", sizes=(split, split), region_len=8 << 20, bytes_budget=8 << 20)
    parts = []
    while not gen.exhausted:
        _, offsets, sizes = gen.next_chunk(1024)
        if not offsets.size:
            break
        parts.append((offsets.copy(), sizes.copy()))
    offsets = np.concatenate([p[0] for p in parts])
    sizes = np.concatenate([p[1] for p in parts])
    covered = np.zeros(8 << 20 >> 12, np.int64)
    for o, n in zip(((offsets - (1 << 20)) >> 12).tolist(), (sizes >> 12).tolist()):
        covered[o:o + n] += 1
    assert (covered == 1).all() and int(sizes.sum()) == 8 << 20
    assert set(np.unique(sizes).tolist()) - {4096, 65536}  # some 64 KiB blocks were cut short
    assert sizes.mean() < 0.8 * (4096 + 65536) / 2
    free = _generator("randwrite", sizes=(split, split), region_len=8 << 20, randommap=False)
    assert set(np.unique(free.next_chunk(1024)[2]).tolist()) == {4096, 65536}  # norandommap: as drawn


def test_setup_errors_name_the_job_line(tmp_path):
    with pytest.raises(JobFileError, match=r"t.fio:2: option 'size'"):
        run(f"[j]\nsize=2k\nbs=4k\nfilename={tmp_path / 'x.img'}\n")
    with pytest.raises(JobFileError, match="size= is needed"):
        run(f"[j]\nfilename={tmp_path / 'missing.img'}\n")


def test_cli_reads_stdin_and_runs_the_model_clock(tmp_path, monkeypatch, capsys):
    job = f"[s]\nfilename={tmp_path / 'f.img'}\nsize=256k\nrw=read\n{DEVICE}"
    monkeypatch.setattr("sys.stdin", io.StringIO(job))
    assert cli_main(["fio", "-"]) == 0
    assert "Run status group 0" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO(job + "cxlhm_clock=model\n"))
    assert cli_main(["fio", "-"]) == 0
    assert "clock=model" in capsys.readouterr().out


def test_cli_cmdhelp(capsys):
    assert cli_main(["fio", "--cmdhelp"]) == 0
    assert "random_distribution" in capsys.readouterr().out
    assert cli_main(["fio", "--cmdhelp", "nosuch"]) == 2


@pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed (apt-get install fio)")
def test_compare_fio_prints_both_and_the_ratios(tmp_path, capsys):
    job = tmp_path / "c.fio"
    job.write_text(f"[c]\nfilename={tmp_path / 'f.img'}\nsize=2m\nbs=64k\nrw=read\n{DEVICE}")
    assert cli_main(["fio", "--compare-fio", str(job)]) == 0
    out = capsys.readouterr().out
    assert "vs real fio" in out and " cxlhm " in out and " fio " in out and "ratio" in out


def test_compare_fio_without_fio_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    job = tmp_path / "c.fio"
    job.write_text(f"[c]\nfilename={tmp_path / 'f.img'}\nsize=64k\n")
    assert cli_main(["fio", "--compare-fio", str(job)]) == 3
    assert "apt-get install fio" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "f.img")


def test_ramp_time_is_not_recorded(tmp_path):
    text = f"[t]\nfilename={tmp_path / 'f.img'}\nsize=1m\nrw=randread\nruntime=600ms\nramp_time=400ms\ntime_based\n{DEVICE}"
    result, out = run(text)
    read = out["jobs"][0]["read"]
    assert 550 <= read["runtime"] <= 900 and read["total_ios"] > 0  # 600 ms measured, not 1000
    assert not result.failed


# ---------------------------------------------------------------- the model clock
def model_job(path, iodepth: int, size: str, profile: str = "") -> str:
    return (f"[m]\nfilename={path}\nsize={size}\nrw=randread\nbs=4k\niodepth={iodepth}\nioengine=cxlhm\n"
            f"cxlhm_dram=1m\ncxlhm_block_size=4k\ncxlhm_clock=model\n" + (f"cxlhm_profile={profile}\n" if profile else ""))


def cmm_h_timing() -> TimingModel:
    return TimingModel.from_device_config(load_config("cmm-h", {"block_size": 4096}))


def test_model_clock_qd1_latency_is_the_timing_models_miss_latency(tmp_path):
    result, out = run(model_job(tmp_path / "m.img", 1, "8m"))  # 2048 reads, every one a miss
    read = out["jobs"][0]["read"]
    assert not result.failed and read["total_ios"] == 2048 and read["cachehit"] == 0
    expected = cmm_h_timing().miss_read_latency_ns(4096)
    assert read["clat_ns"]["mean"] == pytest.approx(expected, rel=0.01)
    assert read["clat_ns"]["min"] == pytest.approx(expected, rel=0.01)  # no queueing at QD1
    assert read["iops"] == pytest.approx(1e9 / expected, rel=0.02)  # runtime is whole ms
    assert out["jobs"][0]["job options"]["cxlhm_clock"] == "model"


def test_model_clock_iodepth_raises_iops_up_to_the_die_limit(tmp_path):
    """The job keeps iodepth I/Os outstanding on the model clock, so IOPS grow with it
    until the NAND dies (dies / tR) bind. Timing-only device: same model, no data moved."""
    profile = tmp_path / "timing-only.yaml"
    profile.write_text("profile: cmm-h\ndata: none\n")
    limit = cmm_h_timing().random_read_iops_limit(4096)
    bounds = []  # (low, high): the job's runtime is reported in whole ms
    for qd in (1, 8, 64, 1024):
        result, out = run(model_job(tmp_path / "m.img", qd, "64m", str(profile)))
        read = out["jobs"][0]["read"]
        assert not result.failed and read["total_ios"] == 16384
        ms = read["runtime"]
        bounds.append((1000 * read["total_ios"] / (ms + 1), 1000 * read["total_ios"] / ms))
    assert all(high < next_low for (_, high), (next_low, _) in zip(bounds, bounds[1:])), bounds
    assert all(low <= limit for low, _ in bounds)
    assert bounds[-1][1] > 0.85 * limit  # QD1024 keeps nearly every die busy
    again, _ = run(model_job(tmp_path / "m.img", 64, "64m", str(profile)))
    first, _ = run(model_job(tmp_path / "m.img", 64, "64m", str(profile)))
    assert again.clones[0].stats.dirs[0].clat.mean == first.clones[0].stats.dirs[0].clat.mean  # bit-identical


def test_two_jobs_share_a_model_clock_device_in_turn(tmp_path):
    """Two clones on one device take turns in model time, so the run is deterministic."""
    text = model_job(tmp_path / "m.img", 4, "4m") + "numjobs=2\n"
    runs = [run(text)[1]["jobs"] for _ in range(2)]
    for jobs in runs:
        assert [j["read"]["total_ios"] for j in jobs] == [1024, 1024]
    assert [j["read"]["clat_ns"] for j in runs[0]] == [j["read"]["clat_ns"] for j in runs[1]]


# ---------------------------------------------------------------- the wall clock keeps iodepth in flight
def _record_streams(monkeypatch):
    """Record every streamed read run (Device.stream_io) the engine makes."""
    from cxlhm.device import Device
    runs = []
    real = Device.stream_io

    def stream_io(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        runs.append((result, self.ssd.queued()))
        return result

    monkeypatch.setattr(Device, "stream_io", stream_io)
    return runs


def test_cxlhm_engine_keeps_iodepth_reads_at_the_ssd(tmp_path, monkeypatch):
    """iodepth=8 on the wall clock: the engine's reads reach the SSD one by one as
    others complete (Device.stream_io), up to 8 at once, and none is left behind."""
    runs = _record_streams(monkeypatch)
    result, out = run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=1m\nbs=4k\nrw=randread\niodepth=8\n{DEVICE}")
    read = out["jobs"][0]["read"]
    assert not result.failed and read["total_ios"] == 256 and read["cachehit"] == 0
    job_runs = [r for r, _ in runs if r.count > 1]  # (the one-read warm-up before the clock runs aside)
    assert sum(r.count for r in job_runs) == 256
    assert max(r.peak_in_flight for r in job_runs) == 8 and all(left == 0 for _, left in runs)
    assert read["clat_ns"]["N"] == 256 and read["slat_ns"]["N"] == 256 and read["clat_ns"]["min"] > 0


def test_cxlhm_engine_overlaps_whole_batches_when_reads_cannot_be_split(tmp_path, monkeypatch):
    """With injected faults (no split-phase reads) the submitter threads' device calls
    still overlap at the back end: 4 of them at once at iodepth=4."""
    from cxlhm.media.faults import FaultInjector
    real = FaultInjector.submit
    state = {"now": 0, "max": 0}
    lock = threading.Lock()

    def counted(self, ops):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        try:
            return real(self, ops)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(FaultInjector, "submit", counted)
    profile = tmp_path / "slow.yaml"  # every back-end batch takes 5 ms longer
    profile.write_text("profile: cmm-h\nbackend: {faults: {spike_rate: 1.0, spike_ns: 5000000}}\n")
    result, out = run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=256k\nbs=4k\nrw=randread\niodepth=4\n"
                      f"cxlhm_profile={profile}\n{DEVICE}")
    read = out["jobs"][0]["read"]
    assert not result.failed and read["total_ios"] == 64
    assert state["max"] >= 3
    assert read["clat_ns"]["min"] >= 5_000_000  # each I/O's latency covers its own device call


def test_a_read_of_a_poisoned_block_ends_the_job_with_eio_after_the_reads_before_it(tmp_path, monkeypatch):
    """The stream stops before the read of a poisoned block; the engine runs the rest as
    whole device calls, and the one that touches the block fails the job with EIO,
    naming the block."""
    from cxlhm_apps.fio import engines
    from host_runtime import driver
    real, real_device_for, opened = engines.DeviceShare.__init__, driver.device_for, []

    def poisoned(self, handle, clock):
        real(self, handle, clock)
        opened[-1]._poison(5, "test: lost")  # the device behind the handle the engine was given

    monkeypatch.setattr(driver, "device_for", lambda cfg: opened.append(real_device_for(cfg)) or opened[-1])
    monkeypatch.setattr(engines.DeviceShare, "__init__", poisoned)
    result, out = run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=256k\nbs=4k\nrw=read\niodepth=4\n{DEVICE}")
    job = out["jobs"][0]
    assert result.failed and job["error"] == 5
    assert "block 5 " in result.clones[0].stats.error_text and "poisoned" in result.clones[0].stats.error_text


@pytest.mark.parametrize("batch, bucket", [("", "4"), ("iodepth_batch_submit=8\n", "8"), ("iodepth_batch=0\n", "16")])
def test_io_uring_submits_as_iodepth_batch_submit_says(tmp_path, batch, bucket):
    """fio's default submits each I/O at once; a batch hands that many to one enter
    (0: iodepth's worth)."""
    _, out = run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=1m\nbs=4k\nrw=randread\niodepth=16\n{batch}"
                 f"ioengine=io_uring\n")
    submit = out["jobs"][0]["iodepth_submit"]
    assert submit[bucket] == 100.0 and sum(submit.values()) == 100.0


def test_iodepth_batch_submit_refuses_a_negative_value(tmp_path):
    with pytest.raises(JobFileError, match="iodepth_batch_submit"):
        build_jobs([read_sections(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=1m\niodepth_batch_submit=-1\n", "t.fio")])


def test_the_device_submits_each_io_as_it_is_planned(tmp_path):
    _, out = run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=1m\nbs=4k\nrw=randread\niodepth=16\n"
                 f"iodepth_batch_submit=8\n{engine_lines('cxlhm')}")
    submit = out["jobs"][0]["iodepth_submit"]
    assert submit["4"] == 100.0
