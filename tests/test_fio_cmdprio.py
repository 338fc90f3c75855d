"""fio's command priorities (cmdprio_percentage / cmdprio_class / cmdprio / cmdprio_bssplit,
prioclass / prio) on libaio, io_uring and the device engine: which I/Os carry a priority,
that libaio hands it to the kernel, the per-priority latencies in fio 3.33's JSON shape,
and that the device engine says it does not order I/Os by priority."""
from __future__ import annotations

import errno
import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio.cmdprio import CmdPrio, ioprio_value, parse_cmdprio_bssplit, split_tag
from cxlhm_apps.fio.engines import IoArena
from cxlhm_apps.fio.pattern import Chunk
from cxlhm_apps.fio.raw_engines import LibaioEngine, RawEngineError, libaio_unavailable
from cxlhm_apps.fio.testing import IOEngineConformance

K = 1024
# What fio 3.33 writes per priority (from a run of cmdprio-percentage.fio on a plain file:
# `fio --output-format=json`): a "prios" list in each direction with two priorities or more
# that have samples, each entry these keys, its latency object fio's clat_ns keys.
FIO_PRIO_KEYS = ["prioclass", "prio", "clat_ns"]
FIO_LAT_KEYS = ["min", "max", "mean", "stddev", "N", "percentile"]


def _tags(prio: CmdPrio, dirs, sizes):
    return prio.tags(np.asarray(dirs, np.int8), np.asarray(sizes, np.int64))


def test_percentage_marks_that_share_with_the_class_and_level_and_the_rest_the_default():
    values = {"cmdprio_percentage": (20, 20), "cmdprio_class": (None, None), "cmdprio": (None, None),
              "cmdprio_bssplit": (None, None), "prioclass": 3, "prio": None}
    n = 200_000
    tags = _tags(CmdPrio(values, seed=7), np.zeros(n), np.full(n, 4096))
    parts = [split_tag(t) for t in tags[:5].tolist()]
    assert all(p in ((0, 3, 0), (1, 1, 0)) for p in parts)  # default prioclass=3 first, then realtime (class 1)
    share = float(np.mean((tags >> 16) == 1))
    assert 0.19 < share < 0.21


def test_bssplit_marks_only_its_block_sizes_with_each_entrys_priority_in_fios_order():
    read, write = parse_cmdprio_bssplit("64k/25/1/1:64k/75/3/2:1024k/0,1024k/0", 1024)
    values = {"cmdprio_percentage": (None, None), "cmdprio_class": (None, None), "cmdprio": (None, None),
              "cmdprio_bssplit": (read, write), "prioclass": 2, "prio": 7}
    n = 100_000
    rng = np.random.default_rng(1)
    dirs = rng.integers(0, 2, n)
    sizes = np.where(rng.integers(0, 2, n) == 1, 64 * K, 1024 * K)
    tags = _tags(CmdPrio(values, seed=3), dirs, sizes)
    index = tags >> 16
    assert set(index[(dirs == 1) | (sizes == 1024 * K)].tolist()) == {0}  # 1M and writes: 0% -> the default
    small_reads = index[(dirs == 0) & (sizes == 64 * K)]
    assert set(small_reads.tolist()) == {1, 2}  # 25% + 75% = every 64k read
    assert 0.24 < float(np.mean(small_reads == 1)) < 0.26
    assert {split_tag(t)[1:] for t in tags.tolist()} == {(2, 7), (1, 1), (3, 2)}
    assert split_tag(int(tags[index == 0][0]))[1:] == (2, 7)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([4, 8, 64]), st.integers(0, 40), st.integers(1, 3), st.integers(0, 7)),
                min_size=1, max_size=4))
def test_bssplit_entries_take_their_share_and_other_sizes_none(entries):
    assume(all(sum(p for b, p, _, _ in entries if b == bs) <= 100 for bs in (4, 8, 64)))
    text = ":".join(f"{bs}k/{pct}/{c}/{lvl}" for bs, pct, c, lvl in entries)
    read, _ = parse_cmdprio_bssplit(text + ",", 1024)
    values = {"cmdprio_bssplit": (read, None)}
    n = 20_000
    sizes = np.random.default_rng(0).choice([4 * K, 8 * K, 64 * K, 128 * K], n)
    tags = _tags(CmdPrio(values, seed=5), np.zeros(n), sizes)
    assert not (tags[sizes == 128 * K]).any()  # a size with no entry keeps the default (none)
    for bs in (4, 8, 64):
        total = sum(p for b, p, _, _ in entries if b == bs)
        mine = tags[sizes == bs * K]
        if mine.size > 500:
            assert abs(float(np.mean((mine >> 16) != 0)) - total / 100) < 0.06
        allowed = {ioprio_value(c, lvl) for b, _, c, lvl in entries if b == bs} | {0}
        assert set((mine & 0xFFFF).tolist()) <= allowed


@pytest.mark.parametrize("text, says", [
    ("1M/10/2/0/1024", "priority hint"), ("1M/10/2/0/", "priority hint"), ("64k/60:64k/50", "more than 100"), ("64k/10/4/0", "class must be 1-3"),
    ("64k", "expected BS/PERCENT"),
])
def test_bad_cmdprio_bssplit_says_what_is_accepted(text, says):
    with pytest.raises(ValueError, match=says):
        parse_cmdprio_bssplit(text, 1024)


def test_a_priority_hint_is_accepted_and_the_entry_is_its_class_and_level():
    """fio's cmdprio-bssplit example gives CDL hints; fio 3.33 runs it and reports the
    priorities by class and level alone (a hint reaches only a drive with CDL on)."""
    hinted = parse_cmdprio_bssplit("1M/10/2/0/1:1M/30/2/0/2:2M/90/2/0/0", 1024)
    plain = parse_cmdprio_bssplit("1M/10/2/0:1M/30/2/0:2M/90/2/0", 1024)
    assert hinted == plain


@pytest.mark.skipif(libaio_unavailable() is not None, reason="no Linux native AIO here")
def test_libaio_hands_the_priority_to_the_kernel(tmp_path):
    """An invalid priority class (7) is refused by io_submit with EINVAL only when
    IOCB_FLAG_IOPRIO carries it: the flag and aio_reqprio reach the kernel."""
    path = tmp_path / "f"
    path.write_bytes(b"\0" * (1 << 20))
    engine = LibaioEngine(str(path), 1 << 20, 4, direct=False, writes=False, values={})
    arena = IoArena(4, 4096)
    chunk = Chunk(np.zeros(4, np.int8), np.arange(4, dtype=np.int64) * 4096, np.full(4, 4096, np.int64),
                  np.arange(4, dtype=np.int64))

    class Fixed:
        def __init__(self, ioprio):
            self.ioprio = ioprio

        def tags(self, direction, size):
            return np.full(direction.shape[0], self.ioprio, np.int64)
    try:
        engine.cmdprio = Fixed(ioprio_value(1, 0))
        assert engine.execute(chunk, arena, 1 << 62, keep_read_data=False).count == 4
        engine.cmdprio = Fixed(7 << 13)
        with pytest.raises(RawEngineError) as err:
            engine.execute(chunk, arena, 1 << 62, keep_read_data=False)
        assert err.value.errno == errno.EINVAL
    finally:
        engine.close()


JOB = """[global]
filename={path}
size=8m
direct=0
time_based
runtime=300ms
[randread]
rw=randread
bs=4k
ioengine={engine}
iodepth=8
prioclass=3
cmdprio_percentage=20
cmdprio_class=1
"""


def _job(tmp_path, engine):
    job = tmp_path / f"{engine}.fio"
    job.write_text(JOB.format(path=tmp_path / "data", engine=engine))
    return job


def _run(cmd, tmp_path, engine):
    job = _job(tmp_path, engine)
    out = subprocess.run([*cmd, "--output-format=json", str(job)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout[out.stdout.index("{"):])


def _check_fio_shape(report):
    read, write = report["jobs"][0]["read"], report["jobs"][0]["write"]
    assert "prios" not in write  # no writes: fewer than two priorities with samples
    prios = read["prios"]
    assert [(p["prioclass"], p["prio"]) for p in prios] == [(3, 0), (1, 0)]  # the default first
    for p in prios:
        assert list(p) == FIO_PRIO_KEYS
        assert list(p["clat_ns"]) == FIO_LAT_KEYS
    assert sum(p["clat_ns"]["N"] for p in prios) == read["total_ios"]
    keys = list(read)
    assert keys.index("lat_ns") + 1 == keys.index("prios")  # where fio puts it


@pytest.mark.parametrize("engine", ["libaio", "io_uring", "cxlhm"])
def test_cxlhm_writes_fios_per_priority_latencies(tmp_path, engine):
    rc, report, said = IOEngineConformance.fio(str(_job(tmp_path, engine)))
    assert rc == 0, said
    _check_fio_shape(report)


@pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed")
def test_real_fio_writes_the_same_shape(tmp_path):
    _check_fio_shape(_run(["fio"], tmp_path, "libaio"))


def _log_column(path) -> list[int]:
    return [int(line.rsplit(",", 1)[1], 0) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("runner", ["cxlhm", "fio"])
def test_per_io_logs_mark_realtime_ios_and_log_prio_writes_the_values(tmp_path, runner):
    """fio's per-I/O log lines end in 1 for an I/O of the realtime class (else 0); with
    log_prio=1 in its priority value (class << 13 | level); averaged lines in 0."""
    if runner == "fio" and shutil.which("fio") is None:
        pytest.skip("real fio is not installed")
    job = _job(tmp_path, "libaio")
    # a count of I/Os, not 300 ms, from the page cache: an idle-class job on a loaded disk
    # may do a handful of I/Os in 300 ms, too few to show both classes
    job.write_text(job.read_text().replace("time_based\nruntime=300ms\n", "number_ios=600\ninvalidate=0\n")
                   .replace("[randread]", f"write_lat_log={tmp_path / 'lg'}\n[randread]"))

    def run_job():
        """The job's report under cxlhm (None under fio, whose logs alone are compared)."""
        if runner == "fio":
            subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True,
                           timeout=120, check=True, cwd=tmp_path)
            return None
        rc, report, said = IOEngineConformance.fio(str(job))
        assert rc == 0, said
        return report

    def last_column() -> list[str]:
        return [line.rsplit(", ", 1)[1] for line in (tmp_path / "lg_clat.1.log").read_text().splitlines()]

    report = run_job()
    marks = _log_column(tmp_path / "lg_clat.1.log")
    n = len(marks)
    assert set(marks) <= {0, 1} and abs(marks.count(1) / n - 0.2) <= 5 * (0.16 / n) ** 0.5  # cmdprio_percentage=20
    if report is not None:
        realtime = next(p for p in report["jobs"][0]["read"]["prios"] if p["prioclass"] == 1)
        assert marks.count(1) == realtime["clat_ns"]["N"]  # the log's realtime I/Os are the report's
    job.write_text(job.read_text() + "log_prio=1\n")
    run_job()
    assert set(last_column()) == {"0x2000", "0x6000"}  # fio: 0x%04x
    assert set(_log_column(tmp_path / "lg_clat.1.log")) == {ioprio_value(1, 0), ioprio_value(3, 0)}
    job.write_text(job.read_text() + "log_avg_msec=100\n")
    run_job()
    assert set(last_column()) == {"0x0000"}


def test_prioclass_and_prio_run_the_jobs_io_at_that_priority_and_give_the_thread_back(tmp_path):
    """fio sets prioclass/prio on the job's thread (ioprio_set) on any engine: the I/O
    runs at that priority, and the thread (runner threads outlive a job) has its own back."""
    from cxlhm_apps.fio.cmdprio import thread_ioprio
    from cxlhm_apps.fio.raw_engines import PsyncEngine
    path = tmp_path / "f"
    path.write_bytes(b"\0" * (1 << 16))
    seen = []

    class Watching(PsyncEngine):
        def _io(self, buf, offset, write):
            seen.append(thread_ioprio())
            return super()._io(buf, offset, write)
    engine = Watching(str(path), 1 << 16, 1, direct=False, writes=False, values={"prioclass": 2, "prio": 5})
    chunk = Chunk(np.zeros(2, np.int8), np.array([0, 4096], np.int64), np.full(2, 4096, np.int64),
                  np.arange(2, dtype=np.int64))
    before = thread_ioprio()
    try:
        assert engine.execute(chunk, IoArena(2, 4096), 1 << 62, keep_read_data=False).count == 2
    finally:
        engine.close()
    assert seen == [ioprio_value(2, 5)] * 2
    assert thread_ioprio() == before


def test_text_output_has_fios_per_priority_lines(tmp_path):
    """fio 3.33's normal output: a `clat prio C/L` line per priority after the latencies,
    and `clat prio C/L (P% of IOs) percentiles` blocks after the percentiles."""
    import re

    from cxlhm_apps.fio import report
    from cxlhm_apps.fio.jobfile import load_jobs
    from cxlhm_apps.fio.runner import run_jobs
    jobs, _ = load_jobs([str(_job(tmp_path, "libaio"))])
    text = report.format_normal(run_jobs(jobs, log=lambda _: None))
    lines = text.splitlines()
    at = [i for i, line in enumerate(lines) if re.match(r"    clat prio [13]/0 \((nsec|usec|msec)\): min=", line)]
    assert len(at) == 2 and "prio 3/0" in lines[at[0]] and at[1] == at[0] + 1
    shares = [float(m) for m in re.findall(r"    clat prio [13]/0 \((\d+\.\d\d)% of IOs\) percentiles", text)]
    assert len(shares) == 2 and abs(sum(shares) - 100) < 0.02 and 0 < shares[1] < 60  # (the share itself: tests above; a 300 ms job under load does few I/Os)


DEVICE_NOTE = "the device model does not order I/Os by priority"


def test_the_device_engine_keeps_each_ios_priority_in_its_logs_and_says_it_does_not_order_by_it(tmp_path):
    """ioengine=cxlhm: the priorities libaio would send reach fio's per-priority statistics
    and log_prio's column, with a note that the device serves them alike (not a silent
    substitution); the note is the device's only."""
    job = _job(tmp_path, "cxlhm")
    job.write_text(job.read_text().replace("[randread]", f"write_lat_log={tmp_path / 'lg'}\nlog_prio=1\n[randread]"))
    rc, report, said = IOEngineConformance.fio(str(job))
    assert rc == 0, said
    notes = [line for line in said.splitlines() if DEVICE_NOTE in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: {job}:") and "job 'randread'" in notes[0], said
    assert "prioclass/cmdprio_percentage/cmdprio_class" in notes[0]
    column = _log_column(tmp_path / "lg_clat.1.log")
    assert set(column) == {ioprio_value(1, 0), ioprio_value(3, 0)}  # cmdprio_class=1 level 0, prioclass=3
    realtime = next(p for p in report["jobs"][0]["read"]["prios"] if p["prioclass"] == 1)
    assert column.count(ioprio_value(1, 0)) == realtime["clat_ns"]["N"]
    n = len(column)
    assert abs(realtime["clat_ns"]["N"] / n - 0.2) <= 5 * (0.16 / n) ** 0.5  # cmdprio_percentage=20
    rc, _report, said = IOEngineConformance.fio(str(_job(tmp_path, "libaio")))
    assert rc == 0 and DEVICE_NOTE not in said


def test_the_device_engine_splits_priorities_by_block_size_and_refuses_what_fio_refuses(tmp_path):
    from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
    base = (f"[j]\nfilename={tmp_path / 'd.img'}\nioengine=cxlhm\nsize=4m\nrw=randread\nruntime=200ms\n"
            "time_based\niodepth=4\nbssplit=4k/50:16k/50\n")
    job = tmp_path / "split.fio"
    job.write_text(base + "cmdprio_bssplit=4k/100/1/2:16k/0\nprioclass=2\nprio=7\n")
    rc, report, said = IOEngineConformance.fio(str(job))
    assert rc == 0, said
    read = report["jobs"][0]["read"]
    prios = {(p["prioclass"], p["prio"]): p["clat_ns"]["N"] for p in read["prios"]}
    assert list(prios) == [(2, 7), (1, 2)] and sum(prios.values()) == read["total_ios"]
    assert abs(prios[(1, 2)] / read["total_ios"] - 0.5) < 0.2  # every 4k read (half by count), no 16k one
    with pytest.raises(JobFileError, match="exclusive"):
        jobs, _ = build_jobs([read_sections(base + "cmdprio_bssplit=4k/10\ncmdprio_percentage=5\n", "t.fio")])
        from cxlhm_apps.fio.runner import run_jobs
        run_jobs(jobs, log=lambda _: None)


@pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed")
@pytest.mark.parametrize("example", ["cmdprio-percentage.fio", "latency-profile.fio"])
def test_fios_priority_and_latency_examples_run_on_the_device(example, tmp_path):
    """fio's own examples with ioengine=cxlhm swapped in agree with fio (they were refused
    on the device: priorities, and the latency search's depth)."""
    from cxlhm_apps.fio import compat
    folder = compat.corpus_dir()
    if folder is None or compat.check_corpus(folder, compat.read_manifest(), (example,)):
        pytest.skip("fio's examples are not here (python -m cxlhm_apps.fio.compat --fetch)")
    row = compat.run_example(folder / example, shutil.which("fio"), size_cap=1 << 20, runtime_cap_s=1, keep=tmp_path,
                             engine="cxlhm")
    assert row.status == "agrees", row.detail
