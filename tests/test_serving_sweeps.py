"""The sensitivity sweeps' axes, each varied alone: the share of sessions that keep
their reuse (workloads.keep_reuse), the device's SSD timing (ServingParams.device_timing,
hence the load/recompute ratio), and the bench's one-axis runs and their shared cells."""
from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm_apps.serving import workloads as W
from cxlhm_apps.serving.boundary import boundary, device_ssd_path
from cxlhm_apps.serving.workloads import quick_sizes
from cxlhm_apps.serving.params import ServingParams, params_from
from cxlhm_apps.serving.topologies import replay

SSD = "CXL-HM SSD (cold)"


def _reusable(w: W.Workload) -> float:
    return w.summary()["reusable_chunk_share"]


@pytest.fixture(scope="module")
def agent() -> W.Workload:
    return W.build(W.default_spec("agent", sessions=12))


@settings(max_examples=20, deadline=None)
@given(keep=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_keep_reuse_changes_which_prefixes_were_computed_and_nothing_else(agent, keep, seed):
    thinned = W.keep_reuse(agent, keep, seed)
    assert len(thinned.requests) == len(agent.requests)
    for a, b in zip(agent.requests, thinned.requests):
        assert (a.session, a.turn, a.parent, a.arrival_ns, a.after_parent_ns, a.output_tokens, a.last_turn,
                a.expected_pause_ns) == (b.session, b.turn, b.parent, b.arrival_ns, b.after_parent_ns,
                                         b.output_tokens, b.last_turn, b.expected_pause_ns)
        assert np.array_equal(a.chunk_tokens, b.chunk_tokens)
    assert _reusable(thinned) <= _reusable(agent)
    # a session either keeps every chunk id or shares none with any other request
    owners: dict[int, set] = {}
    for r in thinned.requests:
        for cid in r.chunk_ids.tolist():
            owners.setdefault(cid, set()).add(r.index)
    for a, b in zip(agent.requests, thinned.requests):
        if not np.array_equal(a.chunk_ids, b.chunk_ids):
            assert all(owners[c] == {b.index} for c in b.chunk_ids.tolist())


def test_keep_reuse_ends_and_its_errors(agent):
    assert W.keep_reuse(agent, 1.0) is agent
    assert _reusable(W.keep_reuse(agent, 0.0)) == 0.0
    shares = [_reusable(W.keep_reuse(agent, k)) for k in (0.0, 0.3, 0.6, 1.0)]
    assert shares == sorted(shares) and shares[0] < shares[-1]   # one draw per session: nested sets
    with pytest.raises(ValueError, match="reuse_keep"):
        W.keep_reuse(agent, 1.5)
    spec = dataclasses.replace(W.default_spec("agent", sessions=12), reuse_keep=0.5)
    assert _reusable(W.build(spec)) < _reusable(agent)


def test_device_timing_moves_the_ssd_path_and_only_it():
    base = ServingParams()
    fast = params_from((("device_timing", {"nand_channel_rate": "2.4GB/s"}),), base)
    assert fast.device_timing == (("nand_channel_rate", "2.4GB/s"),)
    assert device_ssd_path(fast).bandwidth == pytest.approx(2 * device_ssd_path(base).bandwidth)
    gpu = base.gpu_cost_model()
    b0, b1 = boundary(gpu, base, 8192), boundary(gpu, fast, 8192)
    assert b1.load_over_recompute[SSD] < b0.load_over_recompute[SSD]
    others = [k for k in b0.load_over_recompute if k != SSD]
    assert [b1.load_over_recompute[k] for k in others] == [b0.load_over_recompute[k] for k in others]
    with pytest.raises(ValueError, match="nand_chanel_rate"):
        params_from((("device_timing", {"nand_chanel_rate": "2GB/s"}),), base)
    with pytest.raises(ValueError, match="nand_channel_rate"):
        params_from((("device_timing", {"nand_channel_rate": "fast"}),), base)


def test_a_faster_ssd_loads_cold_chunks_sooner():
    """The device the replay builds runs the given timing: with twice the channel rate,
    the same cold loads (device DRAM too small to keep them) finish sooner."""
    w = W.build(W.default_spec("agent", sessions=4, max_context_tokens=12000))
    slow = ServingParams(gpu_kv_bytes=2 << 30, dram_bytes=64 << 20)
    fast = slow.replace(device_timing=(("nand_channel_rate", "4.8GB/s"),))
    a, b = replay(w, "cxlhm-hymcache", slow), replay(w, "cxlhm-hymcache", fast)
    loaded = (a.load_ns > 0) & (b.load_ns > 0)
    assert loaded.sum() > 3
    assert b.load_ns[loaded].sum() < a.load_ns[loaded].sum()


# ---------------------------------------------------------------- the bench's sweeps
@pytest.fixture(scope="module")
def bench_serving():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        import bench_serving
    finally:
        sys.path.pop(0)
    return bench_serving


def test_each_sweep_varies_one_axis_and_shares_its_base_cells(bench_serving):
    args = types.SimpleNamespace(sweep_configs="lmcache-local,cxlhm-hymcache,mooncake-dram", pools="16GiB,48GiB",
                                 ssd_rates="0.6GB/s,2.4GB/s", reuse="0.5")
    base = ServingParams()
    runs = bench_serving.sweep_runs(base, ["pool", "ratio", "reuse"], args, quick_sizes(), 2)
    assert [(r.sweep, r.point) for r in runs] == [
        ("pool", "95 GiB"), ("pool", "16 GiB"), ("pool", "48 GiB"), ("ratio", "1.2GB/s"), ("ratio", "0.6GB/s"),
        ("ratio", "2.4GB/s"), ("reuse", "1"), ("reuse", "0.5")]
    for run in runs:  # what differs from the base is the swept axis alone
        changed = {f.name for f in dataclasses.fields(ServingParams)
                   if getattr(run.params, f.name) != getattr(base, f.name)}
        assert changed <= {"pool": {"gpu_kv_bytes"}, "ratio": {"device_timing"}, "reuse": set()}[run.sweep]
        keeps = {spec.reuse_keep for spec, _ in run.comparison.specs()}
        assert keeps == ({float(run.point)} if run.sweep == "reuse" else {1.0})
        assert run.comparison.topologies == ["colocated"]
    tasks = [t for r in runs for t in r.comparison.tasks()]
    cells, where = bench_serving.unique_tasks(tasks)
    # 8 runs x 2 workloads x 3 configurations; the three base runs are one, and the ratio
    # sweep's DRAM configurations do not depend on the device: 48 - 12 - 8 cells
    assert len(tasks) == 48 and len(cells) == 28
    assert all(cells[i].config == t.config and cells[i].workload == t.workload for t, i in zip(tasks, where))
    hym = [cells[i] for t, i in zip(tasks, where) if t.config == "cxlhm-hymcache"]
    assert len({c.params.device_timing for c in hym}) == 3
