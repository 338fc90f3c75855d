"""Huge pages in the load/store window: a prefetched 2 MiB-aligned region is rebuilt as
one transparent huge page (MADV_COLLAPSE) once its blocks are installed and clean.

What the kernel does is observed directly - the page tables through PAGEMAP_SCAN and,
independently, /proc/self/smaps' AnonHugePages - and every test checks the bytes against
a model through a store, an eviction and a re-fault, and after a reopen."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from cxlhm.integrity import PoisonError
from cxlhm.window import WindowOptions, open_window, probe
from host_runtime.driver import open_device

KIB, MIB = 1 << 10, 1 << 20
BLOCK = 64 * KIB
REGION = 2 * MIB
CAPACITY = 16 * MIB
UNAVAILABLE = probe()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"userfaultfd window unavailable: {UNAVAILABLE}")


def config(path, dram_blocks: int) -> dict:
    return {"capacity": CAPACITY, "block_size": BLOCK, "dram_bytes": dram_blocks * BLOCK,
            "backend": {"path": str(path)}, "firmware": {"policy": "lru"}}


@pytest.fixture
def huge_window(tmp_path):
    opened = []

    def factory(dram_blocks: int, path=None):
        w = open_window(config(path or tmp_path / "img", dram_blocks), WindowOptions(sample_interval_ms=0))
        opened.append(w)
        reason = w.huge_pages_unavailable()
        if reason:
            pytest.skip(f"no huge pages for the window on this kernel: {reason}")
        return w

    yield factory
    for w in opened:
        w.close()


def smaps_huge_bytes(start: int, end: int) -> int:
    """AnonHugePages of the mappings overlapping [start, end), from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < end and hi > start
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1]) * KIB
    return total


def fill(w, n: int, seed: int) -> np.ndarray:
    """Random bytes at [0, n), written through the window and flushed to the SSD."""
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    w.ndarray(0, n, np.uint8)[:] = data
    w.flush()
    return data


def evict_all(w) -> None:
    """Read as many other blocks as device DRAM holds (LRU evicts everything else)."""
    w.ndarray(CAPACITY // 2, w.n_slots * BLOCK, np.uint8).sum()


def prefetch_region(w, hpa: int = 0) -> None:
    failures = w.stats()["collapse_failures"]
    w.prefetch(hpa, REGION)
    assert w.wait_idle(timeout=60)
    if w.stats()["collapse_failures"] > failures:  # ENOMEM/EAGAIN: memory too fragmented right now
        pytest.skip("the kernel had no huge page to collapse the region into (MADV_COLLAPSE failed)")


def test_prefetched_region_is_one_huge_page_and_keeps_its_bytes_through_store_eviction_refault(
        huge_window, tmp_path):
    path = tmp_path / "img"
    w = huge_window(40, path)
    model = fill(w, REGION, seed=1)
    evict_all(w)
    assert w.huge_page_bytes(0, REGION) == 0
    before = w.stats()
    prefetch_region(w)
    after = w.stats()
    assert w.huge_page_bytes(0, REGION) == REGION, "the prefetched region is not mapped by a huge page"
    base = w.address(0)
    assert smaps_huge_bytes(base, base + REGION) >= REGION, "smaps does not see the huge page"
    assert after["huge_collapses"] - before["huge_collapses"] == 1
    view = w.ndarray(0, REGION, np.uint8)
    assert np.array_equal(view, model)
    assert w.stats()["faults"] == after["faults"], "reading the collapsed region faulted"

    # a first store: one write-protect fault, which splits the huge page
    view[5 * BLOCK + 7] = model[5 * BLOCK + 7] = model[5 * BLOCK + 7] ^ 0xFF
    assert w.stats()["wp_faults"] == after["wp_faults"] + 1
    assert w.huge_page_bytes(0, REGION) == 0
    assert np.array_equal(view, model)

    # eviction (the written block is written back), re-fault, same bytes
    evict_all(w)
    assert w.stats()["writebacks"] > after["writebacks"]
    assert np.array_equal(view, model)
    del view
    w.close()
    with open_device(config(path, 8)) as dev:
        assert dev.load(0, REGION) == model.tobytes()


def test_evicting_one_clean_block_of_a_huge_page_drops_only_that_block(huge_window):
    w = huge_window(33)  # the region's 32 blocks and one more
    model = fill(w, REGION, seed=2)
    evict_all(w)
    prefetch_region(w)
    assert w.huge_page_bytes(0, REGION) == REGION
    w.ndarray(CAPACITY - 2 * BLOCK, 2 * BLOCK, np.uint8).sum()  # two more blocks: one of the region goes
    assert w.stats()["evictions"] >= 1
    assert w.huge_page_bytes(0, REGION) == 0
    assert w.resident_bytes() <= 33 * BLOCK, "the evicted block's pages are still mapped"
    assert np.array_equal(w.ndarray(0, REGION, np.uint8), model)


def window_mappings(w) -> int:
    """Mappings (VMAs) over the window's range, from /proc/self/maps."""
    start, end = w.address(0), w.address(0) + w.capacity
    with open("/proc/self/maps") as f:
        spans = [[int(x, 16) for x in line.split()[0].split("-")] for line in f]
    return sum(1 for lo, hi in spans if lo < end and hi > start)


def test_collapses_leave_the_window_one_mapping(huge_window):
    """Each collapse flips its region's huge-page advice and back; the kernel must merge
    the region back, or every collapse would cost a mapping (of vm.max_map_count)."""
    w = huge_window(120)
    n = 3 * REGION
    model = fill(w, n, seed=7)
    evict_all(w)
    w.prefetch(0, n)
    assert w.wait_idle(timeout=60)
    if w.stats()["collapse_failures"]:
        pytest.skip("the kernel had no huge page to collapse the region into (MADV_COLLAPSE failed)")
    assert w.huge_page_bytes(0, n) == n
    assert window_mappings(w) == 1
    assert np.array_equal(w.ndarray(0, n, np.uint8), model)


def test_a_region_is_collapsed_again_after_it_was_split(huge_window):
    w = huge_window(40)
    model = fill(w, REGION, seed=3)
    evict_all(w)
    prefetch_region(w)
    w.ndarray(0, REGION, np.uint8)[0] = model[0] = 9  # split, dirty
    w.flush()  # clean again, but on 4 KiB pages
    evict_all(w)
    prefetch_region(w)
    assert w.huge_page_bytes(0, REGION) == REGION
    assert np.array_equal(w.ndarray(0, REGION, np.uint8), model)


def test_stores_racing_with_the_collapse_are_kept(huge_window, tmp_path):
    """A writer stores into the region while it is collapsed in the background, starting
    a little later each round: a store that lands while the region is unprotected takes
    no fault (the window finds it by comparing bytes), one before or after takes a
    write-protect fault. Whatever the interleaving, the bytes and the image end up with
    the writer's values."""
    path = tmp_path / "img"
    w = huge_window(40, path)
    model = fill(w, REGION, seed=4)
    rng = np.random.default_rng(5)
    for round_ in range(12):
        evict_all(w)
        view = w.ndarray(0, REGION, np.uint8)
        offsets = rng.permutation(REGION // BLOCK) * BLOCK + rng.integers(0, BLOCK, REGION // BLOCK)
        values = (model[offsets] + 1 + round_).astype(np.uint8)  # every store changes its byte
        go = threading.Event()

        def writer():
            go.wait()
            time.sleep(round_ * 0.0003)  # sweeps the collapse's few milliseconds
            for off, value in zip(offsets, values):
                view[off] = value

        t = threading.Thread(target=writer)
        t.start()
        w.prefetch(0, REGION)  # returns once installed; the collapse follows in the background
        go.set()
        t.join()
        assert w.wait_idle(timeout=60)
        model[offsets] = values
        assert np.array_equal(view, model), round_
        del view
    w.close()
    with open_device(config(path, 8)) as dev:
        assert dev.load(0, REGION) == model.tobytes()


def test_kill9_after_a_collapse_loses_only_the_block_written_since(tmp_path):
    """The collapse logs its blocks dirty while they are writable, then clean again: a
    crash afterwards poisons only the block stored to, the others read back intact."""
    image = tmp_path / "img"
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        import numpy as np
        from cxlhm.window import WindowOptions, open_window
        cfg = {config(image, 40)!r}
        w = open_window(cfg, WindowOptions(sample_interval_ms=0))
        if w.huge_pages_unavailable():
            print("skip", w.huge_pages_unavailable(), flush=True)
            sys.exit(0)
        w.ndarray(0, {REGION}, np.uint8)[:] = ord("A")
        w.flush()
        w.ndarray({CAPACITY // 2}, 40 * {BLOCK}, np.uint8).sum()
        w.prefetch(0, {REGION})
        assert w.wait_idle(timeout=60)
        if w.stats()["collapse_failures"]:
            print("skip the kernel had no huge page to collapse the region into", flush=True)
            sys.exit(0)
        assert w.huge_page_bytes(0, {REGION}) == {REGION}
        w.ndarray(3 * {BLOCK}, 1, np.uint8)[0] = ord("B")
        print("written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if r.stdout.startswith("skip"):
        pytest.skip(f"no huge pages for the window on this kernel: {r.stdout[5:].strip()}")
    assert r.returncode == -signal.SIGKILL and "written" in r.stdout, r.stderr
    with open_device(config(image, 8)) as dev:
        for block in range(REGION // BLOCK):
            if block == 3:
                with pytest.raises(PoisonError):
                    dev.load(block * BLOCK, BLOCK)
            else:
                assert dev.load(block * BLOCK, BLOCK) == b"A" * BLOCK, block


def test_sampler_parks_a_page_of_a_huge_page_and_the_bytes_survive(tmp_path):
    """The recency sampler moves one page of an idle block out of the window: on a huge
    page that splits it; the sampled access brings the page back, bytes unchanged."""
    path = tmp_path / "img"
    options = WindowOptions(sample_interval_ms=5, sample_min_age_ms=1, sample_fraction=1.0, prefetch_grace_ms=0)
    w = open_window(config(path, 40), options)
    try:
        if w.huge_pages_unavailable():
            pytest.skip(f"no huge pages for the window on this kernel: {w.huge_pages_unavailable()}")
        model = fill(w, REGION, seed=6)
        evict_all(w)
        prefetch_region(w)
        assert w.stats()["huge_collapses"] == 1  # before the sampler's first park (it waits while busy)
        deadline = time.monotonic() + 30
        while w.stats()["samples"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.stats()["samples"] > 0
        assert np.array_equal(w.ndarray(0, REGION, np.uint8), model)
        view = w.ndarray(0, REGION, np.uint8)
        view[7 * BLOCK] = model[7 * BLOCK] = model[7 * BLOCK] ^ 1
        assert np.array_equal(view, model)
        del view
    finally:
        w.close()
    with open_device(config(path, 8)) as dev:
        assert dev.load(0, REGION) == model.tobytes()


def test_switched_off_the_window_keeps_small_pages(tmp_path):
    w = open_window(config(tmp_path / "img", 40), WindowOptions(sample_interval_ms=0, huge_pages=False))
    try:
        assert "switched off" in w.huge_pages_unavailable()
        w.prefetch(0, REGION)
        assert w.wait_idle(timeout=60)
        assert w.huge_page_bytes(0, REGION) == 0 and w.stats()["huge_collapses"] == 0
    finally:
        w.close()
