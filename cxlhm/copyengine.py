"""The device's copy engine (native/cxlhm_copy.c): runs of copies out of device DRAM and
block checksums, shared between the calling thread and a helper thread - the second
core doing what a controller's DMA engines do. Streamed reads hand it the blocks of a
reap (cxlhm/readstream_kernels.py); `copy_many` is the same call from Python.

A job is a row of six int64: (src, dst, len, hash_at, hash_len, hash out), see
native/cxlhm_copy.h. The checksum is xxh3-64, the function cxlhm/sumtable.py uses;
without it (COMPILED_HASH false) jobs are copies only."""
from __future__ import annotations

import ctypes

import numpy as np

from cxlhm import _native, sumtable

SRC, DST, LEN, HASH_AT, HASH_LEN, HASH = range(6)
FIELDS = 6

if sumtable.COMPILED_HASH:
    _native.lib.cxlhm_copy_set_hash(_native.ffi.cast("void *", ctypes.cast(sumtable._xxh3, ctypes.c_void_p).value))


def new_jobs(n: int) -> np.ndarray:
    return np.zeros((n, FIELDS), np.int64)


def copy_many(jobs: np.ndarray) -> int:
    """Run every job of `jobs` (an (n, 6) int64 array, see the module docstring); the
    checksums land in jobs[:, HASH]. Returns how many the helper thread ran."""
    if jobs.dtype != np.int64 or jobs.ndim != 2 or jobs.shape[1] != FIELDS or not jobs.flags.c_contiguous:
        raise ValueError(f"jobs must be a C-contiguous (n, {FIELDS}) int64 array")
    return int(_native.lib.cxlhm_copy_many(_native.ffi.cast("struct cxlhm_copy *", jobs.ctypes.data), jobs.shape[0]))
