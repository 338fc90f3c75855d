"""cxlhm-fio output: fio's JSON schema (checked against real fio when installed), the
normal text layout, and fio's number formats."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from cxlhm_apps.cli import main as cli_main
from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs
from cxlhm_apps.fio.stats import DEFAULT_PERCENTILES, LatencyStat, num2str, plat_index, plat_value

FIO_PERCENTILE_KEYS = ["1.000000", "5.000000", "10.000000", "20.000000", "30.000000", "40.000000", "50.000000",
                       "60.000000", "70.000000", "80.000000", "90.000000", "95.000000", "99.000000", "99.500000",
                       "99.900000", "99.950000", "99.990000"]
LAT_FIELDS = ("min", "max", "mean", "stddev", "N", "percentile")
DIR_FIELDS = ("io_bytes", "io_kbytes", "bw_bytes", "bw", "iops", "runtime", "total_ios", "slat_ns", "clat_ns", "lat_ns",
              "bw_min", "bw_max", "bw_mean", "bw_dev", "iops_min", "iops_max", "iops_mean", "iops_stddev")
# keys we add that fio does not have (cachehit is fio's own key, filled only by some engines)
EXTRAS = {("cxlhm_devices",), ("jobs", "[]", "read", "cachehit"), ("jobs", "[]", "write", "cachehit")}


def job_text(tmp_path, extra: str = "", engine: str = "cxlhm") -> str:
    device = "cxlhm_dram=1m\ncxlhm_block_size=4k\n" if engine == "cxlhm" else ""
    return (f"[global]\nfilename={tmp_path / 'dev.img'}\nsize=4m\n{device}ioengine={engine}\n"
            f"[mixed]\nrw=randrw\nrwmixread=70\nbs=4k\niodepth=4\nslat_percentiles=1\nlat_percentiles=1\n{extra}")


def run_text(text: str, *, plus: bool = False):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return result, report.to_json(result, globals_, plus=plus)


@pytest.fixture(scope="module")
def cxlhm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("out")
    return run_text(job_text(tmp), plus=True)


def test_json_has_every_field_fio_tools_read(cxlhm_run):
    _, out = cxlhm_run
    for key in ("fio version", "timestamp", "global options", "jobs"):
        assert key in out
    job = out["jobs"][0]
    # fio's "job options": the job's own section as written, nothing added
    assert job["job options"] == {"rw": "randrw", "rwmixread": "70", "bs": "4k", "iodepth": "4",
                                  "slat_percentiles": "1", "lat_percentiles": "1"}
    for direction in ("read", "write"):
        d = job[direction]
        for key in DIR_FIELDS:
            assert key in d, (direction, key)
        for lat in ("slat_ns", "clat_ns", "lat_ns"):
            for key in LAT_FIELDS:
                assert key in d[lat], (direction, lat, key)
            assert list(d[lat]["percentile"]) == FIO_PERCENTILE_KEYS
            assert sum(d[lat]["bins"].values()) == d[lat]["N"] == d["total_ios"]
        assert 0.0 <= d["cachehit"] <= 100.0
        assert d["io_kbytes"] == d["io_bytes"] >> 10
        assert d["bw"] == d["bw_bytes"] // 1024
    assert job["read"]["total_ios"] + job["write"]["total_ios"] == 1024  # 4 MiB / 4 KiB
    for key, labels in (("latency_ns", 10), ("latency_us", 10), ("latency_ms", 12), ("iodepth_level", 7)):
        assert len(job[key]) == labels
    assert list(job["iodepth_level"]) == ["1", "2", "4", "8", "16", "32", ">=64"]
    assert job["iodepth_level"]["4"] > 99.0
    assert 99.0 < sum(job["latency_ns"].values()) + sum(job["latency_us"].values()) + sum(job["latency_ms"].values()) < 101.0
    assert out["cxlhm_devices"][0]["block_size"] == 4096


def test_json_without_plus_has_no_bins(tmp_path):
    _, out = run_text(job_text(tmp_path, "number_ios=64\n"))
    assert "bins" not in out["jobs"][0]["read"]["clat_ns"]


def test_percentile_keys_use_fios_format():
    assert [f"{p:f}" for p in DEFAULT_PERCENTILES] == FIO_PERCENTILE_KEYS


def _paths(obj, prefix=()):
    out = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.add(prefix + (key,))
            if key not in ("percentile", "bins", "job options", "global options"):  # contents vary by run
                out |= _paths(value, prefix + (key,))
    elif isinstance(obj, list) and obj:
        out |= _paths(obj[0], prefix + ("[]",))
    return out


@pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed (apt-get install fio)")
def test_json_keys_sit_where_real_fio_puts_them(cxlhm_run, tmp_path):
    text = job_text(tmp_path, engine="io_uring").replace("ioengine=io_uring\n", "ioengine=io_uring\ndirect=1\n")
    proc = subprocess.run(["fio", "--output-format=json+", "-"], input=text, capture_output=True, text=True, check=True)
    theirs = json.loads(proc.stdout[proc.stdout.find("{"):])
    _, ours = cxlhm_run
    missing = {p for p in _paths(ours) - _paths(theirs) if not any(p[:len(e)] == e for e in EXTRAS)}
    assert not missing, f"keys fio does not have there: {sorted(missing)}"
    for direction in ("read", "write"):
        for lat in ("slat_ns", "clat_ns", "lat_ns"):
            assert list(theirs["jobs"][0][direction][lat]["percentile"]) == list(ours["jobs"][0][direction][lat]["percentile"])


def test_normal_text_layout(cxlhm_run):
    result, _ = cxlhm_run
    text = report.format_normal(result)
    lines = text.splitlines()
    assert lines[0].startswith("mixed: (g=0): rw=randrw, bs=(R) 4096B-4096B, (W) 4096B-4096B")
    assert any(line.startswith("mixed: (groupid=0, jobs=1): err= 0: pid=") for line in lines)
    read_line = next(line for line in lines if line.startswith("  read: IOPS="))
    assert "; Cachehit=" in read_line and "msec)" in read_line
    assert any(line.startswith("  write: IOPS=") for line in lines)
    for needle in ("    clat (", "     lat (", "    slat (", "    clat percentiles (", "     |  1.00th=[",
                   "99.99th=[", "  IO depths    : 1=", "     submit    : 0=",
                   "     issued rwts: total=", "Run status group 0 (all jobs):", "   READ: bw=", "  WRITE: bw="):
        assert needle in text, needle
    # the bandwidth and IOPS sample lines, as fio's, only where a sample window closed in the run
    sampled = len(result.clones[0].stats.dirs[0].bw.samples) > 0
    assert ("   bw (" in text) == sampled and ("   iops        : min=" in text) == sampled
    assert any(line.startswith("  lat (") for line in lines)


def test_num2str_matches_fio():
    assert num2str(24336, 4, 1, False) == "24.3k"
    assert num2str(1018, 4, 1, False) == "1018"
    assert num2str(199229440, 4, 1, True, "B") == "190MiB"
    assert num2str(99745792, 4, 1, True, "B/s") == "95.1MiB/s"
    assert num2str(99745792, 4, 1, False, "B/s") == "99.7MB/s"
    assert num2str(4096, 4, 1, True, "B") == "4096B"
    assert num2str(1 << 20, 4, 1, True, "B") == "1024KiB"
    assert num2str(2817500, 6, 1, False) == "2817.5k"


def test_histogram_buckets_follow_fio():
    assert [plat_value(int(i)) for i in plat_index(np.array([0, 1, 127]))] == [0, 1, 127]
    # above 128 each power of two has 64 buckets: relative error below 1/64
    values = np.array([1000, 50_000, 2_000_000, 10**9])
    recovered = np.array([plat_value(int(i)) for i in plat_index(values)])
    assert (np.abs(recovered - values) / values < 1 / 64).all()


def test_percentiles_pick_the_first_bucket_reaching_p():
    stat = LatencyStat()
    stat.add(np.arange(1, 101))  # 1..100 ns: exact buckets
    pct = dict(stat.percentiles((1.0, 50.0, 99.0, 99.99)))
    assert pct == {1.0: 1, 50.0: 50, 99.0: 99, 99.99: 100}
    assert stat.n == 100 and stat.min == 1 and stat.max == 100 and abs(stat.mean - 50.5) < 1e-9


def test_cli_writes_json_to_output_file(tmp_path, capsys):
    job = tmp_path / "j.fio"
    job.write_text(job_text(tmp_path, "number_ios=32\n"))
    out = tmp_path / "o.json"
    assert cli_main(["fio", "--output-format=json", "--output", str(out), str(job)]) == 0
    data = json.loads(out.read_text())
    assert data["jobs"][0]["jobname"] == "mixed"
    assert capsys.readouterr().out == ""
