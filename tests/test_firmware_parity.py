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


def _state_bytes(tree) -> list[bytes]:
    if isinstance(tree, np.ndarray):
        return [tree.tobytes()]
    return [b for child in tree for b in _state_bytes(child)]


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo"])
def test_the_replays_prefetch_hints_change_nothing(policy):
    """The trace simulator asks the policy's `upcoming` hook to prefetch ahead of an
    access: for a resident block and for a missing one it leaves the block table and
    the policy state bit for bit as they were, and a replay with the hints gives the
    counters of the same accesses planned one by one through the firmware's planner."""
    from cxlhm import counters as C
    from cxlhm import firmware as fw
    from cxlhm import policies
    from cxlhm.sim import Simulator

    rng = np.random.default_rng(7)
    blocks = rng.zipf(1.3, 4000).astype(np.int64) % 700
    sim = Simulator(policy, 64)
    sim.replay(blocks)
    p = policies.get(policy)
    before = _state_bytes((sim.bt, sim.ps))
    resident = int(sim.bt.block[np.flatnonzero(sim.bt.block >= 0)[0]])
    p.upcoming(sim.ps, sim.bt, resident, int(np.flatnonzero(sim.bt.block == resident)[0]))
    p.upcoming(sim.ps, sim.bt, 10_000, -1)
    assert _state_bytes((sim.bt, sim.ps)) == before

    one_by_one = Simulator(policy, 64)
    plan = fw.kernels_for(p).plan
    scratch = one_by_one._scratch
    for b in blocks:  # no replay loop, no prefetch: the planner alone
        scratch[0][0] = b
        ok, k, _, _ = plan(one_by_one.bt, one_by_one.ps, one_by_one.counters, one_by_one.clock, scratch[0], scratch[1],
                           False, fw.WRITE_BACK, 0, 0, 1, scratch[2], scratch[3], scratch[4], scratch[5])
        fw.finish(one_by_one.bt, scratch[2], k)
        assert ok
    assert C.as_dict(one_by_one.counters) == sim.result().counters
