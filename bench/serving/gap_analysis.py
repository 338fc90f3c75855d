"""Where cxlhm-hymcache's gain over lmcache-local comes from: the measurements behind
the mechanisms docs/serving.md section 7 explains.

    python bench/serving/gap_analysis.py                      # ~1 min on 2 cores
    python bench/serving/gap_analysis.py --requests 400 --sessions 30   # a quick look

For each workload (Mooncake trace, agent) at its reference speed it prints

1. capacity: the LRU stack distance, in bytes of KV, of every reused chunk (offline, no
   timing): the share of reusable tokens an LRU cache of the GPU pool's size, of D, of
   GPU + D, of the 16 x D pool would hold. An inclusive host store smaller than the GPU
   pool can only hold what the GPU holds;
2. per request class (by the stack distance of the request's reused prefix) and
   configuration: where the reusable tokens came from and the mean TTFT;
3. the cost of one 512-token chunk: recomputing it vs loading it from each tier;
4. GPU time (prefill / decode) and the device's NAND traffic against its bandwidth;

and, first, for every (model, GPU) pair of the reproduction, the transfer-vs-recompute
boundary: the device bandwidth above which loading a chunk beats recomputing it and the
chunk size above which it does at each path's bandwidth (`--boundary` prints only that).

`--bounds` prints each committed calibration table's prefill and decode figures against
their roofline bounds: how many are within 2x, and every one beyond with its reason.

It writes stack_distance.png (the capacity curve) to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import command, machine  # noqa: E402

from cxlhm_apps.serving.workloads import default_names, reference_speed  # noqa: E402
from cxlhm_apps.serving.configs import TierContext, all_names, make_system  # noqa: E402
from cxlhm_apps.serving.boundary import boundary_lines  # noqa: E402
from cxlhm_apps.serving.bounds import report as bounds_report  # noqa: E402
from cxlhm_apps.serving.gpu import PAIRS, TABLES  # noqa: E402
from cxlhm_apps.serving.metrics import summarize  # noqa: E402
from cxlhm_apps.serving.params import ServingParams  # noqa: E402
from cxlhm_apps.serving.topologies import replay  # noqa: E402
from cxlhm_apps.serving.workloads import Workload, build, default_spec, kind, spec_at_speed  # noqa: E402

GiB = 1 << 30
CLASSES = (("< GPU pool", 0.0, 96.0), ("GPU..GPU+D", 96.0, 160.0), ("GPU+D..16D", 160.0, 1024.0),
           ("> 16D", 1024.0, np.inf))


# ---------------------------------------------------------------- 1. capacity
def stack_distances(w: Workload, order: np.ndarray, bpt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LRU stack distance (bytes of distinct KV touched since the chunk's previous use) of
    every reused chunk, with its tokens and its request. Requests in `order` (arrival);
    a request touches its context's chunks in order. Fenwick tree over access times."""
    n_access = sum(r.chunk_ids.size for r in w.requests)
    tree = np.zeros(n_access + 1)

    def add(i, v):
        i += 1
        while i <= n_access:
            tree[i] += v
            i += i & -i

    def prefix(i):  # sum of positions < i
        s = 0.0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    last: dict[int, tuple[int, float]] = {}
    dist, toks, reqs = [], [], []
    t = 0
    for ri in order:
        r = w.requests[ri]
        for cid, tk in zip(r.chunk_ids.tolist(), r.chunk_tokens.tolist()):
            size = tk * bpt
            if cid in last:
                pos, old = last[cid]
                dist.append(prefix(t) - prefix(pos + 1))
                toks.append(tk)
                reqs.append(ri)
                add(pos, -old)
            add(t, size)
            last[cid] = (t, size)
            t += 1
    return np.array(dist), np.array(toks, float), np.array(reqs, int)


def capacity_lines(dist, toks, params: ServingParams) -> list[str]:
    d, g = params.dram_bytes, params.kv_pool_bytes
    total = toks.sum() or 1.0
    out = []
    for label, cap in ((f"D = {d / GiB:g} GiB", d), (f"GPU pool {g / GiB:g} GiB", g),
                       (f"GPU + D = {(g + d) / GiB:g} GiB", g + d),
                       (f"16 x D = {params.pool_factor * d / GiB:g} GiB", params.pool_factor * d),
                       ("unbounded", np.inf)):
        out.append(f"  LRU of {label:<22} holds {toks[dist < cap].sum() / total:6.1%} of reusable tokens")
    return out


# ---------------------------------------------------------------- 3. chunk costs
def chunk_costs(params: ServingParams) -> list[str]:
    gpu = params.gpu_cost_model()
    chunk = 512 * gpu.kv_bytes_per_token
    out = [f"  one 512-token chunk = {chunk / 2**20:.0f} MiB of KV"]
    for cached in (0, 8192, 32768):
        # recomputing a chunk inside a long prefill: the marginal prefill time
        big = 8192
        t = gpu.prefill_s([cached + big + 512], [0]) - gpu.prefill_s([cached + big], [0])
        out.append(f"  recompute it after {cached:>5} tokens (marginal, inside a long prefill): {t * 1e3:6.1f} ms")
    out.append(f"  load it from host DRAM over PCIe ({gpu.h2d_bandwidth / 1e9:.1f} GB/s): "
               f"{gpu.h2d_s(chunk) * 1e3:6.1f} ms")
    out.append(f"  load it from the DRAM pool over RDMA ({params.rdma_bandwidth / 1e9:.1f} GB/s): "
               f"{(chunk / params.rdma_bandwidth + params.rdma_latency_ns / 1e9) * 1e3:6.1f} ms")
    # the device, measured on its model: a chunk still in device DRAM, and cold ones from NAND
    ctx = TierContext(params.replace(dram_bytes=4 * GiB), 64, chunk, 1, gpu.h2d_bandwidth, gpu.h2d_latency_s * 1e9)
    tier = make_system("cxlhm-hymcache").make_tier(ctx)
    try:
        tier.store(0.0, 1, np.arange(1), np.full(1, float(chunk)))
        tier.advance(30e9)  # idle: the write buffering has flushed it, it stays resident
        hot = tier.load(30e9, 1, np.arange(1), np.full(1, float(chunk))).done_ns - 30e9
        plan = chunk * tier.ns_per_byte
    finally:
        tier.close()
    out.append(f"  load it from device DRAM (CXL x8 + PCIe, measured on the device model): {hot / 1e6:6.1f} ms")
    out.append(f"  load it from the device's NAND: planned at the nominal SSD path ({chunk / plan:.1f} GB/s) "
               f"{plan / 1e6:.1f} ms; measured (24 cold chunks in a row, idle device) "
               f"{cold_chunk_ms(params):.1f} ms each")
    return out


def cold_chunk_ms(params: ServingParams) -> float:
    gpu = params.gpu_cost_model()
    chunk = 512 * gpu.kv_bytes_per_token
    ctx = TierContext(params.replace(dram_bytes=256 << 20), 64, chunk, 1, gpu.h2d_bandwidth, gpu.h2d_latency_s * 1e9)
    tier = make_system("cxlhm-hymcache").make_tier(ctx)
    try:
        ids, nbytes = np.arange(40), np.full(40, float(chunk))
        tier.store(0.0, 1, ids, nbytes)          # 2.5 GiB through 256 MiB: the first ones are on NAND
        tier.advance(60e9)                       # idle: every dirty block flushed, no program queued
        return (tier.load(60e9, 1, ids[:24], nbytes[:24]).done_ns - 60e9) / 24 / 1e6
    finally:
        tier.close()


# ---------------------------------------------------------------- 2. and 4.
def per_class(w: Workload, results: dict, dist, toks, reqs, configs) -> list[str]:
    """Requests classed by the median stack distance of their reused chunks."""
    n = len(w.requests)
    req_dist = np.full(n, np.nan)
    for i in np.unique(reqs):
        sel = reqs == i
        req_dist[i] = np.median(dist[sel]) / GiB
    first = np.array([r.parent < 0 for r in w.requests])
    classes = [("no reuse", np.isnan(req_dist))]
    for label, lo, hi in CLASSES:
        classes.append((label, (req_dist >= lo) & (req_dist < hi)))
    out = [f"  {'class (median reuse distance)':<22} {'reqs':>5} {'1st turn':>8} {'reusable':>8}  {'config':<15} "
           f"{'GPU':>5} {'DRAM':>5} {'SSD':>5} {'miss':>5} {'TTFT s':>7}"]
    for label, sel in classes:
        if not sel.any():
            continue
        head = f"  {label:<22} {int(sel.sum()):>5} {first[sel].mean():>8.2f} "
        for j, config in enumerate(configs):
            res = results[config]
            t = res.tokens
            tot = float(sum(t[k][sel].sum() for k in ("gpu", "dram", "ssd", "recomputed")))
            ttft = float(np.mean((res.first_token[sel] - res.arrival[sel]) / 1e9))
            lead = head + f"{tot / 1e6:>7.2f}M  " if j == 0 else " " * (len(head) + 10)
            tot = tot or 1.0
            out.append(lead + f"{config:<15} {t['gpu'][sel].sum() / tot:>5.2f} {t['dram'][sel].sum() / tot:>5.2f} "
                       f"{t['ssd'][sel].sum() / tot:>5.2f} {t['recomputed'][sel].sum() / tot:>5.2f} {ttft:>7.2f}")
    return out


def gpu_and_nand(results: dict, summaries: dict) -> list[str]:
    out = [f"  {'config':<15} {'GPU busy':>8} {'prefill':>8} {'decode':>7} {'recomp tok':>10} "
           f"{'NAND read GB/s':>14} {'NAND write GB/s':>15} {'store skip':>10} {'recompute cuts':>14}"]
    for config, res in results.items():
        s = summaries[config]
        span = (np.nanmax(res.done) - np.nanmin(res.arrival)) / 1e9
        ts = res.tier_stats
        util = s["gpu_util"][0]
        pre = s["gpu_prefill_util"][0]
        rec = float(res.tokens["recomputed"].sum() + res.tokens["new"].sum())
        out.append(f"  {config:<15} {util:>8.2f} {pre:>8.2f} {util - pre:>7.2f} {rec / 1e6:>9.2f}M "
                   f"{ts.get('ssd_read_bytes', 0) / span / 1e9:>14.2f} "
                   f"{ts.get('ssd_write_bytes', 0) / span / 1e9:>15.2f} "
                   f"{s['store_skipped_share']:>10.2f} {res.recompute_choices:>14}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="Mooncake: the first N requests (default 2000)")
    ap.add_argument("--sessions", type=int, default=150, help="agent sessions at speed 1 (default 150)")
    ap.add_argument("--workload", default=",".join(default_names()))
    ap.add_argument("--configs", default=",".join(all_names()))
    ap.add_argument("--class-configs", default="recompute,lmcache-local,cxlhm-hymcache,mooncake-dram",
                    help="configurations in the per-class table")
    ap.add_argument("--boundary", action="store_true", help="print the transfer-vs-recompute boundary only")
    ap.add_argument("--bounds", action="store_true",
                    help="print the calibration tables' figures against their roofline bounds only")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--out", default="out/gap-analysis")
    args = ap.parse_args()
    params = ServingParams(model=args.model, gpu=args.gpu)
    print(f"command: {command()}")
    print(f"machine: {machine()} (model clock: the figures do not depend on it)")
    if args.bounds:
        text, unexplained = bounds_report([t for t in TABLES.values() if t.exists()])
        print(text)
        return 1 if unexplained else 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"GPU KV pool {params.kv_pool_bytes / GiB:g} GiB, D = {params.dram_bytes / GiB:g} GiB, "
          f"pool {params.pool_factor:g} x D")
    print("\n== transfer vs recompute: per model and GPU, the bandwidth above which loading a chunk beats "
          "recomputing it, and the chunk size above which it does on each path")
    for model, gpu in PAIRS:
        p = params.replace(model=model, gpu=gpu)
        print("\n".join(boundary_lines(p.gpu_cost_model(), p)))
    if args.boundary:
        return 0
    print("\n== cost of one chunk")
    print("\n".join(chunk_costs(params)))
    curves = {}
    for name in [w.strip() for w in args.workload.split(",") if w.strip()]:
        start = time.time()
        fields = {f.name for f in dataclasses.fields(kind(name).config)}   # each size its workloads have
        sizes = {k: v for k, v in (("requests", args.requests), ("sessions", args.sessions)) if k in fields}
        speed = reference_speed(name)
        spec = spec_at_speed(default_spec(name, **sizes), speed)
        w = build(spec)
        results, summaries = {}, {}
        for config in args.configs.split(","):
            results[config] = replay(w, config, params, speed)
            summaries[config] = summarize(results[config], params.slo_ttft_s, params.slo_percentile,
                                          params.slo_tbt_ms)
        order = np.argsort(next(iter(results.values())).arrival, kind="stable")
        bpt = params.gpu_cost_model().kv_bytes_per_token
        dist, toks, reqs = stack_distances(w, order, bpt)
        curves[name] = (dist, toks)
        print(f"\n== {name} at speed {speed:g}: {w.description}; {w.summary()}")
        print("1. capacity (LRU stack distance of reused chunks, arrival order):")
        print("\n".join(capacity_lines(dist, toks, params)))
        print("2. per request class: share of the class's reusable tokens from GPU / DRAM tier / device SSD / "
              "recomputed, and mean TTFT (s):")
        print("\n".join(per_class(w, results, dist, toks, reqs,
                                   [c for c in args.class_configs.split(",") if c in results])))
        print("4. GPU time (share of the run) and device traffic:")
        print("\n".join(gpu_and_nand(results, summaries)))
        print(f"({time.time() - start:.0f} s)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, (dist, toks) in curves.items():
            o = np.argsort(dist)
            ax.plot(dist[o] / GiB, np.cumsum(toks[o]) / toks.sum(), label=name)
        for x, label in ((params.dram_bytes / GiB, "D"), (params.kv_pool_bytes / GiB, "GPU pool"),
                         ((params.kv_pool_bytes + params.dram_bytes) / GiB, "GPU+D"),
                         (params.pool_factor * params.dram_bytes / GiB, "16 D")):
            ax.axvline(x, color="gray", linewidth=0.8, linestyle="--")
            ax.text(x, 0.02, label, rotation=90, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("LRU stack distance of a reused chunk (GiB of KV)")
        ax.set_ylabel("share of reusable tokens within")
        ax.set_title("what an LRU cache of each size can hold")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "stack_distance.png", dpi=110)
        print(f"\nplot: {out / 'stack_distance.png'}")
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
