"""`cxlhm mrc`: miss-ratio curves of several firmware policies on one trace."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

import firmware_policies
from cxlhm.cliutil import CommandError, check_output_path, positive_int
from cxlhm.commands._device_args import parse_set_value
from cxlhm.config import ConfigError
from cxlhm.mrc import format_table, format_timing_table, miss_ratios, parse_cache_sizes, plot_curves, simulate_curves
from cxlhm.traces import TraceError
from cxlhm.traces.formats import format_names, load_trace
from cxlhm.units import format_size, parse_size

NAME = "mrc"
HELP = "miss-ratio curves: replay a trace through several policies at several DRAM sizes"
DESCRIPTION = """\
Replay a block trace through each policy's compiled firmware (timing-only, no data) at
each DRAM size; print a table of miss ratios and write a PNG plot.

Sizes: a bare number is a count of blocks, a number with a unit is bytes (64MiB), N% is
a share of the trace's distinct blocks.

examples:
  cxlhm mrc --trace ../shared/traces/mooncake_conversation_trace.jsonl --policies lru,arc,s3fifo,sieve,belady \\
            --sizes 1000,5000,20000
  cxlhm mrc --trace w.oracleGeneral.bin --format oracle-general --block-size 4KiB --sizes 1%,5%,10% --json
  cxlhm mrc --trace w.csv --format csv --csv-spec "time-col=1, obj-id-col=2, op-col=3" --sizes 64MiB,256MiB
  cxlhm mrc --trace w.cbt --policies lru,s3fifo --sizes 1%,10% --timing cmm-h    # + mean and p99 latency
"""


def add_arguments(parser):
    parser.add_argument("--trace", required=True, help="trace file")
    parser.add_argument("--format", default=None, help=f"trace format: {', '.join(format_names())} "
                                                       "(default: guessed from the file name)")
    parser.add_argument("--policies", default="fifo,lru,clock,sieve,arc,s3fifo,belady",
                        help="comma-separated policy names (`cxlhm policies` lists them)")
    parser.add_argument("--sizes", default="1%,2%,5%,10%,20%,50%", help="comma-separated DRAM sizes")
    parser.add_argument("--param", action="append", default=[], metavar="POLICY.KEY=VALUE",
                        help="a policy parameter, e.g. s3fifo.small_ratio=0.2; repeatable")
    parser.add_argument("--limit", type=positive_int, default=None, help="replay only the first N accesses")
    parser.add_argument("--block-size", default=None, help="bytes per block, for byte sizes and the plot "
                        "(default: the trace's own; 4KiB for oracle-general and csv)")
    parser.add_argument("--csv-spec", default=None, help='libCacheSim-style CSV columns, e.g. "time-col=1, obj-id-col=2"')
    parser.add_argument("--out", default="mrc.png", help="PNG plot path (default mrc.png)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the plot")
    parser.add_argument("--json", action="store_true", help="print {policy: {size: miss_ratio}} as JSON instead of a table "
                        "(with --timing: {policy: {size: {miss_ratio, mean_ns, p50_ns, p99_ns, model_ns}}})")
    parser.add_argument("--timing", default=None, metavar="PROFILE",
                        help="also charge every access to this profile's timing model (e.g. cmm-h) on the model "
                             "clock, one access after the other, and report mean and p99 latency per size")


def _parse_params(items: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for item in items:
        key, sep, _ = item.partition("=")
        policy, dot, name = key.strip().partition(".")
        if not sep or not dot or not policy or not name:
            raise ValueError(f"--param {item!r}: expected POLICY.KEY=VALUE, e.g. s3fifo.small_ratio=0.2")
        out.setdefault(policy, {})[name] = parse_set_value("--param", item)[1]
    return out


def _json_entry(result, timing: str | None):
    if timing is None:
        return result.miss_ratio
    return {"miss_ratio": result.miss_ratio, **{k: result.timing[k] for k in ("mean_ns", "p50_ns", "p99_ns", "model_ns")}}


def run(args) -> int:
    if not args.no_plot:
        check_output_path(Path(args.out), "--out")  # before the work, not after it
    try:
        block_size = parse_size(args.block_size) if args.block_size else None
        if block_size is not None and block_size <= 0:
            raise ValueError("--block-size must be positive")
        trace = load_trace(args.trace, args.format, limit=args.limit, block_size=block_size, csv_spec=args.csv_spec)
        if len(trace) == 0:
            raise CommandError(f"--trace {args.trace}: no accesses in the trace")
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies:
            raise ValueError("--policies is empty")
        sizes = parse_cache_sizes(args.sizes, trace.block_size, trace.unique_blocks)
        params = _parse_params(args.param)
        with tqdm(total=len(trace) * len(sizes) * len(policies), unit="acc", unit_scale=True,
                  desc="mrc", file=sys.stderr, disable=None) as bar:
            results = simulate_curves(trace, policies, sizes, params=params, progress=bar.update,
                                      timing=args.timing)
    except (TraceError, ValueError, ConfigError, firmware_policies.UnknownPolicy) as exc:
        print(f"cxlhm mrc: error: {exc}", file=sys.stderr)
        return 2
    curves = miss_ratios(results)
    if args.json:
        print(json.dumps({p: {str(s): _json_entry(r, args.timing) for s, r in curve.items()}
                          for p, curve in results.items()}, indent=1))
    else:
        print(f"trace {args.trace}: {len(trace)} accesses, {trace.unique_blocks} distinct blocks of "
              f"{format_size(trace.block_size)}")
        if args.timing:
            print(f"latency: model clock, timing profile {args.timing}, one access after the other (QD1)")
            print(format_timing_table(results, trace.block_size))
        else:
            print(format_table(curves, trace.block_size))
    if not args.no_plot:
        plot_curves(curves, args.out, block_size=trace.block_size,
                    title=f"{Path(args.trace).name}: {len(trace)} accesses")
        if not args.json:
            print(f"plot: {args.out}")
    return 0
