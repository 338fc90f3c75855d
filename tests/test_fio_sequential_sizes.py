"""A sequential job of several block sizes (bssplit, bsrange) draws its sizes as fio 3.33
does (fio's generator, seed and rounding to the smallest size), so it does fio's I/Os:
counts and bytes are real fio's for the same job; where fio is installed, checked live."""
from __future__ import annotations

import pytest

from fio_helpers import FIO, real_fio_job, run_ours

# (job lines, (writes, bytes written, reads, bytes read)) as fio 3.33 ran them
GOLDEN = [
    ("rw=write\nbssplit=4k/50:2300/50\n", (10029, 23066700, 0, 0)),  # 4k rounds down to 2300, fio's rule
    ("rw=write\nbssplit=4k/50:64k/50\n", (652, 23068672, 0, 0)),
    ("rw=write\nbsrange=4k-64k\n", (640, 23068672, 0, 0)),
    ("rw=rw\nbssplit=4k/50:64k/50\n", (356, 12394496, 326, 10674176)),
    ("rw=write\nbssplit=4k/30:16k/70\nloops=2\n", (3590, 46137344, 0, 0)),
    ("rw=read\nbssplit=4k/50:64k/50\n", (0, 0, 697, 23068672)),
]


def _job(path, lines: str) -> str:
    return f"[j]\nfilename={path}\nsize=22m\nioengine=psync\n{lines}"


def _counts(job: dict) -> tuple[int, int, int, int]:
    return job["write"]["total_ios"], job["write"]["io_bytes"], job["read"]["total_ios"], job["read"]["io_bytes"]


@pytest.mark.parametrize("lines,want", GOLDEN)
def test_a_sequential_job_of_several_sizes_does_fios_ios(tmp_path, lines, want):
    assert _counts(run_ours(_job(tmp_path / "f", lines))[1]) == want


@pytest.mark.skipif(FIO is None, reason="real fio is not installed")
@pytest.mark.parametrize("lines,want", GOLDEN)
def test_the_goldens_are_real_fios(tmp_path, lines, want):
    assert _counts(real_fio_job(_job(tmp_path / "f", lines))) == want
