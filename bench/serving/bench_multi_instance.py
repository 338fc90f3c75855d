"""Multi-instance serving: N instances (GPUs) sharing one pooled CXL-HM device vs
per-instance LMCache-local (with and without P2P) vs Mooncake's DRAM pool, all at equal
DRAM in total, under round-robin and session-affinity routing.

    python bench/serving/bench_multi_instance.py                       # agent, 60 sessions, 4 instances
    python bench/serving/bench_multi_instance.py --sessions 120 --instances 8 --speed 8 --plot docs/pool-serving.png

Prints a table (TTFT, where reused tokens came from, P2P share) with each row's TTFT
ratio against lmcache-local-n under the same routing, plus the command and machine;
writes the rows as JSON and, with --plot, a bar chart.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import command, machine  # noqa: E402

from cxlhm_apps.serving import workloads as W  # noqa: E402
from cxlhm_apps.serving.metrics import summarize  # noqa: E402
from cxlhm_apps.serving.multi import ROUTINGS, multi_configs, replay_multi  # noqa: E402
from cxlhm_apps.serving.params import GiB, ServingParams  # noqa: E402

BASELINE = "lmcache-local-n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="agent", help="agent | mooncake | qa | a workload YAML (default agent)")
    ap.add_argument("--sessions", type=int, default=60, help="sessions of a synthetic workload (default 60)")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--speed", type=float, default=4.0, help="arrival-rate multiplier (default: one instance's x N)")
    ap.add_argument("--dram-gib", type=float, default=64.0, help="DRAM D in total for every system (default 64)")
    ap.add_argument("--gpu-kv-gib", type=float, default=96.0, help="KV memory of each GPU (default 96)")
    ap.add_argument("--configs", default=",".join(multi_configs()))
    ap.add_argument("--routings", default=",".join(ROUTINGS))
    ap.add_argument("--json", default="out/pool-serving.json")
    ap.add_argument("--plot", default=None, help="write a bar chart here (PNG)")
    args = ap.parse_args()

    spec = W.resolve(args.workload)
    if "sessions" in {f.name for f in dataclasses.fields(spec.config)}:  # the workloads that have sessions
        spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, sessions=args.sessions))
    workload = W.build(spec)
    params = ServingParams(dram_bytes=int(args.dram_gib * GiB), pool_factor=1.0, gpu_kv_bytes=int(args.gpu_kv_gib * GiB))
    print(f"# command: {command()}")
    print(f"# machine: {machine()} (shared with other agents' jobs: wall times are noisy; the figures are on the model clock)")
    print(f"# {workload.name}: {len(workload.requests)} requests, {args.instances} instances, speed {args.speed}, "
          f"D = {args.dram_gib:g} GiB in total per system, {args.gpu_kv_gib:g} GiB of KV per GPU")
    rows = []
    for routing in args.routings.split(","):
        for config in args.configs.split(","):
            t = time.time()
            res = replay_multi(workload, config, params, args.speed, instances=args.instances, routing=routing)
            s = summarize(res, params.slo_ttft_s, params.slo_percentile, params.slo_tbt_ms)
            s.update(routing=routing, instances=args.instances, wall_s=time.time() - t,
                     p2p_share=float(res.tier_stats.get("remote_hit_share", 0.0)))
            s.pop("ttft_quantiles", None)
            rows.append(s)
    base = {r["routing"]: r["ttft_mean_s"] for r in rows if r["config"] == BASELINE}
    head = (f"{'routing':17s} {'system':16s} {'TTFT mean':>9s} {'p50':>7s} {'p90':>7s} {'p99':>7s} "
            f"{'vs local':>8s} {'gpu':>5s} {'dram':>5s} {'ssd':>5s} {'miss':>5s} {'p2p':>5s} {'rps':>6s}")
    print(head)
    for r in rows:
        ratio = base.get(r["routing"], 0) / r["ttft_mean_s"] if r["ttft_mean_s"] else 0
        print(f"{r['routing']:17s} {r['config']:16s} {r['ttft_mean_s']:9.3f} {r['ttft_p50_s']:7.3f} "
              f"{r['ttft_p90_s']:7.3f} {r['ttft_p99_s']:7.3f} {ratio:7.2f}x {r['hit_gpu']:5.2f} {r['hit_dram']:5.2f} "
              f"{r['hit_ssd']:5.2f} {r['hit_miss']:5.2f} {r['p2p_share']:5.2f} {r['throughput_rps']:6.2f}")
    print("(TTFT in s on the model clock; vs local: lmcache-local-n's mean TTFT / this row's, same routing; "
          "gpu/dram/ssd/miss: where reusable tokens came from; p2p: tier hits read from another instance)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"command": command(), "machine": machine(), "rows": rows}, indent=1))
    if args.plot:
        plot(rows, Path(args.plot), args)
    return 0


def plot(rows: list[dict], path: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    routings = list(dict.fromkeys(r["routing"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, len(routings), figsize=(5 * len(routings), 3.6), sharey=True, squeeze=False)
    for ax, routing in zip(axes[0], routings):
        mine = {r["config"]: r for r in rows if r["routing"] == routing}
        x = range(len(configs))
        ax.bar([i - 0.2 for i in x], [mine[c]["ttft_mean_s"] for c in configs], 0.4, label="mean")
        ax.bar([i + 0.2 for i in x], [mine[c]["ttft_p90_s"] for c in configs], 0.4, label="p90")
        ax.set_xticks(list(x), configs, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{args.instances} instances, {routing}", fontsize=9)
        ax.set_ylabel("TTFT (s, model clock)")
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.workload}: equal DRAM ({args.dram_gib:g} GiB in total)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
