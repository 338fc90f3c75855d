"""The simulator against published figures, each row with its source: vLLM's public
performance benchmark (its latency tests: Llama-3.1-8B and Llama-3-70B, H200 and H100) and
Mooncake FAST'25 (Table 2, Figs. 8-10) on the traces it published. Prints a Markdown table (published,
simulated, error, within 15% or why not) with the command and the machine.

    python bench/serving/validation.py

The published side of every row was read from the paper (FAST25-release/Mooncake-FAST25.pdf
in github.com/kvcache-ai/Mooncake): nothing here is fitted to it. The simulated side runs
the same experiment on the same trace with this project's pieces: prefix matching over the
trace's 512-token block hashes, LRU caches of the paper's capacities, and the prefill cost
of the GPU model (gpu.py) for a 70B model (the paper's LLaMA3-70B; here the projection on
two H200s: only ratios are compared, so the GPU cancels to first order).
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import command, machine  # noqa: E402

from cxlhm.traces.mooncake import DEFAULT_TRACE, read_requests  # noqa: E402
import dataclasses  # noqa: E402

from cxlhm_apps.serving.gpu import GPUS, gpu_model  # noqa: E402
from cxlhm_apps.serving.workloads import SYNTHETIC_TRACE  # noqa: E402

BLOCK = 512
PAPER = "Mooncake FAST'25 (Qin et al.), FAST25-release/Mooncake-FAST25.pdf"
TRACES = {"conversation": str(DEFAULT_TRACE), "synthetic": SYNTHETIC_TRACE}
LOCAL_TOKENS = 3_000_000      # Fig. 9/10: "a local cache with a 3M token capacity" per node
NODES_FIG10 = 10              # Fig. 10: "a cluster with 10 prefill nodes"


class LruTokens:
    """An LRU cache of 512-token blocks, capacity in tokens."""

    def __init__(self, capacity_tokens: float):
        self.capacity = capacity_tokens
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def match(self, hashes) -> int:
        """Leading blocks present (a prefix match)."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def insert(self, hashes) -> None:
        for h in hashes:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) * BLOCK > self.capacity:
            self.blocks.popitem(last=False)


def replay_caches(reqs, caches: list[LruTokens], route) -> np.ndarray:
    """Cached tokens per request: routed to a cache by route(caches, hashes), matched, then
    its blocks inserted (the request's KV is kept)."""
    cached = np.zeros(len(reqs))
    for i, r in enumerate(reqs):
        hashes = r.hash_ids.tolist()
        c = route(caches, hashes, i)
        cached[i] = min(r.input_length - 1, caches[c].match(hashes) * BLOCK)
        caches[c].insert(hashes)
    return cached


def one(caches, hashes, i):
    return 0


def best_prefix(caches, hashes, i):
    """Fig. 10's local setting: the node with the longest prefix match (ties: in turn)."""
    matches = [c.match(hashes) for c in caches]
    top = max(matches)
    tied = [k for k, m in enumerate(matches) if m == top]
    return tied[i % len(tied)]


def round_robin(caches, hashes, i):
    return i % len(caches)


def prefill_seconds(reqs, cached, gpu) -> float:
    inp = np.array([r.input_length for r in reqs], np.float64)
    new = np.maximum(1.0, inp - cached)
    return float(gpu.prefill_alone_s(new, inp - new).sum())


# vLLM's performance benchmark, latency tests (input 32 tokens, output 128, batch 8; end-to-end
# mean latency in ms), as published on its Buildkite pipeline:
VLLM_LATENCY = (
    ("llama3-8b", "h200", 1, 833.421, "buildkite.com/vllm/performance-benchmark/builds/9515"),
    ("llama3-70b", "h200", 4, 2077.53, "buildkite.com/vllm/performance-benchmark/builds/9515"),
    ("llama3-8b", "h100-80g", 1, 997.542, "the same tests' page on 8xH100, found at "
     "buildkite.com/elastic/enterprise-search-ruby/builds/571"),
    ("llama3-70b", "h100-80g", 4, 2444.47, "the same tests' page on 8xH100, found at "
     "buildkite.com/elastic/enterprise-search-ruby/builds/571"),
)


def latency_ms(model: str, gpu: str, tp: int, batch: int = 8, new: int = 32, output: int = 128) -> float:
    """One batch of `batch` prompts of `new` tokens prefilled together, then output - 1
    decode steps of the whole batch (vLLM's latency test)."""
    spec = GPUS[gpu] if tp == 1 else dataclasses.replace(GPUS[gpu], name=f"{tp}x {GPUS[gpu].name}", tp=tp,
                                                          nvlink_bandwidth=450e9)
    g = gpu_model(model, spec)
    prefill = g.prefill_s([new] * batch, [0] * batch)
    decode = float(g.decode_steps_s(batch, batch * (new + 1), output - 1).sum())
    return (prefill + decode) * 1e3


def rows() -> list[tuple]:
    gpu = gpu_model("llama3-70b", "2xh200-tp2")
    out = []
    for model, gname, tp, published, source in VLLM_LATENCY:
        how = {("llama3-8b", "h200"): "the 8B H200 measurement",
               ("llama3-8b", "h100-80g"): "derived from the 8B H200 measurement by the rooflines (gpu.py)"}.get(
            (model, gname), "projected from the 32B H200 measurement; TP all-reduces charged by NVLink bandwidth")
        out.append((f"vLLM latency test, {model} TP{tp} on {gname}: mean latency (ms) [{source}]", published,
                    latency_ms(model, gname, tp), how))
    fig8 = {"conversation": 1.56, "synthetic": 2.76}
    fig8_hbm = {"conversation": 1.43, "synthetic": 2.59}
    fig9 = {"conversation": 0.41, "synthetic": 0.46}
    fig10_hit = {"conversation": 2.22, "synthetic": 2.36}
    fig10_time = {"conversation": 0.76, "synthetic": 0.52}
    table2 = {"conversation": (12035, 343, 0.40), "synthetic": (15325, 149, 0.66)}
    for name, path in TRACES.items():
        reqs = read_requests(path)
        inp = np.array([r.input_length for r in reqs], np.float64)
        outl = np.array([r.output_length for r in reqs], np.float64)
        unbounded = replay_caches(reqs, [LruTokens(float("inf"))], one)
        a_in, a_out, ratio = table2[name]
        out.append((f"Table 2, {name}: mean input tokens", a_in, inp.mean(), "the trace's own statistic"))
        out.append((f"Table 2, {name}: mean output tokens", a_out, outl.mean(), "the trace's own statistic"))
        out.append((f"Table 2, {name}: cache ratio (tokens a prefix match reuses, unbounded cache)", ratio,
                    unbounded.sum() / inp.sum(), "prefix matching on the published block hashes"))
        local = replay_caches(reqs, [LruTokens(LOCAL_TOKENS)], one)
        out.append((f"Fig. 9, {name}: hit rate of a 3M-token cache / the theoretical maximum", fig9[name],
                    local.sum() / max(1.0, unbounded.sum()), "one LRU of 3M tokens vs unbounded, request order"))
        loc10 = replay_caches(reqs, [LruTokens(LOCAL_TOKENS) for _ in range(NODES_FIG10)], best_prefix)
        glob10 = replay_caches(reqs, [LruTokens(LOCAL_TOKENS * NODES_FIG10)], one)
        out.append((f"Fig. 10, {name}: hit rate, global / local cache (10 nodes x 3M tokens)", fig10_hit[name],
                    glob10.sum() / max(1.0, loc10.sum()), "local: longest-prefix routing; global: one 30M pool"))
        out.append((f"Fig. 10, {name}: prefill GPU time, global / local", fig10_time[name],
                    prefill_seconds(reqs, glob10, gpu) / prefill_seconds(reqs, loc10, gpu), "gpu.py 70B prefill"))
        none = prefill_seconds(reqs, np.zeros(len(reqs)), gpu)
        pool = prefill_seconds(reqs, unbounded, gpu)
        out.append((f"Fig. 8, {name}: prefill GPU time, vLLM (no cache) / Mooncake", fig8[name], none / pool,
                    "Mooncake's pool taken as unbounded (50M tokens 'nearly reach' the maximum, Fig. 9)"))
        hbm = replay_caches(reqs, [LruTokens(1_000_000) for _ in range(16)], round_robin)
        out.append((f"Fig. 8, {name}: prefill GPU time, vLLM prefix caching / Mooncake", fig8_hbm[name],
                    prefill_seconds(reqs, hbm, gpu) / pool,
                    "16 nodes, 1M tokens of HBM prefix cache each (assumed), requests in turn"))
    return out


def main() -> int:
    print(f"command: {command()}")
    print(f"machine: {machine()} (trace replays: the figures do not depend on it)")
    print(f"sources: vLLM's performance benchmark pages (per row); {PAPER}\n")
    print("| figure | published | simulated | error | within 15%? | how simulated |")
    print("|---|---|---|---|---|---|")
    for what, published, simulated, how in rows():
        err = simulated / published - 1
        shown = f"{simulated:.0f}" if simulated >= 100 else f"{simulated:.3g}"
        print(f"| {what} | {published:g} | {shown} | {err:+.0%} | {'yes' if abs(err) <= 0.15 else 'no'} | "
              f"{how} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
