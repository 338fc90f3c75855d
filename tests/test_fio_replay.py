"""read_iolog: a job's I/O replayed from an I/O log, as fio 3.33 replays it (the log's
I/O, file, syncs and timing in place of rw, bs, size and filename)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cxlhm_apps.fio import iolog_replay as R
from cxlhm_apps.fio.jobfile import JobFileError, JobFileErrors
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.syncs import FDATASYNC, FSYNC

from fio_helpers import FIO, real_fio_job, run_ours

needs_fio = pytest.mark.skipif(FIO is None, reason="real fio is not installed (apt-get install fio)")

DEFAULTS = {"replay_skip": frozenset(), "replay_no_stall": False, "replay_time_scale": 100,
            "replay_redirect": None, "replay_scale": 1, "replay_align": 0}


def v3(*lines: str) -> str:
    return "fio version 3 iolog\n" + "".join(line + "\n" for line in lines)


def read(tmp_path, text: str, **options) -> R.ReplayLog:
    path = tmp_path / "io.log"
    path.write_text(text)
    return R.read_log(str(path), {**DEFAULTS, **options})


def totals(doc: dict) -> tuple:
    return tuple((doc[d]["total_ios"], doc[d]["io_bytes"]) for d in ("read", "write")) + (doc["sync"]["total_ios"],)


# ---------------------------------------------------------------- reading a log

def test_a_v3_log_gives_its_ios_in_order_with_the_gaps_between_its_lines(tmp_path):
    log = read(tmp_path, v3("10 f add", "30 f open", "40 f write 8192 4096", "45 f read 0 512",
                            "45 f sync 0 0", "70 f write 4096 4096", "80 f close"))
    assert log.file == "f" and log.version == 3
    assert log.direction.tolist() == [WRITE, READ, WRITE]
    assert log.offset.tolist() == [8192, 0, 4096] and log.size.tolist() == [4096, 512, 4096]
    # each line's gap from the one before, in ns; the open's gap goes to the next I/O, the sync's too
    assert log.gap_ns.tolist() == [30_000, 5_000, 25_000]
    assert log.sync_at.tolist() == [2] and log.sync_kind.tolist() == [FSYNC]
    assert log.extent == 12288 and log.rw().name == "rw"


def test_the_replay_options_shape_the_log(tmp_path):
    text = v3("1 f add", "2 f write 12288 4096", "4 f read 5000 4096", "6 f datasync 0 0", "8 f sync 0 0")
    log = read(tmp_path, text, replay_scale=2, replay_align=4096, replay_time_scale=200, replay_skip=frozenset({"sync"}))
    assert log.offset.tolist() == [4096, 0]  # 12288 / 2 = 6144 -> 4096; 5000 / 2 = 2500 -> 0
    assert log.gap_ns.tolist() == [500, 1000]  # twice as fast
    assert log.sync_kind.tolist() == [FDATASYNC]  # replay_skip=sync leaves fsyncs out, not datasyncs
    log = read(tmp_path, text, replay_no_stall=True, replay_skip=frozenset({"read"}), replay_redirect="g")
    assert log.file == "g" and log.direction.tolist() == [WRITE] and not log.paced


def test_lines_fio_cannot_read_are_skipped_with_its_words(tmp_path):
    log = read(tmp_path, v3("1 f add", "2 f write 0", "garbage", "3 f frobnicate 0 4096", "4 f read 0 4096",
                            "5 f wait 10 0"))
    assert log.direction.tolist() == [READ]
    assert [m.split(" (")[0] for m in log.skipped] == [
        "bad iolog3: 2 f write 0", "bad iolog3: garbage", "fio: bad iolog file action: frobnicate",
        "iolog: ignoring wait command with version 3 for file f"]
    assert log.skipped[0].endswith("io.log:3)")  # (the line, counted from 1 with the header)


def test_a_v2_wait_holds_the_next_io_until_its_time_from_the_runs_start(tmp_path):
    log = read(tmp_path, "fio version 2 iolog\nf add\nf open\nf write 0 4096\nf wait 300 0\nf read 0 4096\n")
    assert log.not_before_ns.tolist() == [0, 300_000_000] and log.gap_ns.tolist() == [0, 0]
    assert not read(tmp_path, "fio version 2 iolog\nf add\nf read 0 4096\nf wait 300 0\nf read 0 4096\n",
                    replay_no_stall=True).paced


@pytest.mark.parametrize("text, says", [
    ("f add\nf read 0 4096\n", "iolog version 1 is no longer supported"),
    (v3("1 f add", "2 f trim 0 4096"), "trim is not modelled"),
    (v3("1 f add", "2 g read 0 4096"), "a file the log never added"),
    (v3("1 f add", "2 f close", "3 f read 0 4096"), "after the log closed it"),
    (v3("1 f add", "1 g add", "2 f read 0 4096", "3 g read 0 4096"), "one file per job is modelled"),
    (v3("1 f add", "2 f read 0 0"), "an I/O moves at least one byte"),
    (v3("1 f add", "2 f read 0 4294967296"), "32-bit"),
    (v3("1 f add", "2 f open"), "holds no I/O"),
])
def test_a_log_that_cannot_be_replayed_says_why_and_where(tmp_path, text, says):
    with pytest.raises(R.ReplayError, match=says):
        read(tmp_path, text)


def test_skipping_the_trims_lets_a_trimming_log_replay(tmp_path):
    log = read(tmp_path, v3("1 f add", "2 f trim 0 4096", "3 f write 0 4096"), replay_skip=frozenset({"trim"}))
    assert log.direction.tolist() == [WRITE]


def test_a_blktrace_is_refused_by_name(tmp_path):
    path = tmp_path / "sda.blktrace.0"
    path.write_bytes((0x65617407).to_bytes(4, "little") + bytes(60))
    with pytest.raises(R.ReplayError, match="blktrace"):
        R.read_log(str(path), DEFAULTS)


_ENTRY = st.one_of(
    st.tuples(st.just("io"), st.sampled_from(["read", "write"]), st.integers(0, 1 << 30), st.integers(1, 1 << 20)),
    st.tuples(st.just("sync"), st.sampled_from(["sync", "datasync"])),
    st.tuples(st.just("open")), st.tuples(st.just("junk"), st.text("abc xyz", max_size=12)))


@settings(max_examples=60, deadline=None)
@given(entries=st.lists(st.tuples(_ENTRY, st.integers(0, 5000)), max_size=40))
def test_any_v3_log_replays_as_a_plain_reading_of_its_lines(tmp_path_factory, entries):
    """Against a reference that reads the lines one by one: the I/Os in order, each gap
    the time since the line before it (whatever that line was), syncs before the I/O
    that follows them."""
    lines, t = ["1 f add"], 1  # (a line at time 0 would start no gap: fio's last time 0 is "none yet")
    want_ios, want_gaps, want_syncs, last = [], [], [], 1
    pending = 0
    for entry, step in entries:
        t += step
        kind = entry[0]
        gap = (t - last) * 1000
        if kind == "io":
            lines.append(f"{t} f {entry[1]} {entry[2]} {entry[3]}")
            want_ios.append(({"read": READ, "write": WRITE}[entry[1]], entry[2], entry[3]))
            want_gaps.append(pending + gap)
            pending = 0
        elif kind == "sync":
            lines.append(f"{t} f {entry[1]} 0 0")
            want_syncs.append((len(want_ios), {"sync": FSYNC, "datasync": FDATASYNC}[entry[1]]))
            pending += gap
        elif kind == "open":
            lines.append(f"{t} f open")
            pending += gap
        else:
            text = entry[1].strip()
            lines.append(f"{t} junk! {text}")  # (a bad line: its time still counts, as fio's sscanf read it)
            # (its gap is lost: fio skips the line after taking its time)
        last = t
    if not want_ios and not want_syncs:
        return
    log = read(tmp_path_factory.mktemp("log"), v3(*lines))
    assert [(int(d), int(o), int(s)) for d, o, s in zip(log.direction, log.offset, log.size)] == want_ios
    assert log.gap_ns.tolist() == want_gaps
    assert list(zip(log.sync_at.tolist(), log.sync_kind.tolist())) == want_syncs


# ---------------------------------------------------------------- the pacer

class FakeClock:
    def __init__(self):
        self.t = 0

    def now(self) -> int:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += int(seconds * 1e9) + 1


class Chunk:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def test_the_pacer_keeps_the_logs_gaps_and_never_runs_ahead(tmp_path):
    log = read(tmp_path, v3("1 f add", "2 f write 0 4096", "5002 f write 4096 4096", "5003 f write 8192 4096",
                            "5004 f write 0 4096", "12004 f write 0 4096"))
    clock = FakeClock()
    pacer = R.ReplayPacer(log, 0, threading.Event(), sleep=clock.sleep)
    pacer.restart(0)
    issued = []
    left = 5
    while left:
        n = pacer.admit(Chunk(left), clock.now, 2**62)
        issued.append((clock.t, n))
        pacer.did(Chunk(n))
        left -= n
    # the first I/O 1 us after the add; the next three, 5 ms on, in one batch (1 us apart); the last 7 ms after
    starts = [t for t, _ in issued]
    assert [n for _, n in issued] == [1, 3, 1]
    assert starts[1] >= 5_001_000 - R.BATCH_HORIZON_NS and starts[2] >= 12_002_000 - R.BATCH_HORIZON_NS
    assert starts[2] - starts[1] >= 7_000_000 - R.BATCH_HORIZON_NS


def test_the_pacer_gives_up_when_the_job_time_ends(tmp_path):
    log = read(tmp_path, v3("1 f add", "2 f write 0 4096", "900000 f write 0 4096"))
    clock = FakeClock()
    pacer = R.ReplayPacer(log, 0, threading.Event(), sleep=clock.sleep)
    pacer.restart(0)
    assert pacer.admit(Chunk(2), clock.now, 10**9) == 1
    pacer.did(Chunk(1))
    assert pacer.admit(Chunk(1), clock.now, 10**8) == 0 and clock.t >= 10**8


# ---------------------------------------------------------------- whole jobs

def write_log(tmp_path, ios: int = 64) -> str:
    rng = np.random.default_rng(3)
    lines = [f"1 {tmp_path}/data add", f"2 {tmp_path}/data open"]
    for i in range(ios):
        d = "write" if i % 3 else "read"
        lines.append(f"{3 + i} {tmp_path}/data {d} {int(rng.integers(0, 256)) * 4096} {4096 * (1 + i % 2)}")
        if i % 10 == 9:
            lines.append(f"{3 + i} {tmp_path}/data sync 0 0")
    lines.append(f"{ios + 5} {tmp_path}/data close")
    path = tmp_path / "io.log"
    path.write_text(v3(*lines))
    return str(path)


def test_a_replayed_job_does_the_logs_io_on_the_logs_file_once(tmp_path):
    log = write_log(tmp_path)
    (tmp_path / "data").write_bytes(bytes(2 << 20))
    text = (f"[r]\nread_iolog={log}\nioengine=psync\nfilename={tmp_path}/unused\nrw=randread\nbs=64k\nsize=64k\n"
            "loops=3\n")
    result, doc = run_ours(text)
    parsed = R.read_log(log, DEFAULTS)
    want = tuple((int((parsed.direction == d).sum()), int(parsed.size[parsed.direction == d].sum()))
                 for d in (READ, WRITE)) + (6,)
    assert totals(doc) == want
    assert not (tmp_path / "unused").exists()  # (the log's file, not the job's)
    assert result.clones[0].plan.filename == f"{tmp_path}/data"


def test_a_replayed_write_lands_at_the_logged_offset(tmp_path):
    (tmp_path / "data").write_bytes(bytes(1 << 20))
    (tmp_path / "io.log").write_text(v3(f"1 {tmp_path}/data add", f"2 {tmp_path}/data write 8192 4096"))
    run_ours(f"[r]\nread_iolog={tmp_path}/io.log\nioengine=psync\n")
    data = (tmp_path / "data").read_bytes()
    assert any(data[8192:12288]) and not any(data[:8192]) and not any(data[12288:])


def test_a_replay_job_that_cannot_read_its_log_names_the_option(tmp_path):
    with pytest.raises((JobFileError, JobFileErrors), match="read_iolog"):
        run_ours(f"[r]\nread_iolog={tmp_path}/missing.log\nioengine=psync\n")


@pytest.mark.parametrize("option", ["verify=crc32c", "rate=1m", "thinktime=10"])
def test_options_that_would_reshape_a_replay_are_refused(tmp_path, option):
    log = write_log(tmp_path)
    with pytest.raises((JobFileError, JobFileErrors), match="with read_iolog is not modelled"):
        run_ours(f"[r]\nread_iolog={log}\nioengine=psync\n{option}\n")


def test_write_iolog_gives_way_to_read_iolog_as_in_fio(tmp_path):
    log = write_log(tmp_path)
    notes = []
    run_ours(f"[r]\nread_iolog={log}\nwrite_iolog={tmp_path}/out.log\nioengine=psync\nreplay_no_stall=1\n",
             log=notes.append)
    assert "fio: read iolog overrides write_iolog" in notes and not (tmp_path / "out.log").exists()


def test_the_log_write_iolog_wrote_replays_the_same_io(tmp_path):
    (tmp_path / "data").write_bytes(bytes(1 << 20))
    _, first = run_ours(f"[w]\nfilename={tmp_path}/data\nrw=randrw\nbssplit=4k/50:16k/50\nsize=1m\nioengine=psync\n"
                        f"fsync=7\nwrite_iolog={tmp_path}/w.log\n")
    _, again = run_ours(f"[r]\nread_iolog={tmp_path}/w.log\nioengine=psync\nreplay_no_stall=1\n")
    assert totals(again) == totals(first)


@needs_fio
@pytest.mark.parametrize("extra", ["", "replay_no_stall=1", "replay_scale=3\nreplay_align=8k", "ioengine=libaio"])
def test_fio_and_cxlhm_replay_the_same_log_alike(tmp_path, extra):
    """(Not at iodepth > 1, nor with replay_skip: there fio 3.33 reports fewer bytes than
    the log's I/Os move, and ignores replay_skip; the later fio the corpora come from
    agrees with cxlhm on both.)"""
    log = write_log(tmp_path)
    (tmp_path / "data").write_bytes(bytes(2 << 20))
    text = f"[r]\nread_iolog={log}\nioengine=psync\n{extra}\n"
    theirs = real_fio_job(text)
    _, ours = run_ours(text)
    assert totals(ours) == totals(theirs)
