"""The device's copy engine (cxlhm/device/stream/copyengine.py, native/cxlhm_copy.c) against numpy and
Python's xxhash: every byte copied and every checksum right, whichever thread ran a job,
with several callers at once, and in a child after fork()."""
import os
import threading

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm.device.stream import copyengine as ce
from cxlhm import sumtable
from threads import run_all, wait_child

BLOCK = 64 << 10


def _jobs(src: np.ndarray, dst: np.ndarray, pieces: list[tuple[int, int, int]], hash_block: bool) -> np.ndarray:
    """A job per (block, start, length): copy that piece of src's block to the same place
    in dst; checksum the whole block if asked."""
    jobs = ce.new_jobs(len(pieces))
    for row, (block, start, length) in enumerate(pieces):
        jobs[row, ce.SRC] = src.ctypes.data + block * BLOCK + start
        jobs[row, ce.DST] = dst.ctypes.data + block * BLOCK + start
        jobs[row, ce.LEN] = length
        if hash_block:
            jobs[row, ce.HASH_AT] = src.ctypes.data + block * BLOCK
            jobs[row, ce.HASH_LEN] = BLOCK
    return jobs


def _check(src, dst, jobs, pieces, hash_block):
    expected = np.zeros_like(dst)
    for block, start, length in pieces:
        lo = block * BLOCK + start
        expected[lo:lo + length] = src[lo:lo + length]
    assert np.array_equal(dst, expected)
    if hash_block and sumtable.COMPILED_HASH:
        want = [xxhash.xxh3_64_intdigest(src[b * BLOCK:(b + 1) * BLOCK]) for b, _, _ in pieces]
        assert jobs[:, ce.HASH].view(np.uint64).tolist() == want


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_copies_and_checksums_match_numpy_and_xxhash(data):
    n_blocks = data.draw(st.integers(1, 24))
    blocks = data.draw(st.lists(st.integers(0, n_blocks - 1), min_size=1, max_size=n_blocks, unique=True))
    pieces = []
    for b in blocks:
        start = data.draw(st.integers(0, BLOCK - 1))
        pieces.append((b, start, data.draw(st.integers(0, BLOCK - start))))
    hash_block = data.draw(st.booleans())
    src = np.random.default_rng(n_blocks).integers(0, 256, n_blocks * BLOCK, dtype=np.uint8)
    dst = np.zeros_like(src)
    jobs = _jobs(src, dst, pieces, hash_block)
    ran_by_helper = ce.copy_many(jobs)
    assert 0 <= ran_by_helper <= len(pieces)
    _check(src, dst, jobs, pieces, hash_block)


def test_a_large_run_is_shared_with_the_helper_thread():
    """64 whole blocks (4 MiB to copy and hash): the helper joins unless it wakes after the
    caller did them all, which cannot happen every time in 50 tries."""
    src = np.random.default_rng(1).integers(0, 256, 64 * BLOCK, dtype=np.uint8)
    pieces = [(b, 0, BLOCK) for b in range(64)]
    shared = 0
    for _ in range(50):
        dst = np.zeros_like(src)
        jobs = _jobs(src, dst, pieces, True)
        shared += ce.copy_many(jobs) > 0
        _check(src, dst, jobs, pieces, True)
    assert shared > 0


def test_callers_on_several_threads_at_once():
    src = np.random.default_rng(2).integers(0, 256, 32 * BLOCK, dtype=np.uint8)
    pieces = [(b, 0, BLOCK) for b in range(32)]
    errors = []

    def caller():
        try:
            for _ in range(30):
                dst = np.zeros_like(src)
                jobs = _jobs(src, dst, pieces, True)
                ce.copy_many(jobs)
                _check(src, dst, jobs, pieces, True)
        except AssertionError as e:  # pragma: no cover - reported below
            errors.append(e)

    run_all([threading.Thread(target=caller) for _ in range(4)], hang="a caller never returned")
    assert not errors


def test_a_forked_child_gets_its_own_helper():
    src = np.random.default_rng(3).integers(0, 256, 32 * BLOCK, dtype=np.uint8)
    pieces = [(b, 0, BLOCK) for b in range(32)]
    dst = np.zeros_like(src)  # kept alive until the copy is made (the jobs hold only its address)
    ce.copy_many(_jobs(src, dst, pieces, True))  # the parent's helper runs
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status, never returns into pytest
        code = 5  # 5: the child raised
        try:
            shared = 0
            for _ in range(50):
                dst = np.zeros_like(src)
                shared += ce.copy_many(_jobs(src, dst, pieces, True)) > 0
                if not np.array_equal(dst, src):
                    code = 3
                    break
            else:
                code = 0 if shared else 4  # 4: no helper thread in the child
        finally:
            os._exit(code)
    status = wait_child(pid, timeout=120, hang="the forked child's copy never returned (a helper's state carried "
                                                "over the fork?)")
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_malformed_job_array_is_refused():
    with pytest.raises(ValueError, match="int64"):
        ce.copy_many(np.zeros((2, 5), np.int64))
    with pytest.raises(ValueError, match="int64"):
        ce.copy_many(np.zeros((2, 6), np.int32))


def _in_a_fresh_process(child: str, linger: str | None) -> str:
    """Run `child` (Python, with this folder and the repository on sys.path) in a new
    process with CXLHM_COPY_LINGER_US set to `linger` (None: unset); its stdout."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "CXLHM_COPY_LINGER_US"}
    if linger is not None:
        env["CXLHM_COPY_LINGER_US"] = linger
    proc = subprocess.run([sys.executable, "-c", "import sys\nsys.path[:0] = [sys.argv[1], sys.argv[2]]\n" + child,
                           here, os.path.dirname(here)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize("linger, polls_us", [("0", 0), ("50000", 50000), ("-3", 0), ("not a number", 0),
                                              ("99999999999999999999", 10_000_000)])
def test_the_helpers_linger_setting_is_read_safely_and_never_changes_what_is_copied(linger, polls_us):
    """CXLHM_COPY_LINGER_US (how long the helper polls before it sleeps): a negative or
    non-numeric value turns polling off, a huge one is capped at 10 s; polling or not,
    every run is right and large runs are still shared with the helper."""
    out = _in_a_fresh_process(
        "import numpy as np\n"
        "import test_copy_engine as t\n"
        "from cxlhm.device.stream import copyengine as ce\n"
        "src = np.random.default_rng(4).integers(0, 256, 64 * t.BLOCK, dtype=np.uint8)\n"
        "pieces = [(b, 0, t.BLOCK) for b in range(64)]\n"
        "shared = 0\n"
        "for _ in range(50):\n"
        "    dst = np.zeros_like(src)\n"
        "    jobs = t._jobs(src, dst, pieces, True)\n"
        "    shared += ce.copy_many(jobs) > 0\n"
        "    t._check(src, dst, jobs, pieces, True)\n"
        "print(ce.linger_us(), shared)\n", linger)
    linger_us, shared = map(int, out.split())
    assert linger_us == polls_us
    assert shared > 0


def test_polling_is_on_by_default_and_off_on_one_cpu():
    """Unset, the helper polls for 2 ms - unless the process may run on one CPU only,
    where polling would take the caller's core."""
    child = "from cxlhm.device.stream import copyengine as ce\nprint(ce.linger_us())\n"
    if len(os.sched_getaffinity(0)) >= 2:
        assert int(_in_a_fresh_process(child, None)) == 2000
    one_cpu = "import os\nos.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n" + child
    assert int(_in_a_fresh_process(one_cpu, None)) == 0
    assert int(_in_a_fresh_process(one_cpu, "300")) == 300  # told to: it does


@settings(max_examples=40, deadline=None)
@given(src_off=st.integers(0, 63), dst_off=st.integers(0, 63),
       length=st.sampled_from([1, 4095, 65535, 65536, 65537, 65536 + 63, 200_001, 3 * BLOCK]),
       n_jobs=st.integers(1, 6))
def test_copies_out_to_the_host_bypass_the_caches_and_stay_exact(src_off, dst_off, length, n_jobs):
    """copy_many(bypass_caches=True) streams copies of 64 KiB or more past the caches: any
    alignment of either side, any tail, the bytes around each copy untouched."""
    stride = length + 128
    src = np.random.default_rng(length).integers(0, 256, n_jobs * stride + 64, dtype=np.uint8)
    dst = np.zeros_like(src)
    jobs = ce.new_jobs(n_jobs)
    for j in range(n_jobs):
        jobs[j, ce.SRC] = src.ctypes.data + j * stride + src_off
        jobs[j, ce.DST] = dst.ctypes.data + j * stride + dst_off
        jobs[j, ce.LEN] = length
    ce.copy_many(jobs, bypass_caches=True)
    expected = np.zeros_like(dst)
    for j in range(n_jobs):
        expected[j * stride + dst_off:j * stride + dst_off + length] = src[j * stride + src_off:j * stride + src_off + length]
    assert np.array_equal(dst, expected)



@pytest.mark.skipif(not sumtable.COMPILED_HASH, reason="the engine checksums only with the compiled xxh3")
@pytest.mark.parametrize("copy", [False, True])
def test_block_jobs_copy_whole_blocks_in_and_checksum_each_after_its_copy(copy):
    """block_jobs: a job per block slot, copying into it from a flat buffer (or not), then
    checksumming the slot - the checksum is of the bytes the slot holds after the copy."""
    n = 6
    slots = np.random.default_rng(3).integers(0, 256, n * BLOCK, dtype=np.uint8)
    host = np.random.default_rng(4).integers(0, 256, n * BLOCK, dtype=np.uint8)
    before = slots.copy()
    addrs = slots.ctypes.data + np.arange(n, dtype=np.int64)[::-1].copy() * BLOCK  # slots in any order
    jobs = ce.block_jobs(addrs, BLOCK, copy_from=host.ctypes.data if copy else 0, hashed=True)
    ce.copy_many(jobs)
    want = np.empty_like(slots)
    for i in range(n):  # job i fills the slot at addrs[i] from host block i
        at = (n - 1 - i) * BLOCK
        want[at:at + BLOCK] = host[i * BLOCK:(i + 1) * BLOCK] if copy else before[at:at + BLOCK]
    assert np.array_equal(slots, want)
    sums = jobs[:, ce.HASH].view(np.uint64)
    assert sums.tolist() == [xxhash.xxh3_64_intdigest(want[(n - 1 - i) * BLOCK:(n - i) * BLOCK].tobytes())
                             for i in range(n)]
