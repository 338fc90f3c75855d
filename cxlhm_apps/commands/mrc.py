"""`cxlhm mrc`: miss-ratio curves of several firmware policies on one trace."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

import firmware_policies
from cxlhm_apps.cliutil import CommandError, check_output_path, default_output_dir, positive_int, trace_block_size
from cxlhm_apps.commands._device_args import (add_policy_arguments, check_policies_selected, parse_set_value,
                                              policy_params)
from cxlhm.config import ConfigError
from cxlhm.mrc import miss_ratios, parse_cache_sizes, plot_curves, plot_latency, simulate_curves
from cxlhm.sim import MAX_QUEUE_DEPTH
from cxlhm.traces import TraceError
from cxlhm.traces.formats import format_names, load_trace, trace_format
from cxlhm.units import format_size, parse_size

NAME = "mrc"
HELP = "miss-ratio curves: replay a trace through several policies at several DRAM sizes"
DESCRIPTION = """\
Replay a block trace through each policy's compiled firmware (timing-only, no data) at
each DRAM size; print a table of miss ratios and write a PNG plot.

Sizes: a bare number is a count of blocks, a number with a unit is bytes (64MiB), N% is
a share of the trace's distinct blocks. A size above the trace's distinct blocks is
simulated at that count (a cache that holds everything never evicts).

One block size B for the whole run, stated once in the output: --block-size if given,
else the block size a cxlhm block trace (.cbt) records, else the device's block size
(the --timing profile's, or cmm-h's 64 KiB without --timing) - each trace record (one
object, one Mooncake hash id) is one device block, as in `cxlhm run`. Byte sizes in
--sizes count B-byte blocks and the DRAM column is slots x B, with or without --timing.

With --timing PROFILE every access is also charged to the profile's timing model on the
model clock: each record is one access to one device block of B bytes at HPA id x B - a
write where the trace says write, else a read. The table then has one section per figure
(miss ratio, mean and p99 latency) so that it stays narrow; --json has every figure.
Closed loop (default): --queue-depth N accesses in flight,
each issued when the one N before it completed (1: one after the other). --open-loop:
each access issues at its trace timestamp (Mooncake, cxlhm and traces with a time column)
and its latency includes the time it queued behind earlier ones. A second plot,
NAME-latency.png beside --out, shows mean and p99 latency vs size.

The Mooncake trace ships with cxlhm (cxlhm.traces.mooncake.DEFAULT_TRACE, .jsonl.xz).

examples:
  cxlhm mrc --trace "$(python -c 'from cxlhm.traces.mooncake import DEFAULT_TRACE; print(DEFAULT_TRACE)')" \\
            --policies lru,arc,s3fifo,sieve,belady --sizes 1000,5000,20000
  cxlhm mrc --trace w.oracleGeneral.bin --format oracle-general --block-size 4KiB --sizes 1%,5%,10% --json
  cxlhm mrc --trace w.csv --format csv --csv-spec "time-col=1, obj-id-col=2, op-col=3" --sizes 64MiB,256MiB
  cxlhm mrc --trace w.cbt --policies lru,s3fifo --sizes 1%,10% --timing cmm-h    # + mean and p99 latency
  cxlhm mrc --trace T.jsonl --policies lru,s3fifo --timing cmm-h --queue-depth 32
  cxlhm mrc --trace T.jsonl --policies lru,lecar --libcachesim      # + libCacheSim's LRU and LeCaR
"""


def add_arguments(parser):
    parser.add_argument("--trace", required=True, help="trace file")
    parser.add_argument("--format", default=None, help=f"trace format: {', '.join(format_names())} "
                                                       "(default: guessed from the file name)")
    parser.add_argument("--policies", default="fifo,lru,clock,sieve,arc,s3fifo,belady",
                        help="comma-separated policy names (`cxlhm policies` lists them)")
    parser.add_argument("--sizes", default="1%,2%,5%,10%,20%,50%", help="comma-separated DRAM sizes")
    parser.add_argument("--param", action="append", default=[], metavar="POLICY.KEY=VALUE",
                        help="a policy parameter, e.g. s3fifo.small_ratio=0.2; repeatable (as --s3fifo.small_ratio 0.2)")
    parser.add_argument("--limit", type=positive_int, default=None, help="replay only the first N accesses")
    parser.add_argument("--block-size", default=None, help="bytes per block, for byte sizes, the plot and the "
                        "timing model (default: a .cbt trace's own, else the device's: the --timing profile's, "
                        "or cmm-h's)")
    parser.add_argument("--csv-spec", default=None, help='libCacheSim-style CSV columns, e.g. "time-col=1, obj-id-col=2"')
    parser.add_argument("--out", default=None, help="PNG plot path (default: mrc.png in a new folder under "
                        "$CXLHM_OUT_DIR or ~/.local/state/cxlhm/mrc/, never the current directory)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the plot")
    parser.add_argument("--json", action="store_true", help="print {policy: {size: miss_ratio}} as JSON instead of a table "
                        "(with --timing: {policy: {size: {miss_ratio, mean_ns, p50_ns, p99_ns, model_ns}}})")
    parser.add_argument("--timing", default=None, metavar="PROFILE",
                        help="also charge every access to this profile's timing model (e.g. cmm-h) on the model "
                             "clock and report mean and p99 latency per size (see above for the mapping)")
    parser.add_argument("--queue-depth", type=positive_int, default=1, metavar="N",
                        help="with --timing, closed loop: accesses in flight (default 1)")
    parser.add_argument("--open-loop", action="store_true",
                        help="with --timing: issue each access at its trace timestamp instead")
    parser.add_argument("--libcachesim", action="store_true",
                        help="also replay the trace through libCacheSim's policy of each name (LRU, LeCaR, ...; "
                             "the libcachesim package, cxlhm[test]) and print its miss ratios beside ours")
    add_policy_arguments(parser)


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


def _latency_plot_path(out: str) -> Path:
    path = Path(out)
    return path.with_name(f"{path.stem}-latency{path.suffix or '.png'}")


def _block_source(args) -> str:
    from cxlhm.config import DEFAULT_PROFILE
    if args.block_size:
        return "--block-size"
    if trace_format(args.trace, args.format).own_block_size:
        return "as the trace records it"
    return f"{args.timing or DEFAULT_PROFILE}'s device block; one record = one block"


TABLE_WIDTH = 100  # columns: a table wider than a terminal is split by policy


def _policy_groups(policies: list[str], fixed: int, cell: int) -> list[list[str]]:
    """Policies in groups whose table fits TABLE_WIDTH (at least one policy per group)."""
    groups, current, width = [], [], fixed
    for name in policies:
        need = 2 + max(len(name), cell)
        if current and width + need > TABLE_WIDTH:
            groups.append(current)
            current, width = [], fixed
        current.append(name)
        width += need
    return groups + [current] if current else groups


def format_report(results, block_size: int, *, timing: bool) -> str:
    """The miss-ratio table (and with `timing` the mean and p99 latency tables), one row
    per DRAM size ("blocks", "DRAM" = blocks x block size), a column per policy; policies
    are split over several tables when one would be wider than TABLE_WIDTH."""
    policies = list(results)
    sizes = sorted({s for curve in results.values() for s in curve})
    lead = [[str(s), format_size(s * block_size)] for s in sizes]
    fixed = max(len("blocks"), *(len(r[0]) for r in lead)) + 2 + max(len("DRAM"), *(len(r[1]) for r in lead))
    sections = [("miss ratio", lambda r: f"{r.miss_ratio:.4f}")]
    if timing:
        sections += [("mean latency, us", lambda r: f"{r.timing['mean_ns'] / 1e3:.1f}"),
                     ("p99 latency, us", lambda r: f"{r.timing['p99_ns'] / 1e3:.1f}")]
    out = []
    for title, cell in sections:
        for group in _policy_groups(policies, fixed, 6):
            rows = [["blocks", "DRAM"] + group]
            rows += [lead[i] + [cell(results[p][s]) for p in group] for i, s in enumerate(sizes)]
            if timing:
                out.append(f"{title}:")
            out.append(_aligned(rows))
    return "\n".join(out)


def _aligned(table: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table)


def _libcachesim_curves(trace, results, sizes) -> dict[str, tuple[str, dict[int, float]]]:
    """{policy: (libCacheSim class, {size: miss ratio})} for each policy with a namesake."""
    try:
        from cxlhm.testing.golden import libcachesim_miss_ratios, namesake
    except ImportError as exc:
        raise CommandError(f"--libcachesim: {exc}; install the test extra: pip install 'cxlhm[test]'") from None
    try:
        return {p: (cls, libcachesim_miss_ratios(cls, trace, sizes)) for p in results
                if (cls := namesake(p)) is not None}
    except ImportError:
        raise CommandError("--libcachesim needs the libcachesim package: pip install 'cxlhm[test]'") from None


def format_libcachesim(results, golden, block_size: int) -> str:
    """libCacheSim's miss ratio per policy and size, with ours minus it in points."""
    missing = [p for p in results if p not in golden]
    lines = ["libCacheSim, same requests (objects = blocks): miss ratio (ours minus it, points)"]
    if golden:
        sizes = sorted({s for _, curve in golden.values() for s in curve})
        lead = [[str(s), format_size(s * block_size)] for s in sizes]
        fixed = max(len("blocks"), *(len(r[0]) for r in lead)) + 2 + max(len("DRAM"), *(len(r[1]) for r in lead))
        for group in _policy_groups(list(golden), fixed, 15):
            rows = [["blocks", "DRAM"] + [f"{golden[p][0]}" for p in group]]
            rows += [lead[i] + [f"{golden[p][1][s]:.4f} ({(results[p][s].miss_ratio - golden[p][1][s]) * 100:+.2f})"
                                for p in group] for i, s in enumerate(sizes)]
            lines.append(_aligned(rows))
    if missing:
        lines.append(f"no libCacheSim policy of the same name: {', '.join(missing)}")
    return "\n".join(lines)


def run(args) -> int:
    if (args.queue_depth != 1 or args.open_loop) and not args.timing:
        raise CommandError("--queue-depth and --open-loop need --timing PROFILE")
    if args.queue_depth != 1 and args.open_loop:
        raise CommandError("--queue-depth is for the closed loop; --open-loop issues at the trace's timestamps")
    if args.queue_depth > MAX_QUEUE_DEPTH:
        raise CommandError(f"--queue-depth {args.queue_depth}: at most {MAX_QUEUE_DEPTH}")
    if not args.no_plot:
        given = args.out is not None
        args.out = args.out if given else str(default_output_dir("mrc") / "mrc.png")
        check_output_path(Path(args.out), "--out", create_parent=not given)  # before the work, not after it
    try:
        block_size = parse_size(args.block_size) if args.block_size else None
        if block_size is not None and block_size <= 0:
            raise ValueError("--block-size must be positive")
        block_size = trace_block_size(args.trace, args.format, block_size, args.timing)  # record = device block
        trace = load_trace(args.trace, args.format, limit=args.limit, block_size=block_size, csv_spec=args.csv_spec)
        if len(trace) == 0:
            raise CommandError(f"--trace {args.trace}: no accesses in the trace")
        if args.open_loop and trace.timestamps_ns is None:
            raise CommandError(f"--open-loop: {args.trace} has no timestamps")
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies:
            raise ValueError("--policies is empty")
        sizes = parse_cache_sizes(args.sizes, trace.block_size, trace.unique_blocks)
        params = _parse_params(args.param)
        check_policies_selected(args, policies, f"--policies runs {', '.join(policies)}; add {{name}} to --policies")
        for policy, values in policy_params(args).items():
            params.setdefault(policy, {}).update(values)
        with tqdm(total=len(trace) * len(sizes) * len(policies), unit="acc", unit_scale=True,
                  desc="mrc", file=sys.stderr, disable=None) as bar:
            results = simulate_curves(trace, policies, sizes, params=params, progress=bar.update,
                                      timing=args.timing, queue_depth=args.queue_depth, open_loop=args.open_loop)
    except (TraceError, ValueError, ConfigError, firmware_policies.UnknownPolicy) as exc:
        print(f"cxlhm mrc: error: {exc}", file=sys.stderr)
        return 2
    curves = miss_ratios(results)
    golden = _libcachesim_curves(trace, results, sizes) if args.libcachesim else None
    if args.json:
        figures = {p: {str(s): _json_entry(r, args.timing) for s, r in curve.items()} for p, curve in results.items()}
        if golden is not None:
            figures["libcachesim"] = {f"{p} ({cls})": {str(s): r for s, r in curve.items()}
                                      for p, (cls, curve) in golden.items()}
        print(json.dumps(figures, indent=1))
    else:
        print(f"trace {args.trace}: {len(trace)} accesses, {trace.unique_blocks} distinct blocks")
        print(f"block = {format_size(trace.block_size)} ({_block_source(args)})")
        if args.timing:
            loop = ("open loop: each access issued at its trace timestamp" if args.open_loop else
                    f"closed loop, queue depth {args.queue_depth}")
            print(f"latency: model clock, timing profile {args.timing}, each record one device block access, {loop}")
        print(format_report(results, trace.block_size, timing=bool(args.timing)))
        if golden is not None:
            print(format_libcachesim(results, golden, trace.block_size))
    if not args.no_plot:
        plot_curves(curves, args.out, block_size=trace.block_size,
                    title=f"{Path(args.trace).name}: {len(trace)} accesses")
        if args.timing:
            plot_latency(results, str(_latency_plot_path(args.out)), block_size=trace.block_size,
                         title=f"{Path(args.trace).name}: {args.timing}, "
                               f"{'open loop' if args.open_loop else f'QD{args.queue_depth}'}")
        if not args.json:
            print(f"plot: {args.out}" + (f", latency: {_latency_plot_path(args.out)}" if args.timing else ""))
    return 0
