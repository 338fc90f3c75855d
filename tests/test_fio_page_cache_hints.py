"""What a buffered job leaves in the page cache, as fio's: `fadvise_hint` (by default a
random job tells the kernel to read no more than it asks for), `pre_read` (the region
read into the cache before the job), and the one-file options (`nrfiles`, `openfiles`,
`file_service_type`) accepted where they describe one file."""
from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from cxlhm_apps.fio import report
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

SIZE = 16 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(None, use_errno=True)


def _cached_pages(path) -> int:
    """Pages of the file in the page cache (mincore over a mapping of it)."""
    mmap_, munmap, mincore = _libc.mmap, _libc.munmap, _libc.mincore
    mmap_.restype = ctypes.c_void_p
    mmap_.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = mmap_(None, SIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            pytest.skip(f"mmap: {os.strerror(ctypes.get_errno())}")
        try:
            vec = (ctypes.c_ubyte * (SIZE // PAGE))()
            if mincore(addr, SIZE, vec) != 0:
                pytest.skip(f"mincore: {os.strerror(ctypes.get_errno())}")
            return sum(v & 1 for v in vec)
        finally:
            munmap(addr, SIZE)
    finally:
        os.close(fd)


@pytest.fixture
def cold_file(tmp_path):
    """A written, synced file whose pages were dropped from the cache; skips where the
    file system keeps them (tmpfs)."""
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(os.urandom(SIZE))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if _cached_pages(path) > SIZE // PAGE // 4:
        pytest.skip("this file system keeps the file's pages cached (tmpfs?)")
    return path


def _run(path, extra: str) -> dict:
    text = f"[j]\nfilename={path}\nsize={SIZE}\nbs=4k\nioengine=psync\nrandseed=7\n{extra}"
    jobs, globals_ = build_jobs([read_sections(text, "t.fio")])
    return report.to_json(run_jobs(jobs, log=lambda _: None), globals_)["jobs"][0]


@pytest.mark.parametrize("engine", ["psync", "mmap"])
def test_a_random_job_reads_only_what_it_asks_for_and_without_the_hint_the_kernel_reads_ahead(cold_file, engine):
    job = _run(cold_file, f"rw=randread\nnumber_ios=1024\nioengine={engine}\n")
    assert job["read"]["total_ios"] == 1024
    hinted = _cached_pages(cold_file)
    assert 1024 <= hinted <= 1024 * 5 // 4  # (each block's page, and no read-ahead around it)
    fd = os.open(cold_file, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    _run(cold_file, f"rw=randread\nnumber_ios=1024\nioengine={engine}\nfadvise_hint=0\n")
    unhinted = _cached_pages(cold_file)
    assert unhinted > hinted + hinted // 10  # the kernel's read-ahead around misses


def test_pre_read_caches_the_region_before_the_job(cold_file):
    job = _run(cold_file, "rw=randread\nnumber_ios=8\npre_read=1\n")
    assert job["read"]["total_ios"] == 8
    assert _cached_pages(cold_file) >= SIZE // PAGE * 9 // 10


@pytest.mark.parametrize("extra, option", [("direct=1\n", "pre_read"), ("ioengine=cxlhm\n", "pre_read"),
                                           ("nrfiles=2\n", "nrfiles")])
def test_what_one_file_per_job_cannot_do_is_refused_by_name(tmp_path, extra, option):
    text = f"[j]\nfilename={tmp_path / 'f'}\nsize=1m\nrw=read\npre_read={int(option == 'pre_read')}\n{extra}"
    with pytest.raises(JobFileError, match=f"option '{option}'"):
        build_jobs([read_sections(text, "t.fio")])


def test_one_file_options_describing_one_file_run(tmp_path):
    job = _run(tmp_path / "f", "rw=read\nio_size=64k\nnrfiles=1\nopenfiles=4\nfile_service_type=random:4\n")
    assert job["read"]["io_bytes"] == 64 << 10
