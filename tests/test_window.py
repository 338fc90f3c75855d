"""The load/store window: numpy / torch / C code reading and writing the HDM
range as plain memory, served by the native userfaultfd fault handler.

Every data test checks bytes against a model, under heavy eviction (device DRAM of a
few blocks), and most reopen the image in explicit mode to check what was persisted.
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from cxlhm.window import WindowOptions, WindowUnavailable, open_window, probe
from cxlhm.window.availability import explain
from host_runtime.driver import open_device

KIB = 1024
UNAVAILABLE = probe()
needs_window = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"userfaultfd window unavailable: {UNAVAILABLE}")


@pytest.fixture
def make_window(tmp_path):
    opened = []

    def factory(options: WindowOptions | None = None, path: str | None = None, **overrides):
        cfg = {"capacity": 4 << 20, "block_size": 16 * KIB, "dram_bytes": 4 * 16 * KIB,
               "backend": {"path": path or str(tmp_path / "ssd.img")}}
        cfg.update(overrides)
        w = open_window(cfg, options or WindowOptions(sample_interval_ms=0))
        opened.append(w)
        return w

    yield factory
    for w in opened:
        w.close()


def explicit_bytes(path: str, capacity: int, hpa: int, n: int, block_size: int = 16 * KIB) -> bytes:
    with open_device({"capacity": capacity, "block_size": block_size, "dram_bytes": 4 * block_size,
                      "backend": {"path": path}}) as dev:
        return dev.load(hpa, n)


# ---------------------------------------------------------------- basics and persistence

@needs_window
def test_window_bytes_persist_and_read_back_in_explicit_mode(make_window, tmp_path):
    path = str(tmp_path / "img")
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 300 * KIB, dtype=np.uint8)
    w = make_window(path=path)
    a = w.ndarray(5000, data.shape, np.uint8)
    assert not a.any(), "a fresh device reads zeros"
    a[:] = data  # 300 KiB through 4 slots of 16 KiB: most blocks are evicted on the way
    assert np.array_equal(a, data)
    assert w.stats()["evictions"] > 0
    del a
    w.close()
    written = w.stats()  # final counters, the close's own flush included
    assert written["writeback_bytes"] >= data.size and written["dirty_blocks"] == 0
    assert explicit_bytes(path, 4 << 20, 5000, data.size) == data.tobytes()

    # and the other way round: explicit writes, window reads
    with open_device({"capacity": 4 << 20, "block_size": 16 * KIB, "dram_bytes": 64 * KIB,
                      "backend": {"path": path}}) as dev:
        dev.store(1 << 20, b"explicit mode wrote this")
    w = make_window(path=path)
    assert bytes(w.memoryview(1 << 20, 24)) == b"explicit mode wrote this"
    assert w.ndarray(5000, data.shape, np.uint8).tobytes() == data.tobytes()


@needs_window
def test_views_check_their_range_and_dtype(make_window):
    w = make_window()
    f = w.ndarray(4096, (64, 16), np.float32)
    f[:] = np.arange(1024, dtype=np.float32).reshape(64, 16)
    assert w.ndarray(4096, 1024, np.float32)[1023] == 1023
    assert bytes(w.memoryview(4096, 4)) == np.float32(0).tobytes()
    with pytest.raises(IndexError):
        w.ndarray(w.capacity - 8, 2, np.float64)
    with pytest.raises(IndexError):
        w.prefetch(-1, 10)


# ---------------------------------------------------------------- concurrency under eviction

def _hammer(arr: np.ndarray, model: np.ndarray, tid: int, n_threads: int, chunk: int, ops: int, seed: int,
            errors: list) -> None:
    """Random reads and writes of this thread's chunks (chunks interleave between
    threads, so threads share blocks and fault on the same ones)."""
    rng = np.random.default_rng(seed)
    n_chunks = arr.size // chunk // n_threads
    for _ in range(ops):
        c = (int(rng.integers(n_chunks)) * n_threads + tid) * chunk
        start = c + int(rng.integers(chunk))
        end = min(c + chunk, start + 1 + int(rng.integers(chunk)))
        if rng.random() < 0.5:
            data = rng.integers(0, 256, end - start, dtype=np.uint8)
            arr[start:end] = data
            model[start:end] = data
        elif not np.array_equal(arr[start:end], model[start:end]):
            errors.append((tid, start, end))
            return


@needs_window
@pytest.mark.parametrize("granule", [None, 4 * KIB], ids=["granule=block", "granule=4KiB"])
def test_threads_read_and_write_under_heavy_eviction(make_window, tmp_path, granule):
    path = str(tmp_path / f"img{granule}")
    w = make_window(WindowOptions(dirty_granule=granule, sample_interval_ms=0), path=path)
    size, n_threads = 1 << 20, 4  # 64 blocks through 4 slots
    arr = w.ndarray(0, size, np.uint8)
    model = np.zeros(size, np.uint8)
    errors: list = []
    peak = [0]
    stop = threading.Event()

    def watch_residency():
        while not stop.is_set():
            peak[0] = max(peak[0], w.resident_bytes())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch_residency)
    watcher.start()
    threads = [threading.Thread(target=_hammer, args=(arr, model, t, n_threads, 3000, 1500, t, errors))
               for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    watcher.join()
    assert not any(t.is_alive() for t in threads), "a thread hung in a fault"
    assert errors == [], f"stale bytes read at {errors[:3]}"
    assert np.array_equal(arr, model)
    stats = w.stats()
    assert stats["evictions"] > 100 and stats["writebacks"] > 0
    assert peak[0] <= w.cfg.dram_bytes + w.block_size, "resident bytes exceeded the DRAM budget"
    if granule:  # partial write-backs: only the written 4 KiB granules go to the SSD
        assert stats["writeback_bytes"] < stats["writebacks"] * w.block_size
    del arr
    w.close()
    assert explicit_bytes(path, 4 << 20, 0, size) == model.tobytes()


HELPER_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#define CHUNK 1000
struct job { unsigned char *win, *model; uint64_t size; int tid, nthreads, ops; uint32_t seed; long bad; };
static uint32_t next(uint32_t *s) { *s = *s * 1103515245u + 12345u; return *s >> 4; }
static void *run(void *arg) {
    struct job *j = arg;
    uint32_t s = j->seed;
    uint64_t owned = j->size / CHUNK / j->nthreads;
    unsigned char buf[CHUNK];
    for (int i = 0; i < j->ops; i++) {
        uint64_t c = ((next(&s) % owned) * j->nthreads + j->tid) * CHUNK;
        uint64_t start = c + next(&s) % CHUNK, len = 1 + next(&s) % CHUNK;
        if (start + len > c + CHUNK) len = c + CHUNK - start;
        if (next(&s) & 1) {
            for (uint64_t k = 0; k < len; k++) buf[k] = (unsigned char)next(&s);
            memcpy(j->win + start, buf, len);
            memcpy(j->model + start, buf, len);
        } else if (memcmp(j->win + start, j->model + start, len)) {
            j->bad++;
        }
    }
    return 0;
}
long hammer(unsigned char *win, unsigned char *model, uint64_t size, int nthreads, int ops) {
    pthread_t t[16]; struct job jobs[16]; long bad = 0;
    for (int i = 0; i < nthreads; i++) {
        jobs[i] = (struct job){win, model, size, i, nthreads, ops, 7u * (i + 1), 0};
        pthread_create(&t[i], 0, run, &jobs[i]);
    }
    for (int i = 0; i < nthreads; i++) { pthread_join(t[i], 0); bad += jobs[i].bad; }
    return bad;
}
"""


@needs_window
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the C helper")
def test_c_threads_read_and_write_under_heavy_eviction(make_window, tmp_path):
    src = tmp_path / "helper.c"
    src.write_text(HELPER_C)
    lib_path = tmp_path / "helper.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", "-o", str(lib_path), str(src)], check=True)
    helper = ctypes.CDLL(str(lib_path))
    helper.hammer.restype = ctypes.c_long
    helper.hammer.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]

    path = str(tmp_path / "img")
    w = make_window(WindowOptions(dirty_granule=4 * KIB, sample_interval_ms=0), path=path)
    size = 1 << 20
    view = w.ndarray(0, size, np.uint8)  # keeps the range alive while C uses the address
    model = np.zeros(size, np.uint8)
    bad = helper.hammer(w.address(0), model.ctypes.data, size, 4, 4000)
    assert bad == 0, f"{bad} stale reads from C threads"
    assert np.array_equal(view, model)
    assert w.stats()["evictions"] > 100
    del view
    w.close()
    assert explicit_bytes(path, 4 << 20, 0, size) == model.tobytes()


@needs_window
def test_store_racing_with_eviction_survives(make_window, tmp_path):
    """A writer keeps storing into block 0 while another thread keeps evicting it."""
    path = str(tmp_path / "img")
    w = make_window(path=path, dram_bytes=2 * 16 * KIB)
    counter = w.ndarray(100, 1, np.int64)
    others = w.ndarray(16 * KIB, 40 * 16 * KIB, np.uint8)
    stop = threading.Event()
    last = [0]

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            counter[0] = i  # a store that may land while block 0 is being evicted
            last[0] = i
            assert counter[0] == i

    def evictor():
        while not stop.is_set():
            for b in range(40):
                others[b * 16 * KIB] += 1  # read-modify-write: fills and write-backs

    threads = [threading.Thread(target=writer), threading.Thread(target=evictor)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert last[0] > 0 and int(counter[0]) == last[0]
    assert w.stats()["wp_faults"] > 1, "block 0 was re-dirtied after write-backs"
    expected = last[0]
    del counter, others
    w.close()
    assert int(np.frombuffer(explicit_bytes(path, 4 << 20, 100, 8), np.int64)[0]) == expected


@needs_window
def test_concurrent_faults_on_one_block_are_served_once(make_window):
    w = make_window(block_size=256 * KIB, dram_bytes=4 * 256 * KIB)
    arr = w.ndarray(0, 256 * KIB, np.uint8)
    barrier = threading.Barrier(8)
    seen = []

    def touch(i):
        barrier.wait()
        seen.append(int(arr[i * 32 * KIB]))

    before = w.stats()
    threads = [threading.Thread(target=touch, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    after = w.stats()
    assert seen == [0] * 8
    assert after["fills"] - before["fills"] == 1, (before, after, w.base_address)
    assert after["uffdio_copies"] - before["uffdio_copies"] == 1


# ---------------------------------------------------------------- the GIL

@needs_window
def test_thread_holding_the_gil_faults_without_deadlock(make_window):
    w = make_window()
    w.ndarray(0, 1 << 20, np.uint8)[::4096] = 7  # write some blocks out, evicting most
    mv = w.memoryview(0, 1 << 20)
    result = {}

    def copy_holding_gil():
        result["bytes"] = bytes(mv)  # one memcpy under the GIL, faulting on 60 absent blocks
        result["array"] = np.array(w.ndarray(0, 1 << 20, np.uint8))  # numpy copy of absent blocks

    t = threading.Thread(target=copy_holding_gil)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "deadlock: a GIL-holding thread's fault was never served"
    assert result["bytes"][::4096] == b"\x07" * 256
    assert result["array"][4096] == 7 and result["array"][4097] == 0


# ---------------------------------------------------------------- prefetch and hints

@needs_window
def test_prefetched_range_is_read_with_zero_faults(make_window):
    w = make_window(dram_bytes=32 * 16 * KIB, options=WindowOptions(sample_interval_ms=5, sample_min_age_ms=1,
                                                                    sample_fraction=1.0))
    data = np.arange(20 * 16 * KIB, dtype=np.uint8)
    w.ndarray(1 << 20, data.size, np.uint8)[:] = data
    w.flush()
    w.ndarray(3 << 20, 40 * 16 * KIB, np.uint8).sum()  # evict it
    before = w.stats()
    assert w.prefetch(1 << 20, data.size) == 20
    time.sleep(0.05)  # the sampler runs meanwhile; it must leave prefetched blocks alone
    assert np.array_equal(w.ndarray(1 << 20, data.size, np.uint8), data)
    after = w.stats()
    assert after["faults"] == before["faults"], "a prefetched block faulted"
    assert after["prefetch_installed"] - before["prefetch_installed"] == 20


@needs_window
def test_hinted_prefix_is_prefetched_by_the_policy_and_read_without_faults(make_window):
    from cxlhm.mailbox.hints import HintKind
    w = make_window(dram_bytes=32 * 16 * KIB, firmware={"policy": "hymcache"})
    prefix = np.random.default_rng(3).integers(0, 256, 12 * 16 * KIB, dtype=np.uint8)
    w.ndarray(0, prefix.size, np.uint8)[:] = prefix
    w.ndarray(2 << 20, 40 * 16 * KIB, np.uint8).sum()  # the session pauses: its prefix is evicted
    before = w.stats()
    assert w.hint(HintKind.SESSION_RESUME, 7, 0, 12)
    assert w.wait_idle(timeout=20)
    assert np.array_equal(w.ndarray(0, prefix.size, np.uint8), prefix)
    after = w.stats()
    assert after["prefetch_installed"] - before["prefetch_installed"] == 12
    assert after["faults"] == before["faults"], "the hinted prefix was read with faults"


@needs_window
def test_pinned_block_stays_resident(make_window):
    from cxlhm.mailbox.hints import HintKind
    w = make_window()
    assert w.hint(HintKind.PIN, 0, 3, 1)
    w.ndarray(10 * 16 * KIB, 30 * 16 * KIB, np.uint8).sum()
    before = w.stats()["faults"]
    w.ndarray(3 * 16 * KIB, 16 * KIB, np.uint8).sum()
    assert w.stats()["faults"] == before
    assert not w.hint(HintKind.PIN, 0, 10, 4), "pinning all of DRAM would leave no slot for faults"
    assert w.hint(HintKind.UNPIN, 0, 3, 1)


# ---------------------------------------------------------------- recency sampler

@needs_window
@pytest.mark.parametrize("parked", [None, 16 * KIB], ids=["park-a-page", "park-the-block"])
def test_sampler_reports_accesses_and_keeps_written_bytes(make_window, tmp_path, parked):
    path = str(tmp_path / "img")
    w = make_window(WindowOptions(sample_interval_ms=2, sample_min_age_ms=1, sample_fraction=1.0,
                                  dirty_granule=4 * KIB, sample_bytes=parked), path=path, dram_bytes=8 * 16 * KIB)
    arr = w.ndarray(0, 8 * 16 * KIB, np.uint8)
    model = np.random.default_rng(5).integers(0, 256, arr.size, dtype=np.uint8)
    arr[: arr.size // 2] = model[: arr.size // 2]  # half the blocks written, half only read (clean)
    model[arr.size // 2:] = 0
    assert not arr[arr.size // 2:].any()
    deadline = time.time() + 10
    while w.stats()["samples"] < 8 and time.time() < deadline:
        time.sleep(0.01)
    before = w.stats()
    assert before["samples"] >= 8, "the sampler parked nothing"
    for _ in range(3):  # reads and writes of parked blocks: each is an access signal
        assert np.array_equal(arr, model)
        arr[::5000] = 9
        model[::5000] = 9
        time.sleep(0.02)
    after = w.stats()
    assert after["sample_faults"] > before["sample_faults"]
    assert after["hits"] > before["hits"], "sampled accesses did not reach the policy"
    w.ndarray(1 << 20, 20 * 16 * KIB, np.uint8).sum()  # evict everything, parked or not
    assert np.array_equal(arr, model)
    del arr
    w.close()
    assert explicit_bytes(path, 4 << 20, 0, model.size) == model.tobytes()


# ---------------------------------------------------------------- torch, the driver facade

@needs_window
def test_torch_frombuffer_over_the_window(make_window, tmp_path):
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "img")
    w = make_window(path=path)
    n = 50_000
    t = torch.frombuffer(w.memoryview(8192, 4 * n), dtype=torch.float32)
    t.copy_(torch.arange(n, dtype=torch.float32))
    assert torch.equal(t, torch.arange(n, dtype=torch.float32))
    assert w.ndarray(8192, n, np.float32)[12345] == 12345
    del t
    w.close()
    assert np.frombuffer(explicit_bytes(path, 4 << 20, 8192, 4 * n), np.float32)[n - 1] == n - 1


@needs_window
def test_driver_handle_over_a_window_device(tmp_path):
    from cxlhm.config import load_config
    from cxlhm.window import WindowDevice
    from host_runtime.driver import DeviceHandle
    cfg = load_config({"capacity": 1 << 20, "block_size": 16 * KIB, "dram_bytes": 64 * KIB, "mode": "window",
                       "backend": {"path": str(tmp_path / "img")}})
    with DeviceHandle(WindowDevice(cfg)) as dev:
        dev.store(70_000, b"through the handle")
        window = dev.window
        assert bytes(window.memoryview(70_000, 18)) == b"through the handle"
        window.ndarray(200_000, 5, np.uint8)[:] = 42
        assert dev.load(200_000, 5) == b"\x2a" * 5
        out = np.zeros(5, np.uint8)
        dev.readv([200_000], 5, out)
        assert (out == 42).all()
        assert dev.mailbox.identify()  # the CXL mailbox runs over the window device too
        before = window.stats()["prefetch_installed"]
        dev.hint_sink("mailbox").pin([(16 * KIB * 40, 16 * KIB)])  # PIN through the mailbox: installs the block
        assert window.wait_idle(timeout=10)
        assert window.stats()["prefetch_installed"] == before + 1


# ---------------------------------------------------------------- availability

def test_unavailable_messages_name_the_fix():
    text = explain(1, errno.EPERM, "userfaultfd: Operation not permitted")
    assert "vm.unprivileged_userfaultfd=1" in text and "seccomp" in text and "explicit" in text
    assert "CONFIG_USERFAULTFD" in explain(1, errno.ENOSYS, "userfaultfd")
    assert "Linux 5.7" in explain(3, errno.EINVAL, "UFFDIO_REGISTER")
    assert issubclass(WindowUnavailable, RuntimeError)


def test_window_rejects_configs_it_cannot_serve(tmp_path):
    from cxlhm.config import ConfigError
    base = {"capacity": 1 << 20, "block_size": 16 * KIB, "dram_bytes": 64 * KIB,
            "backend": {"path": str(tmp_path / "img")}}
    with pytest.raises(ConfigError, match="data: real"):
        open_window({**base, "data": "none"})
    with pytest.raises(ConfigError, match="wall clock"):
        open_window({**base, "clock": "model"})
    with pytest.raises(ConfigError, match="write-through"):
        open_window({**base, "firmware": {"policy": "lru", "write_mode": "write-through"}})


@pytest.mark.slow
@needs_window
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_unprivileged_process_gets_a_window_or_a_fix():
    """As `nobody` with vm.unprivileged_userfaultfd=0 the window falls back to a
    user-mode-only userfaultfd (loads and stores work) or says what to change."""
    import tempfile
    from pathlib import Path
    tmp_path = Path(tempfile.mkdtemp(prefix="cxlhm-nobody-"))  # pytest's own tmp is root-only
    os.chmod(tmp_path, 0o777)
    script = (
        "import numpy as np, warnings\n"
        "from cxlhm.window import open_window, WindowUnavailable\n"
        "try:\n"
        f"    w = open_window({{'capacity': 1 << 20, 'block_size': 16384, 'dram_bytes': 65536,"
        f" 'backend': {{'path': '{tmp_path}/img'}}}})\n"
        "except WindowUnavailable as exc:\n"
        "    print('UNAVAILABLE', exc)\n"
        "else:\n"
        "    a = w.ndarray(0, 200000, np.uint8); a[:] = 3\n"
        "    print('OK', int(a.sum()), w.user_mode_only); del a; w.close()\n")
    env = {**os.environ, "CXLHM_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path),
           "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                           script], capture_output=True, text=True, env=env, timeout=300)
    shutil.rmtree(tmp_path, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert "OK 600000" in out or ("UNAVAILABLE" in out and "vm.unprivileged_userfaultfd" in out), out
