"""fio's latency-target queue-depth search (cxlhm_apps/fio/latency_target.py): its
decisions against a transcription of fio 3.33's rule (io_u.c), a real run on a plain
file compared with fio, and the values refused."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.latency_target import DepthSearch
from cxlhm_apps.fio.runner import run_jobs

MS = 1_000_000
TARGET = 1 * MS
WINDOW = 100 * MS


class FioModel:
    """fio 3.33's lat_target_init / lat_target_check / lat_target_success /
    __lat_target_failed, line by line (td->latency_qd, _low, _high, _end_run)."""

    def __init__(self, iodepth: int):
        self.iodepth, self.qd, self.low, self.high, self.end_run, self.done = iodepth, 1, 1, iodepth, False, False

        self.ios = self.failed = 0  # since lat_new_cycle

    def window(self, ios: int, failed: int, percentile: float) -> None:
        """lat_target_check at the window's end, after `ios` more completions."""
        self.ios += ios
        self.failed += failed
        if (self.ios - self.failed) / self.ios * 100.0 >= percentile:
            qd = self.qd
            self.low = self.qd
            self.qd = (self.qd + self.high) // 2 if self.high != self.iodepth else self.qd * 2
            if self.qd > self.iodepth:
                self.qd = self.iodepth
            if self.qd == qd:
                if self.end_run:
                    self.done = True
                else:
                    self.end_run = True
            self.ios = self.failed = 0
        elif self.qd != 1:  # (at depth 1 it returns without a new cycle: the window goes on)
            self.high = self.qd
            if self.qd == self.low:
                self.low -= 1
            self.qd = (self.qd + self.low) // 2
            self.ios = self.failed = 0


def _window_latencies(n: int, failed: int) -> np.ndarray:
    lat = np.full(n, TARGET // 2, np.int64)
    lat[:failed] = TARGET + 1
    return lat


@settings(max_examples=300, deadline=None)
@given(iodepth=st.integers(1, 256), percentile=st.floats(50.0, 99.9),
       windows=st.lists(st.integers(0, 100), min_size=1, max_size=40))
def test_each_window_decides_the_depth_as_fios_rule(iodepth, percentile, windows):
    search = DepthSearch(TARGET, WINDOW, percentile, iodepth, keep_running=False, now_ns=0)
    model = FioModel(iodepth)
    now = 0
    for failed in windows:  # `failed` of 100 I/Os missed the target in this window
        now += WINDOW
        event = search.observe(_window_latencies(100, failed), now)
        model.window(100, failed, percentile)
        assert search.depth == model.qd and 1 <= search.depth <= iodepth
        assert (search.state.low, search.state.high, search.state.end_run) == (model.low, model.high, model.end_run)
        assert (event == "done") == model.done
        if model.done:
            break


@settings(max_examples=100, deadline=None)
@given(iodepth=st.integers(1, 128), good_up_to=st.integers(1, 128))
def test_a_device_good_up_to_a_depth_converges_there(iodepth, good_up_to):
    """Windows meet the target exactly while the depth is at most `good_up_to`: the
    search ends at min(good_up_to, iodepth), after its final window - except where
    iodepth itself missed: fio's rule then doubles again after each success (it bisects
    only below a failing depth other than iodepth) and never settles."""
    search = DepthSearch(TARGET, WINDOW, 99.0, iodepth, keep_running=False, now_ns=0)
    now, event = 0, ""
    for _ in range(64):
        now += WINDOW
        event = search.observe(_window_latencies(100, 0 if search.depth <= good_up_to else 50), now)
        if event == "done":
            break
    if event != "done":
        assert good_up_to < iodepth and search.state.high == iodepth
        return
    assert search.depth == min(good_up_to, iodepth)


def test_a_window_is_judged_only_when_it_has_ended_and_percentile_100_fails_at_once():
    search = DepthSearch(TARGET, WINDOW, 99.0, 16, keep_running=False, now_ns=0)
    search.observe(_window_latencies(10, 0), WINDOW - 1)
    assert search.depth == 1  # the window is not over yet
    search.observe(_window_latencies(10, 0), WINDOW)
    assert search.depth == 2
    strict = DepthSearch(TARGET, WINDOW, 100.0, 16, keep_running=False, now_ns=0)
    for _ in range(3):
        strict.observe(_window_latencies(10, 0), strict.window_end())
    assert strict.depth == 8
    assert strict.observe(_window_latencies(10, 1), strict.window_start + 1) == ""  # mid-window: down at once
    assert (strict.depth, strict.state.high) == (6, 8)
    at_one = DepthSearch(TARGET, WINDOW, 100.0, 16, keep_running=False, now_ns=0)
    assert at_one.observe(_window_latencies(10, 1), 1) == "fatal"  # fio: ETIMEDOUT


def test_latency_run_keeps_searching_after_the_final_window():
    search = DepthSearch(TARGET, WINDOW, 99.0, 4, keep_running=True, now_ns=0)
    events = [search.observe(_window_latencies(100, 0), WINDOW * (i + 1)) for i in range(6)]
    assert events[:4] == ["", "", "final", ""] and "done" not in events and search.depth == 4


def _jobs(text: str):
    return build_jobs([read_sections(text, "t.fio")])


@pytest.mark.parametrize("line, accepted", [
    ("latency_percentile=0", "above 0 and at most 100"), ("latency_percentile=100.5", "above 0 and at most 100"),
    ("latency_percentile=abc", "expected a number"), ("latency_target=-5", "must not be negative"),
    ("latency_window=soon", "latency_window"),
])
def test_bad_values_are_refused_with_their_line(line, accepted):
    with pytest.raises(JobFileError) as err:
        _jobs(f"[j]\nsize=1m\n{line}\n")
    assert "t.fio:3:" in str(err.value) and accepted in str(err.value)


def test_values_have_fios_units():
    jobs, _ = _jobs("[j]\nsize=1m\nlatency_target=50\nlatency_window=1s\nlatency_percentile=99.9\n")
    assert (jobs[0]["latency_target"], jobs[0]["latency_window"]) == (50_000, 10**9)  # bare number: usec
    jobs, _ = _jobs("[j]\nsize=1m\nlatency_target=1ns\n")
    assert jobs[0]["latency_target"] == 1000  # fio keeps whole microseconds


def _job_text(tmp_path, target: str) -> str:
    return (f"[j]\nfilename={tmp_path / 'f.dat'}\nsize=4m\nbs=4k\nrw=randread\nioengine=posixaio\niodepth=8\n"
            f"runtime=5\ntime_based\nlatency_target={target}\nlatency_percentile=90\nlatency_window=50ms\n")


def _latency_keys(job: dict) -> dict:
    return {k: job[k] for k in ("latency_depth", "latency_target", "latency_percentile", "latency_window")}


def _fio_json(tmp_path, text: str) -> dict | None:
    if not shutil.which("fio"):
        return None
    job = tmp_path / "fio.fio"
    job.write_text(text)
    done = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout[done.stdout.index("{"):])["jobs"][0]


def test_a_run_on_a_file_finds_the_depth_stops_and_reports_fios_keys(tmp_path):
    # 2 s for 90% of 4 KiB reads of a cached 4 MiB file: met at every depth on an idle
    # machine (the search doubles 1, 2, 4, 8 and ends after its final window at 8); on a
    # loaded one a window may miss, so only the search's range is asserted
    text = _job_text(tmp_path, "2s")
    jobs, globals_ = _jobs(text)
    result = run_jobs(jobs, log=lambda _: None)
    job = report.to_json(result, globals_)["jobs"][0]
    keys = _latency_keys(job)
    assert job["error"] == 0 and 1 <= keys.pop("latency_depth") <= 8
    assert keys == {"latency_target": 2 * 10**9, "latency_percentile": 90.0, "latency_window": 50_000}
    assert (f"latency   : target=2000000000, window=50000, percentile=90.00%, depth={job['latency_depth']}\n"
            in report.format_normal(result))
    fio = _fio_json(tmp_path, text)
    if fio is not None:
        fio_keys = _latency_keys(fio)
        assert 1 <= fio_keys.pop("latency_depth") <= 8 and fio_keys == keys


def test_a_target_missed_at_depth_1_fails_the_job_as_fio(tmp_path):
    text = _job_text(tmp_path, "1ns").replace("latency_percentile=90\n", "")
    jobs, globals_ = _jobs(text)
    result = run_jobs(jobs, log=lambda _: None)
    job = report.to_json(result, globals_)["jobs"][0]
    assert job["error"] == 110 and job["latency_depth"] == 1 and job["latency_target"] == 1000
    assert any("exceeds specified max (1000 nsec)" in m for m in result.messages)
    fio = _fio_json(tmp_path, text)
    if fio is not None:
        assert (fio["error"], fio["latency_depth"], fio["latency_target"]) == (110, 1, 1000)


def test_the_device_engine_says_it_does_not_search(tmp_path):
    jobs, globals_ = _jobs(f"[j]\nfilename={tmp_path / 'd.img'}\nioengine=cxlhm\nsize=8m\nrw=randread\n"
                           "latency_target=1ms\n")
    result = run_jobs(jobs, log=lambda _: None)
    assert result.failed and any("not ioengine=cxlhm" in m for m in result.messages)
