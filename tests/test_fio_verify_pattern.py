"""verify_pattern, verify_interval, verify=meta / pattern (cxlhm_apps/fio/verify_pattern.py):
the bytes written against files real fio 3.33 writes for the same job (skipped where fio is
absent; golden values from fio 3.33 kept for the parser), a corrupted byte reported in fio's
words, bad values refused with the line and what is accepted."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs
from cxlhm_apps.fio.verify_pattern import MAX_PATTERN_BYTES, parse_pattern

FIO = shutil.which("fio")
needs_fio = pytest.mark.skipif(FIO is None, reason="real fio is not installed")

# verify_pattern -> the first bytes of a block at offset 0, as fio 3.33 wrote them (verify=pattern)
GOLDEN = [
    ("12345", "3930"), ("-12", "f4ffffff"), ("0xabc", "0abc"), ("258", "0201"), ("65536", "000001"),
    ("0", "00"), ("-2147483648", "00000080"), (" 5", "05"), ('"x" 7', "7807"), ('5"a"', "0561"),
    ('0xff%o"0xabc"-12', "ff0000000000000000" + "3078616263" + "f4ffffff"), ('"a"%o"b"', "61" + "00" * 8 + "62"),
    # fio reads a decimal only up to the next 0x, and a hex run's last 0 before an x as the next one's
    ('"abcd"-120xdeadface', "61626364f4ffffffdeadface"), ("0xff0x14", "ff14"), ('-100xab"1"', "f6ffffffab31"),
    ("0xFF0X1", "ff01"),
]
REFUSED = ["'ab'", '"a\\"b"', "0x01 0x02", "4294967296", "2147483648", "-2147483649", "0x", "12a", "%x",
           "5 ", '"x" ', '"a" %o', '"abc', "", "0x0g", "-0x1"]


@pytest.mark.parametrize("text,hexbytes", GOLDEN)
def test_patterns_parse_to_fios_bytes(text, hexbytes):
    assert parse_pattern(text).fill(len(hexbytes) // 2, 0).tobytes().hex() == hexbytes


@pytest.mark.parametrize("text", REFUSED)
def test_patterns_fio_refuses_are_refused_with_what_is_accepted(text):
    with pytest.raises(ValueError) as err:
        parse_pattern(text)
    assert "accepted" in str(err.value) or "limit" in str(err.value)


@needs_fio
@pytest.mark.parametrize("text", [t for t, _ in GOLDEN[:6]] + ['0xff%o"0xabc"-12'])
def test_pattern_fill_is_the_file_fio_writes(tmp_path, text):
    path = tmp_path / "f"
    subprocess.run([FIO, "--name=w", f"--filename={path}", "--size=8k", "--bs=4k", "--rw=write", "--ioengine=psync",
                    "--verify=pattern", f"--verify_pattern={text}", "--do_verify=0"], check=True, capture_output=True, cwd=path.parent)
    data = path.read_bytes()
    pattern = parse_pattern(text)
    assert data == pattern.fill(4096, 0).tobytes() + pattern.fill(4096, 4096).tobytes()


_TOKENS = st.one_of(
    st.integers(-2**31, 2**31 - 1).map(lambda v: (str(v), (v & 0xFFFFFFFF).to_bytes(4, "little") if v < 0 else
                                                  v.to_bytes(max(1, (v.bit_length() + 7) // 8), "little"))),
    st.binary(min_size=1, max_size=6).map(lambda b: ("0x" + b.hex(), b)),
    st.text(st.characters(blacklist_characters='"', blacklist_categories=("Cs",)), min_size=1, max_size=5)
    .map(lambda s: (f'"{s}"', s.encode())),
    st.just(("%o", b"\x07\x00\x00\x00\x00\x00\x00\x00")),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TOKENS, min_size=1, max_size=8))
def test_any_sequence_of_tokens_parses_to_their_bytes(tokens):
    numeric = [t[0] not in '"%' for t, _ in tokens]
    assume(not any(a and b for a, b in zip(numeric, numeric[1:])))  # ("1" "2" is the number 12)
    text, want = "".join(t for t, _ in tokens), b"".join(b for _, b in tokens)
    if len(want) > MAX_PATTERN_BYTES:
        with pytest.raises(ValueError):
            parse_pattern(text)
        return
    assert parse_pattern(text).fill(len(want), 7).tobytes() == want


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_parses_or_is_refused_with_a_reason(text):
    try:
        pattern = parse_pattern(text)
    except ValueError as exc:
        assert str(exc)
    else:
        assert 0 < len(pattern.data) <= MAX_PATTERN_BYTES


def _run(text: str):
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    result = run_jobs(jobs, log=lambda _: None)
    return result, report.to_json(result, globals_)["jobs"]


def _write_job(path, verify: str, extra: str = "") -> str:
    return (f"[w]\nfilename={path}\nsize=64k\nbs=4k\nrw=write\nioengine=psync\nverify={verify}\n"
            f"do_verify=0\n{extra}")


def _fio(path, verify: str, extra: str) -> None:
    args = [f"--{line}" for line in extra.strip().splitlines()]
    subprocess.run([FIO, "--name=w", f"--filename={path}", "--size=64k", "--bs=4k", "--rw=write", "--ioengine=psync",
                    f"--verify={verify}", "--do_verify=0", *args], check=True, capture_output=True, cwd=path.parent)


def _headers_masked(data: bytes, step: int) -> np.ndarray:
    """The file with each header's time and own crc (which covers it) zeroed: fio writes
    its clock there (the thread field, 1 for the one job, is compared)."""
    arr = np.frombuffer(data, np.uint8).copy().reshape(-1, step)
    arr[:, 24:32] = 0
    arr[:, 36:40] = 0  # (the payload checksum after them is compared)
    return arr


@needs_fio
@pytest.mark.parametrize("verify,extra,step", [
    ("meta", "verify_pattern=0xaa555aa5\nverify_interval=512\n", 512),  # fio's surface-scan example
    ("meta", 'verify_pattern="ab"%o\n', 4096),
    ("crc32c", 'verify_pattern="ab"%o\nverify_interval=1024\n', 1024),  # the checksum covers the pattern
    ("xxhash", "verify_pattern=-12\n", 4096),
])
def test_written_bytes_equal_fios_but_for_the_clock(tmp_path, verify, extra, step):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    result, out = _run(_write_job(ours, verify, extra))
    assert out[0]["error"] == 0, result.messages
    _fio(theirs, verify, extra)
    assert np.array_equal(_headers_masked(ours.read_bytes(), step), _headers_masked(theirs.read_bytes(), step))


@needs_fio
def test_verify_pattern_alone_writes_fios_pattern_header(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _run(f"[w]\nfilename={ours}\nsize=64k\nbs=4k\nrw=write\nioengine=psync\nverify_pattern=0x11\ndo_verify=0\n")
    subprocess.run([FIO, "--name=w", f"--filename={theirs}", "--size=64k", "--bs=4k", "--rw=write",
                    "--ioengine=psync", "--verify_pattern=0x11", "--do_verify=0"], check=True, capture_output=True, cwd=tmp_path)
    assert ours.read_bytes()[2] == 17  # fio's VERIFY_PATTERN type
    assert np.array_equal(_headers_masked(ours.read_bytes(), 4096), _headers_masked(theirs.read_bytes(), 4096))


def _corrupt(path, at: int, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([value]))


READ_BACK = "[r]\nfilename={}\nsize=64k\nbs=4k\nrw=read\nioengine=psync\nverify=meta\nverify_pattern=0xaa555aa5\n" \
            "verify_interval=512\n"
FIO_LINES = ["fio: got pattern 'ab', wanted 'aa'. Bad bits 1", "fio: bad pattern block offset 60",
             "pattern: verify failed at file {} offset 8704, length 512 (requested block: offset=8192, length=4096"]


@pytest.mark.parametrize("checker", ["cxlhm", pytest.param("fio", marks=needs_fio)])
def test_a_corrupted_pattern_byte_is_reported_as_fio_reports_it(tmp_path, checker):
    path = tmp_path / "img"
    result, out = _run(_write_job(path, "meta", "verify_pattern=0xaa555aa5\nverify_interval=512\n"))
    assert out[0]["error"] == 0, result.messages
    _corrupt(path, 8192 + 512 + 40 + 60, 0xAB)  # block 2, second interval, 60 bytes after its header
    if checker == "fio":  # the same lines from real fio, on the same file
        proc = subprocess.run([FIO, "--name=r", f"--filename={path}", "--size=64k", "--bs=4k", "--rw=read",
                               "--ioengine=psync", "--verify=meta", "--verify_pattern=0xaa555aa5",
                               "--verify_interval=512"], capture_output=True, text=True, cwd=path.parent)
        text = proc.stdout + proc.stderr
    else:
        result, out = _run(READ_BACK.format(path))
        assert out[0]["cxlhm_verify"]["failures"] == 1 and out[0]["error"] == 84
        text = "\n".join(result.messages)
    for line in FIO_LINES:
        assert line.format(path) in text, text


def test_a_corrupted_header_and_a_corrupted_checksummed_pattern_fail(tmp_path):
    path = tmp_path / "img"
    _run(_write_job(path, "meta", "verify_pattern=0xaa555aa5\nverify_interval=512\n"))
    _corrupt(path, 4096 + 1024 + 16, 0x55)  # the offset field of block 1's third header
    result, out = _run(READ_BACK.format(path))
    assert out[0]["cxlhm_verify"]["failures"] == 1
    assert any("bad header offset" in m and "offset 5120, length 512" in m for m in result.messages), result.messages
    _run(_write_job(path, "crc32c", "verify_pattern=0x01\n"))
    _corrupt(path, 100, 0x02)
    result, out = _run(READ_BACK.format(path).replace("verify=meta", "verify=crc32c").replace(
        "0xaa555aa5", "0x01").replace("verify_interval=512\n", ""))
    assert out[0]["cxlhm_verify"]["failures"] == 1 and any("crc32c: verify failed" in m for m in result.messages)


def test_verify_phase_of_a_pattern_job_passes_and_checks_every_block(tmp_path):
    text = _write_job(tmp_path / "img", "pattern", "verify_pattern=0x0102%o\n").replace("do_verify=0", "do_verify=1")
    result, out = _run(text)
    assert out[0]["error"] == 0 and out[0]["cxlhm_verify"] == {"blocks_checked": 16, "failures": 0}, result.messages


@pytest.mark.parametrize("text,words", [
    ("verify_pattern=0x01 0x02\n", "accepted: 0x hex bytes"),
    ("verify_pattern='ab'\n", "at character 1"),
    ("verify_interval=40\n", "at least 80"),
    ("verify=sha1\n", "must be one of"),
])
def test_bad_values_are_refused_with_the_line_and_what_is_accepted(text, words):
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections(f"[j]\nfilename=x\nsize=1m\n{text}", "t.fio")])
    assert "t.fio:4:" in str(err.value) and words in str(err.value), str(err.value)


@needs_fio
@pytest.mark.parametrize("verify,extra", [("crc32c", ""), ("crc32c", "verify_interval=1024\n"), ("md5", "verify_interval=512\n"),
                                          ("xxhash", "verify_pattern=\"ab\"%o\n"), ("pattern", "verify_pattern=0x0102\n"),
                                          ("meta", "verify_pattern=0xaa555aa5\nverify_interval=512\n")])
def test_real_fio_verifies_what_cxlhm_wrote(tmp_path, verify, extra):
    path = tmp_path / "img"
    result, out = _run(_write_job(path, verify, extra))
    assert out[0]["error"] == 0, result.messages
    args = [f"--{line}" for line in extra.strip().splitlines()]
    proc = subprocess.run([FIO, "--name=r", f"--filename={path}", "--size=64k", "--bs=4k", "--rw=read",
                           "--ioengine=psync", f"--verify={verify}", *args], capture_output=True, text=True, cwd=path.parent)
    assert proc.returncode == 0 and "err= 0" in proc.stdout, proc.stdout + proc.stderr


def test_fill_device_needs_a_bound_and_a_bound_that_fits(tmp_path):
    base = f"[w]\nfilename={tmp_path / 'f'}\nrw=write\nbs=64k\nioengine=psync\nfill_device=1\n"
    with pytest.raises(JobFileError) as err:
        _run(base)
    assert "t.fio:6:" in str(err.value) and "give size= or filesize=" in str(err.value), str(err.value)
    with pytest.raises(JobFileError) as err:
        _run(base + "size=1p\n")
    assert "t.fio:7:" in str(err.value) and "bytes free on" in str(err.value), str(err.value)


def test_fio_surface_scan_runs_bounded_by_size(tmp_path):
    """fio's surface-scan example (fill_device, verify=meta, a pattern, 512-byte intervals,
    create_serialize) with size=1m: written, then read back and checked by a second job."""
    text = ("[global]\nthread\nbs=64k\ndirect=1\nioengine=sync\nverify=meta\nverify_pattern=0xaa555aa5\n"
            f"verify_interval=512\nsize=1m\n[write-phase]\nfilename={tmp_path / 'd'}\nrw=write\nfill_device=1\n"
            f"do_verify=0\n[verify-phase]\nstonewall\ncreate_serialize=0\nfilename={tmp_path / 'd'}\nrw=read\n"
            "do_verify=1\n")
    result, out = _run(text)
    assert [j["error"] for j in out] == [0, 0], result.messages
    assert out[1]["cxlhm_verify"] == {"blocks_checked": 16, "failures": 0}
    assert (tmp_path / "d").stat().st_size == 1 << 20
