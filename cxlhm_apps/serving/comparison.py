"""The whole comparison as one call: which cells to run for the given workloads,
configurations, DRAM budgets and topologies, then the table and the plots. Used by
`cxlhm serve-bench` and bench/bench_serving.py."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from tqdm import tqdm

from cxlhm_apps.serving.configs import meta, parse_configs
from cxlhm_apps.serving.params import ServingParams, params_from
from cxlhm_apps.serving.report import (LEGEND, QUICK_CAVEAT, format_budget_table, format_table, plot_all, search_notes,
                                   write_json)
from cxlhm_apps.serving.sweep import Task, run_grid
from cxlhm_apps.serving.topologies import parse_topologies
from cxlhm_apps.serving.workloads import WorkloadSpec, kind, quick_sizes, reference_speed, resolve

# Per workload, the registry says the replay speed of the TTFT columns (the same offered
# load for every configuration, where the max-QPS search starts) and --quick's sizes
# (workloads.WorkloadKind); per configuration, whether the DRAM budget matters to it
# (configs.Meta.dram: the budget sweep runs only those).


@dataclasses.dataclass
class Comparison:
    workloads: list[str]
    configs: list[str]
    params: ServingParams
    budgets: list[int]               # extra DRAM budgets for the throughput-vs-DRAM plot
    topologies: list[str]
    quick: bool = False
    search: bool = True
    speed: float | None = None       # overrides each workload's reference speed
    refine: int = 4
    budget_refine: int | None = None  # bisection steps for the extra-budget cells (None: refine)
    budget_topologies: tuple = ("colocated",)  # the DRAM sweep runs in these topologies
    sizes: dict | None = None        # workload config overrides by registered kind: {kind: {field: value}}
    reuse_keep: float = 1.0          # share of sessions that keep their reuse (workloads.keep_reuse)

    def specs(self) -> list[tuple[WorkloadSpec, ServingParams]]:
        out = []
        for name in self.workloads:
            spec = resolve(name)
            changes = dict(quick_sizes().get(name, {})) if self.quick else {}
            if self.sizes:  # by registered kind: a workload file of that kind takes them over its own values
                changes.update(self.sizes.get(spec.kind, {}))
                if name != spec.kind:
                    changes.update(self.sizes.get(name, {}))
            if changes:
                spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, **changes))
            spec = dataclasses.replace(spec, reuse_keep=self.reuse_keep)
            params = params_from(spec.serving, self.params) if spec.serving else self.params
            out.append((spec, params))
        return out

    def tasks(self) -> list[Task]:
        tasks = []
        for spec, params in self.specs():
            speed = self.speed or reference_speed(spec.kind)
            for topology in self.topologies:
                for config in self.configs:
                    tasks.append(Task(spec, config, params, topology, speed, speed if self.search else None,
                                      self.refine))
                    if meta(config).dram and meta(config).role != "multi" and topology in self.budget_topologies:
                        for dram in (b for b in self.budgets if b != params.dram_bytes):
                            tasks.append(Task(spec, config, params.replace(dram_bytes=dram), topology, speed,
                                              speed if self.search else None,
                                              self.refine if self.budget_refine is None else self.budget_refine))
        return tasks

    def run(self, *, workers: int | None = None, ray: str | None = None, out: Path | None = None,
            progress: bool = True) -> tuple[list[dict], str]:
        tasks = self.tasks()
        with tqdm(total=len(tasks), desc="serve-bench cells", unit="cell", file=sys.stderr,
                  disable=not progress) as bar:
            results = run_grid(tasks, workers=workers, ray=ray, progress=bar.update, status=bar.set_postfix_str)
        dram_gib = self.params.dram_bytes / 2**30
        table = format_table(results, dram_gib)
        notes = search_notes(results, dram_gib)
        if notes:
            table += "\n".join(notes) + "\n"
        sweep = format_budget_table(results)
        if sweep:
            table = f"{table}\n{sweep}"
        table += f"\n{LEGEND}\n"
        if self.quick:
            table += f"\n{QUICK_CAVEAT}\n"
        if out is not None:
            write_json(results, out / "results.json")
            plot_all(results, out, dram_gib, (self.params.slo_ttft_s, self.params.slo_percentile))
            (out / "table.txt").write_text(table)
        return results, table


def parse_comparison(workloads: str, configs: str, params: ServingParams, budgets: list[int], topology: str,
                     **kwargs) -> Comparison:
    topologies = parse_topologies(topology)
    names = [w.strip() for w in workloads.split(",") if w.strip()]
    return Comparison(names, parse_configs(configs), params, budgets, topologies, **kwargs)


__all__ = ["Comparison", "parse_comparison", "kind"]
