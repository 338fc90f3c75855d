"""The clone's side thread (cxlhm_apps/fio/sidework.py): the next chunk of I/Os is made and
the last chunk's latencies recorded there while the engine runs. What it must keep: the
generator's sequence, every I/O recorded, and errors reported."""
from __future__ import annotations

import threading
import time

import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.pattern import IoGenerator
from cxlhm_apps.fio.runner import run_jobs
from cxlhm_apps.fio.sidework import SideWork

DEVICE = "ioengine=cxlhm\ncxlhm_dram=1m\ncxlhm_block_size=4k\n"


def test_tasks_run_in_the_order_given_on_one_thread():
    side = SideWork("t")
    order, threads = [], set()

    def task(i):
        time.sleep(0.001 * (5 - i))  # later tasks are shorter: only the order given keeps them in turn
        order.append(i)
        threads.add(threading.get_ident())
        return i * i

    futures = [side.submit(task, i) for i in range(5)]
    side.settle()
    assert order == list(range(5)) and [f.result() for f in futures] == [0, 1, 4, 9, 16]
    assert len(threads) == 1 and threading.get_ident() not in threads
    side.close()


def test_a_tasks_error_is_raised_by_settle_not_by_later_submits():
    side = SideWork("t")

    def fail():
        raise ValueError("bad chunk")

    failed = side.submit(fail)
    assert isinstance(failed.exception(), ValueError)  # (waits for it)
    later = side.submit(lambda: 7)  # an unrelated task goes on
    assert later.result() == 7
    with pytest.raises(ValueError, match="bad chunk"):
        side.settle()
    side.settle()  # reported once
    side.close()


def test_cpu_of_the_tasks_is_counted():
    side = SideWork("t")

    def spin():
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    side.submit(spin)
    side.settle()
    side.close()
    assert side.usr_s + side.sys_s >= 0.04


def _run(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return result, report.to_json(result, globals_)


def test_chunks_made_ahead_keep_the_random_maps_passes(tmp_path, monkeypatch):
    """iodepth=1 makes chunks of 512 I/Os: 2048 random reads over 1024 blocks are four
    chunks, made on the side thread while the one before runs. The random map covers
    every block once per pass, so each 1024 reads in issue order are all the blocks, and
    the second pass repeats the first (fio seeds it again) - a chunk skipped, repeated or
    run out of turn breaks that. All 2048 are recorded."""
    from cxlhm.device import Device
    issued = []
    real = Device.stream_io

    def stream_io(self, hpas, *args, **kwargs):
        result = real(self, hpas, *args, **kwargs)
        issued.extend(hpas[:result.count].tolist())
        return result

    monkeypatch.setattr(Device, "stream_io", stream_io)
    result, out = _run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=4m\nbs=4k\nrw=randread\niodepth=1\n"
                       f"io_size=8m\n{DEVICE}")
    read = out["jobs"][0]["read"]
    assert not result.failed and read["total_ios"] == 2048 and read["clat_ns"]["N"] == 2048
    job_reads = issued[-2048:]  # (before them: the engine's one-read warm-up)
    blocks = list(range(0, 4 << 20, 4096))
    assert sorted(job_reads[:1024]) == blocks and sorted(job_reads[1024:]) == blocks
    assert job_reads[:1024] == job_reads[1024:]  # fio seeds each pass again (randrepeat): the same order


def test_an_error_making_a_chunk_ends_the_job_with_it(tmp_path, monkeypatch):
    real = IoGenerator.next_chunk
    calls = {"n": 0}

    def next_chunk(self, n):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("the generator broke")
        return real(self, n)

    monkeypatch.setattr(IoGenerator, "next_chunk", next_chunk)
    result, out = _run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=4m\nbs=4k\nrw=randread\niodepth=1\n"
                       f"io_size=8m\n{DEVICE}")
    assert result.failed and out["jobs"][0]["error"] != 0
    assert any("the generator broke" in m for m in result.messages)
    assert out["jobs"][0]["read"]["total_ios"] == 1024  # the two chunks made before it ran


def test_progress_counts_the_chunk_made_ahead_as_still_to_do(tmp_path, monkeypatch):
    """A size-based job: while its first chunk (half of the bytes) runs, the second is
    already made, so the generator's budget is spent; progress must still say ~half."""
    from cxlhm_apps.fio import runner as R
    seen = []
    real = R.Worker._account

    def account(self, chunk, done, measuring):
        real(self, chunk, done, measuring)
        seen.append(self.fraction_done())

    monkeypatch.setattr(R.Worker, "_account", account)
    result, _ = _run(f"[r]\nfilename={tmp_path / 'f.img'}\nsize=4m\nbs=4k\nrw=randread\niodepth=1\n{DEVICE}")
    assert not result.failed and len(seen) == 2  # two chunks of 512 reads
    assert seen[0] == pytest.approx(0.5, abs=0.01) and seen[1] == pytest.approx(1.0)
