"""The map of where HyMCache's ratios hold: every axis that decides them, in combination.

A *scenario* fixes the workload (long-context coding agent: context cap, output length,
tool pause, reusable share), the model x GPU preset, the topology, the DRAM budget D (as a
share of the workload's working set) and the hint lead time. For each scenario every
configuration (lmcache-local, cxlhm-hymcache, mooncake-dram at 16 x D, ideal) is replayed
on one ladder of replay speeds (x2 apart), each probe keeping its p90 TTFT, p90 TBT and
steady throughput. The SLO axes then cost no replay: the max QPS under a (p90 TTFT, p90
TBT) SLO is the throughput where the ladder crosses it, interpolated in log space between
the last probe that meets it and the first that does not. Probes stop (fail fast) once the
loosest SLO of the map is surely missed, which is then missed by every stricter one.

Cells run in forked worker processes (the CXL-HM firmware compiled once, before the
fork), or on Ray where it is installed and asked for. bench/bench_serving.py --map is
the command; it prints the command and the machine next to the figures.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from cxlhm_apps.serving import workloads as W
from cxlhm_apps.serving.metrics import summarize
from cxlhm_apps.serving.params import ServingParams
from cxlhm_apps.serving.scheduler import SloMissed
from cxlhm_apps.serving.sweep import fork_context, warm_up
from cxlhm_apps.serving.topologies import replay

MAP_CONFIGS = ("lmcache-local", "cxlhm-hymcache", "mooncake-dram", "ideal")
# the three claims: (numerator, denominator, the paper's figure, label)
CLAIMS = (("cxlhm-hymcache", "lmcache-local", 3.0, "hymcache / lmcache-local (paper: 3.0x colocated, 1.45x disagg.)"),
          ("cxlhm-hymcache", "mooncake-dram", 0.7, "hymcache / mooncake-dram at 16x its DRAM (paper: ~0.7x)"),
          ("ideal", "lmcache-local", 3.0, "ideal / lmcache-local (the ceiling of any tier)"))
CONTOURS = (0.7, 1.45, 3.0)


@dataclasses.dataclass(frozen=True)
class Scenario:
    model: str = "llama3-8b"
    gpu: str = "h200"
    topology: str = "colocated"
    dram_share: float = 1 / 16          # D as a share of the working set: every distinct chunk of the speed-1 run
    max_context: int = 131_072
    output_median: float = 330.0
    tool_pause_s: float = 20.0
    reuse_keep: float = 1.0
    lead_s: float = 1.0
    sessions: int = 48                  # sessions at speed 1 (the ladder scales them)
    workload: str = "coding-agent"      # or any registered workload (then only its size is set)
    requests: int = 2000                # a trace's first N requests (a trace is the same at every speed)

    def label(self) -> str:
        short = {"llama3-8b": "8B", "qwen2.5-32b": "32B", "llama3-70b": "70B"}.get(self.model, self.model)
        gpu = {"h200": "H200", "h100-80g": "H100", "l40s-48g": "L40S", "2xh200-tp2": "2xH200"}.get(self.gpu, self.gpu)
        if self.workload != "coding-agent":
            return f"{self.workload} {short}/{gpu} {self.topology[:5]} D=1/{round(1 / self.dram_share)}"
        return (f"{short}/{gpu} {self.topology[:5]} D=1/{round(1 / self.dram_share)} ctx{self.max_context // 1024}k "
                f"out{self.output_median:g} tool{self.tool_pause_s:g}s reuse{self.reuse_keep:g} lead{self.lead_s:g}s")

    def spec(self) -> W.WorkloadSpec:
        if self.workload != "coding-agent":
            cfg = W.kind(self.workload).config()
            size = {"requests": self.requests} if hasattr(cfg, "requests") else {"sessions": self.sessions}
            return W.WorkloadSpec(self.workload, dataclasses.replace(cfg, **size), reuse_keep=self.reuse_keep)
        cfg = dataclasses.replace(W.CodingAgentConfig(), sessions=self.sessions, max_context_tokens=self.max_context,
                                  model_output_tokens=W.Dist("lognormal", self.output_median, 0.7),
                                  tool_pause_s=W.Dist("lognormal", self.tool_pause_s, 0.6))
        return W.WorkloadSpec("coding-agent", cfg, reuse_keep=self.reuse_keep)

    def params(self, loosest: tuple) -> ServingParams:
        base = ServingParams(model=self.model, gpu=self.gpu, prefetch_lead_s=self.lead_s,
                             slo_ttft_s=loosest[0], slo_tbt_ms=loosest[1])
        # the working set of the same sessions with all their reuse (dropping reuse would only grow it)
        full = dataclasses.replace(self.spec(), reuse_keep=1.0)
        return base.replace(dram_bytes=max(1 << 30, int(working_set_bytes(full, base) * self.dram_share)))


def working_set_bytes(spec: W.WorkloadSpec, params: ServingParams) -> float:
    """KV bytes of every distinct chunk the workload (at speed 1) computes."""
    w = W.build(spec)
    sizes: dict[int, int] = {}
    for r in w.requests:
        for cid, tok in zip(r.chunk_ids.tolist(), r.chunk_tokens.tolist()):
            sizes[cid] = max(sizes.get(cid, 0), tok)
    return float(sum(sizes.values())) * params.gpu_cost_model().kv_bytes_per_token


@dataclasses.dataclass(frozen=True)
class Cell:
    scenario: Scenario
    config: str
    speeds: tuple
    loosest: tuple      # (p90 TTFT s, p90 TBT ms): probes stop once it is surely missed


def run_cell(cell: Cell) -> dict:
    """The ladder of one (scenario, configuration): a probe per speed until the loosest
    SLO is missed (the rest would miss it too)."""
    sc = cell.scenario
    params = sc.params(cell.loosest)
    probes = []
    for speed in cell.speeds:
        w = W.build(W.spec_at_speed(sc.spec(), speed))
        try:
            res = replay(w, cell.config, params, speed, sc.topology, fail_fast=True)
        except SloMissed:
            probes.append({"speed": speed, "ttft": math.inf, "tbt": math.inf, "rps": math.nan})
            break
        except Exception as exc:  # e.g. a request's KV larger than this GPU's pool: the cell says so, the map goes on
            return {"scenario": dataclasses.asdict(sc), "config": cell.config, "probes": probes,
                    "error": f"{type(exc).__name__}: {exc}"}
        s = summarize(res, params.slo_ttft_s, params.slo_percentile, params.slo_tbt_ms)
        probes.append({"speed": speed, "ttft": s["ttft_slo_s"], "tbt": s["tbt_slo_ms"], "rps": s["throughput_rps"],
                       "hit_gpu": s["hit_gpu"], "hit_dram": s["hit_dram"], "hit_ssd": s["hit_ssd"],
                       "hit_miss": s["hit_miss"], "gpu_util": s["gpu_util"], "prefill_util": s["gpu_prefill_util"]})
        if not s["slo_met"]:
            break
    return {"scenario": dataclasses.asdict(sc), "config": cell.config, "probes": probes,
            "dram_gib": params.dram_bytes / 2**30}


def max_qps(probes: list[dict], ttft_slo: float, tbt_slo: float) -> float:
    """Throughput where the ladder crosses the SLO: the last probe meeting both bounds,
    moved toward the first that misses by log-linear interpolation of the binding one."""
    best, prev = 0.0, None
    for p in probes:
        if p["ttft"] <= ttft_slo and p["tbt"] <= tbt_slo:
            best, prev = p["rps"], p
            continue
        if prev is not None and math.isfinite(p["ttft"]) and math.isfinite(p["rps"]):
            # the fraction of the step (in log speed) at which the first bound is crossed
            fracs = []
            for key, slo in (("ttft", ttft_slo), ("tbt", tbt_slo)):
                a, b = max(prev[key], 1e-9), max(p[key], 1e-9)
                if b > slo >= a and b > a:
                    fracs.append(math.log(slo / a) / math.log(b / a))
            if fracs:
                f = min(fracs)
                best = math.exp(math.log(max(prev["rps"], 1e-12)) * (1 - f) + math.log(max(p["rps"], 1e-12)) * f)
        break
    return best


def grid(quick: bool) -> tuple[list[Scenario], list[float], list[float]]:
    """The scenarios and the SLO axes. Quick: the development grid (a handful of cells)."""
    ttft = [0.5, 1.0, 2.0, 5.0, 10.0]
    tbt = [50.0, 100.0, 200.0]
    if quick:
        base = Scenario(sessions=12)
        scenarios = [base, dataclasses.replace(base, dram_share=1.0)]
        return scenarios, ttft, tbt
    base = Scenario(sessions=16)
    out = [base, dataclasses.replace(base, dram_share=1 / 4), dataclasses.replace(base, dram_share=1.0),
           dataclasses.replace(base, topology="disagg")]
    for model, gpu in (("llama3-8b", "h100-80g"), ("llama3-8b", "l40s-48g"), ("qwen2.5-32b", "h200"),
                       ("llama3-70b", "2xh200-tp2")):
        out.append(dataclasses.replace(base, model=model, gpu=gpu))
    for changes in ({"max_context": 32_768, "output_median": 100.0}, {"output_median": 100.0},
                    {"output_median": 100.0, "tool_pause_s": 60.0}, {"reuse_keep": 0.5}, {"lead_s": 0.1},
                    {"lead_s": 10.0}):
        out.append(dataclasses.replace(base, **changes))
    return out, ttft, tbt


def cells(scenarios, speeds, loosest, configs=MAP_CONFIGS) -> list[Cell]:
    """Every (scenario, configuration) ladder; the lead time only reaches the device's hints."""
    out = []
    for sc in scenarios:
        for config in configs:
            if config != "cxlhm-hymcache" and sc.lead_s != Scenario.lead_s:
                continue  # the lead time only reaches the device's hints: reuse the base scenario's cells
            out.append(Cell(sc, config, tuple(speeds), loosest))
    return out


def _key(sc: dict, config: str) -> tuple:
    if config != "cxlhm-hymcache":
        sc = dict(sc, lead_s=Scenario.lead_s)
    return tuple(sorted(sc.items())) + (config,)


def run_map(todo: list[Cell], workers: int | None, ray: str | None, progress=print) -> list[dict]:
    if ray:
        import ray as ray_mod  # optional: only with --ray
        if not ray_mod.is_initialized():
            ray_mod.init(address=ray, ignore_reinit_error=True, log_to_driver=False)
        remote = ray_mod.remote(run_cell)
        return ray_mod.get([remote.remote(c) for c in todo])
    workers = workers or os.cpu_count() or 1
    context = fork_context()
    order = sorted(range(len(todo)), key=lambda i: todo[i].config != "cxlhm-hymcache")  # slow cells first
    results: list[dict | None] = [None] * len(todo)
    if workers <= 1 or context is None:
        for n, i in enumerate(order):
            results[i] = run_cell(todo[i])
            progress(f"  {n + 1}/{len(todo)} cells")
        return results
    warm_up({c.config for c in todo})
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(run_cell, todo[i]): i for i in order}
        for n, fut in enumerate(as_completed(futures)):
            results[futures[fut]] = fut.result()
            progress(f"  {n + 1}/{len(todo)} cells")
    return results


def ratios(results: list[dict], ttft: list[float], tbt: list[float]) -> list[dict]:
    """Per scenario and SLO pair: max QPS per configuration and the three claims' ratios."""
    by = {_key(r["scenario"], r["config"]): r for r in results}
    rows = []
    for r in results:
        anchor = "cxlhm-hymcache" if any(x["config"] == "cxlhm-hymcache" for x in results) else "lmcache-local"
        if r["config"] != anchor:
            continue
        sc = r["scenario"]
        for t, b in itertools.product(ttft, tbt):
            q = {}
            for config in MAP_CONFIGS:
                cell = by.get(_key(sc, config))
                if cell is None:
                    q[config] = math.nan
                    continue
                q[config] = max_qps(cell["probes"], t, b) if cell["probes"] else math.nan
            row = {"scenario": Scenario(**sc).label(), **sc, "ttft_slo": t, "tbt_slo": b, "max_qps": q}
            for num, den, _, label in CLAIMS:
                row[f"{num}/{den}"] = q[num] / q[den] if q[den] and q[den] > 0 and q[num] == q[num] else math.nan
            rows.append(row)
    return rows


def draw(rows: list[dict], path: Path, ttft: list[float], tbt: list[float], title: str) -> None:
    """Three heatmaps (the claims), scenarios down, (TBT, TTFT) SLO pairs across, with the
    0.7x, 1.45x and 3.0x contours."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    slos = list(itertools.product(tbt, ttft))
    fig, axes = plt.subplots(1, 3, figsize=(22, 2.2 + 0.32 * len(scenarios)), sharey=True)
    for ax, (num, den, paper, label) in zip(axes, CLAIMS):
        z = np.full((len(scenarios), len(slos)), np.nan)
        for r in rows:
            z[scenarios.index(r["scenario"]), slos.index((r["tbt_slo"], r["ttft_slo"]))] = r[f"{num}/{den}"]
        shown = np.where(np.isfinite(z) & (z > 0), z, np.nan)
        im = ax.imshow(shown, aspect="auto", cmap="RdYlGn", norm=LogNorm(vmin=0.3, vmax=6.0), interpolation="nearest")
        masked = np.ma.masked_invalid(shown)  # no contour around cells without a ratio
        if len(scenarios) > 1 and len(slos) > 1 and masked.count():
            cs = ax.contour(masked, levels=list(CONTOURS), colors=["navy", "black", "purple"],
                            linewidths=[1.0, 1.4, 2.0], linestyles=[":", "--", "-"])
            ax.clabel(cs, fmt=lambda v: f"{v:g}x", fontsize=7)
        for (i, j), v in np.ndenumerate(z):
            ax.text(j, i, "-" if not np.isfinite(v) else f"{v:.2f}", ha="center", va="center", fontsize=5.5)
        ax.set_xticks(range(len(slos)))
        ax.set_xticklabels([f"{t:g}s\n{b:g}ms" for b, t in slos], fontsize=6)
        ax.set_xlabel("p90 TTFT SLO / p90 TBT SLO", fontsize=8)
        ax.set_title(label, fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    axes[0].set_yticks(range(len(scenarios)))
    axes[0].set_yticklabels(scenarios, fontsize=6)
    fig.suptitle(title + "\ncontours: 0.7x (dotted), 1.45x (dashed), 3.0x (solid); '-': the denominator met the "
                 "SLO at no probed speed", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(rows: list[dict], ttft_slo: float, tbt_slo: float) -> str:
    """One line per scenario at one SLO pair: max QPS per configuration and the ratios."""
    lines = [f"p90 TTFT <= {ttft_slo:g} s, p90 TBT <= {tbt_slo:g} ms",
             f"{'scenario':<78} {'lmc':>6} {'hym':>6} {'moon':>6} {'ideal':>6} {'hym/lmc':>7} {'hym/moon':>8} "
             f"{'ideal/lmc':>9}"]
    for r in rows:
        if r["ttft_slo"] != ttft_slo or r["tbt_slo"] != tbt_slo:
            continue
        q = r["max_qps"]
        lines.append(f"{r['scenario']:<78} {q['lmcache-local']:>6.3f} {q['cxlhm-hymcache']:>6.3f} "
                     f"{q['mooncake-dram']:>6.3f} {q['ideal']:>6.3f} {r['cxlhm-hymcache/lmcache-local']:>7.2f} "
                     f"{r['cxlhm-hymcache/mooncake-dram']:>8.2f} {r['ideal/lmcache-local']:>9.2f}")
    return "\n".join(lines)


def summary_of_claims(rows: list[dict]) -> list[str]:
    """Where each claim holds: the share of (scenario, SLO) points at or above it."""
    out = []
    for num, den, paper, label in CLAIMS:
        key = f"{num}/{den}"
        vals = [r[key] for r in rows if r[key] == r[key]]
        for topology in ("colocated", "disagg"):
            tv = [r[key] for r in rows if r[key] == r[key] and r["topology"] == topology]
            target = paper if not (key == "cxlhm-hymcache/lmcache-local" and topology == "disagg") else 1.45
            if tv:
                out.append(f"{label}, {topology}: >= {target:g}x at {sum(v >= target for v in tv)} of {len(tv)} "
                           f"(scenario, SLO) points; median {np.median(tv):.2f}x, max {max(tv):.2f}x")
        if not vals:
            out.append(f"{label}: no point with a finite ratio")
    return out


__all__ = ["Scenario", "grid", "cells", "run_map", "ratios", "draw", "table", "summary_of_claims", "max_qps"]
