"""Steady state on latency (`ss=lat:...`, `ss=lat_slope:...`) and the check interval
(`steadystate_check_interval` / `ss_interval`), with the meaning of fio at the examples'
commit (cxlhm_apps/fio/steadystate.py): fio's own samples give fio's JSON object and
report line, the limit is read as fio reads it, and the interval's rules are fio's."""
from __future__ import annotations

import types

import numpy as np
import pytest

from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.stats import LatencyStat, num2str
from cxlhm_apps.fio.steadystate import Monitor, SteadySpec, SteadyState, parse_lat_limit, parse_steadystate

# fio at f5344384f7c7 on this machine (randread 4k psync on a 16 MiB file), its JSON
# "steadystate" object and report line; the samples before the ring's keep it unmet
GOLDEN = [
    ("lat:30%", 3, 1, [], {
        "ss": "lat:30.000000%", "duration": 3, "attained": 1, "criterion": "12.498153%",
        "max_deviation": 10710.333333, "slope": 0.0,
        "data": {"bw_mean": 42096256, "iops_mean": 10277, "lat_mean": 85695, "lat_ns": [93426, 88675, 74985],
                 "iops": [6736, 10959, 13136], "bw": [27592167, 44888064, 53808537]}},
     "  steadystate  : attained=yes, bw=40.1MiB/s (41.1MB/s), iops=10.3k, lat=85.7knsec, lat mean dev=12.498%\n"),
    ("lat_slope:0.5%", 4, 2, [(1, 1, 1000)], {
        "ss": "lat_slope:0.500000%", "duration": 4, "attained": 0, "criterion": "10.175745%", "max_deviation": 0.0,
        "slope": 7336.0, "data": {"bw_mean": 55512418, "iops_mean": 13552, "lat_mean": 72093,
                                  "lat_ns": [68425, 75761], "iops": [14312, 12793], "bw": [58624708, 52400128]}},
     "  steadystate  : attained=no, bw=52.9MiB/s (54.2MB/s), iops=13.6k, lat=72.1knsec, lat slope=10.176%\n"),
    ("lat:1ms", 4, 2, [(1, 1, 1000)], {
        "ss": "lat:1000.000000", "duration": 4, "attained": 0, "criterion": "19461.500000",
        "max_deviation": 19461.5, "slope": 0.0,
        "data": {"bw_mean": 25952014, "iops_mean": 6335, "lat_mean": 127501, "lat_ns": [108040, 146963],
                 "iops": [5958, 6713], "bw": [24404954, 27499075]}},
     "  steadystate  : attained=no, bw=24.7MiB/s (25.3MB/s), iops=6335, lat=128knsec, lat mean dev=19461.500\n"),
]


@pytest.mark.parametrize("ss,dur,interval,prefix,want,line", GOLDEN)
def test_fios_latency_samples_give_fios_object_and_line(ss, dur, interval, prefix, want, line):
    state = SteadyState(parse_steadystate(ss, 1024), dur, 0, interval)
    data = want["data"]
    samples = prefix + list(zip(data["iops"], data["bw"], data["lat_ns"]))
    results = [state.add(*sample) for sample in samples]
    assert results[-1] == bool(want["attained"]) and not any(results[:-1])
    state.attained = results[-1]
    got = state.to_json()
    assert got["max_deviation"] == pytest.approx(want["max_deviation"])
    got["max_deviation"] = want["max_deviation"]
    assert got == want and list(got["data"]) == list(want["data"])  # (fio's key order too)
    assert state.text_line(num2str) == line


def test_an_iops_criterion_writes_no_latency_ring():
    state = SteadyState(parse_steadystate("iops:10%", 1024), 2, 0)
    state.add(100, 4096, 5000.0)
    assert "lat_ns" not in state.to_json()["data"] and "lat=" not in state.text_line(num2str)


@pytest.mark.parametrize("text, value", [("500", 500), ("1ms", 1000), ("2s", 2_000_000), ("3us", 3),
                                         ("0x10", 16), ("7msec", 7000), ("5furlongs", 5)])
def test_a_latency_limit_is_read_as_fio_reads_it(text, value):
    assert parse_lat_limit(text) == value
    assert parse_steadystate(f"lat:{text}", 1024) == SteadySpec(False, False, float(value), False, lat=True)


@pytest.mark.parametrize("text", ["", "ms", "1.5ms", "-"])
def test_a_bad_latency_limit_is_refused(text):
    with pytest.raises(ValueError):
        parse_lat_limit(text)


def test_lat_and_lat_slope_parse_with_a_percentage():
    spec = parse_steadystate("lat_slope:0.1%", 1024)
    assert (spec.metric, spec.slope, spec.limit, spec.pct) == ("lat", True, 0.1, True)
    assert spec.text() == "lat_slope:0.100000%"


@pytest.mark.parametrize("text, option, words", [
    ("ss_dur=10\nss_interval=3\n", "ss_dur", "multiple of steadystate_check_interval (3s here)"),
    ("ss_dur=4\nss_interval=4\n", "ss_dur", "longer than it"),
    ("ss_dur=10\nss_interval=500ms\n", "ss_interval", "at least 1s"),
])
def test_the_interval_rules_are_fios(text, option, words):
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections(f"[j]\nsize=1m\n{text}", "t.fio")])
    assert f"option '{option}'" in str(err.value) and words in str(err.value)


def test_one_interval_for_the_whole_run():
    text = "[a]\nsize=1m\nss_dur=4\nss_interval=2\n[b]\nnew_group\nsize=1m\nss_dur=4\n"
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections(text, "t.fio")])
    assert "t.fio:5: option 'steadystate_check_interval'" in str(err.value)
    assert "job 'a' has another" in str(err.value)
    jobs, _ = build_jobs([read_sections("[global]\nss_interval=2\n" + text, "t.fio")])
    assert [SteadyState.of_job(j).n for j in jobs] == [2, 2]


def _worker(ss: str, dur: int, interval: int, ramp_ns: int = 0, group: int = 0, grouped: bool = False):
    stats = types.SimpleNamespace(dirs=(types.SimpleNamespace(clat=LatencyStat()),
                                        types.SimpleNamespace(clat=LatencyStat())))
    w = types.SimpleNamespace(job={"group_reporting": grouped}, plan=types.SimpleNamespace(groupid=group),
                              state="r", progress_ios=[0, 0], progress_bytes=[0, 0], _wall_start=1, stats=stats,
                              steady=SteadyState(parse_steadystate(ss, 1024), dur, ramp_ns, interval), stopped=False)
    w.stop = lambda: setattr(w, "stopped", True)
    return w


S = 1_000_000_000


def test_the_monitor_looks_once_per_interval_and_takes_the_mean_latency_since_the_last_look():
    w = _worker("lat:10%", 4, 2)
    monitor = Monitor([w])
    assert monitor.interval_ns == 2 * S and w.steady.n == 2
    w.stats.dirs[0].clat.add(np.array([1000, 3000], np.int64))  # mean 2000
    w.progress_ios[0] = 2
    monitor.check(1 + 2 * S)
    w.stats.dirs[0].clat.add(np.array([2100], np.int64))  # reads since: 2100
    w.stats.dirs[1].clat.add(np.array([1900], np.int64))  # and writes: 1900; the look's mean 2000
    w.progress_ios[0] += 2
    monitor.check(1 + 4 * S)
    assert w.steady.lat_data == [2000, 2000] and w.steady.attained and w.stopped


def test_a_group_latency_is_the_mean_over_all_its_ios():
    a, b = _worker("lat:1%", 2, 1, grouped=True), _worker("lat:1%", 2, 1, grouped=True)
    monitor = Monitor([a, b])
    a.stats.dirs[0].clat.add(np.array([1000] * 3, np.int64))
    b.stats.dirs[0].clat.add(np.array([5000], np.int64))
    monitor.check(1 + S)
    assert b.steady.lat_data[0] == 2000 and a.steady.lat_data == [0, 0]  # (3 x 1000 + 5000) / 4


def test_the_ramp_ends_one_interval_after_ss_ramp():
    w = _worker("lat:10%", 4, 2, ramp_ns=3 * S)
    monitor = Monitor([w])
    monitor.check(1 + 4 * S)  # 4 s < ramp 3 s + interval 2 s
    assert not w.steady.ramp_over
    monitor.check(1 + 5 * S)
    assert w.steady.ramp_over
