"""fsync=N, fdatasync=N, end_fsync, fsync_on_close with fio 3.33's meaning
(cxlhm_apps/fio/syncs.py): where the syncs fall among the I/Os, how many, and how the
report counts them. Golden counts are real fio 3.33's for the same job (psync: one I/O at
a time, so fio's sequence is exact); where fio is installed each is also checked live."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio import report
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.syncs import FDATASYNC, FSYNC, SyncSchedule
from fio_helpers import FIO, real_fio_job, run_ours as _ours

# (job lines, (writes, reads, fsyncs = sync total_ios, syncs = sync lat N)) as fio 3.33 ran them
GOLDEN = [
    ("size=4m\nbs=64k\nfsync=4\n", (64, 0, 15, 15)),  # no I/O follows the 64th write: 15
    ("size=4m\nbs=64k\nfdatasync=4\n", (64, 0, 0, 15)),  # fdatasyncs: in N, not in total_ios
    ("size=4m\nbs=64k\nfsync=5\n", (64, 0, 12, 12)),
    ("size=4m\nbs=64k\nfsync=4\nfdatasync=2\n", (64, 0, 15, 31)),  # fsync first where both fall due
    ("size=4m\nbs=64k\nend_fsync=1\nfsync_on_close=1\n", (64, 0, 0, 0)),  # neither is counted
    ("size=4m\nbs=64k\nrw=randrw\nrandseed=3\nfsync=3\n", (36, 28, 25, 25)),  # reads after the 3rd write sync too
    ("size=24000\nbs=2300\nfsync=1\n", (10, 0, 10, 10)),  # bytes left no block fits: one more as fio looks
    ("size=24000\nbs=2300\nloops=3\nfsync=2\n", (30, 0, 17, 17)),  # each new pass syncs again
    ("size=23000\nbs=2300\nloops=3\nfsync=10\n", (30, 0, 4, 4)),
    ("size=24000\nbs=2300\nio_size=72000\nfsync=10\n", (32, 0, 6, 6)),
    ("size=24000\nbs=2300\nloops=2\nrw=randwrite\nfsync=2\n", (20, 0, 11, 11)),
    ("size=1m\nbs=2300\nfdatasync=1\n", (455, 0, 0, 455)),  # the etcd disk check, smaller
]


def _job(path, lines: str, engine: str = "psync") -> str:
    return f"[j]\nfilename={path}\nrw=write\nioengine={engine}\n{lines}"


def _counts(job: dict) -> tuple[int, int, int, int]:
    return (job["write"]["total_ios"], job["read"]["total_ios"], job["sync"]["total_ios"],
            job["sync"]["lat_ns"]["N"])


@pytest.mark.parametrize("lines,want", GOLDEN)
def test_syncs_fall_where_fios_do(tmp_path, lines, want):
    _, job = _ours(_job(tmp_path / "f", lines))
    assert job["error"] == 0
    assert _counts(job) == want
    syncs = want[3]
    if syncs:  # each in the depth histogram at depth 1, over the reads and writes
        assert job["iodepth_level"]["1"] == pytest.approx(100.0 * (want[0] + want[1] + syncs) / (want[0] + want[1]))
        assert job["sync"]["lat_ns"]["min"] > 0 and "99.000000" in job["sync"]["lat_ns"]["percentile"]


@pytest.mark.skipif(FIO is None, reason="real fio is not installed")
@pytest.mark.parametrize("lines,want", GOLDEN)
def test_the_goldens_are_real_fios(tmp_path, lines, want):
    assert _counts(real_fio_job(_job(tmp_path / "f", lines))) == want


def test_a_sequential_job_stops_where_no_block_fits_before_the_end(tmp_path):
    # fio neither wraps the block that would cross the end nor writes past it
    _, job = _ours(_job(tmp_path / "f", "size=24000\nbs=2300\n"))
    assert (job["write"]["total_ios"], job["write"]["io_bytes"]) == (10, 23000)
    assert (tmp_path / "f").stat().st_size == 24000


def test_the_text_report_shows_the_syncs_as_fio(tmp_path):
    result, _ = _ours(_job(tmp_path / "f", "size=4m\nbs=64k\nfsync=4\n"))
    text = report.format_normal(result)
    assert "  fsync/fdatasync/sync_file_range:\n    sync (" in text
    assert "    sync percentiles (" in text
    assert "issued rwts: total=0,64,0,15 " in text
    assert "IO depths    : 1=123.4%" in text


def test_the_device_syncs_by_writing_its_dirty_dram_back(tmp_path):
    lines = "size=1m\nbs=4k\nfsync=64\ncxlhm_dram=1m\ncxlhm_block_size=4k\ncxlhm_clock=wall\n"
    result, job = _ours(_job(tmp_path / "f", lines, "cxlhm"))
    assert job["error"] == 0 and _counts(job)[2:] == (3, 3)  # 256 writes: after the 64th, 128th, 192nd
    assert result.devices[0]["counters"]["writebacks"] >= 192  # each sync wrote its 64 blocks back


def test_the_model_clock_refuses_syncs_and_says_why(tmp_path):
    lines = "size=1m\nbs=4k\nfsync=64\ncxlhm_dram=1m\ncxlhm_block_size=4k\ncxlhm_clock=model\n"
    result, job = _ours(_job(tmp_path / "f", lines, "cxlhm"))
    assert job["error"] != 0
    assert any("cxlhm_clock=wall" in m for m in result.messages), result.messages


@pytest.mark.parametrize("engine", ["io_uring", "libaio", "posixaio"])
def test_a_queued_engine_syncs_once_per_due_point(tmp_path, engine):
    # fio's count races with completions there (the module says why); ours is the
    # one-at-a-time count, the in-flight writes complete before each sync
    _, job = _ours(_job(tmp_path / "f", "size=4m\nbs=64k\niodepth=16\nfsync=4\n", engine))
    assert job["error"] == 0 and _counts(job) == (64, 0, 15, 15)


# ---------------------------------------------------------------- the schedule against fio's loop

def _fio_loop(directions, fsync_every, fdatasync_every, pass_starts, bytes_left_at_end):
    """fio 3.33's get_rw_ddir, one I/O at a time: the kinds of syncs in order."""
    out, writes, last_was_sync = [], 0, False
    starts = set(pass_starts)

    def due():
        if last_was_sync or not writes:
            return 0
        if fsync_every and writes % fsync_every == 0:
            return FSYNC
        if fdatasync_every and writes % fdatasync_every == 0:
            return FDATASYNC
        return 0
    for i, d in enumerate(directions):
        if i in starts:  # the pass before ends as fio looks for this I/O, and clear_io_state
            if due():
                out.append(due())
                last_was_sync = True
            last_was_sync = False
        if due():
            out.append(due())
            last_was_sync = True
        writes += d == WRITE
        last_was_sync = False
    if bytes_left_at_end and due():
        out.append(due())
    return out


@settings(max_examples=200, deadline=None)
@given(directions=st.lists(st.sampled_from([READ, WRITE]), min_size=1, max_size=60),
       fsync_every=st.integers(0, 5), fdatasync_every=st.integers(0, 5),
       pass_starts=st.lists(st.integers(1, 59), max_size=4, unique=True), cuts=st.lists(st.integers(1, 9), min_size=1))
def test_the_schedule_in_any_batches_is_fios_loop(directions, fsync_every, fdatasync_every, pass_starts, cuts):
    if not (fsync_every or fdatasync_every):
        fsync_every = 1
    pass_starts = sorted(p for p in pass_starts if p < len(directions))
    want = _fio_loop(directions, fsync_every, fdatasync_every, pass_starts, True)
    sched, got = SyncSchedule(fsync_every, fdatasync_every, pass_starts), []
    pending, k = np.array(directions, np.int8), 0
    while pending.shape[0]:  # the runner's loop: a sync where due, then a batch up to the next one
        if sched.due():
            got.append(sched.due())
            sched.did_sync()
            continue
        batch = pending[:min(cuts[k % len(cuts)], sched.run_length(pending))]
        k += 1
        sched.did_ios(batch)
        pending = pending[batch.shape[0]:]
    if sched.due():  # bytes left at the end that no block fits in
        got.append(sched.due())
    assert got == want

