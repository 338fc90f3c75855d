"""fio's flow control (flow, flow_id, flow_sleep): the rule's arithmetic against fio's
check before each I/O, the shared counts under any interleaving of jobs, and whole runs,
against real fio where it is installed."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio import flow, report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.raw_engines import libaio_unavailable
from cxlhm_apps.fio.runner import run_jobs


def fio_passes(mine: int, count: int, weight: int, total: int) -> bool:
    """fio 3.33's flow_threshold_exceeded, negated: the job's share of the group's count
    is not above its weight's share of the group's total weight."""
    return not mine / count > weight / total


def run(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return report.to_json(result, globals_)


# ---------------------------------------------------------------- the rule

@settings(deadline=None)  # (a job far behind is checked one I/O at a time: ~100k)
@given(mine=st.integers(0, 10_000), others=st.integers(0, 10_000), weight=st.integers(1, 64),
       rest=st.integers(0, 64))
@example(mine=0, others=0, weight=1, rest=8)  # a group's first look: the count starts at one
@example(mine=0, others=1715, weight=64, rest=1)  # far behind with 64/65 of the group: ~110k in a row
def test_allowance_is_the_number_of_fios_checks_in_a_row_that_pass(mine, others, weight, rest):
    total, count = weight + rest, 1 + mine + others
    got = flow.allowance(mine, count, weight, total)
    if rest == 0:
        assert got is None  # the job holds the group's whole weight: never ahead
        return
    j, cap = 0, 200_000
    while j < cap and fio_passes(mine + j, count + j, weight, total):
        j += 1  # (fio counts each I/O as its check passes)
    assert got == j if j < cap else got >= cap


def test_weights_one_and_eight_take_turns_of_two_and_sixteen():
    """The group's count starting at one leaves the heavy job a weight's worth of slack:
    fio's flow.fio runs its jobs 2 and about 16 I/Os at a time (its depth histograms)."""
    group, stop = flow.FlowGroup(), threading.Event()
    light, heavy = flow.FlowTicket(group, 1, 1000, stop), flow.FlowTicket(group, 8, 1000, stop)
    light.join()
    heavy.join()
    turns = []
    for _ in range(20):
        for ticket in (light, heavy):
            n = ticket.take()
            turns.append(n)
            ticket.did(n)
            assert ticket.take() == 0  # ahead until the other issues
    assert turns[:4] == [1, 17, 2, 16] and set(turns[4:]) == {2, 16}


# ---------------------------------------------------------------- the shared counts

@st.composite
def schedules(draw):
    weights = draw(st.lists(st.integers(1, 20), min_size=1, max_size=4))
    steps = draw(st.lists(st.tuples(st.integers(0, len(weights) - 1), st.integers(1, 300),
                                    st.sampled_from(["take", "did", "did_less"])), max_size=60))
    return weights, steps


@settings(deadline=None)
@given(schedules())
def test_no_job_gets_more_than_one_io_past_its_share_whatever_the_interleaving(schedule):
    """Jobs of one phase take batches and finish them in any order, several batches in
    flight at once (fio counts an I/O when its check passes, so a batch counts before it
    runs): the group's count is always one plus its jobs' counts, and no job is more than
    one I/O past its weight's share of the count ((count - 1) / (group - 1) <= w / W)."""
    weights, steps = schedule
    group, stop = flow.FlowGroup(), threading.Event()
    tickets = [flow.FlowTicket(group, w, 100, stop) for w in weights]
    for t in tickets:
        t.join()
    total, cut = sum(weights), False
    for who, most, what in steps:
        t = tickets[who]
        if what == "take" and t.reserved is None:
            before_mine, before_group = t.count, group.count
            n = t.take(most)
            if len(weights) == 1:
                assert n is None
            else:
                j = 0  # what fio's per-I/O check would let through, up to `most`
                while j < most and fio_passes(before_mine + j, before_group + j, t.weight, total):
                    j += 1
                assert n == j
        elif t.reserved is not None:
            cut |= what == "did_less"
            t.did(t.reserved // 2 if what == "did_less" else t.reserved)
        assert group.count == 1 + sum(x.count for x in tickets)
        if not cut:  # (what a cut batch gives back shrinks the count the others took against)
            for x in tickets:
                assert (x.count - 1) * total <= x.weight * (group.count - 1)


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 500)), min_size=1, max_size=5), st.data())
def test_jobs_that_leave_take_their_counts_and_weights_with_them(members, data):
    group, stop = flow.FlowGroup(), threading.Event()
    tickets = []
    for weight, ios in members:
        t = flow.FlowTicket(group, weight, 0, stop)
        t.join()
        t.join()  # (joining twice counts the weight once)
        t.did(ios)
        tickets.append(t)
    for t in data.draw(st.permutations(tickets)):
        t.leave()
        t.leave()
        left = [x for x in tickets if not x.left]
        assert group.total_weight == sum(x.weight for x in left)
        assert group.count == 1 + sum(x.count for x in left)
    assert (group.total_weight, group.count) == (0, 1)  # fio asserts the same when the last job goes


def test_a_job_ahead_sleeps_until_the_other_issues_and_stops_at_its_deadline():
    group, stop = flow.FlowGroup(), threading.Event()
    a, b = flow.FlowTicket(group, 1, 200, stop), flow.FlowTicket(group, 1, 200, stop)
    a.join()
    b.join()
    a.did(a.take())
    a.did(a.take())
    assert a.take() == 0
    clock = iter(range(10))
    assert a.wait_turn(3, now=lambda: next(clock)) is None  # deadline on the given clock
    assert a.count == 2 and a.reserved is None
    threading.Timer(0.02, lambda: b.did(b.take(1))).start()
    assert a.wait_turn(1 << 62) == 1  # (b's issue lets a go again)
    stop.set()
    assert b.wait_turn(1 << 62) is None


# ---------------------------------------------------------------- whole runs

FLOW_FIO = ("[global]\nnorandommap\nthread\ntime_based\nruntime=1\ndirect=1\nioengine=libaio\niodepth=256\n"
            "size=16m\nbs=8k\nfilename={path}\nflow_sleep=1000\n"
            "[job2]\nrw=write\nflow=1\n[job1]\nrw=randread\nflow=8\n")  # fio's flow.fio, a 1 s run


def _flow_example(runner: str, tmp_path) -> dict:
    text = FLOW_FIO.format(path=tmp_path / "testfile")
    if runner == "cxlhm":
        # a short run first: what is compiled on first use is not compiled inside the measured second
        run(text.replace("time_based\n", "").replace("size=16m", "size=256k"))
        return run(text)
    job = tmp_path / "flow.fio"
    job.write_text(text)
    proc = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout[proc.stdout.index("{"):])


@pytest.mark.parametrize("runner", ["cxlhm", "fio"])
def test_fios_flow_example_runs_one_to_eight_two_and_sixteen_at_a_time(tmp_path, runner):
    """fio's flow.fio, under cxlhm and under fio 3.33 alike: 8 reads per write, the writes
    issued 2 at a time (half at depth 1, half at depth 2) and the reads about 16 at a
    time from an empty queue (depths 1, 2, 4-7, 8-15: most in the 8 bucket). What the
    counts allow decides these, not the machine's speed."""
    if runner == "fio" and shutil.which("fio") is None:
        pytest.skip("real fio is not installed (apt-get install fio)")
    if libaio_unavailable():
        pytest.skip(libaio_unavailable())
    jobs = {j["jobname"]: j for j in _flow_example(runner, tmp_path)["jobs"]}
    writes, reads = jobs["job2"]["write"]["total_ios"], jobs["job1"]["read"]["total_ios"]
    assert writes >= 40, writes  # (a 1 s run at 1 ms a turn: hundreds)
    assert 7.0 <= reads / writes <= 9.0
    light, heavy = jobs["job2"]["iodepth_level"], jobs["job1"]["iodepth_level"]
    assert light["1"] + light["2"] >= 90 and min(light["1"], light["2"]) >= 30, light
    assert max(heavy, key=heavy.get) == "8", heavy
    assert heavy["4"] >= 15 and heavy["32"] + heavy[">=64"] < 5, heavy


def test_ratio_of_weights_holds_with_a_short_sleep_on_a_synchronous_engine(tmp_path):
    out = run(f"[global]\nfilename={tmp_path / 'f'}\nsize=8m\nbs=4k\ntime_based\nruntime=1\nflow_sleep=100\n"
              "[w]\nrw=write\nflow=1\n[r]\nrw=randread\nflow=3\n")
    writes = out["jobs"][0]["write"]["total_ios"]
    reads = out["jobs"][1]["read"]["total_ios"]
    assert writes > 0 and 2.5 < reads / writes < 3.5


def test_a_flow_job_of_a_later_phase_holds_no_one_back(tmp_path):
    """(fio counts every job's weight from the start: this file never ends there. The run
    time ends a job held back for good, so a wrong hold fails instead of hanging.)"""
    out = run(f"[global]\nfilename={tmp_path / 'f'}\nsize=256k\nruntime=20\n[a]\nrw=write\nflow=1\n"
              "[b]\nstonewall\nrw=read\nflow=5\n")
    assert [j["write"]["io_bytes"] + j["read"]["io_bytes"] for j in out["jobs"]] == [256 << 10] * 2


def test_flow_on_the_model_clock_is_refused_with_the_reason(tmp_path):
    from cxlhm_apps.fio.jobfile import JobFileError
    text = (f"[global]\nfilename={tmp_path / 'dev.img'}\nsize=256k\nioengine=cxlhm\ncxlhm_dram=1m\n"
            "cxlhm_block_size=4k\ncxlhm_clock=model\n[a]\nrw=write\nflow=1\n[b]\nrw=read\nflow=2\n")
    with pytest.raises(JobFileError, match="option 'flow': flow control needs wall time"):
        run(text)


def test_a_flow_job_that_waits_for_another_of_its_phase_joins_when_it_starts(tmp_path):
    out = run(f"[global]\nfilename={tmp_path / 'f'}\nsize=256k\nruntime=20\n[a]\nrw=write\nflow=1\n"
              "[b]\nwait_for=a\nrw=read\nflow=5\n")
    assert [j["write"]["io_bytes"] + j["read"]["io_bytes"] for j in out["jobs"]] == [256 << 10] * 2
