"""fio's pacing of submissions: thinktime and rate / rate_iops / rate_process.

The schedule itself is checked on a fake clock (deterministic: when each I/O is let go,
which direction goes, when the job sleeps); whole runs on the real clock check only what
load cannot break (a rate is a ceiling; waits end at the runtime)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.pacing import Pacer
from cxlhm_apps.fio.pattern import Chunk
from cxlhm_apps.fio.raw_engines import libaio_unavailable
from cxlhm_apps.fio.runner import run_jobs

MS = 1_000_000


def job_of(text: str):
    jobs, _ = build_jobs([read_sections("[j]\nsize=1m\n" + text, "t.fio")])
    return jobs[0]


class FakeClock:
    def __init__(self):
        self.t = 0
        self.slept: list[int] = []

    def now(self) -> int:
        return self.t

    def sleep(self, seconds: float) -> None:
        ns = round(seconds * 1e9)
        self.slept.append(ns)
        self.t += ns


def pacer_of(text: str, bs: int = 4096):
    clock = FakeClock()
    pacer = Pacer(job_of(text), (bs, bs), True, 7, threading.Event(), sleep=clock.sleep)
    pacer.restart(0)
    return pacer, clock


def chunk(directions, bs: int = 4096) -> Chunk:
    n = len(directions)
    return Chunk(np.array(directions, np.int8), np.arange(n, dtype=np.int64) * bs, np.full(n, bs, np.int64),
                 np.arange(n, dtype=np.int64))


def issue_times(pacer, clock, directions, end=10**15):
    """Run I/Os through the pacer one admitted batch at a time (each completing at
    once): the time each was let go, and its direction."""
    pending = chunk(directions)
    out = []
    while len(pending):
        n = pacer.admit(pending, clock.now, end)
        if n == 0:
            break
        for d in pending.direction[:n]:
            out.append((clock.t, int(d)))
        pacer.did(pending.take(0, n))
        pending = pending.take(n)
    return out


def test_rate_iops_lets_each_io_go_when_it_is_due():
    pacer, clock = pacer_of("rw=read\nrate_iops=100\n")
    times = [t for t, _ in issue_times(pacer, clock, [READ] * 5)]
    assert times == [0, 10 * MS, 20 * MS, 30 * MS, 40 * MS]


def test_rate_in_bytes_spaces_ios_by_their_bytes():
    pacer, clock = pacer_of("rw=read\nrate=1m\n")  # 4 KiB at 1 MiB/s: 1/256 s apart
    times = [t for t, _ in issue_times(pacer, clock, [READ] * 3)]
    assert times == [0, 10**9 // 256, 2 * 10**9 // 256]


def test_ios_already_due_go_together_in_one_batch():
    pacer, clock = pacer_of("rw=read\nrate_iops=100\n")
    clock.t = 35 * MS  # the job fell behind: the I/Os due by now go at once, the rest wait
    pending = chunk([READ] * 10)
    assert pacer.admit(pending, clock.now, 10**15) == 4
    assert clock.slept == []


def test_a_mixed_job_ahead_in_one_direction_takes_the_other_as_fio_does():
    # rate=300 B/s per direction: each direction is due once, at the start; the second
    # read turns into a write, and the third I/O waits for the earliest due direction
    pacer, clock = pacer_of("rw=randrw\nrate=300,300,300\n")
    done = issue_times(pacer, clock, [READ, READ, READ])
    assert [d for _, d in done] == [READ, WRITE, READ]
    assert [t for t, _ in done[:2]] == [0, 0]
    assert done[2][0] == 4096 * 10**9 // 300


def test_a_wait_never_runs_past_the_runtime():
    pacer, clock = pacer_of("rw=read\nrate_iops=1\n")
    done = issue_times(pacer, clock, [READ] * 3, end=500 * MS)
    assert [t for t, _ in done] == [0] and clock.t == 500 * MS


def test_poisson_gaps_have_the_rates_mean_and_vary():
    pacer, clock = pacer_of("rw=read\nrate_iops=1000\nrate_process=poisson\n")
    times = np.array([t for t, _ in issue_times(pacer, clock, [READ] * 2001)])
    gaps = np.diff(times)
    assert abs(gaps.mean() - MS) < 0.1 * MS  # 2000 exponential gaps: the mean is within a few %
    assert gaps.std() > 0.7 * MS  # exponential: std = mean (a linear rate has none)


def test_thinktime_pauses_after_every_thinktime_blocks_ios():
    pacer, clock = pacer_of("rw=read\nthinktime=2ms\nthinktime_blocks=3\n")
    times = [t for t, _ in issue_times(pacer, clock, [READ] * 7)]
    assert times == [0, 0, 0, 2 * MS, 2 * MS, 2 * MS, 4 * MS]


def test_thinktime_bare_number_is_microseconds_and_defaults_to_every_io():
    pacer, clock = pacer_of("rw=read\nthinktime=2000\n")
    times = [t for t, _ in issue_times(pacer, clock, [READ] * 3)]
    assert times == [0, 2 * MS, 4 * MS]


def test_thinktime_iotime_pauses_by_time_when_no_block_count_is_given():
    pacer, clock = pacer_of("rw=read\nthinktime=1ms\nthinktime_iotime=10ms\n")
    assert pacer.admit(chunk([READ] * 100), clock.now, 10**15) == 100  # no block count: one batch
    pacer.did(chunk([READ] * 100))
    assert pacer.deadline() == 10 * MS  # the engine stops the batch there
    clock.t = 10 * MS
    pacer.admit(chunk([READ]), clock.now, 10**15)
    assert clock.slept == [1 * MS]


@pytest.mark.parametrize("text, says", [
    ("rw=read\nrate_ignore_thinktime=1\n", "think time counts against the rate"),
    ("rw=randrw\nverify=crc32c\nrate=1m\n", "mixed job with verify"),
    ("rw=randrw\nbs=4k,8k\nrate_iops=100\n", "different block sizes"),
    ("rw=read\nioengine=cxlhm\ncxlhm_clock=model\nthinktime=10\n", "needs wall time"),
])
def test_what_is_not_modelled_is_refused_with_its_reason(text, says):
    with pytest.raises(JobFileError) as err:
        job_of(text)
    assert says in str(err.value)


def run(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return report.to_json(result, globals_)


def test_a_rate_is_a_ceiling_on_a_real_run(tmp_path):
    out = run(f"[r]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=randread\nioengine=psync\nrate_iops=200\n"
              "runtime=500ms\ntime_based\n")
    ios = out["jobs"][0]["read"]["total_ios"]
    assert 10 <= ios <= 101  # 200/s for 0.5 s, the first at once; never more (load only slows it)
    assert out["jobs"][0]["iodepth_level"]["1"] == 100.0


def test_thinktime_with_number_ios_runs_the_ios_with_pauses(tmp_path):
    out = run(f"[t]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=write\nioengine=sync\nthinktime=2000\n"
              "number_ios=50\n")
    job = out["jobs"][0]
    assert job["write"]["total_ios"] == 50
    assert job["job_runtime"] >= 49 * 2  # 49 pauses of 2 ms at least (one after each I/O but the last)


def test_a_rated_job_ended_by_exitall_stops_waiting(tmp_path):
    # fio's exitwhat example in small: the rated jobs would wait 13 s for their next I/O
    if libaio_unavailable():
        pytest.skip(libaio_unavailable())
    out = run(f"[global]\nfilename={tmp_path / 'f'}\nsize=1m\n"
              "[slow]\nrw=read\nioengine=sync\nthinktime=2000\nnumber_ios=250\nexitall\nexit_what=all\n"
              "[fast]\nrw=randrw\nioengine=libaio\niodepth=32\nrate=300,300,300\n")
    slow, fast = out["jobs"]  # (the slow job's 0.5 s leave the fast one time to start on a loaded machine)
    assert slow["read"]["total_ios"] == 250
    assert (fast["read"]["total_ios"], fast["write"]["total_ios"]) == (1, 1)
    assert fast["job_runtime"] < 5000
