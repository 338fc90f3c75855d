"""The summary table (ratios to the baselines the registry marks) and the PNG plots:
TTFT CDF per configuration, max QPS vs DRAM budget, hit ratio per tier."""
from __future__ import annotations

import json
import math
from pathlib import Path

from cxlhm_apps.serving.configs import baselines, meta, ordered

HEAD = ("TTFT mean", "p50", "p90", "p99", "TBT ms", "maxQPS")
TAIL = ("GPU", "DRAM", "SSD", "miss", "pf acc", "pf cov", "pf late", "SSDw/reuse")


def columns() -> tuple:
    """The table's columns: one ratio column per baseline the registry marks."""
    return ("config",) + HEAD + tuple(f"x {b}" for b in baselines()) + TAIL


def _ratio(a: float | None, b: float | None) -> str:
    """a / b, or "-" when there is no ratio to read: the baseline did not run in this
    block (None), met the SLO at no speed (0), or a is not known."""
    if a is None or b is None or b <= 0 or a != a:
        return "-"
    return f"{a / b:.2f}"


def independent_of_dram(config: str) -> bool:
    try:
        return not meta(config).dram
    except LookupError:  # a configuration no longer registered (results read back from a file)
        return False


def _role(config: str) -> str:
    try:
        return meta(config).role
    except LookupError:
        return ""


def main_cells(results: list[dict], dram_gib: float) -> list[dict]:
    """The cells of the main table: every configuration at the default budget."""
    return [r for r in results if r["dram_gib"] == dram_gib or independent_of_dram(r["config"])]


def _order(names) -> list[str]:
    try:
        return ordered(names)
    except LookupError:
        return list(names)


def format_table(results: list[dict], dram_gib: float) -> str:
    """One block per (workload, topology): TTFT at the reference speed, max QPS under the
    SLO and its ratios, hit shares per tier, prefetch figures, SSD write amplification."""
    lines = []
    cells = main_cells(results, dram_gib)
    for workload, topology in dict.fromkeys((r["workload"], r["topology"]) for r in cells):
        block = {r["config"]: r for r in cells if r["workload"] == workload and r["topology"] == topology}
        ref = next(iter(block.values()))["reference"]
        lines.append(f"== {workload}, {topology}: D = {dram_gib:g} GiB; TTFT (s) at speed {ref['speed']:g} "
                     f"({ref['offered_rps']:.2f} req/s offered); maxQPS: req/s meeting the p{ref_p(ref)} TTFT and TBT SLO")
        cols = columns()
        bases = {b: block.get(name, {}).get("max_qps") for b, name in baselines().items()}
        rows = []
        for config in _order(block):
            r = block[config]
            s = r["reference"]
            q = r.get("max_qps")
            rows.append((config, f"{s['ttft_mean_s']:.3f}", f"{s['ttft_p50_s']:.2f}", f"{s['ttft_p90_s']:.2f}",
                         f"{s['ttft_p99_s']:.2f}", f"{s['tbt_mean_ms']:.1f}", "-" if q is None else f"{q:.3f}",
                         *(_ratio(q, base) for base in bases.values()),
                         f"{s['hit_gpu']:.2f}", f"{s['hit_dram']:.2f}", f"{s['hit_ssd']:.2f}", f"{s['hit_miss']:.2f}",
                         f"{s['prefetch_accuracy']:.2f}", f"{s['prefetch_coverage']:.2f}",
                         f"{s['prefetch_late_share']:.2f}", f"{s['ssd_written_per_reused']:.2f}"))
        # every column as wide as its widest cell: a long name (cxlhm:lecar+hints) keeps the rows aligned
        widths = [max(len(c), *(len(row[k]) for row in rows)) for k, c in enumerate(cols)]
        for row in (cols, *rows):
            lines.append(" ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(zip(row, widths))))
        lines.append("")
    return "\n".join(lines)


def _ratio_words() -> str:
    """'x lmc / x moon - maxQPS over lmcache-local's / mooncake-dram's', from the registry."""
    bases = baselines()
    if not bases:
        return "(no ratio columns: no configuration is registered as a baseline)"
    columns = " / ".join(f"x {b}" for b in bases)
    owners = " / ".join(name + "'s" for name in bases.values())
    return f"{columns} - maxQPS over {owners}"


LEGEND = """\
columns: TTFT mean/p50/p90/p99 - time to first token (s) at the reference speed, the same offered load for every
  configuration; TBT ms - mean time between output tokens; maxQPS - the highest request rate (req/s) whose p-th
  percentile TTFT and TBT meet the SLO, found by a search over replay speeds (the truth lies between maxQPS and the
  next probe, maxQPS x step: see 'search step'); {ratios} in
  the same block ("-" where that baseline did not run or met the SLO at no speed); GPU / DRAM / SSD / miss - share
  of reusable context tokens (KV an earlier request computed) found in the GPU KV pool, in the tier's DRAM (host,
  device or pool), on the device's SSD, or recomputed; pf acc - prefetch accuracy (prefetched device blocks later
  read / prefetched); pf cov - prefetch coverage (reads served by a prefetch / (those + device DRAM misses)); pf
  late - share of useful prefetches that finished after the read asked for them; SSDw/reuse - bytes written to
  the device SSD per byte of KV loaded back from the tier.""".format(ratios=_ratio_words())

QUICK_CAVEAT = ("--quick: small workloads and a coarse max-QPS search (step ~19%): a smoke test of the pipeline, "
                "not a result; run without --quick for the figures docs/serving.md quotes.")


def search_notes(results: list[dict], dram_gib: float) -> list[str]:
    """The search step per block, and orderings the step cannot resolve (ideal below
    another configuration, which no real run can be: ideal finds every reusable chunk)."""
    notes = []
    cells = main_cells(results, dram_gib)
    for workload, topology in dict.fromkeys((r["workload"], r["topology"]) for r in cells):
        block = {r["config"]: r for r in cells if r["workload"] == workload and r["topology"] == topology}
        notes += device_dram_notes(workload, topology, block)
        steps = [r.get("search_step", math.inf) for r in block.values() if "max_qps" in r]
        if not steps:
            continue
        finite = [x for x in steps if math.isfinite(x)]
        step = max(finite) if finite else math.inf
        if all(not r.get("max_qps") for r in block.values() if "max_qps" in r):
            notes.append(f"{workload}, {topology}: no configuration met the SLO at any probed speed (maxQPS 0): "
                         f"the SLO is out of reach here, no ratio can be read")
            continue
        notes.append(f"{workload}, {topology}: search step x{step:.3f} (maxQPS is resolved to "
                     f"{(step - 1) * 100:.0f}%)" if math.isfinite(step) else
                     f"{workload}, {topology}: no SLO failure found above maxQPS (upper end of the search)")
        bound = next((c for c in block if _role(c) == "bound"), None)  # ideal: no run can beat it
        ideal = block[bound].get("max_qps") if bound else None
        for config, r in block.items():
            q = r.get("max_qps")
            if ideal is None or q is None or config == bound or q <= ideal:
                continue
            within = q <= ideal * max(r.get("search_step", math.inf), block[bound].get("search_step", math.inf))
            notes.append(f"  note: {bound} ({ideal:.3f}) below {config} ({q:.3f}): "
                         + ("within the search step, a resolution artefact, not a result" if within else
                            "beyond the search step: look at this cell (ideal should bound every configuration)"))
    return notes


def device_dram_notes(workload: str, topology: str, block: dict) -> list[str]:
    """Where two or more device configurations ran and none served a reusable token from
    device DRAM, say why their figures can still differ: nothing their DRAM kept was read,
    so the firmware policies differ only by their write path."""
    device = {c: r["reference"] for c, r in block.items() if _role(c) == "device" and "hit_dram" in r["reference"]}
    if len(device) < 2 or any(ref["hit_dram"] > 0.005 for ref in device.values()):
        return []
    ref = next(iter(device.values()))
    skipped = ", ".join(f"{c} {ref_.get('store_skipped_share', 0.0):.0%}" for c, ref_ in device.items())
    return [f"{workload}, {topology}: device DRAM served no reusable token for any device configuration at the "
            f"reference speed (GPU pool {ref['hit_gpu']:.0%} of them, device SSD {ref['hit_ssd']:.0%}, recomputed "
            f"{ref['hit_miss']:.0%}): what a firmware policy keeps in DRAM is not read there, so these configurations "
            f"differ by their write path - NAND programs queued ahead of loads and stores skipped under backlog "
            f"({skipped} of stored bytes skipped) - and by what spills from the GPU at the faster max-QPS probes. A "
            f"smaller GPU pool (serving.gpu_kv_bytes) or a workload with shorter reuse distance tells policies apart."]


def format_budget_table(results: list[dict]) -> str:
    """Max QPS per DRAM budget D (the cells the sweep ran), with each configuration's ratio
    to the first baseline (lmcache-local) at the same D; configurations whose metadata
    says the budget does not matter to them (recompute, ideal) are one value."""
    lines = []
    column, lmc = next(iter(baselines().items()), ("-", None))
    for workload, topology in dict.fromkeys((r["workload"], r["topology"]) for r in results):
        cells = [r for r in results if r["workload"] == workload and r["topology"] == topology]
        budgets = sorted({r["dram_gib"] for r in cells if not independent_of_dram(r["config"])})
        if len(budgets) < 2:
            continue
        at = {(r["config"], r["dram_gib"]): r.get("max_qps", float("nan")) for r in cells}
        lines.append(f"== {workload}, {topology}: maxQPS (req/s) by DRAM budget D; (x {column}): ratio to {lmc} "
                     f"at the same D")
        names = _order(dict.fromkeys(k[0] for k in at))
        width = max(15, *(len(c) for c in names))
        lines.append(f"{'config':<{width}}" + "".join(f"{f'{b:g} GiB':>17}" for b in budgets))
        for config in names:
            row = f"{config:<{width}}"
            for b in budgets:
                q = at.get((config, b))
                if q is None:
                    q = next((v for (c, _), v in at.items() if c == config and independent_of_dram(c)), None)
                base = at.get((lmc, b))
                row += f"{'-':>17}" if q is None else f"{q:>9.3f} ({_ratio(q, base) if base else '-':>4}x)"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def ref_p(summary: dict) -> str:
    return f"{summary.get('slo_percentile', 90):g}"


def _style(k: int) -> dict:
    """Colour, dash and marker all change per line, so overlapping CDFs stay apart."""
    dashes = ("-", "--", "-.", ":")
    markers = ("o", "s", "^", "v", "D", "x", "+", "*")
    # markers at staggered points, so that coinciding lines still show each marker
    return {"color": f"C{k % 10}", "linestyle": dashes[k % len(dashes)], "marker": markers[k % len(markers)],
            "markevery": (2 * k % 10, 10), "markersize": 4, "linewidth": 1.4}


def plot_all(results: list[dict], out: Path, dram_gib: float, slo: tuple | None = None) -> list[Path]:
    """The plots; `slo` = (TTFT seconds, percentile) marks the SLO on the CDFs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out.mkdir(parents=True, exist_ok=True)
    written = []
    keys = list(dict.fromkeys((r["workload"], r["topology"]) for r in results))
    for workload, topology in keys:
        cells = [r for r in results if r["workload"] == workload and r["topology"] == topology]
        main = {r["config"]: r for r in main_cells(cells, dram_gib)}
        tag = f"{workload}_{topology}"
        # TTFT CDF at the reference speed
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        drawn: dict[tuple, str] = {}
        for k, (config, r) in enumerate(main.items()):
            q = r["reference"]["ttft_quantiles"]
            same = drawn.setdefault(tuple(q), config)  # a curve that coincides with one drawn already says so
            label = config if same == config else f"{config} (= {same})"
            ax.plot(q, [i / 100 for i in range(len(q))], label=label, **_style(k))
        if slo is not None:
            ttft_slo, pct = slo
            ax.axvline(ttft_slo, color="red", linewidth=1, linestyle=":")
            ax.axhline(pct / 100, color="red", linewidth=0.6, linestyle=":")
            ax.annotate(f"SLO: p{pct:g} TTFT <= {ttft_slo:g} s", (ttft_slo, pct / 100), fontsize=7, color="red",
                        xytext=(4, -12), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("share of requests")
        ax.set_title(f"TTFT CDF: {workload}, {topology}, speed {next(iter(main.values()))['reference']['speed']:g}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        written.append(_save(fig, out / f"ttft_cdf_{tag}.png"))
        # max QPS (the headline) with the search step as the upper whisker
        fig = max_qps_figure(main, workload, topology, dram_gib)
        if fig is not None:
            written.append(_save(fig, out / f"max_qps_{tag}.png"))
        # max QPS vs DRAM budget
        budgets = sorted({r["dram_gib"] for r in cells})
        if len(budgets) > 1:
            fig, ax = plt.subplots(figsize=(6, 4))
            for config in dict.fromkeys(r["config"] for r in cells):
                pts = sorted((r["dram_gib"], r.get("max_qps", 0.0)) for r in cells if r["config"] == config)
                if independent_of_dram(config):
                    ax.axhline(pts[0][1], linestyle="--", linewidth=1, label=config,
                               color="black" if meta(config).role == "bound" else "gray")
                else:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], label=config, **_style(len(ax.lines)))
            ax.set_xscale("log", base=2)
            ax.set_xlabel("DRAM budget D (GiB)")
            ax.set_ylabel("max QPS under the SLO (req/s)")
            ax.set_title(f"throughput vs DRAM: {workload}, {topology}")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            written.append(_save(fig, out / f"throughput_vs_dram_{tag}.png"))
        # hit ratio per tier
        written.append(_save(hit_ratio_figure(main, workload, topology), out / f"hit_ratio_{tag}.png"))
    return written


def max_qps_figure(main: dict, workload: str, topology: str, dram_gib: float):
    """One bar per configuration, the whisker up to the next probe (which missed the SLO),
    the value printed above the whisker's end, clear of it; None when nothing was searched."""
    import matplotlib.pyplot as plt
    searched = [(c, r) for c, r in main.items() if "max_qps" in r]
    if not searched:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    names = [c for c, _ in searched]
    vals = [r["max_qps"] for _, r in searched]
    ups = [v * (r.get("search_step", math.inf) - 1) if math.isfinite(r.get("search_step", math.inf)) else 0.0
           for v, (_, r) in zip(vals, searched)]
    ax.bar(names, vals, yerr=[[0] * len(vals), ups], capsize=4, color=[f"C{k % 10}" for k in range(len(vals))])
    top = max((v + u for v, u in zip(vals, ups)), default=0.0) or 1.0
    for k, (v, u) in enumerate(zip(vals, ups)):
        ax.annotate(f"{v:.3g}", (k, v + u), xytext=(0, 7), textcoords="offset points", ha="center", va="bottom",
                    fontsize=7)
    ax.set_ylim(0, top * 1.15)  # room for the labels above the highest whisker
    ax.set_ylabel("max QPS under the SLO (req/s)")
    ax.set_title(f"max QPS: {workload}, {topology}, D = {dram_gib:g} GiB\n"
                 f"(whisker: up to the next probe, which missed the SLO)", fontsize=9)
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    ax.grid(alpha=0.3, axis="y")
    return fig


def hit_ratio_figure(main: dict, workload: str, topology: str):
    """Stacked shares of reusable tokens per tier; the legend sits outside the axes, to
    the right, so it never covers a bar."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8.2, 4))
    names = list(main)
    bottom = [0.0] * len(names)
    for key, label in (("hit_gpu", "GPU"), ("hit_dram", "DRAM (host/device/pool)"), ("hit_ssd", "device SSD"),
                       ("hit_miss", "recomputed")):
        vals = [main[n]["reference"][key] for n in names]
        ax.bar(names, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("share of reusable context tokens")
    ax.set_title(f"where reusable KV came from: {workload}, {topology}")
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def write_json(results: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=float))
