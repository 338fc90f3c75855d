"""One firmware: the device, the trace simulator and the window's fault service run the
same compiled kernels (cxlhm/firmware.py), so one access sequence gives them the same
counters - prefetch pollution included.

The sequence touches only blocks that are not resident (plus one redundant prefetch):
loads from resident window pages never reach the device, by design, so hits are the
one thing the window cannot count the way explicit accesses do.
"""
from __future__ import annotations

import numpy as np
import pytest

from cxlhm.config import load_config
from cxlhm.device import Device
from cxlhm.window import WindowOptions, open_window, probe

KIB = 16 * 1024
UNAVAILABLE = probe()

# (op, blocks): reads and one-byte writes miss; prefetches evict host blocks into the ghost table
SEQUENCE = [
    ("read", [20, 21, 22, 23]),
    ("prefetch", [0, 1]),        # evicts 20, 21 for a prefetch: ghosts
    ("read", [20]),              # pollution
    ("read", [5]),
    ("read", [21]),              # pollution again; evicts an unused prefetched block
    ("write", [30]),
    ("prefetch", [21]),          # resident: redundant
    ("prefetch", [40, 41, 42]),
    ("read", [22, 23, 5]),
    ("write", [1, 0]),
]
COMPARED = ("hits", "misses", "evictions", "fill_reads", "prefetch_issued", "prefetch_unused",
            "prefetch_redundant", "prefetch_dropped", "prefetch_pollution")


def config(tmp_path, name: str, policy: str) -> dict:
    return {"capacity": 4 << 20, "block_size": KIB, "dram_bytes": 4 * KIB,
            "firmware": {"policy": policy, "background": "manual"}, "backend": {"path": str(tmp_path / name)}}


def run_device(cfg: dict) -> dict:
    dev = Device(load_config(None, cfg))
    try:
        for op, blocks in SEQUENCE:
            if op == "prefetch":
                dev.prefetch(np.array(blocks, np.int64))
            for b in blocks if op != "prefetch" else ():
                buf = np.zeros(1, np.uint8)
                dev.access(np.array([b * KIB + 7]), np.array([1]), buf.ctypes.data, op == "write")
        return dev.stats()
    finally:
        dev.close()


def run_window(cfg: dict) -> dict:
    w = open_window(cfg, WindowOptions(sample_interval_ms=0))
    try:
        view = w.ndarray(0, 4 << 20, np.uint8)
        for op, blocks in SEQUENCE:
            if op == "prefetch":
                w.prefetch_blocks(np.array(blocks, np.int64))
            for b in blocks if op != "prefetch" else ():
                if op == "write":
                    view[b * KIB + 7] = 1
                else:
                    int(view[b * KIB + 7])
        del view
        return w.stats()
    finally:
        w.close()


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"userfaultfd window unavailable: {UNAVAILABLE}")
@pytest.mark.parametrize("policy", ["lru", "fifo"])
def test_device_and_window_count_the_same_accesses_alike(tmp_path, policy):
    device = run_device(config(tmp_path, "explicit.img", policy))
    window = run_window(config(tmp_path, "window.img", policy))
    assert device["prefetch_pollution"] >= 2 and device["prefetch_unused"] >= 1  # the sequence exercises them
    assert {k: window[k] for k in COMPARED} == {k: device[k] for k in COMPARED}
