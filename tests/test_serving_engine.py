"""Engine fidelity of the serving model, each against a schedule worked out by hand:
chunked prefill under a token budget (vLLM V1 mixing chunks with decodes, SGLang's
prefill-first chunks, whole prompts), LMCache's blocking loads and stores, layer-wise
pipelined loads, the GPU-to-GPU disaggregated hand-over, and the cost of a 1-token
full hit."""
from __future__ import annotations

import numpy as np
import pytest

from cxlhm_apps.serving import workloads as W
from cxlhm_apps.serving.batching import PRESETS, plan_iteration, preset
from cxlhm_apps.serving.gpu import GPUS, gpu_model
from cxlhm_apps.serving.params import ServingParams, params_from
from cxlhm_apps.serving.testing import LinearGpu
from cxlhm_apps.serving.topologies import replay

MS = 1e6


def ChunkGpu() -> LinearGpu:
    """LinearGpu's costs (a prefill iteration 10 ms + 0.1 ms per new token, a decode step
    10 ms, 1000 B of KV per token, 1 byte/ns, 32 layers) with a mixed iteration costing the
    prefill plus 2 ms per decode."""
    return LinearGpu(mixed_decode_s=0.002)


def _request(index, session, ids, tokens, output, at_s, parent=-1):
    ids = np.asarray(ids, np.int64)
    return W.Request(index, session, 0, ids, np.asarray(tokens, np.int64), output, at_s * 1e9, parent, None, True, 0)


def short_then_long() -> W.Workload:
    """A: 512 tokens, 3 output tokens, at 0; B: 2048 tokens, 1 output token, at 1 ms."""
    reqs = (_request(0, 1, [0], [512], 3, 0.0), _request(1, 2, [10, 11, 12, 13], [512] * 4, 1, 0.001))
    return W.Workload("short-then-long", reqs, "hand-made", chunk_tokens=512, open_loop=True)


PARAMS = ServingParams(gpu_kv_bytes=10_000_000, dram_bytes=1 << 30, max_batched_tokens=1024)


def _times(res):
    return (res.first_token - res.arrival) / MS, res.done / MS


# ---------------------------------------------------------------- the batching rule
def test_vllm_v1_gives_decodes_their_token_first_and_cuts_the_last_prefill():
    assert plan_iteration(preset("vllm-v1"), 8, [10, 4], 3) == ([5], 3)
    assert plan_iteration(preset("vllm-v1"), 16, [3, 4, 20], 2) == ([3, 4, 7], 2)
    assert plan_iteration(preset("vllm-v1"), 8, [], 3) == ([], 3)


def test_sglang_runs_prefill_chunks_without_decodes():
    assert plan_iteration(preset("sglang"), 8, [10, 4], 3) == ([8], 0)
    assert plan_iteration(preset("sglang"), 16, [3, 4, 20], 2) == ([3, 4, 9], 0)


def test_whole_prompts_are_never_cut():
    assert plan_iteration(preset("whole-prompt"), 8, [10, 4], 3) == ([10], 0)  # over the budget: alone
    assert plan_iteration(preset("whole-prompt"), 16, [3, 4, 20], 2) == ([3, 4], 0)


def test_presets_carry_the_engines_defaults_for_each_gpu():
    """vllm 0.33 get_batch_defaults (OpenAI server): 8192 tokens / 1024 sequences for
    >= 70 GiB non-A100 GPUs, 2048 / 256 below; sglang 0.5.23: chunked_prefill_size 8192
    on H100/H200, 4096 on 35-60 GiB GPUs."""
    h200, h100, l40s = (GPUS[k].hbm_bytes for k in ("h200", "h100-80g", "l40s-48g"))
    v, s = PRESETS["vllm-v1"], PRESETS["sglang"]
    assert (v.budget(h200), v.max_running(h200)) == (8192, 1024)
    assert (v.budget(h100), v.max_running(h100)) == (8192, 1024)
    assert (v.budget(l40s), v.max_running(l40s)) == (2048, 256)
    assert (s.budget(h200), s.budget(h100), s.budget(l40s)) == (8192, 8192, 4096)
    assert ServingParams(gpu="l40s-48g").token_budget == 2048
    assert ServingParams(batching="sglang", gpu="l40s-48g").token_budget == 4096
    assert ServingParams(max_batched_tokens=512).token_budget == 512


def test_batching_and_modes_are_checked_parameters():
    with pytest.raises(ValueError, match="unknown batching 'vllm'"):
        params_from((("batching", "vllm"),))
    with pytest.raises(ValueError, match="load_mode: must be one of"):
        params_from((("load_mode", "lazy"),))
    assert params_from((("batching", "sglang"),)).batching == "sglang"


# ---------------------------------------------------------------- whole schedules
def test_vllm_v1_schedule_by_hand():
    res = replay(short_then_long(), "recompute", PARAMS.replace(batching="vllm-v1"), gpu=ChunkGpu())
    ttft, done = _times(res)
    # 0: A's 512 tokens alone (61.2). 61.2: A decodes (1 token of the budget) + B's first
    # 1023 tokens: 10 + 102.3 + 2 = 114.3 -> 175.5; again -> 289.8 (A's 2 steps: done);
    # B's last 2 tokens alone: 10.2 -> 300.0, B's first token (arrived at 1 ms).
    assert ttft == pytest.approx([61.2, 299.0])
    assert done == pytest.approx([289.8, 300.0])


def test_sglang_schedule_by_hand():
    res = replay(short_then_long(), "recompute", PARAMS.replace(batching="sglang"), gpu=ChunkGpu())
    ttft, done = _times(res)
    # A 61.2; B in two 1024-token prefill batches (112.4 each) while A's decode waits:
    # 286.0; then A's 2 decode steps: 306.0.
    assert ttft == pytest.approx([61.2, 285.0])
    assert done == pytest.approx([306.0, 286.0])


def test_whole_prompt_schedule_by_hand():
    res = replay(short_then_long(), "recompute", PARAMS.replace(batching="whole-prompt"), gpu=ChunkGpu())
    ttft, done = _times(res)
    # B's 2048 tokens run whole although the budget is 1024: 10 + 204.8 -> 276.0
    assert ttft == pytest.approx([61.2, 275.0])
    assert done == pytest.approx([296.0, 276.0])


def two_turns() -> W.Workload:
    """Turn 1: chunks 0-1 (1024 tokens) at 0; session 2 (chunks 20-22) at 5 s pushes them
    out of the small GPU pool; turn 2 at 10 s (chunks 0-2) finds chunks 0-1 in the tier."""
    reqs = (_request(0, 1, [0, 1], [512, 512], 1, 0.0), _request(1, 2, [20, 21, 22], [512] * 3, 1, 5.0),
            _request(2, 1, [0, 1, 2], [512] * 3, 1, 10.0, parent=0))
    return W.Workload("two-turns", reqs, "hand-made", chunk_tokens=512, open_loop=True)


SMALL_POOL = ServingParams(gpu_kv_bytes=3 * 512 * 1000 + 1000, dram_bytes=1 << 30)


@pytest.mark.parametrize("load_mode, expected", [
    ("async", 0.0 + 1.024 + 61.2),                   # load 1.024 ms off the GPU, then the prefill
    ("blocking", 1.024 + 61.2),                       # the iteration waits for it: the same here
    ("layerwise", max(1.024, 61.2) + 1.024 / 32),     # pipelined over 32 layers
])
def test_load_modes_by_hand(load_mode, expected):
    params = SMALL_POOL.replace(load_mode=load_mode, store_mode="async")
    res = replay(two_turns(), "lmcache-local", params, gpu=ChunkGpu())
    ttft, _ = _times(res)
    assert res.tokens["dram"][2] == 1024
    assert ttft[2] == pytest.approx(expected)


def test_a_blocking_load_holds_the_gpu_from_other_requests():
    """While a blocking load runs, the GPU does nothing else: a request that arrives
    during it waits; with an asynchronous load it runs meanwhile."""
    reqs = two_turns().requests + (_request(3, 3, [30], [100], 1, 10.0002),)
    w = W.Workload("blocking", reqs, "hand-made", chunk_tokens=512, open_loop=True)
    pool = SMALL_POOL.replace(gpu_kv_bytes=SMALL_POOL.gpu_kv_bytes + 101_000)  # room for request 3 too
    slow = ChunkGpu()
    slow.h2d_bandwidth = 1e8   # chunk loads take 10.24 ms: 1024 tokens 10.24 ms
    async_ = replay(w, "lmcache-local", pool.replace(load_mode="async", store_mode="async"), gpu=slow)
    block = replay(w, "lmcache-local", pool.replace(load_mode="blocking", store_mode="async"), gpu=slow)
    a, _ = _times(async_)
    b, _ = _times(block)
    # async: request 3 (100 tokens: 20 ms) runs as it arrives, while turn 2 loads; turn 2's
    # prefill follows it: 0.2 + 20 + 61.2
    assert a[3] == pytest.approx(20.0)
    assert a[2] == pytest.approx(81.4)
    # blocking: turn 2's iteration is 10.24 + 61.2 ms; request 3 runs after it
    assert b[2] == pytest.approx(71.44)
    assert b[3] == pytest.approx(71.44 + 20.0 - 0.2)


def test_gpu_to_gpu_handover_by_hand():
    """One 1024-token request, 3 output tokens, disaggregated: the prefill (112.4 ms),
    then its KV straight to the decode GPU at 1 byte/ns (1.024 ms), then 2 decode steps.
    Through the store instead (recompute: a host-DRAM buffer over PCIe at 1 byte/ns):
    stored 1.024, loaded 1.024."""
    w = W.Workload("one", (_request(0, 1, [0, 1], [512, 512], 3, 0.0),), "hand-made", chunk_tokens=512)
    params = ServingParams(gpu_kv_bytes=10_000_000, dram_bytes=1 << 30).with_options(
        "topology", "disagg", handover_bandwidth=1e9, handover_latency_ns=0.0)
    direct = replay(w, "recompute", params, topology="disagg", gpu=ChunkGpu())
    ttft, done = _times(direct)
    assert ttft == pytest.approx([112.4]) and done == pytest.approx([112.4 + 1.024 + 20.0])
    via = replay(w, "recompute", params.with_options("topology", "disagg", handover="tier"), topology="disagg",
                 gpu=ChunkGpu())
    ttft, done = _times(via)
    assert ttft == pytest.approx([112.4]) and done == pytest.approx([112.4 + 2.048 + 20.0])


def test_gpu_to_gpu_handover_leaves_the_tier_to_reuse():
    w = W.Workload("one", (_request(0, 1, [0, 1], [512, 512], 3, 0.0),), "hand-made", chunk_tokens=512)
    params = ServingParams(gpu_kv_bytes=10_000_000, dram_bytes=1 << 30, store_mode="async")
    res = replay(w, "lmcache-local", params, topology="disagg", gpu=ChunkGpu())
    assert res.tier_stats["stored_bytes"] == 1024 * 1000   # the prefix-cache store
    assert res.tier_stats["loaded_bytes"] == 0              # nothing handed over through it


# ---------------------------------------------------------------- the cost model
def test_a_one_token_full_hit_costs_a_decode_step_not_the_128_token_floor():
    gpu = gpu_model("llama3-8b", "h200")
    one = gpu.prefill_s([1], [32768])
    assert one == pytest.approx(gpu.decode_s(1, 32769), rel=1e-9)
    floor = gpu.prefill_s([128], [32768])
    assert one < 0.6 * floor
    steps = [gpu.prefill_s([n], [32768]) for n in (1, 16, 64, 127, 128)]
    assert steps == sorted(steps)


def test_a_mixed_iteration_pays_the_weights_once():
    gpu = gpu_model("llama3-8b", "h200")
    mixed = gpu.iteration_s([512], [0], 32, 32 * 4096)
    assert mixed == pytest.approx(gpu.prefill_s([512], [0]) + gpu.decode_s(32, 32 * 4096) - gpu.decode_s(1, 0))
    assert gpu.prefill_s([512], [0]) < mixed < gpu.prefill_s([512], [0]) + gpu.decode_s(32, 32 * 4096)
