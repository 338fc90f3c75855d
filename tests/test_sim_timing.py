"""The trace simulator on the model clock: every access charged to the timing model in the
compiled replay loop, bit-identical run to run and to a Device with `clock: model,
data: none` replaying the same single-block trace."""
from __future__ import annotations

import numpy as np
import pytest

from cxlhm.config import load_config
from cxlhm.device import Device
from cxlhm.sim import Simulator, simulate
from cxlhm.timing import TimingModel
from cxlhm.traces.synthetic import zipf_trace

KiB = 1 << 10
BLOCK = 64 * KiB
N_BLOCKS = 400
SLOTS = 48


def trace(n=3000, seed=3, write_fraction=0.3):
    return zipf_trace(n, N_BLOCKS, 0.9, write_fraction=write_fraction, seed=seed)


def device(policy="lru", write_mode=None, timing=None):
    firmware = {"policy": policy, "background": "manual"}
    if write_mode:
        firmware["write_mode"] = write_mode
    spec = {"capacity": N_BLOCKS * BLOCK, "block_size": BLOCK, "dram_bytes": SLOTS * BLOCK, "data": "none",
            "clock": "model", "firmware": firmware}
    if timing:
        spec["timing"] = timing
    return Device(load_config(spec))


def device_latencies(dev, blocks, writes, issue_ns=None):
    out = np.zeros(len(blocks))
    for i, (b, w) in enumerate(zip(blocks.tolist(), writes.tolist())):
        at = None if issue_ns is None else float(issue_ns[i])
        out[i] = dev.access_one(b * BLOCK, BLOCK, 0, w, issue_ns=at)
    return out


# counters whose meaning does not depend on how the trace was fed
SAME_COUNTERS = ("hits", "misses", "evictions", "writebacks", "fill_reads", "ssd_reads", "ssd_writes",
                 "ssd_read_bytes", "ssd_write_bytes", "host_reads", "host_writes", "host_read_bytes",
                 "host_write_bytes")


@pytest.mark.parametrize("write_mode", [None, "write-through"])
def test_latencies_equal_a_model_clock_device_bit_for_bit(write_mode):
    tr = trace()
    sim = Simulator("lru", SLOTS, timing="cmm-h", block_size=BLOCK, write_mode=write_mode)
    sim.replay(tr.blocks, tr.writes)
    r = sim.result()
    dev = device(write_mode=write_mode)
    try:
        expected = device_latencies(dev, tr.blocks, tr.writes)
        stats = dev.stats()
        assert sim.latencies.tobytes() == expected.tobytes()  # exact float equality, access by access
        assert r.timing["model_ns"] == sim.model_now_ns == stats["model_now_ns"]
        assert r.timing["latencies"] == r.timing["sampled"] == len(tr.blocks)
        for key in ("nand_page_reads", "nand_page_programs", "write_stall_ns", "durable_ns"):
            assert r.timing[key] == stats[key], key
        device_counters = dev.stats()
        for key in SAME_COUNTERS:
            assert r.counters[key] == device_counters[key], key
        assert r.misses > 0 and r.hits > 0 and r.timing["nand_page_programs"] > 0  # every path exercised
        assert r.writebacks > 0 if write_mode is None else r.counters["fill_reads"] < r.misses
    finally:
        dev.close()


@pytest.mark.slow  # compiles each policy's planner twice (sim and device)
@pytest.mark.parametrize("policy", ["s3fifo", "arc", "clock", "sieve", "hymcache"])
def test_every_online_policy_matches_the_device(policy):
    tr = trace(seed=8)
    sim = Simulator(policy, SLOTS, timing="cmm-h")
    sim.replay(tr.blocks, tr.writes)
    dev = device(policy)
    try:
        assert sim.latencies.tobytes() == device_latencies(dev, tr.blocks, tr.writes).tobytes()
        assert sim.model_now_ns == dev.stats()["model_now_ns"]
    finally:
        dev.close()


def test_open_loop_latencies_equal_a_device_given_the_same_issue_times():
    tr = trace(seed=4)
    rng = np.random.default_rng(4)
    issue = np.cumsum(rng.integers(0, 40_000, len(tr.blocks))).astype(np.float64)
    issue[100:110] = issue[100]  # a burst at one instant
    issue[200] = issue[150]  # a time earlier than the one before: issues at the clock, as the Device does
    r = simulate("lru", tr.blocks, SLOTS, writes=tr.writes, timing="cmm-h", issue_ns=issue)
    sim_lat = Simulator("lru", SLOTS, timing="cmm-h")
    sim_lat.replay(tr.blocks, tr.writes, issue_ns=issue)
    dev = device()
    try:
        expected = device_latencies(dev, tr.blocks, tr.writes, issue)
        assert sim_lat.latencies.tobytes() == expected.tobytes()
        assert r.timing["loop"] == "open"
        assert r.timing["model_ns"] == float(np.max(np.maximum.accumulate(issue) + expected))
    finally:
        dev.close()


def test_bit_identical_run_to_run_and_in_pieces():
    tr = trace(seed=5)
    a = simulate("lru", tr.blocks, SLOTS, writes=tr.writes, timing="cmm-h")
    b = simulate("lru", tr.blocks, SLOTS, writes=tr.writes, timing="cmm-h")
    assert a.timing == b.timing  # every float exactly equal
    sim = Simulator("lru", SLOTS, timing="cmm-h")
    for piece in np.array_split(np.arange(len(tr.blocks)), 7):
        sim.replay(tr.blocks[piece], tr.writes[piece])
    c = sim.result()
    assert c.timing == a.timing and c.counters == a.counters


def test_timing_changes_no_firmware_decision_and_off_means_none():
    tr = trace(seed=6)
    plain = simulate("lru", tr.blocks, SLOTS, writes=tr.writes)
    timed = simulate("lru", tr.blocks, SLOTS, writes=tr.writes, timing="cmm-h")
    assert plain.timing is None
    for key in ("hits", "misses", "evictions", "writebacks", "fill_reads", "prefetch_issued"):
        assert plain.counters[key] == timed.counters[key], key
    # the untimed loop counts a block as one byte; the timed one as block_size bytes
    assert timed.counters["ssd_read_bytes"] == plain.counters["ssd_read_bytes"] * BLOCK


def test_qd1_closed_form_one_page_blocks():
    """Blocks of one NAND page: a cold miss is the QD1 NAND read, a hit the DRAM path;
    at QD1 the model time is the sum of the latencies."""
    m = TimingModel.from_device_config(load_config("cmm-h"))
    page = m.settings.nand_page_size
    blocks = np.array([5, 5, 5, 9, 5, 9], np.int64)
    sim = Simulator("lru", 4, timing=m, block_size=page)
    sim.replay(blocks)
    lat = sim.latencies
    miss, hit = m.miss_read_latency_ns(page), m.hit_read_latency_ns(page)
    np.testing.assert_allclose(lat, [miss, hit, hit, miss, hit, hit], rtol=1e-9)
    assert sim.result().timing["model_ns"] == pytest.approx(lat.sum(), rel=1e-12)
    assert sim.timing is m and m.stats()["nand_page_reads"] == 2  # charged in place


def test_timing_mapping_overrides_the_default_profile():
    blocks = np.arange(50, dtype=np.int64)
    base = simulate("lru", blocks, 8, timing="cmm-h")
    slow = simulate("lru", blocks, 8, timing={"nand_read_latency": "90us"})
    assert slow.timing["block_size"] == base.timing["block_size"] == BLOCK
    assert slow.timing["p50_ns"] - base.timing["p50_ns"] == pytest.approx(45_000, rel=1e-9)
    nvme = simulate("lru", blocks, 8, timing="nvme-tlc")
    assert nvme.timing["block_size"] == 4 * KiB


def test_sampled_latencies_cover_every_access_in_count_mean_and_extremes():
    tr = trace(n=5000, seed=7)
    full = simulate("lru", tr.blocks, SLOTS, writes=tr.writes, timing="cmm-h")
    part = simulate("lru", tr.blocks, SLOTS, writes=tr.writes, timing="cmm-h", latency_samples=512)
    assert part.timing["latencies"] == 5000 and part.timing["sampled"] <= 512 and part.timing["sample_every"] > 1
    for key in ("model_ns", "mean_ns", "min_ns", "max_ns"):
        assert part.timing[key] == full.timing[key], key
    assert part.timing == simulate("lru", tr.blocks, SLOTS, writes=tr.writes, timing="cmm-h",
                                   latency_samples=512).timing
    t = full.timing
    assert t["min_ns"] <= t["p50_ns"] <= t["p90_ns"] <= t["p99_ns"] <= t["p999_ns"] <= t["max_ns"]


def test_bad_arguments_are_rejected():
    blocks = np.arange(10, dtype=np.int64)
    with pytest.raises(ValueError, match="issue_ns needs a timing model"):
        simulate("lru", blocks, 4, issue_ns=np.zeros(10))
    with pytest.raises(ValueError, match="block_size only matters"):
        Simulator("lru", 4, block_size=4096)
    with pytest.raises(ValueError, match="issue_ns has 3 entries"):
        simulate("lru", blocks, 4, timing="cmm-h", issue_ns=np.zeros(3))
    with pytest.raises(ValueError, match="finite, non-negative"):
        simulate("lru", blocks, 4, timing="cmm-h", issue_ns=np.full(10, -1.0))
    with pytest.raises(ValueError, match="block_size"):
        Simulator("lru", 4, timing="cmm-h", block_size=0)
    with pytest.raises(TypeError, match="timing must be"):
        Simulator("lru", 4, timing=3)
    with pytest.raises(ValueError, match="overflows"):
        simulate("lru", np.array([1 << 60]), 4, timing="cmm-h")
    from cxlhm.config import ConfigError
    with pytest.raises(ConfigError, match=r"timing\.nand_channels"):
        Simulator("lru", 4, timing={"nand_channels": 0})


def test_queue_depth_overlaps_accesses_without_changing_decisions():
    """Closed loop at QD N: the same hits and misses as QD1 (the policy sees the same
    order), the model finishes no later, and QD1 is the default."""
    from cxlhm.sim import simulate
    from cxlhm.traces.synthetic import zipf_trace
    trace = zipf_trace(5_000, 800, 0.8, write_fraction=0.2, seed=5)
    runs = {qd: simulate("lru", trace.blocks, 100, writes=trace.writes, timing="cmm-h", queue_depth=qd)
            for qd in (1, 8)}
    default = simulate("lru", trace.blocks, 100, writes=trace.writes, timing="cmm-h")
    assert runs[1].counters == runs[8].counters == default.counters
    assert default.timing["model_ns"] == runs[1].timing["model_ns"]
    assert runs[8].timing["model_ns"] < runs[1].timing["model_ns"]
    assert runs[8].timing["queue_depth"] == 8


def test_queue_depth_is_checked():
    from cxlhm.sim import Simulator
    for bad in (0, -1, 10**9, True):
        with pytest.raises(ValueError, match="queue_depth"):
            Simulator("lru", 10, timing="cmm-h", queue_depth=bad)
