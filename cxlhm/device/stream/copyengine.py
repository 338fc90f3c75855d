"""The device's copy engine (native/cxlhm_copy.c): runs of copies out of device DRAM and
block checksums, shared between the calling thread and a helper thread - the second
core doing what a controller's DMA engines do. Streamed reads hand it the blocks of a
reap (cxlhm/device/stream/loop_kernels.py); `copy_many` is the same call from Python.

A job is a row of six int64: (src, dst, len, hash_at, hash_len, hash out), see
native/cxlhm_copy.h. The checksum is xxh3-64, the function cxlhm/sumtable.py uses;
without it (COMPILED_HASH false) jobs are copies only.

The helper polls for the next run for a while before it sleeps (`linger_us`: waking a
sleeping thread in a VM cost more than the helper saved). A transfer out to the host's
buffer too large to stay in the CPU's caches (`bypasses_caches`) streams its copies of
64 KiB or more past them (`copy_many(bypass_caches=True)`); native/cxlhm_copy.c has the
measurements."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cxlhm import _native, sumtable
from cxlhm import firmware as fw
from cxlhm.jit import njit

SRC, DST, LEN, HASH_AT, HASH_LEN, HASH = range(6)
FIELDS = 6
HELPER_MIN_BYTES = _native.lib.CXLHM_COPY_HELPER_MIN_BYTES  # shorter runs stay on the calling thread

if sumtable.COMPILED_HASH:
    _native.lib.cxlhm_copy_set_hash(_native.ffi.cast("void *", sumtable.xxh3_address()))


def last_level_cache_bytes(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of the CPU's last-level data cache, as the kernel lists it (None: not listed).
    (Not sysconf's: in a VM the CPUID leaf it reads may name another cache than the guest's.)"""
    best = None
    try:
        for index in cpu.glob("index*"):
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            size_bytes = int(size.rstrip("KMG")) * scale
            if best is None or level > best[0]:
                best = (level, size_bytes)
    except (OSError, ValueError):
        return None
    return best[1] if best else None


# Transfers out to the host of at least a quarter of the last-level cache stream their
# copies past the caches: a transfer that fits stays there for whoever reads it next, and
# copying into cached lines is faster than streaming to memory - on the development VM
# (32 MiB L3) a 2 MiB DRAM hit ran at 14-15 GB/s streamed and 23-27 GB/s with memcpy
# (bench_device.py (b), against numpy.copyto's 19-23), while a 32 MiB KV get from device
# DRAM ran at 18.4 GB/s streamed and 13.8 with memcpy (bench_kvstore.py (a)); a larger
# one evicts everything else, the case streaming stores are for. 8 MiB where the kernel
# lists no cache.
_LLC_BYTES = last_level_cache_bytes()
STREAM_MIN_TOTAL = max(1 << 20, _LLC_BYTES // 4) if _LLC_BYTES else 8 << 20


def bypasses_caches(total: int) -> bool:
    """Whether a transfer of `total` bytes out to the host streams past the caches."""
    return total >= STREAM_MIN_TOTAL


def new_jobs(n: int) -> np.ndarray:
    return np.zeros((n, FIELDS), np.int64)


def block_jobs(blocks: np.ndarray, block_size: int, *, copy_from: int = 0, hashed: bool = False) -> np.ndarray:
    """One job per whole block at the addresses `blocks` (device DRAM slots): a copy into
    it of `block_size` bytes from `copy_from` + i * block_size (0: no copy), then, with
    `hashed`, its checksum - right after the copy, while the bytes are in the cache."""
    jobs = new_jobs(blocks.shape[0])
    if copy_from:
        jobs[:, SRC] = copy_from + np.arange(blocks.shape[0], dtype=np.int64) * block_size
        jobs[:, DST], jobs[:, LEN] = blocks, block_size
    if hashed:
        jobs[:, HASH_AT], jobs[:, HASH_LEN] = blocks, block_size
    return jobs


def copy_many(jobs: np.ndarray, *, bypass_caches: bool = False) -> int:
    """Run every job of `jobs` (an (n, 6) int64 array, see the module docstring); the
    checksums land in jobs[:, HASH]. Returns how many the helper thread ran.
    `bypass_caches`: the copies go out of device DRAM into the host's buffer, which this
    thread does not read again, as part of a transfer too large for the caches
    (bypasses_caches) - those of 64 KiB or more bypass them (streaming stores)."""
    if jobs.dtype != np.int64 or jobs.ndim != 2 or jobs.shape[1] != FIELDS or not jobs.flags.c_contiguous:
        raise ValueError(f"jobs must be a C-contiguous (n, {FIELDS}) int64 array")
    run = _native.lib.cxlhm_copy_out_many if bypass_caches else _native.lib.cxlhm_copy_many
    return int(run(_native.ffi.cast("struct cxlhm_copy *", jobs.ctypes.data), jobs.shape[0]))


def linger_us() -> int:
    """How long the helper thread polls for the next run before it sleeps, in µs, as a
    helper started now would: CXLHM_COPY_LINGER_US, else 2000, but 0 in a process confined
    to one CPU (polling would take the caller's core). See native/cxlhm_copy.c."""
    return int(_native.lib.cxlhm_copy_linger_us())


# The longest job a copy of extents is cut into. Shorter jobs share a copy more evenly
# when the helper thread starts late (a claimed job is finished by whoever claimed it):
# 2 MiB copies out of device DRAM through copy_extents ran at 0.74-0.95x of numpy.copyto
# with 256 KiB jobs, 0.62x with 128 KiB and 0.70-0.84x with 1 MiB (one script, the sizes
# interleaved call by call, on the loaded 2-core development machine).
RUN_BYTES = 256 << 10
# A DRAM hit's copy has both threads from its start, so it is cut in halves instead
# (copy_extents(halves=True)), one long run per thread: bench/bench_device.py's 2 MiB
# hits went from 0.72x of numpy.copyto (copied inside the planning kernel) to 1.43x,
# bench/bench_kvstore.py's from 0.77x to 0.94x.


@njit
def extent_jobs(base, block_size, slots, ext_hpa, ext_len, user_addr, to_user, jobs, run_bytes):
    """The jobs (copies only) that firmware.copy_extents' memcpys make: each extent between
    the flat user buffer and its slots, a run of blocks in consecutive slots as one copy,
    cut in pieces of at most `run_bytes` (inside a block too: a block larger than that
    is still shared between the threads). Returns how many; `jobs` needs
    job_rows(...) rows."""
    n_jobs = 0
    k = 0
    pos = 0
    for e in range(ext_hpa.shape[0]):
        hpa = ext_hpa[e]
        left = ext_len[e]
        while left > 0:
            slot_addr, n, k = fw.next_run(base, block_size, slots, k, hpa, left, run_bytes)
            for cut in range(0, n, run_bytes):
                m = min(run_bytes, n - cut)
                jobs[n_jobs, SRC] = slot_addr + cut if to_user else user_addr + pos
                jobs[n_jobs, DST] = user_addr + pos if to_user else slot_addr + cut
                jobs[n_jobs, LEN] = m
                jobs[n_jobs, HASH_AT] = 0
                n_jobs += 1
                pos += m
            hpa += n
            left -= n
    return n_jobs


def job_rows(n_slots: int, total: int, run_bytes: int) -> int:
    """Rows extent_jobs may fill for a copy of `total` bytes over `n_slots` slots: a job
    per run of slots, plus one per run_bytes cut."""
    return n_slots + total // run_bytes


def copy_extents(base: int, block_size: int, slots: np.ndarray, ext_hpa: np.ndarray, ext_len: np.ndarray,
                 user_addr: int, to_user: bool, *, halves: bool = False) -> None:
    """firmware.copy_extents, with a long copy shared with the engine's helper thread.
    `halves`: jobs of half the copy (at least RUN_BYTES), one per thread - a copy that
    owns both threads from its start (a DRAM hit) streams one long run on each."""
    total = int(ext_len.sum())
    if total < HELPER_MIN_BYTES:
        fw.copy_extents(base, block_size, slots, ext_hpa, ext_len, user_addr, to_user)
        return
    run_bytes = max(RUN_BYTES, -(-total // 2)) if halves else RUN_BYTES
    jobs = new_jobs(job_rows(slots.shape[0], total, run_bytes))
    n = extent_jobs(base, block_size, slots, ext_hpa, ext_len, user_addr, to_user, jobs, run_bytes)
    copy_many(jobs[:n], bypass_caches=to_user and bypasses_caches(total))
