"""Verify headers where fio 3.33 fills them from the job: the thread field (fio's thread
number) and the header interval of jobs with several write sizes (fio's verify_interval
fixup), against files real fio writes and checks (skipped where fio is absent)."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs
from cxlhm_apps.fio.verify_pattern import fio_interval

FIO = shutil.which("fio")
needs_fio = pytest.mark.skipif(FIO is None, reason="real fio is not installed")
MAGIC = 0xACCA


def _run(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return result, report.to_json(result, globals_)["jobs"]


def _fio(text: str, cwd) -> str:
    (cwd / "job.fio").write_text(text)
    proc = subprocess.run([FIO, "job.fio"], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _headers(data: bytes) -> list[tuple[int, int, int, int]]:
    """(place in the file, length, offset, thread) of every header, walking the file
    header to header (each header's length says where the next one is)."""
    arr, at, found = np.frombuffer(data, np.uint8), 0, []
    while at < arr.shape[0]:
        head = arr[at:at + 40]
        assert int(head[0:2].view(np.uint16)[0]) == MAGIC, f"no header at {at}"
        length, offset = int(head[4:8].view(np.uint32)[0]), int(head[16:24].view(np.uint64)[0])
        found.append((at, length, offset, int(head[32:34].view(np.uint16)[0])))
        at += length
    return found


# ------------------------------------------------------------------ the thread field

THREADS_JOB = """[global]
ioengine=psync
rw=write
bs=4k
size=32k
verify={verify}
do_verify=0
[a]
filename={dir}/a
[b]
filename={dir}/b
numjobs=2
"""


def _threads_of(files) -> list[set[int]]:
    return [{h[3] for h in _headers(f.read_bytes())} for f in files]


@pytest.mark.parametrize("verify", ["crc32c", "md5", "meta"])
def test_each_header_names_the_thread_number_of_the_clone_that_wrote_it(tmp_path, verify):
    # clones b.0 and b.1 write the same file one after the other; each header names its writer
    result, out = _run(THREADS_JOB.format(verify=verify, dir=tmp_path))
    assert [j["error"] for j in out] == [0, 0, 0], result.messages
    assert _threads_of([tmp_path / "a"]) == [{1}]
    assert _threads_of([tmp_path / "b"])[0] <= {2, 3} and len(_headers((tmp_path / "b").read_bytes())) == 8


@needs_fio
def test_the_thread_field_is_fios(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    one_writer = THREADS_JOB.replace("numjobs=2\n", "")
    _run(one_writer.format(verify="crc32c", dir=ours))
    _fio(one_writer.format(verify="crc32c", dir=theirs), theirs)
    for name in ("a", "b"):
        assert _threads_of([ours / name]) == _threads_of([theirs / name]) == [{1 if name == "a" else 2}]


# ------------------------------------------------------------------ verify_interval

def _job_values(text: str):
    jobs, _ = build_jobs([read_sections("[j]\nfilename=x\nsize=1m\nverify=crc32c\n" + text, "t.fio")])
    return jobs[0]


@pytest.mark.parametrize("text,interval", [
    ("bs=4k\n", 0),  # one size: a header per block
    ("bssplit=4k/50:16k/50\n", 4096),  # several: the smallest write
    ("bsrange=8k-64k\n", 8192),
    ("bssplit=8k/50:12k/50\n", 4096),  # cut to a divisor of both
    ("bssplit=4k/50:16k/50\nverify_interval=8k\n", 4096),  # no larger than the smallest write
    ("bs=16k\nverify_interval=1k\n", 1024),
    ("bs=16k\nverify_interval=3k\n", 0),  # not a divisor of the block: gcd(16k, 16k), the block
    ("bs=4k,16k\nrw=randrw\n", 16384),  # the writes' size (reads do not cut an unset interval)
    ("bs=4k,16k\nrw=randrw\nverify_interval=8k\n", 4096),  # a set one: the reads' size, for a job that reads
])
def test_the_interval_is_fios_after_its_fixup(text, interval):
    assert fio_interval(_job_values(text)) == interval


BSSPLIT_JOB = """[w]
filename={path}
ioengine=psync
rw={rw}
bssplit=4k/40:16k/30:8k/30
size=256k
verify=crc32c
do_verify={do_verify}
"""


def test_a_job_of_several_write_sizes_writes_a_header_every_smallest_write(tmp_path):
    path = tmp_path / "img"
    result, out = _run(BSSPLIT_JOB.format(path=path, rw="write", do_verify=1))
    assert out[0]["error"] == 0 and out[0]["cxlhm_verify"]["failures"] == 0, result.messages
    assert out[0]["cxlhm_verify"]["blocks_checked"] > 0
    assert [(at, length, offset) for at, length, offset, _ in _headers(path.read_bytes())] == \
        [(at, 4096, at) for at in range(0, 256 * 1024, 4096)]


@needs_fio
def test_fio_writes_the_same_header_layout(tmp_path):
    path = tmp_path / "img"
    _fio(BSSPLIT_JOB.format(path=path, rw="write", do_verify=0), tmp_path)
    assert [(at, length, offset) for at, length, offset, _ in _headers(path.read_bytes())] == \
        [(at, 4096, at) for at in range(0, 256 * 1024, 4096)]


@needs_fio
@pytest.mark.parametrize("writer", ["cxlhm", "fio"])
def test_each_verifies_the_others_file_of_several_block_sizes(tmp_path, writer):
    path = tmp_path / "img"
    write, read = (BSSPLIT_JOB.format(path=path, rw=rw, do_verify=0) for rw in ("write", "read"))
    if writer == "cxlhm":
        result, out = _run(write)
        assert out[0]["error"] == 0, result.messages
        stdout = _fio(read, tmp_path)
        assert "err= 0" in stdout and "verify" not in stdout.lower().replace("verify=crc32c", ""), stdout
    else:
        _fio(write, tmp_path)
        result, out = _run(read)
        assert out[0]["error"] == 0 and out[0]["cxlhm_verify"]["failures"] == 0, result.messages
        assert out[0]["cxlhm_verify"]["blocks_checked"] > 0
