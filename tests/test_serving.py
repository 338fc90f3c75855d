"""The serving model (cxlhm_apps.serving): hand-computed cases, determinism, monotonicity in
the DRAM budget, the GPU cost model, workloads and their errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

from cxlhm_apps.serving import workloads as W
from cxlhm_apps.serving.gpu import gpu_model
from cxlhm_apps.serving.metrics import max_speed_under_slo, summarize
from cxlhm_apps.serving.params import ServingParams
from cxlhm_apps.serving.topologies import replay
from cxlhm_apps.serving.sweep import Task, run_grid
from cxlhm_apps.serving.testing import LinearGpu  # costs to work out by hand (its docstring)
from cxlhm_apps.serving.yamlspec import SpecError
from cxlhm.traces import TraceError

MS = 1e6  # ns


def _req(index, session, turn, ids, at_s, parent=-1):
    ids = np.asarray(ids, np.int64)
    return W.Request(index, session, turn, ids, np.full(ids.size, 512, np.int64), 1, at_s * 1e9, parent, None,
                     True, 0)


def three_turns() -> W.Workload:
    """Session 1 asks three times (chunks 0-1, then 0-2, then 0-3); session 2 (chunks
    10-12) comes in between and pushes session 1's chunk 0 (its LRU chunk) out of the
    small GPU pool; chunk 1 stays."""
    reqs = (_req(0, 1, 0, [0, 1], 0.0), _req(1, 2, 0, [10, 11, 12], 5.0),
            _req(2, 1, 1, [0, 1, 2], 10.0, parent=0), _req(3, 1, 2, [0, 1, 2, 3], 20.0, parent=2))
    return W.Workload("three-turns", reqs, "hand-made", chunk_tokens=512, open_loop=True)


# The GPU holds exactly one running 4-chunk request plus its one output token.
TINY = ServingParams(gpu_kv_bytes=4 * 512 * 1000 + 1000, dram_bytes=1 << 30)


def test_three_turns_recompute_by_hand():
    res = replay(three_turns(), "recompute", TINY, gpu=LinearGpu())
    ttft = (res.first_token - res.arrival) / MS
    # turn 1: 1024 new tokens; session 2: 1536; turn 2: chunk 0 was evicted for session
    # 2 and there is no store, so the prefix is gone (chunk 1, still on the GPU, is no use
    # without it): all 1536 tokens again; turn 3: chunks 0-2 are on the GPU (left by
    # turn 2), only chunk 3 is new.
    assert ttft == pytest.approx([112.4, 163.6, 163.6, 61.2])
    assert res.tokens["gpu"].tolist() == [0, 0, 0, 1536]
    assert res.tokens["recomputed"].tolist() == [0, 0, 1024, 0]
    assert res.tokens["new"].tolist() == [1024, 1536, 512, 512]


def test_three_turns_host_dram_by_hand():
    res = replay(three_turns(), "lmcache-local", TINY.replace(load_mode="async", store_mode="async"), gpu=LinearGpu())
    ttft = (res.first_token - res.arrival) / MS
    # turn 2: chunk 0 from host DRAM (512,000 bytes at 1 byte/ns: 0.512 ms), chunk 1
    # still on the GPU, then a prefill of the 512 new tokens: 0.512 + 10 + 51.2 ms.
    assert ttft == pytest.approx([112.4, 163.6, 61.712, 61.2])
    assert res.tokens["dram"].tolist() == [0, 0, 512, 0]
    assert res.tokens["gpu"].tolist() == [0, 0, 512, 1536]
    s = summarize(res, 2.0, 90)
    assert s["hit_dram"] == pytest.approx(512 / (1024 + 1536))
    assert s["hit_gpu"] == pytest.approx(2048 / (1024 + 1536))


def test_lmcache_blocks_the_iteration_on_its_loads_and_stores_by_hand():
    """LMCache's defaults: the iteration that prefills a request first waits for its load,
    and holds the GPU after the forward until the new KV is copied out (1 byte/ns)."""
    res = replay(three_turns(), "lmcache-local", TINY, gpu=LinearGpu())
    ttft = (res.first_token - res.arrival) / MS
    # turn 1: 112.4 ms + 1024 tokens x 1000 B stored (1.024 ms); session 2: 163.6 + 1.536;
    # turn 2: load chunk 0 (0.512) + prefill 61.2 + store chunk 2 (0.512); turn 3: 61.2 + 0.512
    assert ttft == pytest.approx([113.424, 165.136, 62.224, 61.712])


def test_loading_slower_than_recomputing_is_not_done():
    # At 1 MB/s chunk 0 takes 0.512 s to load; recomputing chunks 0-1 costs 102.4 ms.
    res = replay(three_turns(), "lmcache-local", TINY.replace(store_mode="async"), gpu=LinearGpu(bandwidth=1e6))
    ttft = (res.first_token - res.arrival) / MS
    assert ttft[2] == pytest.approx(163.6)
    assert res.recompute_choices == 1
    assert res.tokens["dram"].sum() == 0


def test_three_turns_on_the_device():
    """cxlhm-hymcache: the same session through the emulated device. Chunk 0 was
    written 10 s earlier and is still in device DRAM (the device holds far more than
    these seven chunks), so turn 2 reads it from device DRAM."""
    res = replay(three_turns(), "cxlhm-hymcache", TINY, gpu=LinearGpu())
    assert res.tokens["dram"][2] == 512 and res.tokens["ssd"][2] == 0
    load_ms = res.load_ns[2] / MS
    assert 0.512 < load_ms < 2  # PCIe time plus the device's CXL/DRAM path for one 2 MiB block
    ttft = (res.first_token - res.arrival) / MS
    assert ttft[2] == pytest.approx(load_ms + 61.2)
    assert res.tier_stats["host_writes"] == 7  # chunks 0-3 and 10-12, each stored once


def small_agent(**changes) -> W.Workload:
    return W.build(W.default_spec("agent", sessions=6, **changes))


def test_replay_is_deterministic():
    w = small_agent()
    a = replay(w, "cxlhm-hymcache", ServingParams(), 2.0)
    b = replay(w, "cxlhm-hymcache", ServingParams(), 2.0)
    for field in ("arrival", "first_token", "done", "load_ns"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert a.tier_stats == b.tier_stats


def _qa_16_users() -> W.Workload:
    """Multi-round QA: 16 users whose ~5k-token contexts do not fit a 2 GiB GPU pool, so
    every round reloads (or recomputes) most of its user's context."""
    return W.build(W.default_spec("qa", users=16, rounds=4, history_tokens=4000, qps=0.5))


@pytest.mark.parametrize("config", ["lmcache-local", "mooncake-dram"])
def test_more_dram_never_raises_ttft_for_lru(config):
    """The LRU DRAM tiers: host/device DRAM from a fraction of one user's context to all
    of them; mean TTFT never rises and falls once the contexts fit."""
    w = _qa_16_users()
    means = []
    for mib in (256, 1024, 4096, 16384):
        p = ServingParams(gpu_kv_bytes=2 << 30, dram_bytes=mib << 20)
        means.append(summarize(replay(w, config, p, 1.0), 2.0, 90)["ttft_mean_s"])
    assert all(b <= a * (1 + 1e-9) for a, b in zip(means, means[1:])), means
    assert means[-1] < means[0]


def test_more_device_dram_for_lru_firmware():
    """cxlhm-lru. What LRU guarantees holds: with more device DRAM the device serves at
    least as many blocks from DRAM and reads no more from NAND (LRU is a stack algorithm),
    and once the contexts fit, TTFT is the lowest. TTFT in between is *not* monotone, and
    that is the device, not the scheduler: the host plans the same loads at every budget
    (it cannot see inside the device), the write-back firmware leaves stored KV dirty
    (no idle cleaning), and a read miss must first push a dirty victim through the write
    buffer at the NAND program rate. With more DRAM, fewer of those write-backs happen
    during the (asynchronous) stores and more during the reads that set TTFT: here 4 GiB
    puts ~2.7x the 512 MiB budget's write-backs on the read path. The same firmware in
    write-through mode (device DRAM always clean) is monotone (docs/serving.md, section 8)."""
    w = _qa_16_users()
    budgets = (512, 4096, 16384)

    def run(mode):
        out = []
        for mib in budgets:
            p = ServingParams(gpu_kv_bytes=2 << 30, dram_bytes=mib << 20, device_write_mode=mode)
            res = replay(w, "cxlhm-lru", p, 1.0)
            out.append((summarize(res, 2.0, 90)["ttft_mean_s"], res.tier_stats["hits"],
                        res.tier_stats["fill_reads"], res.tokens["dram"] + res.tokens["ssd"]))
        return out

    write_back = run("")
    ttft, hits, fills, loaded = zip(*write_back)
    assert all(np.array_equal(loaded[0], x) for x in loaded)  # the same loads at every budget
    assert list(hits) == sorted(hits) and hits[-1] > 0
    assert list(fills) == sorted(fills, reverse=True)
    assert ttft[-1] < min(ttft[:-1])
    assert ttft[1] > ttft[0]  # the anomaly (dirty victims on the read path), pinned
    through = [t for t, *_ in run("write-through")]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(through, through[1:])), through
    assert through[-1] < through[0]


def test_more_device_dram_for_hymcache_on_the_same_workload():
    """hymcache's idle flushing keeps its victims clean, so on the workload where LRU's
    write-backs make TTFT non-monotone, more device DRAM only helps (an observed property
    of this workload, not a theorem)."""
    w = _qa_16_users()
    means = [summarize(replay(w, "cxlhm-hymcache", ServingParams(gpu_kv_bytes=2 << 30, dram_bytes=mib << 20), 1.0),
                       2.0, 90)["ttft_mean_s"] for mib in (512, 4096, 16384)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(means, means[1:])), means
    assert means[-1] < means[0]


def test_disaggregated_topology_hands_kv_over_through_the_store():
    w = small_agent()
    res = replay(w, "lmcache-local", ServingParams(), 2.0, topology="disagg")
    assert not np.isnan(res.done).any()
    assert (res.first_token >= res.arrival).all() and (res.done >= res.first_token).all()
    assert len(res.gpu_busy_ns) == 2 and all(b > 0 for b in res.gpu_busy_ns)
    rec = replay(w, "recompute", ServingParams(), 2.0, topology="disagg")  # hand-over via host DRAM
    assert not np.isnan(rec.done).any()


# ---------------------------------------------------------------- GPU cost model
def test_gpu_model_reproduces_the_measured_table():
    """The fitted model returns the measured engine-like times it was fitted to (within the
    fit's error), and keeps the structure a prefill has."""
    import json
    from cxlhm_apps.serving.gpu import TABLES
    g = gpu_model()
    table = json.loads(TABLES["llama3-8b"].read_text())
    for p in table["prefill"]:
        if p.get("kernel") == "flex":
            assert g.prefill_s([p["new_tokens"]], [p["cached_tokens"]]) == pytest.approx(p["seconds"], rel=0.08)
    for p in table["prefill_batched"]:  # packed batches: predicted from single-request points
        assert g.prefill_s(p["new_tokens"], p["cached_tokens"]) == pytest.approx(p["seconds"], rel=0.08)
    for p in table["decode"]:
        assert g.decode_s(p["batch"], p["batch"] * p["context_tokens"]) == pytest.approx(p["seconds"], rel=0.2)
    assert g.h2d_bandwidth == pytest.approx(55e9, rel=0.05)
    # a cached prefix costs attention only: far less than recomputing it
    assert g.prefill_s([512], [32768]) < g.prefill_s([512 + 32768], [0]) / 10
    # batching shares the fixed cost and skips cross-request attention
    assert g.prefill_s([300, 300], [0, 0]) < 2 * g.prefill_s([300], [0])
    assert g.prefill_s([4000, 4000], [0, 0]) < g.prefill_s([8000], [0])
    assert g.prefill_alone_s(np.array([512.0, 8192.0]), np.array([1024.0, 0.0])) == pytest.approx(
        [g.prefill_s([512], [1024]), g.prefill_s([8192], [0])])
    assert g.decode_s(64, 64 * 4096) > g.decode_s(1, 1024)


# ---------------------------------------------------------------- workloads
def test_agent_context_grows_and_shares_the_system_prompt():
    w = small_agent()
    by_session: dict[int, list] = {}
    for r in w.requests:
        by_session.setdefault(r.session, []).append(r)
    shared = (2048 + 4096) // 512
    for turns in by_session.values():
        inputs = [t.input_tokens for t in turns]
        assert inputs == sorted(inputs) and inputs[-1] > inputs[0]
        assert turns[0].chunk_ids[:shared].tolist() == list(range(shared))
        for prev, nxt in zip(turns, turns[1:]):  # the previous context's full chunks are a prefix
            full = prev.input_tokens // 512
            assert nxt.chunk_ids[:full].tolist() == prev.chunk_ids[:full].tolist()
            assert nxt.parent == prev.index and nxt.after_parent_ns > 0


def test_closed_loop_turns_wait_for_the_previous_answer():
    w = small_agent()
    res = replay(w, "ideal", ServingParams(), 1.0)
    for r in w.requests:
        if r.parent >= 0:
            assert res.arrival[r.index] == pytest.approx(res.done[r.parent] + r.after_parent_ns)


def test_qa_rounds_append_questions_and_answers():
    w = W.build(W.default_spec("qa", users=3, rounds=4))
    assert len(w.requests) == 12
    first, second = w.requests[0], w.requests[3]
    assert second.session == first.session and second.input_tokens > first.input_tokens + 100


def test_mooncake_groups_of_equal_timestamps_are_spread():
    w = W.build(W.default_spec("mooncake", requests=30))
    arrivals = [r.arrival_ns for r in w.requests]
    assert arrivals == sorted(arrivals) and len(set(arrivals)) == len(arrivals)
    raw = W.build(W.default_spec("mooncake", requests=30, spread_groups=0))
    assert len({r.arrival_ns for r in raw.requests}) < 10


def test_bad_trace_line_names_the_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
                     '\n'
                     '{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": [0, "x"]}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl:3:.*hash_ids"):
        W.build(W.default_spec("mooncake", trace=str(trace)))


@pytest.mark.parametrize("text, line, match", [
    ("kind: agent\nsessions: 10\nturns: {dist: lognormal, median: 3}\n", 3, "needs 'sigma'"),
    ("kind: agent\nsessions: ten\n", 2, "must be an integer"),
    ("kind: agent\n\nsesions: 10\n", 3, "unknown key"),
    ("kind: qa\nusers: 3\nqps: [1\n", 4, "not valid YAML"),
    ("kind: chat\n", 1, "must be one of"),
    ("kind: agent\ntool_pause_s: {dist: gamma, shape: 2}\n", 2, "must be one of"),
    ("kind: agent\nserving:\n  dram_bytes: 1GiB\n  slo_ttfts: 3\n", 4, "unknown key"),
    ("kind: agent\nserving:\n  dram_bytes: lots\n", 3, "byte size"),
])
def test_bad_workload_yaml_names_the_line(tmp_path, text, line, match):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    from cxlhm_apps.serving.params import SERVING_KEYS
    with pytest.raises(SpecError, match=match) as err:
        W.spec_from_yaml(path, SERVING_KEYS)
    assert err.value.line == line, str(err.value)
    assert f"w.yaml:{line}:" in str(err.value)


def test_workload_yaml_examples_load():
    from pathlib import Path
    from cxlhm_apps.serving.params import SERVING_KEYS, params_from
    folder = Path(__file__).resolve().parents[1] / "bench" / "serving"
    files = sorted(folder.glob("*.yaml"))
    assert files
    for f in files:
        spec = W.spec_from_yaml(f, SERVING_KEYS)
        params_from(spec.serving)


# ---------------------------------------------------------------- search and grid
def test_max_speed_search_brackets_then_bisects():
    capacity = 3.3  # a fake system meets the SLO below speed 3.3

    def run(speed):
        return {"speed": speed, "slo_met": speed <= capacity, "throughput_rps": speed}

    found = max_speed_under_slo(run, 1.0, refine=6)
    assert found.max_speed <= capacity < found.max_speed * 2 ** (1 / 64) * 1.0001
    assert max_speed_under_slo(lambda s: {"speed": s, "slo_met": False, "throughput_rps": 0}, 1.0).best is None


def test_fail_fast_probes_stop_only_when_the_slo_is_surely_missed():
    from cxlhm_apps.serving.scheduler import SloMissed
    w = W.build(W.default_spec("mooncake", requests=80))
    over = summarize(replay(w, "recompute", ServingParams(), 3.0), 2.0, 90, 100.0)
    assert over["ttft_slo_s"] > 2.0
    with pytest.raises(SloMissed):
        replay(w, "recompute", ServingParams(), 3.0, fail_fast=True)
    easy = replay(w, "recompute", ServingParams(), 0.05, fail_fast=True)  # meets it: runs to the end
    assert np.array_equal(easy.first_token, replay(w, "recompute", ServingParams(), 0.05).first_token)


def test_local_grid_matches_direct_runs():
    spec = W.default_spec("agent", sessions=4)
    tasks = [Task(spec, c, ServingParams(), reference_speed=1.0) for c in ("recompute", "ideal")]
    results = run_grid(tasks, workers=2)
    direct = summarize(replay(W.build(spec), "ideal", ServingParams(), 1.0), 2.0, 90, 100.0)
    assert results[1]["reference"]["ttft_mean_s"] == direct["ttft_mean_s"]
    assert [r["config"] for r in results] == ["recompute", "ideal"]


def test_agent_sessions_scale_with_the_replay_speed():
    """A faster agent replay brings more sessions over the same arrival window (else the
    sessions' own tool pauses, not the system, would cap max QPS); a trace is unchanged."""
    spec = W.default_spec("agent", sessions=10)
    fast = W.spec_at_speed(spec, 2.5)
    assert fast.config.sessions == 25 and W.spec_at_speed(spec, 0.01).config.sessions == 1
    base, more = W.build(spec), W.build(fast)
    firsts = [r.arrival_ns for r in base.requests if r.parent < 0]
    assert [r.arrival_ns for r in more.requests if r.parent < 0][:10] == firsts  # the same first sessions
    trace = W.default_spec("mooncake", requests=20)
    assert W.spec_at_speed(trace, 3.0) is trace


def test_device_load_estimate_does_not_learn_from_its_own_loads():
    """The host plans a device load as a cold read behind the queued NAND programs; it
    must not lock itself out (an estimate learned from slow loads made the scheduler stop
    loading, so nothing ever corrected it)."""
    from cxlhm_apps.serving.configs import TierContext, make_system
    ctx = TierContext(ServingParams(dram_bytes=64 << 20), 8, 64 << 20, 1, 52.6e9, 0.0)
    tier = make_system("cxlhm-lru").make_tier(ctx)
    try:
        before = float(tier.estimate_load_ns(0.0, 64 << 20))
        ids, nbytes = np.arange(4), np.full(4, float(64 << 20))
        tier.store(0.0, 1, ids, nbytes)          # dirty KV filling the 64 MiB of device DRAM
        done = tier.load(1e9, 1, ids[:1], nbytes[:1]).done_ns
        assert done - 1e9 > before               # a slow load (dirty victims, NAND reads)
        backlog = tier.write_backlog_ns(2e10)
        assert float(tier.estimate_load_ns(2e10, 64 << 20)) == pytest.approx(before + backlog)
    finally:
        tier.close()


def test_grid_on_a_local_ray_instance():
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'cxlhm[ray]'")
    spec = W.default_spec("agent", sessions=4)
    tasks = [Task(spec, c, ServingParams(), reference_speed=1.0) for c in ("recompute", "ideal")]
    try:
        results = run_grid(tasks, ray="local")
    finally:
        ray.shutdown()
    local = run_grid(tasks, workers=1)
    assert [r["reference"]["ttft_mean_s"] for r in results] == [r["reference"]["ttft_mean_s"] for r in local]
    assert not math.isnan(results[0]["reference"]["ttft_mean_s"])


def test_errors_with_their_own_arguments_cross_a_process_boundary():
    """A worker's exception comes back pickled: one whose constructor takes other
    arguments than its message (a device ConfigError, a broken registry entry) used to
    fail to unpickle, which broke the whole process pool and hid the error."""
    import pickle

    from cxlhm.config import ConfigError
    from cxlhm.registry import BrokenEntry
    from firmware_policies import BrokenPolicy
    for exc in (ConfigError("cmm-h.yaml", "timing.nand_channels", "must be positive"),
                BrokenEntry("boom", name="twoq", source="entry point x"), BrokenPolicy("boom", name="p", source="s")):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.args == exc.args
        assert vars(back) == vars(exc)


def test_a_failing_cell_comes_back_naming_itself_and_its_error():
    from cxlhm_apps.serving.sweep import CellFailed
    spec = W.default_spec("agent", sessions=2)
    bad = ServingParams(device_profile="no-such-profile", gpu_kv_bytes=3 << 30)
    tasks = [Task(spec, "ideal", ServingParams(), reference_speed=1.0),
             Task(spec, "cxlhm-hymcache", bad, reference_speed=1.0)]
    with pytest.raises(CellFailed, match=r"cxlhm-hymcache / agent / colocated / D 64 GiB / GPU pool 3 GiB failed: "
                                         r"ConfigError: profile: profile: no profile named 'no-such-profile'"):
        run_grid(tasks, workers=2)
