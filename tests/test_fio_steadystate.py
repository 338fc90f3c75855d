"""Steady-state detection (ss, ss_dur, ss_ramp) with fio 3.33's meaning
(cxlhm_apps/fio/steadystate.py): the criterion computed on fio's own samples gives fio's
JSON "steadystate" object, the once-a-second look over the jobs (groups summed, the
group's last job holding the data, ramp), and the option rules."""
from __future__ import annotations

import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.stats import num2str
from cxlhm_apps.fio.steadystate import Monitor, SteadySpec, SteadyState, parse_steadystate

# fio 3.33's JSON on this machine (jobs: randread 4k psync, ss_dur=3, the ss below), and the
# samples fed before the ring's (a prefix that keeps the criterion unmet, for rings of
# jobs that did not attain it)
GOLDEN = [
    ("iops_slope:20%", [], {"ss": "iops_slope:20.000000%", "duration": 3, "attained": 1, "criterion": "-3.302535%",
                            "max_deviation": 0.0, "slope": -529.0,
                            "data": {"bw_mean": 65611200, "iops_mean": 16018, "iops": [16590, 15932, 15532],
                                     "bw": [67953236, 65261293, 63619072]}}),
    ("bw:20%", [], {"ss": "bw:20.000000%", "duration": 3, "attained": 1, "criterion": "10.841326%",
                    "max_deviation": 6820280.333333333, "slope": 0.0,
                    "data": {"bw_mean": 62910023, "iops_mean": 15358, "iops": [15077, 17024, 13974],
                             "bw": [61758270, 69730304, 57241497]}}),
    ("iops:0.5%", [(1, 1), (100000, 1)], {
        "ss": "iops:0.500000%", "duration": 3, "attained": 0, "criterion": "7.985461%", "max_deviation": 725.0,
        "slope": 0.0, "data": {"bw_mean": 37188790, "iops_mean": 9079, "iops": [9538, 8354, 9345],
                               "bw": [39069853, 34217984, 38278534]}}),
    ("bw_slope:2000000", [(1, 0), (1, 0), (1, 100_000_000)], {
        "ss": "bw_slope:2000000.000000", "duration": 3, "attained": 0, "criterion": "5902565.500000",
        "max_deviation": 0.0, "slope": 5902565.5,
        "data": {"bw_mean": 48163561, "iops_mean": 11758, "iops": [9230, 13933, 12112],
                 "bw": [37806080, 57073393, 49611211]}}),
]


@pytest.mark.parametrize("ss,prefix,want", GOLDEN)
def test_fios_samples_give_fios_steadystate_object(ss, prefix, want):
    state = SteadyState(parse_steadystate(ss, 1024), 3, 0)
    samples = prefix + list(zip(want["data"]["iops"], want["data"]["bw"]))
    results = [state.add(iops, bw) for iops, bw in samples]
    assert results[-1] == bool(want["attained"]) and not any(results[:-1])
    state.attained = results[-1]
    got = state.to_json()
    assert got["max_deviation"] == pytest.approx(want["max_deviation"])
    got["max_deviation"] = want["max_deviation"]
    assert got == want


def test_the_report_line_is_fios():
    state = SteadyState(parse_steadystate("iops:30%", 1024), 2, 0)
    assert state.add(8454, 34_600_000) is False and state.add(8496, 34_800_000) is True
    state.attained = True
    assert state.text_line(num2str) == ("  steadystate  : attained=yes, bw=33.1MiB/s (33.9MB/s), iops=8475, "
                                        "iops mean dev=0.248%\n")


@given(kind=st.sampled_from(["iops", "iops_slope", "bw", "bw_slope"]),
       limit=st.floats(0, 1e6, allow_nan=False).map(lambda x: round(x, 3)), pct=st.booleans())
def test_a_criterion_parses_back_from_its_text(kind, limit, pct):
    if kind.startswith("bw") and not pct:  # a bandwidth is whole bytes per second
        limit = float(int(limit))
        text = f"{kind}:{int(limit)}"
    else:
        text = f"{kind}:{limit}{'%' if pct else ''}"
    spec = parse_steadystate(text, 1024)
    assert spec.iops == kind.startswith("iops") and spec.slope == kind.endswith("slope") and spec.pct == pct
    assert spec.limit == limit
    assert parse_steadystate(spec.text(), 1024).limit == pytest.approx(spec.limit, rel=1e-6)


def test_a_bandwidth_limit_takes_fios_size_suffixes():
    assert parse_steadystate("bw:10m", 1024) == SteadySpec(False, False, float(10 << 20), False)


@pytest.mark.parametrize("text, words", [
    ("ss=iops\n", "a threshold is needed"),
    ("ss=latency:5%\n", "must be one of iops, iops_slope, bw, bw_slope, lat, lat_slope"),
    ("ss=iops:-1%\n", "finite number >= 0"),
    ("ss_dur=500ms\n", "at least 1s"),
    ("ss_dur=10\nioengine=cxlhm\ncxlhm_clock=model\n", "needs wall time"),
])
def test_bad_values_are_refused_with_the_line(text, words):
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections(f"[j]\nsize=1m\n{text}", "t.fio")])
    assert "t.fio:3:" in str(err.value) and words in str(err.value)


def test_a_reporting_group_needs_the_same_steady_state_options():
    text = "[a]\nsize=1m\nss=iops:10%\nss_dur=5\n[b]\nsize=1m\nss=iops:20%\nss_dur=5\n[c]\nstonewall\nsize=1m\n"
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections(text, "t.fio")])
    assert "t.fio:7: option 'ss'" in str(err.value) and "job 'a' has others" in str(err.value)
    jobs, _ = build_jobs([read_sections(text.replace("iops:20%", "iops:10%"), "t.fio")])
    assert jobs[0]["steadystate_duration"] == 5 * 10**9


def _worker(group: int, grouped: bool, ss: str = "iops:10%", dur: int = 2, ramp_ns: int = 0):
    w = types.SimpleNamespace(job={"group_reporting": grouped}, plan=types.SimpleNamespace(groupid=group),
                              state="r", progress_ios=[0, 0], progress_bytes=[0, 0], _wall_start=1,
                              steady=SteadyState(parse_steadystate(ss, 1024), dur, ramp_ns), stopped=False)
    w.stop = lambda: setattr(w, "stopped", True)
    return w


S = 1_000_000_000


def test_a_group_is_summed_into_its_last_job_and_ends_together():
    a, b = _worker(0, True), _worker(0, True)
    monitor = Monitor([a, b])
    for k, (ia, ib) in enumerate([(100, 300), (120, 290)], start=1):
        a.progress_ios[0] += ia
        b.progress_ios[0] += ib
        monitor.check(1 + k * S)
    assert b.steady.iops_data == [400, 410] and a.steady.iops_data == [0, 0]  # the last job holds the group's
    assert a.stopped and b.stopped and a.steady.attained and b.steady.attained


def test_jobs_without_group_reporting_are_judged_alone_after_their_ramp():
    steady, noisy = _worker(0, False, ramp_ns=S), _worker(0, False)
    monitor = Monitor([steady, noisy])
    for k, (i1, i2) in enumerate([(50, 10), (100, 100), (100, 10), (100, 100)], start=1):
        steady.progress_ios[0] += i1
        noisy.progress_ios[1] += i2
        monitor.check(1 + k * S)
    # the ramp (1 s, plus fio's 1 s) kept the first two samples out
    assert steady.steady.iops_data == [100, 100] and steady.stopped
    assert not noisy.stopped and noisy.steady.criterion > 10
