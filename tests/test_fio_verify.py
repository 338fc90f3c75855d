"""Verification means what it means in fio 3.33: the same header, the same history of
writes, the same checks in the same order - so a job fails under cxlhm exactly when it
fails under fio, for the same reason - and the report counts the blocks it checked."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio import report
from cxlhm_apps.fio import verify as VF
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

DEVICE = "ioengine=cxlhm\ncxlhm_dram=1m\ncxlhm_block_size=4k\ncxlhm_clock=wall\n"
RAW = "ioengine=io_uring\n"


def run(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return result, report.to_json(result, globals_)["jobs"][0]


def job(path, rw, extra=""):
    # serialize_overlap: two overlapping writes in flight may land in either order on a
    # real disk, and verify then fails at random (in fio too); the cases test history
    return (f"[v]\nfilename={path}\nsize=1m\nio_size=512k\nrw={rw}\nbs=4k\niodepth=8\nverify=crc32c\n"
            f"randseed=7\nserialize_overlap=1\n{extra}")


# (rw, options, fails, reason) - as fio 3.33 decides (checked against it below)
CASES = [
    ("randrw", "random_distribution=zipf:1.2\n", True, "bad header rand_seed"),  # history by offset, not write order
    ("randrw", "norandommap=1\n", True, "bad header rand_seed"),
    ("randrw", "", False, None),  # random map: history in write order, no block twice
    ("randwrite", "random_distribution=zipf:1.2\n", False, None),  # write-only: seeds come from the headers
    ("write", "", False, None),
]


@pytest.mark.parametrize("engine", ["cxlhm", "io_uring"])
@pytest.mark.parametrize("rw,extra,fails,reason", CASES)
def test_verify_fails_where_fio_fails_for_the_same_reason(tmp_path, engine, rw, extra, fails, reason):
    result, out = run(job(tmp_path / "f.img", rw, extra) + (DEVICE if engine == "cxlhm" else RAW))
    assert (out["error"] == 84) == fails, result.messages[:3]
    if fails:
        assert result.messages and all(reason in m for m in result.messages), result.messages[:3]
    assert out["cxlhm_verify"]["blocks_checked"] > 0
    assert (out["cxlhm_verify"]["failures"] > 0) == fails


@pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed")
@pytest.mark.parametrize("rw,extra,fails,reason", CASES)
def test_real_fio_agrees(tmp_path, rw, extra, fails, reason):
    text = job(tmp_path / "fio.img", rw, extra) + "ioengine=io_uring\ndirect=1\n"
    proc = subprocess.run(["fio", "--output-format=json", "-"], input=text, capture_output=True, text=True,
                          cwd=tmp_path)  # fio leaves its verify state file in its folder
    assert (proc.returncode != 0) == fails, proc.stderr[:500]
    if fails:
        assert reason in proc.stderr
        assert json.loads(proc.stdout[proc.stdout.find("{"):])["jobs"][0]["error"] == 84


def test_blocks_checked_counts_each_block_read_back(tmp_path):
    """A sequential write of 128 blocks verifies 128 blocks; a read job over them checks
    every block it reads."""
    path = tmp_path / "f.img"
    _, out = run(f"[w]\nfilename={path}\nsize=512k\nrw=write\nbs=4k\nverify=md5\n{RAW}")
    assert out["cxlhm_verify"] == {"blocks_checked": 128, "failures": 0}
    _, out = run(f"[r]\nfilename={path}\nsize=512k\nrw=read\nbs=4k\nverify=md5\n{RAW}")
    assert out["cxlhm_verify"] == {"blocks_checked": 128, "failures": 0} and out["error"] == 0


def test_header_is_fios():
    block = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)
    VF.stamp(block, VF.TYPES["crc32c"], 8192, seed=12345, numberio=7)
    assert block[0:2].view(np.uint16)[0] == 0xACCA and block[4:8].view(np.uint32)[0] == 4096
    assert tuple(block[8:24].view(np.uint64)) == (12345, 8192)
    assert block[36:40].view(np.uint32)[0] == VF.fio_crc32c(block[:36])  # the header checks itself
    assert VF.check(block, 5, 8192, 12345, 7) is None
    assert "rand_seed" in VF.check(block, 5, 8192, 12346, 7).what
    assert "numberio" in VF.check(block, 5, 8192, 12345, 8).what
    assert "offset" in VF.check(block, 5, 4096).what
    block[100] ^= 1
    assert "crc32c: verify failed" in VF.check(block, 5, 8192).what
    block[100] ^= 1
    block[30] ^= 1  # a header field no other check reads: the header's own crc catches it
    assert "bad header crc" in VF.check(block, 5, 8192).what


def test_history_orders_like_fio():
    """List: write order, repeats kept; tree: by offset, a write drops what it overlaps."""
    def entries(log, *writes):
        for n, (offset, size) in enumerate(writes):
            log.add(VF.Written(offset, size, n, n))
        return [(e.offset, e.numberio) for e in log.take()]
    listed = VF.VerifyLog(ordered_by_offset=False, max_bs=8192, align=4096)
    assert entries(listed, (8192, 4096), (0, 4096), (8192, 4096)) == [(8192, 0), (0, 1), (8192, 2)]
    tree = VF.VerifyLog(ordered_by_offset=True, max_bs=8192, align=4096)
    assert entries(tree, (8192, 4096), (0, 8192), (4096, 8192), (0, 4096)) == [(0, 3), (4096, 2)]


class _ReferenceHistory:
    """VerifyLog's rule the plain way: every earlier entry checked against every write."""

    def __init__(self, ordered_by_offset: bool):
        self.sorted, self.entries = ordered_by_offset, []

    def add(self, e):
        def drops(old):
            overlaps = old.offset < e.offset + e.size and e.offset < old.offset + old.size
            repeat = not self.sorted and (old.offset, old.size) == (e.offset, e.size)
            return overlaps and not repeat
        self.entries = [old for old in self.entries if not drops(old)] + [e]

    def take(self):
        out = sorted(self.entries, key=lambda e: e.offset) if self.sorted else self.entries
        self.entries = []
        return out


@settings(max_examples=150, deadline=None)
@given(ordered=st.booleans(), align_shift=st.integers(9, 12), writes=st.lists(
    st.tuples(st.integers(0, 63), st.integers(0, 3)), min_size=1, max_size=60))
def test_history_keeps_what_a_plain_reference_keeps(ordered, align_shift, writes):
    """The indexed history (cells, bisection) against the rule checked pair by pair:
    sizes of 1, 2, 4 and 8 alignment units at aligned offsets."""
    align = 1 << align_shift
    log = VF.VerifyLog(ordered_by_offset=ordered, max_bs=8 * align, align=align)
    ref = _ReferenceHistory(ordered)
    for n, (cell, size_shift) in enumerate(writes):
        entry = (cell * align, align << size_shift)
        log.add(VF.Written(*entry, n, n))
        ref.add(VF.Written(*entry, n, n))
    assert len(log) == len(ref.entries)
    assert [(e.offset, e.size, e.numberio) for e in log.take()] == \
        [(e.offset, e.size, e.numberio) for e in ref.take()]


@pytest.mark.parametrize("depth", [4, 16])
def test_serialize_overlap_lands_overlapping_writes_in_issue_order(tmp_path, depth):
    """With serialize_overlap the raw engine never has two overlapping writes in flight,
    so of many writes to one block the last one issued is what the block holds - every
    time, whatever order the disk would complete concurrent writes in. Writes to other
    blocks still go in parallel."""
    from cxlhm_apps.fio.engines import IoArena
    from cxlhm.media.ssd import SsdBackend

    writes, block = 96, 4096
    ssd = SsdBackend(str(tmp_path / "f.img"), 1 << 20, depth, source="test")
    arena = IoArena(writes, block)
    try:
        for trial in range(10):
            for i in range(writes):
                arena.view(i, block)[:] = (trial * writes + i) % 251
            ops = np.zeros((writes, 4), np.int64)
            ops[:, 0] = arena.base + np.arange(writes) * arena.slot_bytes
            ops[:, 1] = block
            ops[:, 2] = (np.arange(writes) % 3) * block  # three blocks, each written 32 times
            ops[:, 3] = 1
            res, lat = ssd.run_closed_loop(ops, depth, serialize_overlap=True)
            assert (res == block).all() and (lat >= 0).all()
            back = IoArena(1, 3 * block)
            read = np.array([[back.base, 3 * block, 0, 0]], np.int64)
            assert ssd.run_closed_loop(read, 1)[0][0] == 3 * block
            for b in range(3):
                last = max(i for i in range(writes) if i % 3 == b)
                assert (back.view(0, 3 * block)[b * block:(b + 1) * block] == (trial * writes + last) % 251).all()
            back.close()
    finally:
        arena.close()
        ssd.close()


@pytest.mark.parametrize("kind", [5, 15, 2])  # crc32c, xxhash, md5
def test_batch_stamp_and_check_agree_with_the_block_at_a_time_ones(kind):
    rng = np.random.default_rng(kind)
    n, bs = 24, 4096
    data = rng.integers(0, 256, n * bs, dtype=np.uint8)
    one_by_one = data.copy()
    starts = np.arange(n, dtype=np.int64) * bs
    sizes = np.full(n, bs, np.int64)
    sizes[3] = 1000  # a short block (its payload's length not a multiple of 8 or 16)
    offsets = rng.integers(0, 1 << 30, n) * bs
    seeds = VF.seeds_of(11, np.arange(n))
    assert [int(s) for s in seeds] == [VF.seed_of(11, i) for i in range(n)]
    VF.stamp_many(data, starts, sizes, kind, offsets, seeds, np.arange(n))
    for b in range(n):
        VF.stamp(one_by_one[b * bs:b * bs + int(sizes[b])], kind, int(offsets[b]), int(seeds[b]), b)
    assert (data == one_by_one).all()
    assert VF.check_many(data, starts, sizes, kind, offsets, seeds, np.arange(n)) == []
    data[5 * bs + 700] ^= 0x10  # a payload bit, and another block's header offset
    data[9 * bs + 16] ^= 0x01
    found = VF.check_many(data, starts, sizes, kind, offsets, seeds, np.arange(n))
    assert [b for b, _ in found] == [5, 9]
    assert found[0][1].what == VF.check(data[5 * bs:6 * bs], kind, int(offsets[5]), int(seeds[5]), 5).what
    assert "verify failed" in found[0][1].what and found[1][1].what.startswith("bad header offset")
    wrong_seeds = seeds.copy()
    wrong_seeds[0] += np.uint64(1)
    assert [b for b, _ in VF.check_many(data, starts, sizes, kind, offsets, wrong_seeds)][:1] == [0]


def test_crc32c_on_the_cpu_instruction_matches_the_table():
    data = np.frombuffer(np.random.default_rng(0).bytes(10_000), np.uint8)
    assert VF.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    for start, end in [(0, 10_000), (3, 9_997), (44, 4096), (0, 63)]:
        assert VF.crc32c(data[start:end]) == int(VF._crc32c(data[start:end].copy(), VF._CRC32C_TABLE))


@pytest.mark.parametrize("kind", [5, 15], ids=["crc32c", "xxhash"])
def test_warm_up_compiles_the_batch_kernels_before_any_job_runs(kind):
    """A job's runtime must not be spent compiling verify's kernels (with a cold cache and a
    1 s runtime, a verify job did no I/O at all): warm_up leaves both compiled."""
    from cxlhm_apps.fio import verify as VF
    VF.warm_up(kind)
    assert VF._stamp_many.signatures and VF._check_many.signatures


def test_the_verify_phase_counts_io_depths_as_fio(tmp_path):
    # fio 3.33's iodepth_level for this job (both phases): each phase fills from 1 up to 16
    from cxlhm_apps.fio.raw_engines import libaio_unavailable
    if libaio_unavailable():
        pytest.skip(libaio_unavailable())
    _, out = run(f"[w]\nfilename={tmp_path / 'v.dat'}\nsize=8m\nrw=randwrite\nbs=4k\niodepth=16\nioengine=libaio\n"
                 "direct=1\nverify=crc32c\n")
    levels = out["iodepth_level"]
    assert levels == pytest.approx({"1": 0.1, "2": 0.1, "4": 0.195312, "8": 0.390625, "16": 99.267578, "32": 0.0,
                                    ">=64": 0.0}, abs=1e-5)


def test_the_verify_phase_begins_as_fios_with_an_fsync_then_the_pages_dropped(tmp_path, monkeypatch):
    from cxlhm_apps.fio import files, raw_engines
    events = []
    real_execute, real_flush, real_drop = raw_engines.RawEngine.execute, raw_engines.RawEngine.flush, files.drop_cached

    def execute(self, chunk, arena, deadline_ns, *, keep_read_data):
        events.append("write" if chunk.direction.any() else "read")
        return real_execute(self, chunk, arena, deadline_ns, keep_read_data=keep_read_data)

    def flush(self):
        events.append("flush")
        return real_flush(self)

    def drop(path, offset, length):
        events.append(("drop", offset, length))
        return real_drop(path, offset, length)

    monkeypatch.setattr(raw_engines.RawEngine, "execute", execute)
    monkeypatch.setattr(raw_engines.RawEngine, "flush", flush)
    monkeypatch.setattr(files, "drop_cached", drop)
    result, out = run(job(tmp_path / "f.img", "write") + "ioengine=psync\ninvalidate=0\n")
    assert out["error"] == 0, result.messages[:3]
    ran = [e for i, e in enumerate(events) if i == 0 or e != events[i - 1]]  # runs of one kind, once
    assert ran == ["write", "flush", ("drop", 0, 1 << 20), "read"]  # (invalidate=0 drops nothing at the start)


def test_the_device_engines_verify_reads_find_no_dirty_block(tmp_path, monkeypatch):
    from cxlhm_apps.fio import engines
    dirty_when_reads_began = []
    real_execute = engines.CxlhmEngine.execute

    def execute(self, chunk, arena, deadline_ns, *, keep_read_data):
        if not chunk.direction.any() and not dirty_when_reads_began:  # the first reads: the verify phase
            dirty_when_reads_began.append(self.share.handle.stats()["dirty_blocks"])
        return real_execute(self, chunk, arena, deadline_ns, keep_read_data=keep_read_data)

    monkeypatch.setattr(engines.CxlhmEngine, "execute", execute)
    result, out = run(job(tmp_path / "f.img", "randwrite") + DEVICE)
    assert out["error"] == 0 and out["cxlhm_verify"]["blocks_checked"] == 128, result.messages[:3]
    assert dirty_when_reads_began == [0]  # the flush wrote back what the write phase left in device DRAM


def test_verify_dump_writes_the_failing_blocks_bytes_under_fios_name(tmp_path, monkeypatch):
    """A block overwritten behind the job's back fails its read-back check; verify_dump
    leaves its bytes as read in FILE.OFFSET.received in the working folder (fio's name),
    and no file for the blocks that passed."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "f.img"
    run(f"[w]\nfilename={path}\nsize=64k\nrw=write\nbs=4k\nverify=crc32c\ndo_verify=0\n{RAW}")
    with open(path, "r+b") as f:
        f.seek(8192 + 100)
        f.write(b"\xAA" * 16)
    result, out = run(f"[r]\nfilename={path}\nsize=64k\nrw=read\nbs=4k\nverify=crc32c\nverify_dump=1\n{RAW}")
    assert out["error"] == 84
    dumped = sorted(p.name for p in tmp_path.glob("*.received"))
    assert dumped == ["f.img.8192.received"]
    assert (tmp_path / dumped[0]).read_bytes() == path.read_bytes()[8192:12288]
    assert any("received data dumped as f.img.8192.received" in m for m in result.messages)
    with open(path, "r+b") as f:  # a bad header field: fio names the dump hdr_fail
        f.seek(16384)
        f.write(b"\0\0")
    result, _ = run(f"[r]\nfilename={path}\nsize=64k\nrw=read\nbs=4k\nverify=crc32c\nverify_dump=1\n{RAW}")
    assert (tmp_path / "f.img.16384.hdr_fail").read_bytes() == path.read_bytes()[16384:20480]


def _dirs(out: dict) -> list:
    return [(out[d]["total_ios"], out[d]["io_bytes"], out[d]["runtime"] > 0) for d in ("read", "write")]


def test_verify_only_checks_what_the_same_job_wrote_without_writing(tmp_path):
    """fio's dry run: the writes are counted as done (no run time) and not made, the
    verify phase reads back and checks what the earlier run of the job left."""
    path = tmp_path / "f.img"
    text = f"[w]\nfilename={path}\nsize=256k\nrw=randwrite\nbs=4k\nverify=crc32c\n{RAW}"
    run(text)
    before = path.read_bytes()
    result, out = run(text + "verify_only=1\n")
    assert out["error"] == 0 and path.read_bytes() == before
    assert _dirs(out) == [(64, 256 << 10, True), (64, 256 << 10, False)]
    assert out["cxlhm_verify"] == {"blocks_checked": 64, "failures": 0}
    with open(path, "r+b") as f:  # what is there now is not what the job wrote: the dry run says so
        f.seek(4096 * 5 + 200)
        f.write(b"\x55" * 8)
    _, out = run(text + "verify_only=1\n")
    assert out["error"] == 84 and out["cxlhm_verify"]["failures"] == 1


@pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed")
def test_real_fio_counts_a_verify_only_run_alike(tmp_path):
    path = tmp_path / "f.img"
    text = f"[w]\nfilename={path}\nsize=256k\nrw=randwrite\nbs=4k\nverify=crc32c\nioengine=psync\n"
    run(text)
    proc = subprocess.run(["fio", "--output-format=json", "-"], input=text + "verify_only=1\n", capture_output=True,
                          text=True, cwd=tmp_path)
    theirs = json.loads(proc.stdout[proc.stdout.find("{"):])["jobs"][0]
    _, ours = run(text + "verify_only=1\n")
    assert _dirs(ours) == _dirs(theirs) and ours["error"] == theirs["error"] == 0
