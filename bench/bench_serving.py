"""HyMCache serving reproduction for every (model, GPU) pair at the paper's equal-DRAM
setting (D = 64 GiB; Mooncake store on 16 x D): the Mooncake conversation trace and the
agent workload, colocated and disaggregated, on the model clock; then three one-axis
sensitivity sweeps around the first pair (colocated), each varying one thing: the GPU
KV pool, the SSD's read bandwidth (so the load/recompute ratio of a chunk), and the share
of sessions that keep their reuse (so the workload's reusable share)
(docs/serving.md explains every number).

    python bench/bench_serving.py                        # every pair and the sweeps (long on 2 cores)
    python bench/bench_serving.py --pairs llama3-8b@h200 --requests 2000 --sessions 150 --sweeps ""
    python bench/bench_serving.py --quick --sweeps-only  # the three sweeps, small workloads
    python bench/bench_serving.py --map                  # the map: every axis in combination (servingmap.py)
    python bench/bench_serving.py --map --quick          # the map's development grid (minutes)

Prints each run's table with the command and the machine, then the summary; writes
results.json, table.txt and the PNG plots per run, and summary.json, pairs.png (the ratios
across pairs) and sensitivity.png (one panel per swept axis), to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine  # noqa: E402

from cxlhm_apps.serving.boundary import boundary  # noqa: E402
from cxlhm_apps.serving.comparison import Comparison, parse_comparison  # noqa: E402
from cxlhm_apps.serving.configs import CxlHm, make_system  # noqa: E402
from cxlhm_apps.serving.gpu import PAIRS  # noqa: E402
from cxlhm_apps.serving.params import ServingParams, device_timing  # noqa: E402
from cxlhm_apps.serving.report import LEGEND, format_table, plot_all, search_notes, write_json  # noqa: E402
from cxlhm_apps.serving.sweep import Task, run_grid  # noqa: E402
from cxlhm_apps.serving.workloads import build, quick_sizes, resolve  # noqa: E402
from cxlhm.units import parse_size  # noqa: E402

RATIO_CONFIGS = "recompute,lmcache-local,cxlhm-hymcache,mooncake-dram,ideal"
WORKLOADS = "mooncake,agent"   # the workloads of every pair and sweep
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


def workload_sizes(workloads: str, **given) -> dict[str, dict]:
    """{workload: {field: value}}: each size given (requests=N, sessions=N; None: not
    given) for every workload of `workloads` whose config has that field, as its registry
    entry declares it (a workload with neither is left alone)."""
    sizes: dict[str, dict] = {}
    names = [n.strip() for n in workloads.split(",") if n.strip()]
    for field, value in given.items():
        if value is None:
            continue
        takers = [n for n in names if field in {f.name for f in dataclasses.fields(resolve(n).config)}]
        if not takers:
            raise SystemExit(f"bench_serving: error: --{field}: none of the workloads ({', '.join(names)}) has a "
                             f"{field} field")
        for name in takers:
            sizes.setdefault(name, {})[field] = value
    return sizes


def ratio(block: dict, a: str, b: str) -> float:
    qa, qb = block.get(a, {}).get("max_qps"), block.get(b, {}).get("max_qps")
    return qa / qb if qa and qb else float("nan")


@dataclasses.dataclass
class Run:
    label: str
    comparison: Comparison
    params: ServingParams
    sweep: str = "pairs"   # pairs, or the axis a sensitivity sweep varies: pool | ratio | reuse
    point: str = ""        # the swept value, as given


def sweep_runs(base: ServingParams, sweeps: list[str], args, sizes: dict, refine: int) -> list[Run]:
    """One-axis sensitivity sweeps around `base` (colocated): each varies the GPU KV pool,
    the SSD's read bandwidth (so its load/recompute ratio) or the share of sessions that
    keep their reuse, and nothing else. The first point of each is `base` itself."""
    pair = f"{base.model}@{base.gpu}"
    runs = []

    def add(sweep, point, params, keep=1.0):
        comp = parse_comparison(WORKLOADS, args.sweep_configs, params, [], "colocated", refine=refine,
                                sizes=sizes, reuse_keep=keep)
        runs.append(Run(f"{pair} {sweep} {point}", comp, params, sweep, point))
    if "pool" in sweeps:
        add("pool", f"{base.kv_pool_bytes >> 30} GiB", base)
        for pool in (parse_size(p) for p in args.pools.split(",") if p.strip()):
            add("pool", f"{pool >> 30} GiB", base.replace(gpu_kv_bytes=pool))
    if "ratio" in sweeps:
        add("ratio", str(device_timing(base)["nand_channel_rate"]).replace(" ", ""), base)
        for rate in (r.strip() for r in args.ssd_rates.split(",") if r.strip()):
            add("ratio", rate, base.replace(device_timing=(("nand_channel_rate", rate),)))
    if "reuse" in sweeps:
        add("reuse", "1", base)
        for keep in (float(k) for k in args.reuse.split(",") if k.strip()):
            add("reuse", f"{keep:g}", base, keep)
    return runs


def unique_tasks(tasks: list[Task]) -> tuple[list[Task], list[int]]:
    """The distinct cells, and for each task its cell. A configuration without the device
    does not depend on the device's timing: the ratio sweep runs its cells once."""
    def key(t: Task) -> Task:
        if t.params.device_timing and not isinstance(make_system(t.config), CxlHm):
            return dataclasses.replace(t, params=t.params.replace(device_timing=()))
        return t
    index: dict[Task, int] = {}
    where = [index.setdefault(key(t), len(index)) for t in tasks]
    return list(index), where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="all", help="MODEL@GPU,... or all (default: every pair of gpu.PAIRS)")
    parser.add_argument("--configs", default=RATIO_CONFIGS)
    parser.add_argument("--quick", action="store_true", help="small workloads, search step ~19%%")
    parser.add_argument("--requests", type=int, default=None,
                        help=f"requests of every workload of {WORKLOADS} that has the field (the traces: the first N)")
    parser.add_argument("--sessions", type=int, default=None,
                        help=f"sessions of every workload of {WORKLOADS} that has the field (the agents)")
    parser.add_argument("--refine", type=int, default=None, help="bisection steps of the max-QPS search "
                        "(step 2^(1/2^refine): 4 -> 4.4%%, 3 -> 9%%, 2 -> 19%%; default 4, --quick 2)")
    parser.add_argument("--dram", default="64GiB")
    parser.add_argument("--topology", default="both", help="both (colocated and disagg), or registered topologies")
    parser.add_argument("--disagg-pairs", default="all",
                        help="MODEL@GPU,... that also run disaggregated (default all; the rest colocated only)")
    parser.add_argument("--sweeps", default="pool,ratio,reuse",
                        help="one-axis sensitivity sweeps around the first pair, colocated: pool (GPU KV pool), "
                             "ratio (the SSD's read bandwidth: its load/recompute ratio), reuse (share of sessions "
                             "keeping their reuse); '' for none")
    parser.add_argument("--sweeps-only", action="store_true", help="run only the sweeps (not the pairs)")
    parser.add_argument("--pools-only", action="store_true", help="run only the pool sweep")
    parser.add_argument("--sweep-configs", default="lmcache-local,cxlhm-hymcache,mooncake-dram")
    parser.add_argument("--pools", default="16GiB,32GiB,48GiB", help="pool sweep: GPU KV pools besides the pair's own")
    parser.add_argument("--ssd-rates", default="0.3GB/s,0.6GB/s,2.4GB/s",
                        help="ratio sweep: NAND channel rates besides the profile's (cmm-h: 8 channels x 1.2 GB/s)")
    parser.add_argument("--reuse", default="0.25,0.5,0.75",
                        help="reuse sweep: shares of sessions that keep their reuse, besides all (1)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--ray", default=None)
    parser.add_argument("--out", default="out/bench-serving")
    parser.add_argument("--map-from", nargs="+", metavar="SUMMARY_JSON",
                        help="draw the plots from earlier runs' summary.json files, run nothing")
    parser.add_argument("--map", action="store_true",
                        help="the map (bench/serving/servingmap.py): SLOs x DRAM x context/output x tool pause x reuse "
                             "x lead time x model/GPU x topology on the coding-agent workload; heatmaps with the "
                             "0.7x/1.45x/3.0x contours to --out/map.png")
    parser.add_argument("--map-speeds", default="0.25,0.5,1,2,4,8",
                        help="--map: the ladder of replay speeds (sessions scale with the speed)")
    parser.add_argument("--map-sessions", type=int, default=None, help="--map: sessions at speed 1 (default 16, quick 12)")
    parser.add_argument("--map-workload", default="coding-agent",
                        help="--map: another registered workload runs its base scenario on the SLO axes only")
    parser.add_argument("--map-configs", default=None, help="--map: configurations (default lmcache-local, "
                        "cxlhm-hymcache, mooncake-dram, ideal)")
    args = parser.parse_args()
    if args.map:
        return run_the_map(args)
    if args.map_from:
        summary = [s for path in args.map_from for s in json.loads(Path(path).read_text())]
        Path(args.out).mkdir(parents=True, exist_ok=True)
        print("\n".join(draw(summary, Path(args.out))))
        return 0

    pairs = parse_pairs(args.pairs)
    refine = args.refine if args.refine is not None else (2 if args.quick else 4)
    sizes = quick_sizes() if args.quick else {}
    for name, fields in workload_sizes(WORKLOADS, requests=args.requests, sessions=args.sessions).items():
        sizes.setdefault(name, {}).update(fields)
    base = ServingParams(dram_bytes=parse_size(args.dram))
    sweeps = ["pool"] if args.pools_only else [s.strip() for s in args.sweeps.split(",") if s.strip()]
    unknown = set(sweeps) - {"pool", "ratio", "reuse"}
    if unknown:
        raise SystemExit(f"bench_serving: error: --sweeps: unknown {', '.join(sorted(unknown))}; "
                         "accepted: pool, ratio, reuse")
    runs: list[Run] = []
    disagg = pairs if args.disagg_pairs == "all" else parse_pairs(args.disagg_pairs)
    for model, gpu in pairs:
        params = base.replace(model=model, gpu=gpu)
        if params.kv_pool_bytes <= 0:
            print(f"{model} on {gpu}: skipped, the weights leave no KV pool")
            continue
        topology = args.topology if (model, gpu) in disagg or args.topology != "both" else "colocated"
        runs.append(Run(f"{model}@{gpu}", parse_comparison(WORKLOADS, args.configs, params, [], topology,
                                                           refine=refine, sizes=sizes), params))
    if runs and sweeps:
        swept = sweep_runs(runs[0].params, sweeps, args, sizes, refine)
        runs = swept if args.sweeps_only or args.pools_only else runs + swept
    print(f"command: {command()}")
    print(f"machine: {machine()} (model clock: the figures do not depend on it)")
    print(f"sizes: {sizes or 'bench defaults (Mooncake: whole trace prefix per workload file; agent 150)'}; "
          f"max-QPS search step 2^(1/2^{refine}) = x{2 ** (1 / 2 ** refine):.3f}")
    tasks, spans = [], []
    for run in runs:
        t = run.comparison.tasks()
        spans.append((len(tasks), len(tasks) + len(t)))
        tasks += t
        print(f"{run.label}: {run.params.gpu_cost_model().describe()}; GPU KV pool in this run "
              f"{run.params.kv_pool_bytes / 2**30:g} GiB; {len(t)} cells")
    cells, where = unique_tasks(tasks)
    print(f"{len(cells)} distinct cells")
    start = time.time()
    done = [0]

    def progress(n):
        done[0] += n
        print(f"  {done[0]}/{len(cells)} cells after {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    ran = run_grid(cells, workers=args.workers, ray=args.ray, progress=progress)
    results = [ran[i] for i in where]
    out = Path(args.out)
    write_json(results, out / "all_results.json")  # before any formatting: nothing computed is lost
    summary = []
    for run, (a, b) in zip(runs, spans):
        res = results[a:b]
        params = run.params
        dram_gib = params.dram_bytes / 2**30
        table = format_table(res, dram_gib) + "\n".join(search_notes(res, dram_gib))
        print(f"\n######## {run.label}: {params.gpu_cost_model().describe()}; GPU KV pool in this run "
              f"{params.kv_pool_bytes / 2**30:g} GiB\n{table}")
        folder = out / run.label.replace("@", "_").replace(" ", "_").replace("/", "_")
        write_json(res, folder / "results.json")
        plot_all(res, folder, dram_gib, (params.slo_ttft_s, params.slo_percentile))
        (folder / "table.txt").write_text(table + "\n" + LEGEND + "\n")
        gpu = params.gpu_cost_model()
        b8k = boundary(gpu, params, 8192)
        reusable = {spec.label: build(spec).summary()["reusable_chunk_share"] for spec, _ in run.comparison.specs()}
        for workload, topology in dict.fromkeys((r["workload"], r["topology"]) for r in res):
            block = {r["config"]: r for r in res if r["workload"] == workload and r["topology"] == topology}
            lmc = block.get("lmcache-local", {}).get("reference", {})
            summary.append({"pair": run.label, "model": params.model, "gpu": params.gpu, "source": gpu.source,
                            "sweep": run.sweep, "point": run.point,
                            "workload": workload, "topology": topology, "gpu_pool_gib": params.kv_pool_bytes / 2**30,
                            "ssd_load_over_recompute": b8k.load_over_recompute[SSD],
                            "reusable_share": reusable.get(workload, float("nan")),
                            "gpu_hit_share": lmc.get("hit_gpu", float("nan")),
                            "hym_over_lmc": ratio(block, "cxlhm-hymcache", "lmcache-local"),
                            "hym_over_moon": ratio(block, "cxlhm-hymcache", "mooncake-dram"),
                            "ideal_over_lmc": ratio(block, "ideal", "lmcache-local"),
                            "max_qps": {c: r.get("max_qps") for c, r in block.items()},
                            "search_step": max((r.get("search_step", 1.0) for r in block.values()), default=1.0)})
    print(f"\nwall time {time.time() - start:.0f} s")
    print("\n== summary: max-QPS ratios [paper: 3.0x lmcache-local colocated, 1.45x disaggregated, "
          "~0.7x mooncake-dram]")
    print(f"{'run':<40} {'workload':<9} {'topology':<9} {'pool GiB':>8} {'SSD/recomp':>10} {'reusable':>8} "
          f"{'GPU hits':>8} {'hym/lmc':>7} {'hym/moon':>8} {'ideal/lmc':>9} {'step':>6}")
    for s in summary:
        print(f"{s['pair']:<40} {s['workload']:<9} {s['topology']:<9} {s['gpu_pool_gib']:>8.0f} "
              f"{s['ssd_load_over_recompute']:>10.2f} {s['reusable_share']:>8.2f} {s['gpu_hit_share']:>8.2f} "
              f"{s['hym_over_lmc']:>7.2f} {s['hym_over_moon']:>8.2f} {s['ideal_over_lmc']:>9.2f} "
              f"{s['search_step']:>6.3f}")
    print("SSD/recomp: a cold 512-token chunk's load from the CXL-HM SSD over its recompute after 8k tokens; "
          "reusable: share of the workload's context chunks an earlier request computed; GPU hits: share of "
          "reusable tokens the GPU pool alone served (lmcache-local); step: max-QPS search step")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    print("\n".join(draw(summary, out)))
    print(f"results, tables and plots in {out}/")
    return 0


def run_the_map(args) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))
    import servingmap as M
    scenarios, ttft, tbt = M.grid(args.quick)
    if args.map_sessions:
        scenarios = [dataclasses.replace(s, sessions=args.map_sessions) for s in scenarios]
    if args.map_workload != "coding-agent":
        scenarios = [dataclasses.replace(scenarios[0], workload=args.map_workload,
                                         requests=args.requests or scenarios[0].requests)]
    speeds = [float(x) for x in args.map_speeds.split(",") if x.strip()]
    configs = tuple(c.strip() for c in args.map_configs.split(",")) if args.map_configs else M.MAP_CONFIGS
    todo = M.cells(scenarios, speeds, (max(ttft), max(tbt)), configs)
    print(f"command: {command()}")
    print(f"machine: {machine()} (model clock: the figures do not depend on it)")
    print(f"map: {len(scenarios)} scenarios x {len(ttft)} TTFT SLOs x {len(tbt)} TBT SLOs; {len(todo)} ladders of "
          f"speeds {speeds}; workload {args.map_workload}; runner: {'Ray ' + args.ray if args.ray else 'local processes'}")
    start = time.time()
    results = M.run_map(todo, args.workers, args.ray, progress=lambda text: print(
        f"{text} after {time.time() - start:.0f} s", file=sys.stderr, flush=True))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = M.ratios(results, ttft, tbt)
    (out / "map.json").write_text(json.dumps({"cells": results, "rows": rows}, indent=1, default=float))
    for t in (1.0, 2.0, 5.0):
        print("\n" + M.table(rows, t, 100.0))
    print("\n== where the paper's claims hold")
    print("\n".join(M.summary_of_claims(rows)))
    title = f"{command()}  |  {machine()}"
    M.draw(rows, out / "map.png", ttft, tbt, title)
    print(f"\nwall time {time.time() - start:.0f} s; map: {out / 'map.png'}, data: {out / 'map.json'}")
    return 0


def draw(summary: list[dict], out: Path) -> list[str]:
    """The plots the summary has rows for; one line naming each."""
    lines = []
    pairs = [s for s in summary if s.get("sweep", "pairs") == "pairs"]
    if pairs:
        plot_pairs(pairs, out / "pairs.png")
        lines.append(f"ratios across (model, GPU) pairs ({len(pairs)} cells): {out / 'pairs.png'}")
    swept = [s for s in summary if s.get("sweep", "pairs") != "pairs"]
    if swept:
        plot_sweeps(swept, out / "sensitivity.png")
        lines.append(f"sensitivity, one axis at a time ({len(swept)} cells): {out / 'sensitivity.png'}")
    return lines


AXES = {  # sweep -> (summary key on x, label, log scale)
    "pool": ("gpu_pool_gib", "GPU KV pool (GiB)", True),
    "ratio": ("ssd_load_over_recompute", "cold SSD load / recompute of a 512-token chunk (after 8k)", True),
    "reuse": ("reusable_share", "reusable share of the workload's context chunks", False),
}


def plot_sweeps(summary: list[dict], path: Path) -> None:
    """One panel per axis: hymcache / lmcache-local and hymcache / mooncake-dram against
    the swept value, per workload; everything else as in the base pair."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sweeps = [s for s in AXES if any(r["sweep"] == s for r in summary)]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 4.4), squeeze=False)
    styles = {("mooncake", "hym_over_lmc"): ("tab:blue", "-", "o"), ("mooncake", "hym_over_moon"): ("tab:blue", "--", "s"),
              ("agent", "hym_over_lmc"): ("tab:orange", "-", "^"), ("agent", "hym_over_moon"): ("tab:orange", "--", "D")}
    names = {"hym_over_lmc": "hymcache / lmcache-local", "hym_over_moon": "hymcache / mooncake-dram"}
    for ax, sweep in zip(axes[0], sweeps):
        key, xlabel, log = AXES[sweep]
        rows = [r for r in summary if r["sweep"] == sweep]
        for (workload, ratio_key), (colour, dash, marker) in styles.items():
            pts = sorted((r[key], r[ratio_key]) for r in rows if r["workload"] == workload and r[ratio_key] == r[ratio_key])
            if pts:
                ax.plot(*zip(*pts), color=colour, linestyle=dash, marker=marker, label=f"{workload}: {names[ratio_key]}")
        for y, text in ((3.0, "paper 3.0x (lmcache-local)"), (0.7, "paper ~0.7x (mooncake-dram)")):
            ax.axhline(y, color="grey", linestyle=":", linewidth=0.8)
            ax.text(ax.get_xlim()[0], y, text, fontsize=6, va="bottom", color="grey")
        if log:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel("max-QPS ratio")
        base = rows[0]
        ax.set_title(f"{sweep}: {base['model']} on {base['gpu']}, colocated, the rest fixed", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"one axis at a time (max-QPS search step x{max(r['search_step'] for r in summary):.3f}: "
                 "closer ratios are not told apart)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pairs(summary: list[dict], path: Path) -> None:
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
