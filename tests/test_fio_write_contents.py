"""What writes carry without dedupe or compression options (buffers.PlainBuffers): fio
3.33's scramble_buffers (on by default), refill_buffers, zero_buffers and buffer_pattern,
measured as a dedupe estimator sees files (the share of distinct 4 KiB blocks) against
files real fio writes for the same job (skipped where fio is absent; golden shares kept)."""
from __future__ import annotations

import hashlib
import shutil
import subprocess

import numpy as np
import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.buffers import PlainBuffers
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

FIO = shutil.which("fio")
needs_fio = pytest.mark.skipif(FIO is None, reason="real fio is not installed")


def _job(lines: str, path="f"):
    jobs, _ = build_jobs([read_sections(f"[j]\nfilename={path}\nsize=4m\n{lines}", "t.fio")])
    return jobs[0]


@pytest.mark.parametrize("lines,made,refill,scramble", [
    ("rw=write\n", True, False, True),  # fio's default: scramble every write
    ("rw=randrw\n", True, False, True),
    ("rw=write\nscramble_buffers=0\n", False, None, None),  # the buffers as they are
    ("rw=write\nrefill_buffers\n", True, True, True),
    ("rw=write\nzero_buffers\n", True, False, False),  # zeros, asked for: not scrambled
    ("rw=write\nzero_buffers\nscramble_buffers=1\n", True, False, True),
    ('rw=write\nbuffer_pattern="ab"\n', True, False, False),
    ('rw=randrw\nbuffer_pattern=0x11\n', True, True, False),  # reads would overwrite the pattern
    ("rw=write\nverify=crc32c\n", False, None, None),  # verify writes its own contents
    ("rw=read\n", False, None, None),
])
def test_each_option_does_what_fio_does(lines, made, refill, scramble):
    buffers = PlainBuffers.of_job(_job(lines), seed=1)
    assert (buffers is not None) == made
    if made:
        assert (buffers.refill, buffers.scramble) == (refill, scramble)


def test_a_scrambled_block_carries_its_offset_and_time_every_512_bytes():
    buffers = PlainBuffers.of_job(_job("rw=write\n"), seed=1)
    data = np.zeros(3 * 4096, np.uint8)
    starts, sizes, offsets = np.array([0, 4096, 8192]), np.array([4096, 4096, 2048]), np.array([0, 1 << 20, 77 << 12])
    buffers.fill(data, starts, sizes, offsets)
    for start, size, offset in zip(starts, sizes, offsets):
        sectors = data[start:start + size].reshape(-1, 512)
        words = sectors.view(np.uint64)  # 64 words per 512 bytes
        nsec = words[:, 7]
        line = (int(nsec[0]) ^ int(offset)) & 7
        assert (words[:, line * 8] == int(offset) + 512 * np.arange(sectors.shape[0], dtype=np.uint64)).all()
        assert (nsec < 1_000_000_000).all() and (words[:, 6] == words[0, 6]).all()  # (seconds, nanoseconds)
        others = np.ones(64, bool)
        others[[line * 8, 6, 7]] = False
        assert not words[:, others].any()  # nothing else touched
    assert data[8192 + 2048:].sum() == 0


def test_refill_gives_every_block_fresh_random_bytes():
    buffers = PlainBuffers.of_job(_job("rw=write\nrefill_buffers\nscramble_buffers=0\n"), seed=1)
    data = np.zeros(64 * 4096, np.uint8)
    buffers.fill(data, np.arange(64) * 4096, np.full(64, 4096), np.zeros(64, np.int64))
    blocks = {data[i * 4096:(i + 1) * 4096].tobytes() for i in range(64)}
    assert len(blocks) == 64 and abs(float(data.mean()) - 127.5) < 3


def test_buffer_pattern_refuses_offsets_with_the_line():
    with pytest.raises(JobFileError) as err:
        _job("rw=write\nbuffer_pattern=%o\n")
    assert "t.fio:5:" in str(err.value) and "%o (an offset) is not accepted here" in str(err.value)


def _distinct_share(path) -> float:
    data = path.read_bytes()
    hashes = [hashlib.md5(data[i:i + 4096]).digest() for i in range(0, len(data), 4096)]
    return len(set(hashes)) / len(hashes)


# job lines -> the share of distinct 4 KiB blocks in the 4 MiB file fio 3.33 writes
GOLDEN = [
    ("rw=randwrite\n", 1.0),
    ("rw=write\nioengine=libaio\niodepth=8\n", 1.0),
    ("rw=randrw\n", 1.0),  # (the blocks it only reads: fio's layout, random)
    ("rw=write\nscramble_buffers=0\n", 1 / 1024),  # one buffer, written 1024 times
    ("rw=write\nrefill_buffers\nscramble_buffers=0\n", 1.0),
    ("rw=write\nzero_buffers\n", 1 / 1024),
    ("rw=write\nzero_buffers\nscramble_buffers=1\n", 1.0),
    ('rw=write\nbuffer_pattern="abc"\n', 1 / 1024),  # 4096 is no multiple of 3, yet every block the same
]


@pytest.mark.parametrize("lines,share", GOLDEN)
def test_written_files_dedupe_as_fios(tmp_path, lines, share):
    path = tmp_path / "ours"
    text = f"[j]\nfilename={path}\nsize=4m\nbs=4k\n{lines}"
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    assert report.to_json(result, globals_)["jobs"][0]["error"] == 0, result.messages
    assert _distinct_share(path) == pytest.approx(share, abs=0.03)
    if FIO:
        theirs = tmp_path / "theirs"
        (tmp_path / "t.fio").write_text(text.replace(str(path), str(theirs)))
        subprocess.run([FIO, "t.fio"], cwd=tmp_path, capture_output=True, timeout=60, check=True)
        assert _distinct_share(theirs) == pytest.approx(share, abs=0.03)


@needs_fio
@pytest.mark.parametrize("lines", ['buffer_pattern="abc"\n', "buffer_pattern=0xdeadbeef\nrefill_buffers\n",
                                   "zero_buffers\n"])
def test_unscrambled_contents_are_fios_byte_for_byte(tmp_path, lines):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    text = "[j]\nfilename={}\nsize=256k\nbs=4k\nrw=write\n" + lines
    run_jobs(build_jobs([read_sections(text.format(ours), "t.fio")])[0], log=lambda _: None)
    (tmp_path / "t.fio").write_text(text.format(theirs))
    subprocess.run([FIO, "t.fio"], cwd=tmp_path, capture_output=True, timeout=60, check=True)
    assert ours.read_bytes() == theirs.read_bytes()
