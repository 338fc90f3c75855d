"""Figures of one replay, and the max QPS under the SLO (TTFT and TBT at a percentile) found
by sweeping the replay speed.

TTFT: first token - arrival. TBT: a request's (last token - first token) / (output - 1),
so prefill stalls and (disaggregated) KV hand-over show up in it. Throughput: finished
requests per second in the steady part of the run (between the 10th and 90th percentile
completions; `throughput_all_rps` is over the whole run). Hit ratio per tier: the share of *reusable*
context tokens (chunks an earlier request computed) served from the GPU, from the
tier's DRAM (host, device or pool), from the device's SSD, or recomputed.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from cxlhm_apps.serving.scheduler import ReplayResult


def steady_throughput(done_ns: np.ndarray) -> float:
    """Requests per second between the 10th and 90th percentile completions: the steady
    part of the run, without the ramp-up and the drain of the last long sessions."""
    done = np.sort(done_ns[~np.isnan(done_ns)])
    if done.size < 10:
        span = (done[-1] - done[0]) / 1e9 if done.size > 1 else 0.0
        return done.size / span if span > 0 else 0.0
    lo, hi = int(0.1 * done.size), int(0.9 * done.size)
    span = (done[hi] - done[lo]) / 1e9
    return (hi - lo) / span if span > 0 else 0.0


def summarize(res: ReplayResult, slo_ttft_s: float, slo_percentile: float, slo_tbt_ms: float = math.inf) -> dict:
    ttft = (res.first_token - res.arrival) / 1e9
    multi = res.output_tokens > 1
    tbt = (res.done[multi] - res.first_token[multi]) / (res.output_tokens[multi] - 1) / 1e6
    span = (np.nanmax(res.done) - np.nanmin(res.arrival)) / 1e9
    t = res.tokens
    reusable = t["gpu"] + t["dram"] + t["ssd"] + t["recomputed"]
    total_reusable = float(reusable.sum()) or 1.0
    s = res.tier_stats
    useful = s.get("prefetch_useful", 0)
    reused_bytes = s.get("loaded_bytes", 0.0)
    p = np.percentile(ttft, [50, 90, 99, slo_percentile])
    out = {
        "config": res.config, "workload": res.workload, "topology": res.topology, "speed": res.speed,
        "dram_gib": res.dram_bytes / 2**30, "requests": int(ttft.size), "slo_percentile": slo_percentile,
        "ttft_mean_s": float(ttft.mean()), "ttft_p50_s": float(p[0]), "ttft_p90_s": float(p[1]),
        "ttft_p99_s": float(p[2]), "ttft_slo_s": float(p[3]),
        "tbt_mean_ms": float(tbt.mean()) if tbt.size else 0.0,
        "tbt_p90_ms": float(np.percentile(tbt, 90)) if tbt.size else 0.0,
        "tbt_slo_ms": float(np.percentile(tbt, slo_percentile)) if tbt.size else 0.0,
        "throughput_rps": steady_throughput(res.done),
        "throughput_all_rps": ttft.size / span if span > 0 else 0.0,
        "output_tps": float(res.output_tokens.sum()) / span if span > 0 else 0.0,
        "offered_rps": ttft.size / max(1e-9, (np.nanmax(res.arrival) - np.nanmin(res.arrival)) / 1e9),
        "gpu_util": [b / 1e9 / span for b in res.gpu_busy_ns] if span > 0 else [],
        "gpu_prefill_util": [b / 1e9 / span for b in res.gpu_prefill_ns] if span > 0 else [],
        "reusable_share": float(reusable.sum() / max(1.0, sum(float(v.sum()) for v in t.values()))),
        "hit_gpu": float(t["gpu"].sum()) / total_reusable,
        "hit_dram": float(t["dram"].sum()) / total_reusable,
        "hit_ssd": float(t["ssd"].sum()) / total_reusable,
        "hit_miss": float(t["recomputed"].sum()) / total_reusable,
        "load_mean_ms": float(res.load_ns[res.load_ns > 0].mean() / 1e6) if (res.load_ns > 0).any() else 0.0,
        "recompute_choices": res.recompute_choices,
        "prefetch_accuracy": float(s.get("prefetch_accuracy", 0.0)),
        "prefetch_coverage": float(s.get("prefetch_coverage", 0.0)),
        "prefetch_late_share": s.get("prefetch_late", 0) / useful if useful else 0.0,
        "prefetch_late_ms": s.get("prefetch_late_ns", 0) / max(1, s.get("prefetch_late", 0)) / 1e6,
        "prefetch_issued": int(s.get("prefetch_issued", 0)),
        "ssd_written_gib": s.get("ssd_write_bytes", 0) / 2**30,
        "ssd_written_per_reused": s.get("ssd_write_bytes", 0) / reused_bytes if reused_bytes else 0.0,
        "tier_loaded_gib": reused_bytes / 2**30,
        "store_skipped_share": float(s.get("store_skipped_share", 0.0)),
        "device_hit_ratio": float(s.get("hit_ratio", 0.0)),
    }
    out["ttft_quantiles"] = np.percentile(ttft, np.linspace(0, 100, 101)).tolist()  # for the CDF plot
    out["slo_met"] = out["ttft_slo_s"] <= slo_ttft_s and out["tbt_slo_ms"] <= slo_tbt_ms
    return out


@dataclasses.dataclass
class SloSearch:
    """The largest replay speed whose TTFT meets the SLO, by doubling/halving then bisection
    (in log space). Each probe is a full replay; `probes` keeps every one."""
    max_speed: float
    best: dict | None            # the summary at max_speed (None: not even the lowest speed)
    probes: list[dict]


def max_speed_under_slo(run: Callable[[float], dict], start: float, *, refine: int = 3,
                        max_doublings: int = 6) -> SloSearch:
    probes: list[dict] = []

    def probe(speed: float) -> dict:
        summary = run(speed)
        probes.append(summary)
        return summary

    first = probe(start)
    if first["slo_met"]:
        lo, best, hi = start, first, None
        for _ in range(max_doublings):
            s = probe(lo * 2)
            if not s["slo_met"]:
                hi = lo * 2
                break
            lo, best = lo * 2, s
        if hi is None:
            return SloSearch(lo, best, probes)
    else:
        hi, lo, best = start, None, None
        for _ in range(max_doublings):
            s = probe(hi / 2)
            if s["slo_met"]:
                lo, best = hi / 2, s
                break
            hi /= 2
        if lo is None:
            return SloSearch(0.0, None, probes)
    for _ in range(refine):  # bisection in log space: each step halves log(hi / lo)
        mid = math.sqrt(lo * hi)
        s = probe(mid)
        if s["slo_met"]:
            lo, best = mid, s
        else:
            hi = mid
    return SloSearch(lo, best, probes)
