"""What writes carry with fio's dedupe and compression options (cxlhm_apps/fio/buffers.py):
the shares of copied blocks, of zero bytes and of blocks two jobs share, against files real
fio 3.33 writes for the same job files (golden figures from this machine; fio is also run
where installed, a fraction of a second per job file), and the rules fio applies."""
from __future__ import annotations

import hashlib
import shutil
import subprocess

import numpy as np
import pytest

from cxlhm_apps.fio.buffers import JobBuffers
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs


def _buffers(**kw) -> JobBuffers:
    args = dict(thread_index=0, threads=1, seed=1, dedupe_pct=0, mode="repeat", working_set_pages=10,
                global_set=False, compress_pct=0, compress_chunk=512)
    args.update(kw)
    return JobBuffers(**args)


def _blocks(buf: JobBuffers, n: int, bs: int = 4096) -> list[bytes]:
    data = np.zeros(n * bs, np.uint8)
    buf.fill(data, np.arange(n, dtype=np.int64) * bs, np.full(n, bs, np.int64))
    return [data[i * bs:(i + 1) * bs].tobytes() for i in range(n)]


def test_a_repeat_copy_is_the_last_unique_block():
    buf = _buffers(dedupe_pct=50)
    job, index = buf.keys(1000)
    unique_seen = -1
    for i in index.tolist():
        assert i <= unique_seen + 1  # a new block takes the next index; a copy repeats the last one
        unique_seen = max(unique_seen, i)
    blocks = _blocks(_buffers(dedupe_pct=50), 200)
    assert 0.35 < 1 - len(set(blocks)) / len(blocks) < 0.65


def test_working_set_copies_come_from_the_first_unique_blocks():
    buf = _buffers(dedupe_pct=40, mode="working_set", working_set_pages=8)
    _, index = buf.keys(2000)
    first = {}
    for k, i in enumerate(index.tolist()):
        first.setdefault(i, k)
    copies = [i for k, i in enumerate(index.tolist()) if first[i] != k]
    assert copies and max(copies) < 8


def test_all_copies_and_all_zero():
    assert len(set(_blocks(_buffers(dedupe_pct=100), 50))) == 1
    assert set(_blocks(_buffers(compress_pct=100), 3)) == {bytes(4096)}
    half = _blocks(_buffers(compress_pct=25, compress_chunk=1024), 1)[0]
    for c in range(4):  # each 1 KiB: 768 random bytes, then 256 zero bytes
        assert half[c * 1024 + 768:(c + 1) * 1024] == bytes(256) and half[c * 1024:c * 1024 + 768].count(0) < 20


def _file_stats(paths) -> tuple[float, float]:
    hashes, zeros, total = [], 0, 0
    for path in paths:
        data = path.read_bytes()
        for i in range(0, len(data), 4096):
            block = data[i:i + 4096]
            hashes.append(hashlib.md5(block).digest())
            zeros += block.count(0)
            total += len(block)
    return len(set(hashes)) / len(hashes), zeros / total


def _shared(a, b) -> float:
    def hashes(path):
        data = path.read_bytes()
        return [hashlib.md5(data[i:i + 4096]).digest() for i in range(0, len(data), 4096)]
    other = set(hashes(b))
    blocks = hashes(a)
    return sum(h in other for h in blocks) / len(blocks)


def _job_file(mode: str, global_set: int) -> str:
    return ("[global]\nioengine=libaio\niodepth=16\nsize=8m\nbs=4k\nrw=write\n"
            f"dedupe_mode={mode}\ndedupe_global={global_set}\ndedupe_percentage=40\n"
            "buffer_compress_percentage=50\ndedupe_working_set_percentage=30\n[a]\nfilename=a.dat\n"
            "[b]\nfilename=b.dat\n")


# (mode, global) -> fio 3.33's unique-block share, zero-byte share, share of a's blocks also in b
GOLDEN = {("repeat", 0): (0.615, 0.503, 0.0), ("working_set", 0): (0.618, 0.503, 0.0),
          ("working_set", 1): (0.618, 0.503, 0.442)}


def _measure(folder) -> tuple[float, float, float]:
    unique, zero = _file_stats([folder / "a.dat", folder / "b.dat"])
    return unique, zero, _shared(folder / "a.dat", folder / "b.dat")


@pytest.mark.parametrize("mode,global_set", list(GOLDEN))
def test_written_files_have_fios_shares(tmp_path, monkeypatch, mode, global_set):
    monkeypatch.chdir(tmp_path)
    jobs, _ = build_jobs([read_sections(_job_file(mode, global_set), "t.fio")])
    run_jobs(jobs, log=lambda _: None)
    got = _measure(tmp_path)
    want = GOLDEN[(mode, global_set)]
    assert got == pytest.approx(want, abs=0.03)
    if shutil.which("fio"):
        fio_dir = tmp_path / "fio"
        fio_dir.mkdir()
        (fio_dir / "t.fio").write_text(_job_file(mode, global_set))
        subprocess.run(["fio", "t.fio"], cwd=fio_dir, capture_output=True, timeout=60, check=True)
        assert _measure(fio_dir) == pytest.approx(got, abs=0.03)


@pytest.mark.parametrize("text, line, words", [
    ("dedupe_percentage=10\nverify=crc32c\n", 3, "verify writes its own block contents"),
    ("dedupe_percentage=96\ndedupe_mode=working_set\n", 3, "add up to more than 100"),
    ("dedupe_mode=working_set\ndedupe_percentage=10\n", 3, "needs size="),
    ("dedupe_mode=sometimes\n", 3, "must be one of repeat, working_set"),
    ("buffer_compress_percentage=101\n", 3, "from 0 to 100"),
])
def test_bad_values_and_rules_are_refused_with_the_line(text, line, words):
    size = "" if "needs size" in words else "size=1m\n"
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections(f"[j]\n{size}{text}" if size else f"[j]\nfilename=x\n{text}", "t.fio")])
    assert f"t.fio:{line}:" in str(err.value) and words in str(err.value)
