"""The summary table (ratios to lmcache-local and mooncake-dram) and the PNG plots:
TTFT CDF per configuration, max QPS vs DRAM budget, hit ratio per tier."""
from __future__ import annotations

import json
from pathlib import Path

from cxlhm.serving.configs import CONFIG_ORDER

COLUMNS = ("config", "TTFT mean", "p50", "p90", "p99", "TBT ms", "maxQPS", "x lmc", "x moon",
           "GPU", "DRAM", "SSD", "miss", "pf acc", "pf cov", "pf late", "SSDw/reuse")


def _ratio(a: float, b: float) -> str:
    if b <= 0:
        return "inf" if a > 0 else "-"
    return f"{a / b:.2f}"


def main_cells(results: list[dict], dram_gib: float) -> list[dict]:
    """The cells of the main table: every configuration at the default budget."""
    return [r for r in results if r["dram_gib"] == dram_gib or r["config"] in ("recompute", "ideal")]


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
        widths = (15, 9, 6, 6, 6, 7, 7, 6, 6, 5, 5, 5, 5, 6, 6, 7, 10)
        lines.append(" ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(zip(COLUMNS, widths))))
        base = block.get("lmcache-local", {}).get("max_qps", 0.0)
        moon = block.get("mooncake-dram", {}).get("max_qps", 0.0)
        for config in [c for c in CONFIG_ORDER if c in block] + [c for c in block if c not in CONFIG_ORDER]:
            r = block[config]
            s = r["reference"]
            q = r.get("max_qps", float("nan"))
            row = (config, f"{s['ttft_mean_s']:.3f}", f"{s['ttft_p50_s']:.2f}", f"{s['ttft_p90_s']:.2f}",
                   f"{s['ttft_p99_s']:.2f}", f"{s['tbt_mean_ms']:.1f}", f"{q:.3f}", _ratio(q, base), _ratio(q, moon),
                   f"{s['hit_gpu']:.2f}", f"{s['hit_dram']:.2f}", f"{s['hit_ssd']:.2f}", f"{s['hit_miss']:.2f}",
                   f"{s['prefetch_accuracy']:.2f}", f"{s['prefetch_coverage']:.2f}", f"{s['prefetch_late_share']:.2f}",
                   f"{s['ssd_written_per_reused']:.2f}")
            lines.append(" ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(zip(row, widths))))
        lines.append("")
    return "\n".join(lines)


def format_budget_table(results: list[dict]) -> str:
    """Max QPS per DRAM budget D (the cells the sweep ran), with each configuration's ratio
    to lmcache-local at the same D; recompute and ideal do not depend on D."""
    lines = []
    for workload, topology in dict.fromkeys((r["workload"], r["topology"]) for r in results):
        cells = [r for r in results if r["workload"] == workload and r["topology"] == topology]
        budgets = sorted({r["dram_gib"] for r in cells if r["config"] not in ("recompute", "ideal")})
        if len(budgets) < 2:
            continue
        at = {(r["config"], r["dram_gib"]): r.get("max_qps", float("nan")) for r in cells}
        lines.append(f"== {workload}, {topology}: maxQPS (req/s) by DRAM budget D; (x lmc): ratio to lmcache-local "
                     f"at the same D")
        lines.append(f"{'config':<15}" + "".join(f"{f'{b:g} GiB':>17}" for b in budgets))
        for config in [c for c in CONFIG_ORDER if any(k[0] == c for k in at)]:
            row = f"{config:<15}"
            for b in budgets:
                q = at.get((config, b))
                if q is None:
                    q = next((v for (c, _), v in at.items() if c == config and c in ("recompute", "ideal")), None)
                base = at.get(("lmcache-local", b))
                row += f"{'-':>17}" if q is None else f"{q:>9.3f} ({_ratio(q, base) if base else '-':>4}x)"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def ref_p(summary: dict) -> str:
    return f"{summary.get('slo_percentile', 90):g}"


def plot_all(results: list[dict], out: Path, dram_gib: float) -> list[Path]:
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
        fig, ax = plt.subplots(figsize=(6, 4))
        for config, r in main.items():
            q = r["reference"]["ttft_quantiles"]
            ax.plot(q, [i / 100 for i in range(len(q))], label=config)
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("share of requests")
        ax.set_title(f"TTFT CDF: {workload}, {topology}, speed {next(iter(main.values()))['reference']['speed']:g}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        written.append(_save(fig, out / f"ttft_cdf_{tag}.png"))
        # max QPS vs DRAM budget
        budgets = sorted({r["dram_gib"] for r in cells})
        if len(budgets) > 1:
            fig, ax = plt.subplots(figsize=(6, 4))
            for config in dict.fromkeys(r["config"] for r in cells):
                pts = sorted((r["dram_gib"], r.get("max_qps", 0.0)) for r in cells if r["config"] == config)
                if config in ("recompute", "ideal"):
                    ax.axhline(pts[0][1], linestyle="--", linewidth=1, label=config,
                               color="gray" if config == "recompute" else "black")
                else:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=config)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("DRAM budget D (GiB)")
            ax.set_ylabel("max QPS under the SLO (req/s)")
            ax.set_title(f"throughput vs DRAM: {workload}, {topology}")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            written.append(_save(fig, out / f"throughput_vs_dram_{tag}.png"))
        # hit ratio per tier
        fig, ax = plt.subplots(figsize=(7, 4))
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
        ax.legend(fontsize=8)
        written.append(_save(fig, out / f"hit_ratio_{tag}.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def write_json(results: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=float))
