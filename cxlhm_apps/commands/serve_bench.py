"""`cxlhm serve-bench`: the HyMCache serving comparison (docs/serving.md)."""
from __future__ import annotations

import dataclasses
import os
import platform
import sys
import textwrap
from pathlib import Path

from cxlhm_apps.cliutil import hints_ignored, hints_ignored_warning
from cxlhm_apps.serving.batching import PRESETS
from cxlhm_apps.serving.comparison import parse_comparison
from cxlhm_apps.serving.configs import DEVICE_PREFIX, HINTS_SUFFIX, all_names, baselines
from cxlhm_apps.serving import options, workloads
from cxlhm_apps.serving.gpu import GPUS, MODELS
from cxlhm_apps.serving.params import ServingParams
from cxlhm.registry import UnknownName
from cxlhm_apps.serving.report import QUICK_CAVEAT
from cxlhm_apps.serving.sweep import RayUnavailable
from cxlhm_apps.serving.topologies import engine_for
from cxlhm_apps.serving.yamlspec import SpecError
from cxlhm.traces import TraceError
from cxlhm.units import parse_size

NAME = "serve-bench"
HELP = "multi-turn serving replay: TTFT and throughput of KV-cache tiers (recompute, host DRAM, CXL-HM, a DRAM pool)"
DESCRIPTION_HEAD = """\
Replay multi-turn workloads through a serving model (by default an H200 running a
Llama-3-8B-shaped model, calibrated engine-like in bench/data; --model/--gpu pick other
shapes and GPUs, measured, derived or projected) with the KV cache in each configuration,
at the same DRAM budget D: {configs} - and cxlhm:<policy>[+hints] for any registered
firmware policy, an outside package's too. Prints TTFT at a common load, the max QPS
under the TTFT SLO (found by sweeping the replay speed) with ratios to {baselines}, hit
ratio per tier, prefetch figures and SSD write amplification; writes results.json,
table.txt and PNG plots to --out. Everything runs on the model clock: figures do not
depend on this machine.

Every registered workload, configuration and topology with a config dataclass has its
own flags, --<name>.<field> VALUE (listed below, per implementation; an entry point's
too), applied when it is selected: numbers and true/false as YAML scalars, a
distribution as a number or {{dist: lognormal, median: 33, sigma: 0.6}}.

examples:
  cxlhm serve-bench --quick
  cxlhm serve-bench --workload mooncake,agent --topology both --out out/serve
  cxlhm serve-bench --workload bench/serving/agent.yaml --configs lmcache-local,cxlhm-hymcache --dram 32GiB
  cxlhm serve-bench --workload agent --configs lmcache-local,cxlhm:sieve,cxlhm:s3fifo+hints
  cxlhm serve-bench --model qwen2.5-32b --gpu h200 --quick
  cxlhm serve-bench --workload coding-agent --coding-agent.sessions 40 --coding-agent.turns 20 --quick
  cxlhm serve-bench --workload qa --configs lmcache-local,ideal --lmcache-local.load_mode layerwise
  cxlhm serve-bench --workload agent --ray auto        # on an existing Ray cluster
"""


def __getattr__(name):
    # The description names the registered configurations; built on first use (cli.py
    # reads it only for the command it runs).
    if name == "DESCRIPTION":
        text = DESCRIPTION_HEAD.format(configs=", ".join(all_names()),
                                       baselines=" and ".join(baselines().values()) or "(no baseline registered)")
        prose, _, examples = text.partition("examples:")
        prose = "\n\n".join(textwrap.fill(" ".join(p.split()), 88, break_on_hyphens=False)
                              for p in prose.strip().split("\n\n"))
        return f"{prose}\n\nexamples:{examples}"
    raise AttributeError(name)


def add_arguments(parser):
    defaults = ",".join(workloads.default_names())
    parser.usage = "cxlhm serve-bench [options] [--<name>.<field> VALUE ...]"
    parser.add_argument("--workload", default=defaults,
                        help=f"comma-separated registered workloads ({', '.join(workloads.names())}; entry-point "
                             f"group cxlhm.serving_workloads) or workload YAML files (default {defaults})")
    parser.add_argument("--configs", default="all",
                        help=f"comma-separated configurations, or all ({', '.join(all_names())}); "
                             "cxlhm:<policy>[+hints] puts any registered firmware policy on the CXL-HM device "
                             "(with the KV store's lifecycle hints)")
    parser.add_argument("--batching", default="vllm-v1", choices=tuple(PRESETS),
                        help="how iterations are formed, with that engine's defaults for the GPU (default vllm-v1: "
                             "chunked prefill mixed with decodes under an 8192-token budget on H100/H200)")
    parser.add_argument("--model", default="llama3-8b", help=f"model shape: {', '.join(MODELS)} (default llama3-8b)")
    parser.add_argument("--gpu", default="h200", help=f"GPU: {', '.join(GPUS)} (default h200, measured)")
    parser.add_argument("--dram", default="64GiB", help="DRAM budget D (default 64GiB: the paper's 1 TB / 16)")
    parser.add_argument("--budgets", default=None,
                        help="extra budgets for the throughput-vs-DRAM plot (default 16GiB,256GiB; none in --quick)")
    parser.add_argument("--topology", default="colocated",
                        help="colocated (default), disagg, both, or comma-separated registered topologies "
                             "(entry-point group cxlhm.serving_topologies)")
    parser.add_argument("--quick", action="store_true", help="small workloads, one budget: under two minutes")
    parser.add_argument("--speed", type=float, default=None, help="replay speed of the TTFT columns")
    parser.add_argument("--no-search", action="store_true", help="skip the max-QPS search")
    parser.add_argument("--slo", type=float, default=None, help="TTFT SLO in seconds (p90; default 2)")
    parser.add_argument("--decode", default="measured", choices=("measured", "analytic"),
                        help="decode cost model: measured CUDA-graph steps (default) or the plain roofline")
    parser.add_argument("--prefill", default="measured", choices=("measured", "analytic"),
                        help="prefill cost model: the engine-like calibration (default) or the plain roofline")
    parser.add_argument("--requests", type=int, default=None,
                        help="--<name>.requests for every selected workload that has it (the traces: the first N)")
    parser.add_argument("--sessions", type=int, default=None,
                        help="--<name>.sessions for every selected workload that has it (the agents)")
    parser.add_argument("--workers", type=int, default=None, help="local worker processes (default: all cores)")
    parser.add_argument("--ray", default=None, metavar="auto|ADDRESS", help="run the grid on an existing Ray cluster")
    parser.add_argument("--out", default="out/serve-bench", help="folder for results.json, table.txt and plots")
    options.add_option_flags(parser)


def run(args) -> int:
    try:
        params = ServingParams(dram_bytes=parse_size(args.dram), decode_model=args.decode, prefill_model=args.prefill,
                               model=args.model, gpu=args.gpu, batching=args.batching)
        gpu = params.gpu_cost_model()
        if params.kv_pool_bytes <= 0:
            raise ValueError(f"{args.model} does not fit on {args.gpu}: no room is left for a KV pool")
        if args.slo is not None:
            params = params.replace(slo_ttft_s=args.slo)
        budgets = ([] if args.quick else [16 << 30, 256 << 30]) if args.budgets is None else \
            [parse_size(b) for b in args.budgets.split(",") if b.strip()]
        given = options.from_args(args)
        params = params.replace(options=options.as_params_options(given))
        comparison = parse_comparison(args.workload, args.configs, params, budgets, args.topology, quick=args.quick,
                                      search=not args.no_search, speed=args.speed, refine=2 if args.quick else 4)
        kinds = [spec.kind for spec, _ in comparison.specs()]  # validates workload files before starting workers
        options.check_selected(given, {"workload": kinds, "system": comparison.configs,
                                       "topology": comparison.topologies})
        sizes = {name: values for (family, name), values in given.items() if family == "workload"}
        for field in ("requests", "sessions"):
            if getattr(args, field):
                takers = [k for k in kinds if field in {f.name for f in dataclasses.fields(workloads.kind(k).config)}]
                if not takers:
                    raise ValueError(f"--{field}: none of the selected workloads ({', '.join(kinds)}) has a "
                                     f"{field} field")
                for k in takers:
                    sizes.setdefault(k, {}).setdefault(field, getattr(args, field))
        comparison.sizes = sizes
        comparison.specs()
    except (SpecError, TraceError, UnknownName, ValueError) as exc:
        print(f"cxlhm serve-bench: error: {exc}", file=sys.stderr)
        return 2
    for name in comparison.configs:
        if name.startswith(DEVICE_PREFIX) and name.endswith(HINTS_SUFFIX):
            policy = name[len(DEVICE_PREFIX):-len(HINTS_SUFFIX)]
            if hints_ignored(policy):
                print(hints_ignored_warning("cxlhm serve-bench", policy), file=sys.stderr)
    out = Path(args.out)
    print(f"command: cxlhm serve-bench {' '.join(sys.argv[2:]) if sys.argv[1:2] == ['serve-bench'] else ''}".rstrip())
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()} (model clock: the figures do not depend on it)")
    print(f"GPU model: {gpu.describe()}")
    print(f"SLO: p{params.slo_percentile:g} TTFT <= {params.slo_ttft_s:g} s and TBT <= {params.slo_tbt_ms:g} ms; "
          f"GPU KV pool {params.kv_pool_bytes / 2**30:g} GiB; D = {params.dram_bytes / 2**30:g} GiB")
    print(f"batching: {params.batching} ({params.token_budget} tokens per iteration, at most {params.running_limit} "
          f"running; {params.batching_preset().source})")
    for topology in comparison.topologies:
        config = getattr(engine_for(topology), "Options", None)
        if config is not None:  # a topology's own options, as its flags set them
            print(f"topology {topology}: "
                  f"{dataclasses.replace(config(), **params.options_for('topology', topology))}")
    if args.quick:
        print(QUICK_CAVEAT)
    try:
        _, table = comparison.run(workers=args.workers, ray=args.ray, out=out)
    except (SpecError, TraceError, RayUnavailable) as exc:
        print(f"cxlhm serve-bench: error: {exc}", file=sys.stderr)
        return 2
    print(table)
    print(f"results, table and plots: {out}/")
    return 0
