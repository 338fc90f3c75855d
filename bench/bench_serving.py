"""HyMCache serving reproduction for every (model, GPU) pair at the paper's equal-DRAM
setting (D = 64 GiB; Mooncake store on 16 x D): the Mooncake conversation trace and the
agent workload, colocated and disaggregated, on the model clock; then a sensitivity map
of hymcache / lmcache-local and hymcache / mooncake-dram against the GPU KV pool, the
load/recompute cost ratio and the share of reuse the GPU pool alone serves
(docs/serving.md explains every number).

    python bench/bench_serving.py                        # every pair (long on 2 cores)
    python bench/bench_serving.py --pairs llama3-8b@h200 --requests 2000 --sessions 150
    python bench/bench_serving.py --quick                # the smoke version

Prints each pair's table with the command and the machine, then the summary and the
sensitivity map; writes results.json, table.txt and the PNG plots per pair, and
summary.json and sensitivity.png, to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine  # noqa: E402

from cxlhm_apps.serving.boundary import boundary  # noqa: E402
from cxlhm_apps.serving.comparison import QUICK_SIZES, parse_comparison  # noqa: E402
from cxlhm_apps.serving.gpu import PAIRS  # noqa: E402
from cxlhm_apps.serving.params import ServingParams  # noqa: E402
from cxlhm_apps.serving.report import LEGEND, format_table, plot_all, search_notes, write_json  # noqa: E402
from cxlhm_apps.serving.sweep import run_grid  # noqa: E402
from cxlhm.units import parse_size  # noqa: E402

RATIO_CONFIGS = "recompute,lmcache-local,cxlhm-hymcache,mooncake-dram,ideal"
SSD = "CXL-HM SSD (cold)"


def parse_pairs(text: str) -> list[tuple[str, str]]:
    if text == "all":
        return list(PAIRS)
    out = []
    for item in text.split(","):
        model, _, gpu = item.strip().partition("@")
        if not gpu:
            raise SystemExit(f"bench_serving: error: --pairs wants MODEL@GPU items, got {item!r}")
        out.append((model, gpu))
    return out


def ratio(block: dict, a: str, b: str) -> float:
    qa, qb = block.get(a, {}).get("max_qps"), block.get(b, {}).get("max_qps")
    return qa / qb if qa and qb else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="all", help="MODEL@GPU,... or all (default: every pair of gpu.PAIRS)")
    parser.add_argument("--configs", default=RATIO_CONFIGS)
    parser.add_argument("--quick", action="store_true", help="small workloads, search step ~19%%")
    parser.add_argument("--requests", type=int, default=None, help="Mooncake: the first N requests")
    parser.add_argument("--sessions", type=int, default=None, help="agent sessions")
    parser.add_argument("--refine", type=int, default=None, help="bisection steps of the max-QPS search "
                        "(step 2^(1/2^refine): 4 -> 4.4%%, 3 -> 9%%, 2 -> 19%%; default 4, --quick 2)")
    parser.add_argument("--dram", default="64GiB")
    parser.add_argument("--topology", default="both", choices=("colocated", "disagg", "both"))
    parser.add_argument("--disagg-pairs", default="all",
                        help="MODEL@GPU,... that also run disaggregated (default all; the rest colocated only)")
    parser.add_argument("--pools", default="16GiB,48GiB",
                        help="extra GPU KV pool sizes for the sensitivity map (first pair, colocated)")
    parser.add_argument("--pools-only", action="store_true",
                        help="run only the pool-size cells of the first pair (to add them to an earlier run)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--ray", default=None)
    parser.add_argument("--out", default="out/bench-serving")
    parser.add_argument("--map-from", nargs="+", metavar="SUMMARY_JSON",
                        help="draw the sensitivity map from earlier runs' summary.json files, run nothing")
    args = parser.parse_args()
    if args.map_from:
        summary = [s for path in args.map_from for s in json.loads(Path(path).read_text())]
        Path(args.out).mkdir(parents=True, exist_ok=True)
        plot_sensitivity(summary, Path(args.out) / "sensitivity.png")
        print(f"sensitivity map of {len(summary)} cells: {Path(args.out) / 'sensitivity.png'}")
        return 0

    pairs = parse_pairs(args.pairs)
    refine = args.refine if args.refine is not None else (2 if args.quick else 4)
    sizes = {k: dict(v) for k, v in QUICK_SIZES.items()} if args.quick else {}
    if args.requests:
        sizes.setdefault("mooncake", {})["requests"] = args.requests
    if args.sessions:
        sizes.setdefault("agent", {})["sessions"] = args.sessions
    base = ServingParams(dram_bytes=parse_size(args.dram))
    runs = []  # (label, comparison, params)
    disagg = pairs if args.disagg_pairs == "all" else parse_pairs(args.disagg_pairs)
    for model, gpu in pairs:
        params = base.replace(model=model, gpu=gpu)
        if params.kv_pool_bytes <= 0:
            print(f"{model} on {gpu}: skipped, the weights leave no KV pool")
            continue
        topology = args.topology if (model, gpu) in disagg or args.topology != "both" else "colocated"
        runs.append((f"{model}@{gpu}", parse_comparison("mooncake,agent", args.configs, params, [], topology,
                                                        refine=refine, sizes=sizes), params))
    pools = [parse_size(p) for p in args.pools.split(",") if p.strip()]
    if runs and pools:
        first = runs[0][2]
        for pool in pools:
            p = first.replace(gpu_kv_bytes=pool)
            runs.append((f"{first.model}@{first.gpu} pool {pool >> 30} GiB",
                         parse_comparison("mooncake,agent", args.configs, p, [], "colocated", refine=refine,
                                          sizes=sizes), p))
        if args.pools_only:
            runs = runs[len(runs) - len(pools):]
    print(f"command: {command()}")
    print(f"machine: {machine()} (model clock: the figures do not depend on it)")
    print(f"sizes: {sizes or 'bench defaults (Mooncake: whole trace prefix per workload file; agent 150)'}; "
          f"max-QPS search step 2^(1/2^{refine}) = x{2 ** (1 / 2 ** refine):.3f}")
    tasks, spans = [], []
    for label, comp, params in runs:
        t = comp.tasks()
        spans.append((len(tasks), len(tasks) + len(t)))
        tasks += t
        gpu = params.gpu_cost_model()
        print(f"{label}: {gpu.describe()}; GPU KV pool {params.kv_pool_bytes / 2**30:g} GiB; "
              f"{len(t)} cells")
    start = time.time()
    done = [0]

    def progress(n):
        done[0] += n
        print(f"  {done[0]}/{len(tasks)} cells after {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    results = run_grid(tasks, workers=args.workers, ray=args.ray, progress=progress)
    out = Path(args.out)
    write_json(results, out / "all_results.json")  # before any formatting: nothing computed is lost
    summary = []
    for (label, comp, params), (a, b) in zip(runs, spans):
        res = results[a:b]
        dram_gib = params.dram_bytes / 2**30
        table = format_table(res, dram_gib) + "\n".join(search_notes(res, dram_gib))
        print(f"\n######## {label}: {params.gpu_cost_model().describe()}\n{table}")
        folder = out / label.replace("@", "_").replace(" ", "_")
        write_json(res, folder / "results.json")
        plot_all(res, folder, dram_gib, (params.slo_ttft_s, params.slo_percentile))
        (folder / "table.txt").write_text(table + "\n" + LEGEND + "\n")
        gpu = params.gpu_cost_model()
        b8k = boundary(gpu, params, 8192)
        for workload, topology in dict.fromkeys((r["workload"], r["topology"]) for r in res):
            block = {r["config"]: r for r in res if r["workload"] == workload and r["topology"] == topology}
            lmc = block.get("lmcache-local", {}).get("reference", {})
            summary.append({"pair": label, "model": params.model, "gpu": params.gpu, "source": gpu.source,
                            "workload": workload, "topology": topology, "gpu_pool_gib": params.kv_pool_bytes / 2**30,
                            "ssd_load_over_recompute": b8k.load_over_recompute[SSD],
                            "gpu_hit_share": lmc.get("hit_gpu", float("nan")),
                            "hym_over_lmc": ratio(block, "cxlhm-hymcache", "lmcache-local"),
                            "hym_over_moon": ratio(block, "cxlhm-hymcache", "mooncake-dram"),
                            "ideal_over_lmc": ratio(block, "ideal", "lmcache-local"),
                            "max_qps": {c: r.get("max_qps") for c, r in block.items()},
                            "search_step": max((r.get("search_step", 1.0) for r in block.values()), default=1.0)})
    print(f"\nwall time {time.time() - start:.0f} s")
    print("\n== summary: max-QPS ratios per (model, GPU) [paper: 3.0x lmcache-local colocated, 1.45x disaggregated, "
          "~0.7x mooncake-dram]")
    print(f"{'pair':<34} {'workload':<9} {'topology':<9} {'pool GiB':>8} {'SSD/recomp':>10} {'GPU hits':>8} "
          f"{'hym/lmc':>7} {'hym/moon':>8} {'ideal/lmc':>9} {'step':>6}")
    for s in summary:
        print(f"{s['pair']:<34} {s['workload']:<9} {s['topology']:<9} {s['gpu_pool_gib']:>8.0f} "
              f"{s['ssd_load_over_recompute']:>10.2f} {s['gpu_hit_share']:>8.2f} {s['hym_over_lmc']:>7.2f} "
              f"{s['hym_over_moon']:>8.2f} {s['ideal_over_lmc']:>9.2f} {s['search_step']:>6.3f}")
    print("SSD/recomp: a cold 512-token chunk's load from the CXL-HM SSD over its recompute after 8k tokens; "
          "GPU hits: share of reusable tokens the GPU pool alone served (lmcache-local); step: max-QPS search step")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    plot_sensitivity(summary, out / "sensitivity.png")
    print(f"results, tables and plots in {out}/ (sensitivity map: {out / 'sensitivity.png'})")
    return 0


def plot_sensitivity(summary: list[dict], path: Path) -> None:
    """Two panels (hymcache / lmcache-local, hymcache / mooncake-dram): each colocated and
    disaggregated cell placed by its GPU KV pool and its SSD load / recompute ratio, coloured
    by the ratio, labelled with the share of reuse the GPU pool alone served."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.6))
    markers = {("mooncake", "colocated"): "o", ("mooncake", "disagg"): "s", ("agent", "colocated"): "^",
               ("agent", "disagg"): "D"}
    offsets = {("mooncake", "colocated"): (6, 8), ("mooncake", "disagg"): (6, 16), ("agent", "colocated"): (6, -4),
               ("agent", "disagg"): (6, -12)}
    for ax, key, title, paper in ((axes[0], "hym_over_lmc", "hymcache / lmcache-local", "paper 3.0x col., 1.45x disagg."),
                                  (axes[1], "hym_over_moon", "hymcache / mooncake-dram", "paper ~0.7x")):
        sc = None
        for (workload, topology), m in markers.items():
            pts = [s for s in summary if s["workload"] == workload and s["topology"] == topology and s[key] == s[key]]
            if not pts:
                continue
            sc = ax.scatter([p["gpu_pool_gib"] for p in pts], [p["ssd_load_over_recompute"] for p in pts],
                            c=[p[key] for p in pts], cmap="viridis", vmin=0.5, vmax=2.0, marker=m, s=70,
                            edgecolors="k", label=f"{workload}, {topology}")
            offset = offsets[(workload, topology)]  # cells of one pair sit on one point: spread the labels
            for p in pts:
                ax.annotate(f"{workload[:4]} {topology[:4]}: {p[key]:.2f}x ({p['pair'].split('@')[0]}, "
                            f"GPU {p['gpu_hit_share']:.0%})", (p["gpu_pool_gib"], p["ssd_load_over_recompute"]),
                            fontsize=6, xytext=offset, textcoords="offset points")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPU KV pool (GiB)")
        ax.set_ylabel("cold SSD load / recompute of a 512-token chunk (after 8k)")
        ax.set_title(f"{title} ({paper})", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
        ax.margins(x=0.35, y=0.15)
        if sc is not None:
            fig.colorbar(sc, ax=ax, label="max-QPS ratio")
    fig.suptitle("label: ratio, model, share of reusable tokens the GPU pool alone served", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
