"""HyMCache serving reproduction (issue 8): the full comparison table on the Mooncake
conversation trace and the synthetic agent workload, colocated and disaggregated, plus
the DRAM-budget sweep - on the model clock (docs/serving.md explains every number).

    python bench/bench_serving.py                 # the full tables (~7 min on 2 cores)
    python bench/bench_serving.py --quick         # the smoke version (< 2 min), = cxlhm serve-bench --quick
    python bench/bench_serving.py --requests 12031  # max-QPS search on the whole trace (long on 2 cores;
                                                    # --ray on a cluster)

Prints the table with the command and the machine; writes results.json, table.txt and
the PNG plots to --out.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine  # noqa: E402

from cxlhm.serving.comparison import parse_comparison  # noqa: E402
from cxlhm.serving.gpu import gpu_model  # noqa: E402
from cxlhm.serving.params import ServingParams  # noqa: E402
from cxlhm.serving.workloads import build  # noqa: E402
from cxlhm.units import parse_size  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=2000,
                        help="Mooncake: the first N requests for the max-QPS search (default 2000; the whole "
                             "trace is then replayed at the reference speed)")
    parser.add_argument("--sessions", type=int, default=150, help="agent sessions (default 150)")
    parser.add_argument("--dram", default="64GiB")
    parser.add_argument("--budgets", default="16GiB,256GiB,1TiB",
                        help="extra DRAM budgets D for the sweep (colocated; default 16GiB,256GiB,1TiB)")
    parser.add_argument("--topology", default="both", choices=("colocated", "disagg", "both"))
    parser.add_argument("--decode", default="analytic", choices=("analytic", "measured"))
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--ray", default=None)
    parser.add_argument("--no-full-trace", action="store_true", help="skip the whole-trace reference run")
    parser.add_argument("--out", default="out/bench-serving")
    args = parser.parse_args()

    params = ServingParams(dram_bytes=parse_size(args.dram), decode_model=args.decode)
    budgets = [] if args.quick else [parse_size(b) for b in args.budgets.split(",") if b.strip()]
    sizes = None if args.quick else {"mooncake": {"requests": args.requests}, "agent": {"sessions": args.sessions}}
    comparison = parse_comparison("mooncake,agent", "all", params, budgets, "colocated" if args.quick else args.topology,
                                  quick=args.quick, refine=2 if args.quick else 4, sizes=sizes)
    print(f"command: {command()}")
    print(f"machine: {machine()} (model clock: the figures do not depend on it)")
    print(f"GPU model: {gpu_model(decode=params.decode_model).describe()}")
    for spec, _ in comparison.specs():
        print(f"workload {spec.label}: {build(spec).description}; {build(spec).summary()}")
    print(f"SLO: p{params.slo_percentile:g} TTFT <= {params.slo_ttft_s:g} s and TBT <= {params.slo_tbt_ms:g} ms; "
          f"GPU KV pool {params.gpu_kv_bytes / 2**30:g} GiB; D = {params.dram_bytes / 2**30:g} GiB; "
          f"extra budgets {[b / 2**30 for b in budgets]} GiB (colocated)")
    start = time.time()
    results, table = comparison.run(workers=args.workers, ray=args.ray, out=Path(args.out))
    print(table)
    for r in results:  # where each configuration's load went at its max QPS
        s = r.get("at_max") or r["reference"]
        if r["dram_gib"] == params.dram_bytes / 2**30 and r["config"].startswith("cxlhm"):
            print(f"{r['workload']:>9} {r['topology']:<9} {r['config']:<15} at max QPS {r.get('max_qps', 0):.3f}: "
                  f"store skipped {s['store_skipped_share']:.2f}, recompute chosen {s['recompute_choices']}, "
                  f"mean load {s['load_mean_ms']:.0f} ms, SSD written {s['ssd_written_gib']:.0f} GiB, "
                  f"device hit ratio {s['device_hit_ratio']:.2f}, "
                  f"GPU util {[round(float(u), 2) for u in s['gpu_util']]}")
    print(f"wall time {time.time() - start:.0f} s; results, table and plots in {args.out}/")
    if not args.quick and args.requests is not None and args.requests < 12031 and not args.no_full_trace:
        # The whole hour of the trace, every configuration at the reference speed (no max-QPS
        # search: that would take hours here): TTFT and where the reusable KV came from.
        whole = parse_comparison("mooncake", "all", params, [], "colocated", search=False,
                                 sizes={"mooncake": {"requests": None}})
        start = time.time()
        _, table = whole.run(workers=args.workers, ray=args.ray, out=Path(args.out) / "mooncake-full-trace")
        print("whole trace (12,031 requests), reference speed only:")
        print(table)
        print(f"wall time {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
