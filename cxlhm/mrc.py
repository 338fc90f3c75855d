"""Miss-ratio curves: one trace, several policies, several DRAM sizes, via `cxlhm.sim`.

    curves = miss_ratio_curves(trace, ["lru", "s3fifo"], [100, 1000])
    curves["lru"][1000]   # miss ratio with 1000 DRAM slots

Sizes are DRAM slots: a bare number is a count of blocks, a number with a unit is bytes
(``64MiB``; rounded down to whole blocks), and ``N%`` is a share of the trace's
distinct blocks.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from cxlhm.policies import get as get_policy
from cxlhm.sim import SimResult, simulate
from cxlhm.traces.blocktrace import BlockTrace
from cxlhm.units import format_size, parse_size

Curves = dict[str, dict[int, float]]
Results = dict[str, dict[int, SimResult]]


def parse_cache_size(text: str, block_size: int, unique_blocks: int | None = None) -> int:
    """One size (see the module doc) as a number of DRAM slots, at least 1."""
    item = text.strip()
    if item.endswith("%"):
        if unique_blocks is None:
            raise ValueError(f"size {item!r}: a percentage needs the trace's distinct block count")
        try:
            share = float(item[:-1])
        except ValueError:
            raise ValueError(f"size {item!r} is not a percentage such as 10%") from None
        if not 0 < share <= 100:
            raise ValueError(f"size {item!r} must be within (0%, 100%]")
        return max(1, int(unique_blocks * share / 100))
    if item.isdigit():
        slots = int(item)
    else:
        try:
            slots = parse_size(item) // block_size
        except ValueError:
            raise ValueError(f"size {item!r} is neither a block count (1000), a byte size (64MiB) "
                             f"nor a share of the trace (10%)") from None
        if slots < 1:
            raise ValueError(f"size {item!r} is smaller than one block ({format_size(block_size)})")
    if slots < 1:
        raise ValueError(f"size {item!r} must be at least one block")
    return slots


def parse_cache_sizes(text: str, block_size: int, unique_blocks: int | None = None) -> list[int]:
    """Comma-separated sizes as sorted, distinct slot counts. With the trace's distinct
    block count known, a size above it is simulated at it: a cache that holds every block
    the trace touches never evicts, so any larger one behaves the same (and a 1 TiB size
    on a small trace must not allocate a 1 TiB cache's metadata)."""
    items = [s for s in text.split(",") if s.strip()]
    if not items:
        raise ValueError("no cache sizes given")
    slots = {parse_cache_size(s, block_size, unique_blocks) for s in items}
    if unique_blocks:
        slots = {min(s, max(1, unique_blocks)) for s in slots}
    return sorted(slots)


def simulate_curves(trace: BlockTrace, policies: Sequence[str], sizes: Sequence[int], *,
                    params: Mapping[str, Mapping] | None = None, progress: Callable[[int], None] | None = None,
                    timing: str | Mapping | None = None, queue_depth: int = 1, open_loop: bool = False) -> Results:
    """{policy: {slots: SimResult}} for every policy at every size. `params` maps a
    policy name to its parameters; `progress(n)` is told of every n accesses replayed;
    `timing` (a profile name such as "cmm-h", or a mapping of `timing:` keys) also
    charges every access to that timing model on the model clock (SimResult.timing).

    How a trace becomes device I/O under `timing`: every trace record (one access to one
    block id) is one access to one device block of `trace.block_size` bytes at HPA
    ``id * trace.block_size`` - a write for the trace's writes, else a read - so give the
    trace the device's block size (`cxlhm mrc --timing` uses the profile's unless
    --block-size says otherwise). Closed loop: `queue_depth` accesses in flight, each
    issued when the one `queue_depth` before it completed (1: one after the other). Open
    loop: each access issues at its trace timestamp (`trace.timestamps_ns`)."""
    params = params or {}
    unknown = set(params) - set(policies)
    if unknown:
        raise ValueError(f"parameters given for policies not in the run: {', '.join(sorted(unknown))}")
    resolved = [get_policy(name) for name in policies]  # fail before any work
    for policy in resolved:
        policy.resolve_params(params.get(policy.name))
    future = trace.next_use() if any(p.needs_future for p in resolved) else None
    timed = {} if timing is None else {"timing": timing, "block_size": trace.block_size, "queue_depth": queue_depth}
    if open_loop:
        if timing is None or trace.timestamps_ns is None:
            raise ValueError("an open loop needs a timing model and a trace with timestamps")
        timed["issue_ns"] = trace.timestamps_ns
    results: Results = {}
    for policy in resolved:
        curve = results.setdefault(policy.name, {})
        for slots in sizes:
            curve[int(slots)] = simulate(policy, trace.blocks, slots, writes=trace.writes,
                                         params=params.get(policy.name),
                                         next_use=future if policy.needs_future else None, progress=progress,
                                         **timed)
    return results


def miss_ratio_curves(trace: BlockTrace, policies: Sequence[str], sizes: Sequence[int], *,
                      params: Mapping[str, Mapping] | None = None,
                      progress: Callable[[int], None] | None = None) -> Curves:
    """{policy: {slots: miss ratio}} for every policy at every size (simulate_curves)."""
    return miss_ratios(simulate_curves(trace, policies, sizes, params=params, progress=progress))


def miss_ratios(results: Results) -> Curves:
    """The miss-ratio curves of simulate_curves' results."""
    return {name: {slots: r.miss_ratio for slots, r in curve.items()} for name, curve in results.items()}


def format_table(curves: Curves, block_size: int) -> str:
    policies = list(curves)
    sizes = sorted({s for curve in curves.values() for s in curve})
    header = ["slots", "bytes"] + policies
    rows = [[str(s), format_size(s * block_size)] + [f"{curves[p][s]:.4f}" for p in policies] for s in sizes]
    return _aligned([header] + rows)


def plot_latency(results: Results, path: str, *, block_size: int, title: str) -> None:
    """Mean (solid) and p99 (dashed) access latency on the model clock vs DRAM size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (name, curve) in enumerate(results.items()):
        sizes = sorted(curve)
        x = np.array(sizes) * block_size
        color = f"C{k % 10}"
        ax.plot(x, [curve[s].timing["mean_ns"] / 1e3 for s in sizes], marker="o", color=color, label=f"{name} mean")
        ax.plot(x, [curve[s].timing["p99_ns"] / 1e3 for s in sizes], marker="^", linestyle="--", color=color,
                label=f"{name} p99")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: format_size(int(x))))
    ax.set_xlabel(f"device DRAM (bytes, {format_size(block_size)} blocks)")
    ax.set_ylabel("access latency, model clock (us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _aligned(table: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table)


def plot_curves(curves: Curves, path: str, *, block_size: int, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, curve in curves.items():
        sizes = sorted(curve)
        ax.plot(np.array(sizes) * block_size, [curve[s] for s in sizes], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: format_size(int(x))))
    ax.set_xlabel(f"device DRAM (bytes, {format_size(block_size)} blocks)")
    ax.set_ylabel("miss ratio")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
