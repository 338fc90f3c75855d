"""gtod_reduce and disable_lat / disable_clat / disable_slat / disable_bw_measurement, with
fio 3.33's meaning (stats.unmeasured): the latencies a job does not keep are zeros in the
report, their lines and log entries go, the rest stays."""
from __future__ import annotations

import pytest

from cxlhm_apps.fio import report
from fio_helpers import FIO, real_fio_job, run_ours as _ours

# option -> (lat kept, clat kept, percentiles shown, latency distribution kept)
CASES = {
    "gtod_reduce=1": (False, False, False, False),
    "disable_lat=1": (False, True, True, True),
    "disable_clat=1": (True, False, False, False),
    "disable_slat=1": (True, True, True, True),
    "disable_bw_measurement=1": (True, True, True, True),
    "disable_bw=1": (True, True, True, True),  # (fio's alias)
}


def _job(path, option: str, extra: str = "") -> str:
    return f"[j]\nfilename={path}\nsize=1m\nrw=randread\nbs=4k\nioengine=psync\n{option}\n{extra}"


def _shape(job: dict) -> tuple[bool, bool, bool, bool]:
    r = job["read"]
    dist = sum(job["latency_ns"].values()) + sum(job["latency_us"].values()) + sum(job["latency_ms"].values())
    return r["lat_ns"]["N"] > 0, r["clat_ns"]["N"] > 0, "percentile" in r["clat_ns"], dist > 0


@pytest.mark.parametrize("option", sorted(CASES))
def test_what_is_not_measured_is_zero_as_in_fio(tmp_path, option):
    result, job = _ours(_job(tmp_path / "f", option))
    assert job["error"] == 0 and job["read"]["total_ios"] == 256  # the I/O itself is the same
    assert _shape(job) == CASES[option]
    if not CASES[option][1]:
        assert job["read"]["clat_ns"] == {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}
        assert "clat (" not in report.format_normal(result)


@pytest.mark.skipif(FIO is None, reason="real fio is not installed")
@pytest.mark.parametrize("option", sorted(CASES))
def test_the_cases_are_real_fios(tmp_path, option):
    assert _shape(real_fio_job(_job(tmp_path / "f", option))) == CASES[option]


def test_unmeasured_latencies_leave_their_logs_empty_and_the_others_full(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _ours(_job(tmp_path / "f", "disable_lat=1", "write_lat_log=l\n"))
    assert (tmp_path / "l_lat.1.log").read_text() == ""
    assert len((tmp_path / "l_clat.1.log").read_text().splitlines()) == 256


def test_a_sync_is_counted_but_its_latency_not_kept_without_clat(tmp_path):
    text = f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=write\nbs=4k\nioengine=psync\nfsync=4\ndisable_clat=1\n"
    _, job = _ours(text)
    assert job["sync"]["total_ios"] == 3 and job["sync"]["lat_ns"]["N"] == 0
    assert job["iodepth_level"]["1"] == pytest.approx(100.0 * 19 / 16)
