"""fio's latency-target queue-depth search (cxlhm_apps/fio/latency_target.py): its
decisions against a transcription of fio 3.33's rule (io_u.c), a real run on a plain
file compared with fio, runs on the device engine (the model clock's, decided window by
window as fio's rule says; the wall clock's stream kept within the search's depth), and
the values refused."""
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
    __lat_target_failed, line by line (td->latency_qd, _low, _high, _end_run,
    latency_stable_count; o->latency_run)."""

    def __init__(self, iodepth: int, latency_run: bool = False):
        self.iodepth, self.qd, self.low, self.high, self.end_run, self.done = iodepth, 1, 1, iodepth, False, False
        self.latency_run, self.stable_count = latency_run, 0
        self.ios = self.failed = 0  # since lat_new_cycle

    def window(self, ios: int, failed: int, percentile: float) -> None:
        """lat_target_check at the window's end, after `ios` more completions."""
        self.ios += ios
        self.failed += failed
        if (self.ios - self.failed) / self.ios * 100.0 >= percentile:
            qd = self.qd
            self.low = self.qd
            if self.qd + 1 == self.high:
                self.stable_count += 1
                if self.stable_count >= 3:
                    self.high += 1
                    self.stable_count = 0
            self.qd = (self.qd + self.high) // 2 if self.high != self.iodepth else self.qd * 2
            if self.qd > self.iodepth:
                self.qd = self.iodepth
            if not self.latency_run and self.qd == qd:
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
            self.stable_count = 0
            self.ios = self.failed = 0


def _window_latencies(n: int, failed: int) -> np.ndarray:
    lat = np.full(n, TARGET // 2, np.int64)
    lat[:failed] = TARGET + 1
    return lat


@settings(max_examples=300, deadline=None)
@given(iodepth=st.integers(1, 256), percentile=st.floats(50.0, 99.9), latency_run=st.booleans(),
       windows=st.lists(st.integers(0, 100), min_size=1, max_size=40))
def test_each_window_decides_the_depth_as_fios_rule(iodepth, percentile, latency_run, windows):
    search = DepthSearch(TARGET, WINDOW, percentile, iodepth, keep_running=latency_run, now_ns=0)
    model = FioModel(iodepth, latency_run)
    now = 0
    for failed in windows:  # `failed` of 100 I/Os missed the target in this window
        now += WINDOW
        end_run = model.end_run
        event = search.observe(_window_latencies(100, failed), now)
        model.window(100, failed, percentile)
        assert search.depth == model.qd and 1 <= search.depth <= iodepth
        assert (search.state.low, search.state.high, search.state.end_run, search.state.stable) == \
            (model.low, model.high, model.end_run, model.stable_count)
        assert (event == "done") == model.done
        assert (event == "final") == (model.end_run and not end_run)  # (fio resets the statistics there)
        if model.done:
            break


def test_with_latency_run_a_depth_just_below_a_failing_one_is_tried_again_after_three_successes():
    """fio 3.33's latency_stable_count: stuck one below the lowest failing depth, the
    third success in a row raises that ceiling by one and the depth goes up to it."""
    search = DepthSearch(TARGET, WINDOW, 99.0, 16, keep_running=True, now_ns=0)
    now, depths = 0, []
    for failed in [0, 0, 50, 0, 0, 0, 0]:  # 1 -> 2 -> 4; 4 misses -> 3; 3 meets the target four times
        now += WINDOW
        search.observe(_window_latencies(100, failed), now)
        depths.append(search.depth)
    assert depths == [2, 4, 3, 3, 3, 4, 4]
    assert search.state.high == 5


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


def test_latency_run_keeps_searching_and_never_restarts_the_statistics():
    """fio skips its final window (and its statistics reset) under latency_run."""
    search = DepthSearch(TARGET, WINDOW, 99.0, 4, keep_running=True, now_ns=0)
    events = [search.observe(_window_latencies(100, 0), WINDOW * (i + 1)) for i in range(6)]
    assert set(events) == {""} and search.depth == 4
    converging = DepthSearch(TARGET, WINDOW, 99.0, 4, keep_running=False, now_ns=0)
    events = [converging.observe(_window_latencies(100, 0), WINDOW * (i + 1)) for i in range(4)]
    assert events == ["", "", "final", "done"]


def test_a_window_that_ended_before_the_next_batch_gives_that_batch_a_moment_to_run():
    """The last batch ended before the window's end and the next starts after it: that
    batch must still run some I/O (a deadline in the past runs none, and the window
    would never be judged: the job spun without I/O until its run time ended)."""
    from cxlhm_apps.fio.latency_target import LATE_WINDOW_NS
    search = DepthSearch(TARGET, WINDOW, 99.0, 4, keep_running=False, now_ns=0)
    assert search.batch_deadline(WINDOW // 2) == WINDOW
    assert search.batch_deadline(WINDOW + 5) == WINDOW + 5 + LATE_WINDOW_NS


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


class _FixedTime:
    """A model-clock device handle stand-in: time starts at 0."""

    def now_ns(self) -> float:
        return 0.0


def test_the_model_clocks_loop_keeps_at_most_the_depth_it_is_set_to_in_flight():
    from cxlhm_apps.fio.clocks import ModelTimeScheduler
    loop = ModelTimeScheduler(_FixedTime()).open_loop(4)  # opened at iodepth 4
    for latency in (10.0, 20.0, 30.0, 40.0):  # four at t=0, completing at 10, 20, 30, 40
        loop.issue(lambda t, lat=latency: lat)
    loop.set_depth(2)  # the next goes when only one is still out: at 30 (at depth 4 it would go at 10)
    issued = []
    loop.issue(lambda t: issued.append(t) or 100.0)
    assert issued == [30.0]
    loop.set_depth(4)  # two more free at once, at the loop's time
    loop.issue(lambda t: issued.append(t) or 100.0)
    loop.issue(lambda t: issued.append(t) or 100.0)
    assert issued == [30.0, 30.0, 30.0]
    assert loop.next_issue_ns() == 40.0  # the fourth slot: the I/O completing at 40
    assert loop.drain() == 130.0


def _device_job(tmp_path, lines: str) -> str:
    return (f"[j]\nfilename={tmp_path / 'd.img'}\nioengine=cxlhm\nsize=4m\nbs=4k\nrw=randread\n"
            f"time_based\n{lines}")


def test_the_device_engine_on_the_model_clock_moves_the_depth_as_fios_rule(tmp_path, monkeypatch):
    """Real device latencies (the timing model's: deeper queues wait longer at the SSD)
    decide the depth window by window exactly as fio 3.33's rule does with them."""
    import cxlhm_apps.fio.latency_target as LT
    model = FioModel(16)
    judged = []  # (depth after the window, fio's depth after it)
    pending = [0, 0]  # I/Os and failures since the window began
    real = LT.DepthSearch.observe

    def observe(self, lat, now):
        ends = now - self.window_start >= self.window_ns
        pending[0] += lat.shape[0]
        pending[1] += int((lat > self.target_ns).sum())
        event = real(self, lat, now)
        if ends:
            at_one, met = model.qd == 1, (pending[0] - pending[1]) * 100 >= self.percentile * pending[0]
            model.window(pending[0], pending[1], self.percentile)
            judged.append((self.depth, model.qd))
            if met or not at_one:
                pending[:] = [0, 0]  # (a new cycle; at depth 1 a missed window goes on)
        return event
    monkeypatch.setattr(LT.DepthSearch, "observe", observe)
    jobs, globals_ = _jobs(_device_job(tmp_path, "cxlhm_clock=model\ncxlhm_dram=1m\niodepth=16\nruntime=150ms\n"
                                                 "latency_target=80us\nlatency_window=10ms\nlatency_percentile=90\n"))
    result = run_jobs(jobs, log=lambda _: None)
    job = report.to_json(result, globals_)["jobs"][0]
    assert job["error"] == 0
    assert len(judged) >= 4 and all(ours == fios for ours, fios in judged), judged
    depths = [d for d, _ in judged]
    assert max(depths) > 1 and any(b < a for a, b in zip(depths, depths[1:]))  # up, and down again: a real search
    assert job["latency_depth"] == judged[-1][0] and job["latency_target"] == 80_000
    assert (job["latency_percentile"], job["latency_window"]) == (90.0, 10_000)


def test_the_device_engine_on_the_wall_clock_keeps_the_searchs_depth_in_flight(tmp_path, monkeypatch):
    """The device opens at iodepth; each stream it runs is asked for the depth the search
    chose, and never has more I/Os at the SSD than that."""
    import cxlhm_apps.fio.latency_target as LT
    from host_runtime.driver import DeviceHandle
    streams, chosen = [], [1]
    real_stream, real_set = DeviceHandle.stream_io, LT.set_engine_depth

    def stream_io(self, hpa, lens, addrs, depth, **options):
        ran = real_stream(self, hpa, lens, addrs, depth, **options)
        streams.append((depth, ran.peak_in_flight, ran.count))
        return ran

    def set_depth(engine, depth):
        chosen.append(depth)
        real_set(engine, depth)
    monkeypatch.setattr(DeviceHandle, "stream_io", stream_io)
    monkeypatch.setattr(LT, "set_engine_depth", set_depth)
    jobs, globals_ = _jobs(_device_job(tmp_path, "cxlhm_dram=1m\niodepth=16\nruntime=3s\nlatency_target=2s\nlatency_window=50ms\n"
                                                 "latency_percentile=90\n"))
    result = run_jobs(jobs, log=lambda _: None)
    job = report.to_json(result, globals_)["jobs"][0]
    assert job["error"] == 0
    # every window meets a 2 s target: 1, 2, 4, 8, 16, a final window at 16, and the job ends
    assert list(dict.fromkeys(chosen)) == [1, 2, 4, 8, 16] and job["latency_depth"] == 16
    assert job["job_runtime"] < 2500  # (it ended on the search, not the run time)
    ran = [(depth, peak) for depth, peak, count in streams if count]
    assert {depth for depth, _ in ran} == {1, 2, 4, 8, 16}
    assert all(peak <= depth for depth, peak in ran), ran
    assert max(peak for depth, peak in ran if depth == 16) > 8, ran  # (the raised cap is used: mostly misses)
    assert "latency   : target=2000000000, window=50000, percentile=90.00%, depth=16\n" in report.format_normal(result)


class _BatchDevice:
    """A device handle stand-in that does not stream (as one with injected faults):
    the engine shares its depth over submitter threads."""

    class caps:
        streams_io = False


@settings(max_examples=200, deadline=None)
@given(opened=st.integers(1, 64), data=st.data())
def test_a_lower_depth_is_shared_over_the_submitters_within_their_buffers(opened, data):
    from cxlhm_apps.fio.clocks import WallClock
    from cxlhm_apps.fio.engines import CxlhmEngine, DeviceShare
    engine = CxlhmEngine(DeviceShare(_BatchDevice(), WallClock()), opened, 4096)
    try:
        depth = data.draw(st.integers(1, opened))
        engine.iodepth = depth
        depths, staging = engine._shares()
        assert sum(depths) == depth and min(depths) >= 1 and len(depths) == len(staging)
        assert all(buf.shape[0] >= d * 4096 for d, buf in zip(depths, staging))
        with pytest.raises(ValueError, match="outside 1.."):
            engine.iodepth = opened + 1
    finally:
        engine.close()
