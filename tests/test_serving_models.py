"""The serving model across model shapes and GPUs (measured, derived, projected), the
calibration fit, the transfer-vs-recompute boundary, cxlhm:<policy>[+hints]
configurations and the self-explaining report."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm_apps.serving import workloads as W
from cxlhm_apps.serving.boundary import boundary, paths, recompute_per_token_s
from cxlhm_apps.serving.configs import CxlHm, make_system, parse_configs
from cxlhm_apps.serving.gpu import GPUS, LLAMA3_8B, MODELS, PAIRS, fit_table, gpu_model, kv_pool_bytes
from cxlhm_apps.serving.params import ServingParams, params_from
from cxlhm.registry import UnknownName
from cxlhm_apps.serving.report import LEGEND, columns, search_notes
from cxlhm_apps.serving.topologies import replay
from cxlhm_apps.serving.tiers import Link, LruDramTier


# ---------------------------------------------------------------- the calibration fit
def synthetic_table(a, b, p, dec):
    """A table as calibrate_gpu.py writes it, from known coefficients."""
    news, cacheds = [128, 256, 512, 1024, 4096, 16384], [0, 2048, 32768]
    prefill = [{"new_tokens": n, "cached_tokens": c, "kernel": "flex", "seconds": a + b * n + p * (n * n / 2 + n * c)}
               for n in news for c in cacheds]
    c0, c1, c2, c3 = dec
    decode = [{"batch": bb, "context_tokens": ctx, "seconds": c0 + c1 * bb + c2 * bb * ctx + c3 * ctx}
              for bb in (1, 8, 64) for ctx in (1024, 8192)]
    copies = [{"bytes": n, "pinned": True, "direction": d, "seconds": 1e-5 + n / 50e9}
              for n in (2 << 20, 1 << 30) for d in ("h2d", "d2h")]
    return {"model": LLAMA3_8B.table_key(), "prefill": prefill, "decode": decode, "h2d_copy": copies,
            "peaks": {"bf16_flops": 780e12, "hbm_bytes_per_s": 4.2e12}}


@settings(max_examples=25, deadline=None)
@given(a=st.floats(1e-3, 2e-2), b=st.floats(1e-5, 1e-4), p=st.floats(1e-10, 5e-9),
       c0=st.floats(3e-3, 2e-2), c1=st.floats(0, 5e-5), c2=st.floats(1e-9, 1e-7), c3=st.floats(0, 5e-7))
def test_fit_recovers_the_coefficients_of_a_synthetic_table(a, b, p, c0, c1, c2, c3):
    fit = fit_table(synthetic_table(a, b, p, (c0, c1, c2, c3)), LLAMA3_8B)
    assert fit.prefill == pytest.approx((a, b, p), rel=1e-6, abs=1e-12)
    assert fit.decode == pytest.approx((c0, c1, c2, c3), rel=1e-6, abs=1e-12)
    assert fit.h2d_bandwidth == pytest.approx(50e9, rel=1e-9)


def test_a_table_of_another_shape_is_refused(tmp_path):
    import json
    table = synthetic_table(1e-3, 3e-5, 1e-9, (5e-3, 0, 1e-8, 0))
    table["model"]["num_hidden_layers"] = 3
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="another model shape"):
        gpu_model(LLAMA3_8B, table=path)


# ---------------------------------------------------------------- shapes and GPUs
def test_every_pair_has_a_model_and_says_where_its_numbers_come_from():
    for model, gpu in PAIRS:
        g = gpu_model(model, gpu)
        assert g.kv_pool_bytes > 0
        assert g.source.startswith("measured" if gpu == "h200" else ("derived" if GPUS[gpu].tp == 1 else "analytic"))
        assert g.prefill_s([512], [8192]) > g.prefill_s([512], [0]) > 0
        assert g.decode_s(32, 32 * 4096) > g.decode_s(1, 1024) > 0


def test_derived_gpus_scale_by_their_datasheet_roofline():
    h200, h100, l40s = (gpu_model("llama3-8b", g) for g in ("h200", "h100-80g", "l40s-48g"))
    # prefill of 8k tokens is compute bound: the H100 has the H200's FLOPs, the L40S 362/989 of them
    assert h100.prefill_s([8192], [0]) == pytest.approx(h200.prefill_s([8192], [0]), rel=0.02)
    assert l40s.prefill_s([8192], [0]) / h200.prefill_s([8192], [0]) == pytest.approx(989 / 362, rel=0.05)
    # a decode step reads the weights: memory bound, HBM 4.8 vs 3.35 TB/s
    assert h100.decode_s(1, 1024) / h200.decode_s(1, 1024) == pytest.approx(4.8 / 3.35, rel=0.05)
    assert l40s.h2d_bandwidth == pytest.approx(h200.h2d_bandwidth / 2, rel=0.01)  # PCIe 4.0 vs 5.0 x16


def test_kv_pool_follows_memory_and_weights():
    assert kv_pool_bytes(MODELS["llama3-8b"], GPUS["h200"]) == 95 << 30
    assert kv_pool_bytes(MODELS["llama3-8b"], GPUS["h200"]) > kv_pool_bytes(MODELS["llama3-8b"], GPUS["h100-80g"]) \
        > kv_pool_bytes(MODELS["llama3-8b"], GPUS["l40s-48g"]) > 0
    assert kv_pool_bytes(MODELS["llama3-70b"], GPUS["h200"]) == 0     # 141 GB of weights on one GPU
    assert kv_pool_bytes(MODELS["llama3-70b"], GPUS["2xh200-tp2"]) > 0
    assert ServingParams(gpu_kv_bytes=3 << 30).kv_pool_bytes == 3 << 30
    assert ServingParams(model="qwen2.5-32b").kv_pool_bytes < ServingParams().kv_pool_bytes


def test_tensor_parallel_projection_is_faster_than_one_gpu_would_be():
    one = gpu_model("llama3-70b", "h200")     # analytic scaling from the 32B table, 1 GPU (no room for KV)
    two = gpu_model("llama3-70b", "2xh200-tp2")
    assert two.prefill_s([8192], [0]) < one.prefill_s([8192], [0])
    assert two.prefill_s([8192], [0]) > one.prefill_s([8192], [0]) / 2  # plus the all-reduces
    assert "projection" in two.source


def test_unknown_model_or_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'gpt-5'.*llama3-8b"):
        params_from((("model", "gpt-5"),))
    with pytest.raises(ValueError, match="unknown GPU 'b200'"):
        ServingParams(gpu="b200").gpu_cost_model()


# ---------------------------------------------------------------- boundary
def test_boundary_bandwidth_is_kv_bytes_over_recompute_time():
    p = ServingParams()
    g = p.gpu_cost_model()
    for context in (0, 8192):
        b = boundary(g, p, context)
        r = recompute_per_token_s(g, context)
        assert b.bandwidth_gbs == pytest.approx(g.kv_bytes_per_token / r / 1e9)
        for path in paths(g, p):
            slower = path.bandwidth < g.kv_bytes_per_token / r
            assert math.isinf(b.min_chunk_tokens[path.name]) == slower
    # a longer context makes recompute dearer, so loading wins at a lower bandwidth
    assert boundary(g, p, 32768).bandwidth_gbs < boundary(g, p, 0).bandwidth_gbs


# ---------------------------------------------------------------- configurations
def test_any_policy_joins_as_cxlhm_colon_policy():
    assert make_system("cxlhm:sieve") == CxlHm("sieve", False, make_system("cxlhm:sieve").paper)
    assert make_system("cxlhm:s3fifo+hints").hints
    assert parse_configs("lmcache-local,cxlhm:arc+hints") == ["lmcache-local", "cxlhm:arc+hints"]
    for bad, msg in (("cxlhm:nope", "unknown firmware policy 'nope'"), ("cxlhm:", "cxlhm:<policy>"),
                     ("cxlhm:lru+turbo", "cxlhm:<policy>"), ("lmcache", "unknown serving configuration 'lmcache'")):
        with pytest.raises(UnknownName, match=msg):
            parse_configs(bad)


def test_cxlhm_lru_is_cxlhm_colon_lru():
    w = W.build(W.WorkloadSpec("agent", W.AgentConfig(sessions=4, session_rate=1.0, max_context_tokens=12000)))
    p = ServingParams(gpu_kv_bytes=2 << 30, dram_bytes=256 << 20)
    a, b = replay(w, "cxlhm-lru", p, 1.0), replay(w, "cxlhm:lru", p, 1.0)
    assert np.array_equal(a.first_token, b.first_token)


def test_outside_policies_and_systems_join_and_broken_ones_are_named(tmp_path, monkeypatch):
    from entrypoints import install_entry_points
    install_entry_points(tmp_path, monkeypatch, {
        "cxlhm.firmware_policies": {"outside-lru": "firmware_policies.lru", "broken": "outside_pkg_missing:POLICY"},
        "cxlhm.serving_systems": {"outside-lmc": "cxlhm_apps.serving.configs:LmcacheLocal",
                                  "broken-sys": "outside_pkg_missing:SYSTEM"}})
    assert parse_configs("cxlhm:outside-lru+hints,outside-lmc") == ["cxlhm:outside-lru+hints", "outside-lmc"]
    with pytest.raises(UnknownName, match="cxlhm:broken.*'broken'.*ModuleNotFoundError"):
        parse_configs("cxlhm:broken")
    with pytest.raises(UnknownName, match="'broken-sys'.*ModuleNotFoundError"):
        parse_configs("broken-sys")


def test_serve_bench_bad_inputs_are_one_line_errors():
    for argv in (["--configs", "cxlhm:nope"], ["--model", "gpt-5"], ["--gpu", "b200"],
                 ["--model", "llama3-70b", "--gpu", "h200"]):
        proc = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "serve-bench", *argv, "--out", "/nonexistent"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr
        # other commands' load warnings (cxlhm: warning: ...) are not this command's error
        lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("cxlhm: warning:")]
        assert len(lines) == 1 and lines[0].startswith("cxlhm serve-bench: error: "), proc.stderr


# ---------------------------------------------------------------- the report
def test_legend_explains_every_column():
    for column in columns()[1:]:
        for word in column.replace("TTFT mean", "TTFT").split():
            assert word in LEGEND, column


def _cell(config, qps, step):
    return {"config": config, "workload": "agent", "topology": "colocated", "dram_gib": 64.0, "max_qps": qps,
            "search_step": step, "reference": {}}


def test_ideal_below_another_configuration_is_flagged():
    step = 2 ** (1 / 4)
    within = search_notes([_cell("ideal", 1.0, step), _cell("mooncake-dram", 1.1, step)], 64.0)
    assert any("resolution artefact" in n for n in within)
    beyond = search_notes([_cell("ideal", 1.0, step), _cell("mooncake-dram", 1.5, step)], 64.0)
    assert any("beyond the search step" in n for n in beyond)
    fine = search_notes([_cell("ideal", 1.2, step), _cell("mooncake-dram", 1.1, step)], 64.0)
    assert not any("note" in n for n in fine) and "x1.189" in fine[0]
    none = search_notes([_cell("ideal", 0.0, math.inf), _cell("mooncake-dram", 0.0, math.inf)], 64.0)
    assert "out of reach" in none[0]


# ---------------------------------------------------------------- disaggregated hand-over
def test_pinned_chunks_survive_the_store_that_brings_them():
    """The hand-over pins a request's chunks before storing them: the store's own eviction
    must not drop them even when they alone overflow the tier."""
    tier = LruDramTier(2 * 100.0, [Link(1e9, 0)], [Link(1e9, 0)], "t")
    ids = np.arange(3)
    tier.pin(ids)
    tier.store(0.0, 1, ids, np.full(3, 100.0))
    assert all(tier.has(int(c)) for c in ids)
    tier.load(1.0, 1, ids, np.full(3, 100.0))  # no KeyError
    tier.unpin(ids)
    assert tier.used <= tier.capacity
