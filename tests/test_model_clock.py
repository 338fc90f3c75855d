"""The device on the model clock: deterministic, data-independent, and it shows what
prefetch buys (latency and lateness) when the host gives the firmware lead time."""
import numpy as np
import pytest

from cxlhm.mailbox.hints import HintKind
from device_parts import open_parts
from host_runtime.driver import open_device

BLOCK = 64 * 1024
SLOTS = 32


def config(tmp_path, policy="hymcache", data="real", **extra):
    return {"capacity": 1 << 30, "block_size": BLOCK, "dram_bytes": SLOTS * BLOCK, "clock": "model", "data": data,
            "backend": {"path": str(tmp_path / f"{policy}-{data}.img")},
            "firmware": {"policy": policy, "background": "manual"}, **extra}


def workload(dev, seed=0):
    """A mixed, hinted workload; returns every access's latency."""
    rng = np.random.default_rng(seed)
    buf = np.zeros(3 * BLOCK, np.uint8)
    latencies = []
    for step in range(300):
        hpa = int(rng.integers(0, 200)) * BLOCK + int(rng.integers(0, BLOCK))
        n = int(rng.integers(1, 2 * BLOCK))
        if step % 7 == 0:
            dev.hint(HintKind.SESSION_RESUME, 1 + step % 3, hpa // BLOCK, 4)
            dev.advance_to(dev.stats()["model_now_ns"] + 50_000)
        if rng.random() < 0.3:
            latencies.append(dev.access_one(hpa, n, buf.ctypes.data, True, 1))
        else:
            latencies.append(dev.access_one(hpa, n, buf.ctypes.data, False, 1))
    return latencies, dev.stats()


def test_model_clock_is_bit_identical_run_to_run_and_with_or_without_data(tmp_path):
    runs = []
    for data in ("real", "none", "real"):
        with open_device(config(tmp_path, data=data)) as dev:
            runs.append(workload(dev))
    (lat_a, stats_a), (lat_b, stats_b), (lat_c, stats_c) = runs
    assert lat_a == lat_b == lat_c  # exact float equality, not approximate
    for key in ("model_now_ns", "hits", "misses", "prefetch_issued", "prefetch_late", "nand_page_reads"):
        assert stats_a[key] == stats_b[key] == stats_c[key], key


def prefix_then_resume(tmp_path, policy, lead_ns):
    """Write a 16-block prefix, push it to the SSD, hint its resume `lead_ns` before
    reading it back; return (read latency, stats delta)."""
    with open_device(config(tmp_path, policy=policy)) as dev:
        dev.store(0, np.ones(16 * BLOCK, np.uint8), session=1)
        for i in range(2 * SLOTS):
            dev.store((100 + i) * BLOCK, np.zeros(BLOCK, np.uint8), session=2)
        dev.flush()
        now = dev.stats()["model_now_ns"] + 1e6
        dev.advance_to(now)
        dev.hint(HintKind.SESSION_RESUME, 1, 0, 16)
        before = dev.stats()
        out = np.empty(16 * BLOCK, np.uint8)
        latency = dev.access_one(0, out.size, out.ctypes.data, False, 1, issue_ns=now + lead_ns)
        after = dev.stats()
        assert (out == 1).all()
        return latency, {k: after[k] - before[k] for k in ("misses", "prefetch_useful", "prefetch_late")}


def test_prefetch_with_enough_lead_time_makes_the_prefix_read_a_dram_read(tmp_path):
    hinted, delta = prefix_then_resume(tmp_path, "hymcache", lead_ns=20e6)
    assert delta == {"misses": 0, "prefetch_useful": 16, "prefetch_late": 0}
    lru, lru_delta = prefix_then_resume(tmp_path, "lru", lead_ns=20e6)
    assert lru_delta["misses"] == 16
    assert hinted * 3 < lru  # the SSD reads left the foreground path


def test_a_short_lead_time_leaves_prefetches_late_but_still_faster_than_no_hint(tmp_path):
    late, delta = prefix_then_resume(tmp_path, "hymcache", lead_ns=10_000)
    assert delta["misses"] == 0 and delta["prefetch_late"] > 0
    lru, _ = prefix_then_resume(tmp_path, "lru", lead_ns=10_000)
    on_time, _ = prefix_then_resume(tmp_path, "hymcache", lead_ns=20e6)
    assert on_time < late < lru


def test_bad_timing_parameters_are_rejected_with_the_key(tmp_path):
    from cxlhm.config import ConfigError
    with pytest.raises(ConfigError) as info:
        open_device(config(tmp_path, timing={"nand_channels": 0}))
    assert "timing.nand_channels" in str(info.value)


def test_latency_records_give_percentiles(tmp_path):
    with open_parts(config(tmp_path, policy="lru")) as (dev, device):
        rec = device.record_latencies()
        workload(dev)
        assert rec.count == 300
        pct = rec.percentiles()
        assert pct[50.0] <= pct[99.0] <= rec.summary()["max"]
