"""`cxlhm run`: the main job - replay a slice of the Mooncake conversation trace through
the KV store and the host runtime, once per configuration (by default LRU firmware
without hints beside hymcache with lifecycle hints), and compare what the device adds to
each request's time to first token."""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

from tqdm import tqdm

from cxlhm_apps.cliutil import (CommandError, check_output_path, compare_ratio, default_output_dir, hints_ignored,
                                hints_ignored_warning, positive_int, size_arg)
from cxlhm_apps.commands._device_args import (add_device_arguments, check_policies_selected, config_overrides,
                                              device_flag_argv, load_device_config, policy_params, with_policy_params)
from cxlhm_apps.parallel_warmup import ParallelWarmup
from cxlhm_apps.replay import MS, MissionResult, replay_mission
from cxlhm.traces.mooncake import DEFAULT_TRACE, read_requests
from cxlhm.traces.sessions import recover_sessions
from cxlhm.units import format_size
from host_runtime.driver import open_device

NAME = "run"
HELP = "the main job: a conversation trace through the KV store, LRU without hints vs hymcache with hints"
DEFAULT_CONFIGS = "lru,hymcache+hints"
DEFAULT_REQUESTS = 1000
DEFAULT_LEAD_MS = 5.0
DESCRIPTION = f"""\
Replay the first N requests of a Mooncake-style conversation trace (shipped with cxlhm;
--trace for another) the way a serving engine uses the device: each hash id is one KV
chunk in the host runtime's KV store; a request loads every chunk an earlier request
stored, checks every byte, and stores the chunks it computed. With +hints the runtime
sends the request-lifecycle hints through the device's mailbox: SESSION_RESUME and
NEXT_PREFIX when a request arrives, APPEND before new KV, SESSION_PAUSE after each turn,
SESSION_END after a conversation's last. The KV load starts --lead ms after arrival
(queueing and scheduling before prefill): that is the time a hint has to work.

Each configuration POLICY[+hints] runs the same replay on a fresh device, on the model
clock unless --clock wall (latencies from the timing model, independent of this
machine). Printed per configuration: the KV-load latency per request (the part of TTFT
the device adds) p50/p99, the device-DRAM hit ratio of those loads (every loaded chunk was
hinted when hints are on), prefetch issued/accuracy/coverage/lateness/pollution, write
absorption and SSD bytes; a latency CDF is written as a PNG.

Defaults ({DEFAULT_CONFIGS}, {DEFAULT_REQUESTS} requests, {DEFAULT_LEAD_MS:g} ms lead, 64 KiB
chunks = device blocks, cmm-h's 256 MiB DRAM): the DRAM holds about 1/5 of the chunks the
slice writes, so by the time a conversation comes back (minutes later in this trace) LRU has
evicted its KV, and the loads go to the SSD; a resume hint 5 ms ahead is enough for a
prefix to arrive in DRAM (see docs/policies.md, "what hints buy").

examples:
  cxlhm run
  cxlhm run --requests 3000 --lead 1 --configs lru,lru+hints,hymcache+hints
  cxlhm run --set dram_bytes=1GiB --set data=none
  cxlhm run --dram-bytes 1GiB --configs lru,hymcache+hints --hymcache.prefetch_budget 0.3
"""


def add_arguments(parser):
    parser.add_argument("--trace", default=os.environ.get("CXLHM_TRACE") or str(DEFAULT_TRACE),
                        help="Mooncake-style JSONL trace (.jsonl, .jsonl.xz, .jsonl.gz; default: the one shipped "
                             "with cxlhm, or $CXLHM_TRACE)")
    parser.add_argument("--requests", type=positive_int, default=DEFAULT_REQUESTS,
                        help=f"replay the first N requests (default {DEFAULT_REQUESTS})")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"comma-separated POLICY or POLICY+hints (default {DEFAULT_CONFIGS}); "
                             "`cxlhm policies` lists the policies")
    parser.add_argument("--lead", type=float, default=DEFAULT_LEAD_MS, metavar="MS",
                        help=f"ms from a request's arrival (its hints) to its KV load (default {DEFAULT_LEAD_MS:g})")
    parser.add_argument("--chunk-bytes", type=size_arg, default=None,
                        help="bytes of KV per hash id (default: the device's block size)")
    parser.add_argument("--out", default=None, metavar="PNG",
                        help="latency-CDF plot path (default: a new folder under $CXLHM_OUT_DIR or "
                             "~/.local/state/cxlhm/runs)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the plot")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_arguments(parser, {"clock": "model", "firmware.background": "manual on the model clock"})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    policy: str
    hints: bool

    @property
    def label(self) -> str:
        return self.policy + ("+hints" if self.hints else "")


def parse_configs(text: str) -> list[RunConfig]:
    import firmware_policies
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        policy, plus, suffix = item.partition("+")
        if plus and suffix != "hints":
            raise CommandError(f"--configs: {item!r}: expected POLICY or POLICY+hints")
        if policy not in firmware_policies.REGISTRY:
            raise CommandError(f"--configs: unknown firmware policy {policy!r}; available: "
                               f"{', '.join(firmware_policies.available())}")
        if firmware_policies.get(policy).needs_future:
            raise CommandError(f"--configs: {policy!r} is an offline policy (trace-driven simulation only: "
                               "cxlhm mrc), it cannot run a device")
        out.append(RunConfig(policy, bool(plus)))
    if not out:
        raise CommandError("--configs is empty")
    if len({c.label for c in out}) != len(out):
        raise CommandError(f"--configs {text!r} names a configuration twice")
    return out


def run(args) -> int:
    configs = parse_configs(args.configs)
    for config in configs:
        if config.hints and hints_ignored(config.policy):
            print(hints_ignored_warning("cxlhm run", config.policy), file=sys.stderr)
    if args.policy:
        raise CommandError("--policy: give the configurations with --configs POLICY[+hints],... instead")
    if not 0 <= args.lead <= 3_600_000:
        raise CommandError(f"--lead {args.lead!r}: expected milliseconds from 0 to 3600000")
    overrides = config_overrides(args)
    check_policies_selected(args, [c.policy for c in configs],
                            f"--configs runs {', '.join(c.policy for c in configs)}; add {{name}} to --configs")
    base = load_device_config(args, {"clock": "model", **overrides})
    chunk_bytes = args.chunk_bytes or base.block_size
    if chunk_bytes % 8 or chunk_bytes > 64 << 20:
        raise CommandError(f"--chunk-bytes {format_size(chunk_bytes)}: expected a multiple of 8 bytes up to 64 MiB")
    plot = None if args.no_plot else (Path(args.out) if args.out else default_output_dir("runs") / "kv_load_cdf.png")
    if plot is not None:
        check_output_path(plot, "--out", create_parent=args.out is None)
    requests = read_requests(args.trace, limit=args.requests)
    if not requests:
        raise CommandError(f"--trace {args.trace}: no requests in the trace")
    turns = recover_sessions(requests)
    chunks = len({h for r in requests for h in r.hash_ids.tolist()})
    if chunks * chunk_bytes > base.capacity:
        raise CommandError(f"the slice stores {chunks} chunks of {format_size(chunk_bytes)} "
                           f"({format_size(chunks * chunk_bytes)}), more than the device's {format_size(base.capacity)}; "
                           "lower --requests or --chunk-bytes, or raise capacity")
    progress = not args.no_progress and sys.stderr.isatty()
    if progress:
        print("cxlhm run: the first run compiles the firmware (about a minute); later runs reuse it",
              file=sys.stderr)
    results: list[MissionResult] = []
    with ParallelWarmup([c.label for c in configs], lambda label: _warmup_argv(args, label)) as warmup:
        for config in configs:
            warmup.wait_for(config.label)
            results.append(_run_config(args, config, overrides, base, requests, turns, chunk_bytes, progress))
    if plot is not None:
        plot_latency_cdf(results, plot, title=f"{Path(args.trace).name}: first {len(requests)} requests, "
                                              f"lead {args.lead:g} ms ({base.clock} clock)")
    if args.json:
        print(json.dumps({r.label: summary(r) for r in results}, indent=1))
    else:
        print_report(args, base, results, len(requests), turns, chunks, chunk_bytes, plot)
    return 1 if any(r.corrupt_chunks for r in results) else 0


def _run_config(args, config: RunConfig, overrides: dict, base, requests, turns, chunk_bytes: int,
                progress: bool) -> MissionResult:
    cfg = load_device_config(args, with_policy_params(
        {"clock": "model", **overrides,
         "firmware": {**overrides.get("firmware", {}), "policy": config.policy,
                      "background": "manual" if base.clock == "model" else
                      overrides.get("firmware", {}).get("background", "thread")}},
        policy_params(args).get(config.policy, {})))
    with open_device(cfg) as handle, tqdm(total=len(requests), desc=config.label, unit="req", leave=False,
                                          disable=not progress) as bar:
        return replay_mission(handle, requests, turns, chunk_bytes=chunk_bytes, hints=config.hints,
                              lead_ns=int(args.lead * MS), label=config.label, progress=bar.update)


WARMUP_REQUESTS = 200  # enough for every compiled path a replay takes (loads, evictions, hints)


def _warmup_argv(args, label: str) -> list[str]:
    """The command line of a child that compiles `label`'s firmware with this run's device."""
    argv = ["run", "--trace", args.trace, "--requests", str(min(args.requests, WARMUP_REQUESTS)), "--configs", label,
            "--lead", repr(args.lead), "--no-plot", "--no-progress", "--json"]
    if args.chunk_bytes:
        argv += ["--chunk-bytes", str(args.chunk_bytes)]
    if args.device:
        argv += ["--device", args.device]
    for item in args.overrides:
        argv += ["--set", item]
    return argv + device_flag_argv(args, [label.partition("+")[0]])


def summary(r: MissionResult) -> dict:
    import numpy as np
    d = r.device
    p50, p99 = (np.percentile(r.load_latency_ns, [50, 99]).tolist() if r.load_latency_ns.size else (0.0, 0.0))
    return {
        "policy": r.policy, "hints": r.hints, "clock": r.clock, "requests": r.requests,
        "requests_loading": int(r.load_latency_ns.size),
        "kv_load_p50_us": p50 / 1e3, "kv_load_p99_us": p99 / 1e3,
        "kv_load_mean_us": float(r.load_latency_ns.mean() / 1e3) if r.load_latency_ns.size else 0.0,
        "load_dram_hit_ratio": r.load_hit_ratio, "chunks_loaded": r.chunks_loaded,
        "chunks_written": r.chunks_written, "chunks_missing": r.chunks_missing,
        "corrupt_chunks": r.corrupt_chunks if r.verified else None,
        "prefetch_issued": d["prefetch_issued"], "prefetch_accuracy": d["prefetch_accuracy"],
        "prefetch_coverage": d["prefetch_coverage"],
        "prefetch_late_ratio": d["prefetch_late"] / d["prefetch_useful"] if d["prefetch_useful"] else 0.0,
        "prefetch_pollution": d["prefetch_pollution"],
        "write_absorption": r.write_absorption,
        "ssd_read_bytes": d["ssd_read_bytes"], "ssd_write_bytes": d["ssd_write_bytes"],
        "hint_errors": r.hint_errors, "wall_s": r.wall_s,
    }


def print_report(args, cfg, results: list[MissionResult], n_requests: int, turns, chunks: int, chunk_bytes: int,
                 plot: Path | None) -> None:
    from cxlhm.traces.sessions import summarize
    s = summarize(turns)
    clock = ("model clock (timing model of the profile; independent of this machine)" if cfg.clock == "model"
             else "wall clock (this machine; hints sent right before each load, no lead)")
    print(f"cxlhm run: {' '.join(sys.argv[1:]) or '(defaults)'}")
    print(f"  trace    {args.trace}: first {n_requests} requests, {s['sessions']} conversations "
          f"({s['multi_turn_sessions']} multi-turn), {s['requests_resuming']} requests resume one; "
          f"{chunks} distinct chunks (one hash id = one chunk)")
    sizes = (f"block = chunk = {format_size(cfg.block_size)}" if chunk_bytes == cfg.block_size else
             f"blocks of {format_size(cfg.block_size)}, chunks of {format_size(chunk_bytes)}")
    print(f"  device   {cfg.name}: {format_size(cfg.dram_bytes)} DRAM = {cfg.dram_bytes // cfg.block_size} blocks "
          f"({sizes}), data {cfg.data}, {clock}")
    print(f"  hints    SESSION_RESUME/NEXT_PREFIX at arrival, KV load {args.lead:g} ms later; APPEND, "
          f"SESSION_PAUSE, SESSION_END through the mailbox (configs with +hints only)")
    rows = [("config", lambda r, m: r.label)]
    rows += [
        ("KV load per request p50", lambda r, m: f"{m['kv_load_p50_us']:.0f} us"),
        ("KV load per request p99", lambda r, m: f"{m['kv_load_p99_us']:.0f} us"),
        ("DRAM hit ratio of loads", lambda r, m: f"{m['load_dram_hit_ratio']:.3f}"),
        ("prefetch issued (blocks)", lambda r, m: str(m["prefetch_issued"])),
        ("prefetch accuracy", lambda r, m: f"{m['prefetch_accuracy']:.3f}"),
        ("prefetch coverage", lambda r, m: f"{m['prefetch_coverage']:.3f}"),
        ("prefetch late (of useful)", lambda r, m: f"{m['prefetch_late_ratio']:.3f}"),
        ("prefetch pollution (blocks)", lambda r, m: str(m["prefetch_pollution"])),
        ("write absorption", lambda r, m: f"{m['write_absorption']:.3f}"),
        ("SSD read / written", lambda r, m: f"{format_size(m['ssd_read_bytes'])} / "
                                            f"{format_size(m['ssd_write_bytes'])}"),
        ("chunks loaded / written", lambda r, m: f"{m['chunks_loaded']} / {m['chunks_written']}"),
        ("corrupt chunks", lambda r, m: "not checked (data: none)" if m["corrupt_chunks"] is None
         else str(m["corrupt_chunks"])),
        ("wall time", lambda r, m: f"{m['wall_s']:.1f} s"),
    ]
    if any(r.chunks_missing for r in results):
        rows.append(("chunks missing at load", lambda r, m: str(r.chunks_missing)))
    if any(r.hint_errors for r in results):
        rows.append(("hints that failed", lambda r, m: str(r.hint_errors)))
    metrics = [summary(r) for r in results]
    table = [[name] + [fn(r, m) for r, m in zip(results, metrics)] for name, fn in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  " + "  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i])
                               for i, cell in enumerate(row)))
    if len(results) > 1 and results[0].load_latency_ns.size:
        base = metrics[0]
        for r, m in zip(results[1:], metrics[1:]):
            print(f"  {r.label} vs {results[0].label}: KV-load p99 "
                  f"{compare_ratio(base['kv_load_p99_us'], m['kv_load_p99_us'])}, "
                  f"p50 {compare_ratio(base['kv_load_p50_us'], m['kv_load_p50_us'])}")
    print("  (write absorption: share of written bytes no host access waited to write back; prefetch late: "
          "useful prefetches still in flight when read)")
    if plot is not None:
        print(f"  plot     {plot}")
    print(f"  machine  {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}")


def plot_latency_cdf(results: list[MissionResult], path: Path, *, title: str) -> None:
    # a Figure on the Agg canvas, without pyplot: files only (no display on servers and
    # CI), and pyplot's import alone took ~0.4 s of a ~3 s run
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    import numpy as np

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    styles = ["-", "--", "-.", ":"]
    for k, r in enumerate(results):
        lat = np.sort(r.load_latency_ns) / 1e3
        if lat.size:
            ax.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post", linestyle=styles[k % len(styles)],
                    linewidth=1.8, label=f"{r.label} (p99 {np.percentile(lat, 99):.0f} us)")
    ax.set_xscale("log")
    ax.set_xlabel(f"KV load per request ({results[0].clock} clock, us)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=10)
    if ax.lines:
        ax.legend(loc="lower right")
    else:  # the first requests of a trace may load no KV at all
        ax.text(0.5, 0.5, "no KV loads in these requests", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
