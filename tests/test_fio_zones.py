"""zonemode=strided (zonesize, zonerange, zoneskip) and log_offset with fio 3.33's meaning:
each I/O's direction and offset, read from the IOPS log with log_offset=1, against the
same log real fio writes (golden sequences from this machine; fio also runs where it is
installed, well under a second a job)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs


def _job(rw: str, bs: str, zonesize: str, zonerange: str | None, zoneskip: str, size: str) -> str:
    return (f"[z]\nfilename=z.dat\nrw={rw}\nbs={bs}\nzonemode=strided\nzonesize={zonesize}\n"
            + (f"zonerange={zonerange}\n" if zonerange else "")
            + f"zoneskip={zoneskip}\nsize={size}\nioengine=psync\nwrite_iops_log=zl\nlog_offset=1\n")


# job -> fio 3.33's (direction, offset in KiB) per I/O, from its IOPS log with log_offset=1 (a new file)
GOLDEN = [
    (("write", "4k", "16k", None, "48k", "64k"), [(1, 0), (1, 4), (1, 8), (1, 12)] * 4),  # wraps at the file's end
    (("rw", "8k", "64k", "32k", "16k", "128k"),
     [(0, 0), (0, 8), (0, 16), (1, 0), (0, 0), (0, 8), (1, 0), (1, 8), (1, 48), (0, 48), (1, 56), (0, 56), (1, 48),
      (0, 48), (0, 56), (0, 64)]),
    (("read", "64k", "1m", None, "3m", "1m"), [(0, 64 * k) for k in range(16)]),
]


def _log(folder) -> tuple[list[tuple[int, int]], int]:
    rows = [line.split(",") for line in (folder / "zl_iops.1.log").read_text().splitlines()]
    return [(int(r[2]), int(r[4]) // 1024) for r in rows], len(rows[0])


@pytest.mark.parametrize("spec,want", GOLDEN)
def test_strided_zones_put_each_io_where_fio_does(tmp_path, monkeypatch, spec, want):
    monkeypatch.chdir(tmp_path)
    jobs, _ = build_jobs([read_sections(_job(*spec), "t.fio")])
    run_jobs(jobs, log=lambda _: None)
    got, columns = _log(tmp_path)
    assert got == want and columns == 6  # time, value, direction, size, offset, priority
    if shutil.which("fio"):
        fio_dir = tmp_path / "fio"
        fio_dir.mkdir()
        (fio_dir / "t.fio").write_text(_job(*spec))
        subprocess.run(["fio", "t.fio"], cwd=fio_dir, capture_output=True, timeout=60, check=True)
        assert _log(fio_dir) == (want, 6)


@pytest.mark.parametrize("text, words", [
    ("zonemode=zbd\n", "needs a zoned block device"),
    ("zonemode=strided\n", "needs zonesize="),
    ("zonemode=strided\nzonesize=1m\nrw=randread\n", "plain sequential I/O"),
    ("zonemode=sideways\n", "must be one of none, strided, zbd"),
])
def test_what_is_not_modelled_or_wrong_is_refused_with_the_line(text, words):
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections(f"[j]\nsize=1m\n{text}", "t.fio")])
    assert "t.fio:3:" in str(err.value) and words in str(err.value)
