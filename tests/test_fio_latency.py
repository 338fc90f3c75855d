"""slat, clat and lat as fio defines them for the cxlhm engine: slat from taking an I/O
to its submission, clat from submission to completion (copies out of device DRAM
included), lat their sum per I/O; lat_ns percentiles only where fio prints them; CPU
shares of wall time."""
from __future__ import annotations

import pytest

from cxlhm_apps.fio import clocks, report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs


def run(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return report.to_json(result, globals_)["jobs"][0]


def hits_job(path, extra=""):
    # 1 MiB region read 4 times over through a 4 MiB device DRAM: after the first pass all hits
    return (f"[h]\nfilename={path}\nsize=1m\nio_size=4m\nbs=64k\nrw=randread\niodepth=4\nioengine=cxlhm\n"
            f"cxlhm_dram=4m\ncxlhm_block_size=64k\ncxlhm_clock=wall\n{extra}")


def test_lat_is_slat_plus_clat_per_io(tmp_path):
    read = run(hits_job(tmp_path / "f.img"))["read"]
    slat, clat, lat = read["slat_ns"], read["clat_ns"], read["lat_ns"]
    assert slat["N"] == clat["N"] == lat["N"] == read["total_ios"] == 64
    assert lat["mean"] == pytest.approx(slat["mean"] + clat["mean"], rel=1e-9)
    assert slat["min"] + clat["min"] <= lat["min"] and lat["max"] <= slat["max"] + clat["max"]
    # a hit completes when its 64 KiB are copied out of device DRAM: that is in clat
    assert clat["min"] > 0 and read["cachehit"] > 50


def test_percentiles_only_where_fio_prints_them(tmp_path):
    read = run(hits_job(tmp_path / "f.img"))["read"]
    assert "percentile" in read["clat_ns"]
    assert "percentile" not in read["lat_ns"] and "percentile" not in read["slat_ns"]
    read = run(hits_job(tmp_path / "f.img", "lat_percentiles=1\nslat_percentiles=1\nclat_percentiles=0\n"))["read"]
    assert "percentile" in read["lat_ns"] and "percentile" in read["slat_ns"]
    assert "percentile" not in read["clat_ns"]


@pytest.mark.skipif(bool(clocks.model_clock_unavailable()), reason="model clock unavailable here")
def test_model_clock_cpu_is_a_share_of_wall_time(tmp_path):
    job = run(f"[m]\nfilename={tmp_path / 'f.img'}\nsize=4m\nbs=4k\nrw=randread\niodepth=8\nioengine=cxlhm\n"
              "cxlhm_dram=1m\ncxlhm_block_size=4k\ncxlhm_clock=model\n")
    # the model's run time is far shorter than the wall time the job's thread ran for
    assert job["read"]["runtime"] < 1000
    assert 0 < job["usr_cpu"] + job["sys_cpu"] <= 100.0
