"""The configuration x DRAM budget x workload (x topology) grid.

One `Task` is one cell: a reference replay at a fixed speed (the TTFT columns, the CDF
plot) and, optionally, the max-QPS search over replay speeds. Cells run

* locally in worker processes (concurrent.futures), by default. Cells of one
  configuration and workload go to one worker as a group, so a firmware policy is
  compiled (numba, ~15 s) once per group rather than once per cell;
* on an existing Ray cluster with `ray="auto"` or an address (`pip install ray`; imported
  only then). Every cell is its own Ray task there: a cluster has cores to spare.

Results are plain dicts (metrics.summarize), ordered as the tasks were given.
"""
from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from cxlhm.serving.metrics import max_speed_under_slo, summarize
from cxlhm.serving.params import ServingParams
from cxlhm.serving.scheduler import replay
from cxlhm.serving.workloads import WorkloadSpec, build

# Order cells so the slow ones (device configurations) start first.
_COST = {"cxlhm-hymcache": 0, "cxlhm-lru": 1}


@dataclasses.dataclass(frozen=True)
class Task:
    workload: WorkloadSpec
    config: str
    params: ServingParams
    topology: str = "colocated"
    reference_speed: float = 1.0
    search_start: float | None = None   # None: no max-QPS search
    refine: int = 4   # bisection steps after bracketing: 2^(1/2^4) ~ 4% resolution


def run_task(task: Task) -> dict:
    """One cell (runs in a worker)."""
    w = build(task.workload)
    p = task.params

    def run(speed: float) -> dict:
        return summarize(replay(w, task.config, p, speed, task.topology), p.slo_ttft_s, p.slo_percentile,
                         p.slo_tbt_ms)

    out = {"config": task.config, "workload": task.workload.label, "topology": task.topology,
           "dram_gib": p.dram_bytes / 2**30, "reference": run(task.reference_speed)}
    if task.search_start is not None:
        search = max_speed_under_slo(run, task.search_start, refine=task.refine)
        out["max_speed"] = search.max_speed
        out["max_qps"] = search.best["throughput_rps"] if search.best else 0.0
        out["at_max"] = search.best
        out["probes"] = [(s["speed"], s["ttft_slo_s"], s["tbt_slo_ms"], s["throughput_rps"]) for s in search.probes]
    return out


def _run_group(tasks: Sequence[Task]) -> list[dict]:
    return [run_task(t) for t in tasks]


def run_grid(tasks: Sequence[Task], *, workers: int | None = None, ray: str | None = None,
             progress: Callable[[int], None] | None = None) -> list[dict]:
    """Run every task; `progress(n)` is called as n more cells finish."""
    if ray:
        return _run_ray(tasks, ray, progress)
    workers = workers or os.cpu_count() or 1
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        groups[(t.config, t.workload.label)].append(i)
    order = sorted(groups, key=lambda g: (_COST.get(g[0], 9), g))
    results: list[dict | None] = [None] * len(tasks)
    if workers <= 1 or len(order) <= 1:
        for config in order:
            for i in groups[config]:
                results[i] = run_task(tasks[i])
                if progress:
                    progress(1)
        return results
    with ProcessPoolExecutor(max_workers=min(workers, len(order))) as pool:
        futures = {pool.submit(_run_group, [tasks[i] for i in groups[c]]): c for c in order}
        for fut in as_completed(futures):
            for i, res in zip(groups[futures[fut]], fut.result()):
                results[i] = res
            if progress:
                progress(len(groups[futures[fut]]))
    return results


def _run_ray(tasks: Sequence[Task], address: str, progress) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'ray[default]' (an optional extra)") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(run_task)
    refs = [remote.remote(t) for t in sorted(tasks, key=lambda t: _COST.get(t.config, 9))]
    index = {ref: i for i, ref in enumerate(refs)}
    ordered = sorted(range(len(tasks)), key=lambda i: _COST.get(tasks[i].config, 9))
    results: list[dict | None] = [None] * len(tasks)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            results[ordered[index[ref]]] = ray.get(ref)
            if progress:
                progress(1)
    return results
