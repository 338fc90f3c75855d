"""The configuration x DRAM budget x workload (x topology) grid.

One `Task` is one cell: a reference replay at a fixed speed (the TTFT columns, the CDF
plot) and, optionally, the max-QPS search over replay speeds. Cells run

* locally in worker processes (concurrent.futures), by default. On Linux the firmware
  of the CXL-HM configurations is compiled (numba, ~15 s for hymcache) once in this
  process and the workers, forked, inherit it, so every cell is its own job, the slow
  ones (device configurations) first; elsewhere cells of one configuration and workload
  go to one worker as a group, which compiles once;
* on an existing Ray cluster with `ray="auto"` or an address (`pip install 'cxlhm[ray]'`; imported
  only then). Every cell is its own Ray task there: a cluster has cores to spare.

Results are plain dicts (metrics.summarize), ordered as the tasks were given.
"""
from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from cxlhm_apps.serving.configs import CxlHm, make_system, meta
from cxlhm_apps.serving.metrics import max_speed_under_slo, summarize
from cxlhm_apps.serving.params import ServingParams
from cxlhm_apps.serving.scheduler import SloMissed
from cxlhm_apps.serving.topologies import replay
from cxlhm_apps.serving.workloads import AgentConfig, WorkloadSpec, agent, build, spec_at_speed

def _cost(config: str) -> int:
    """Cells of slow configurations (the registry's metadata: the emulated device) start first."""
    return 0 if meta(config).slow else 1


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
    p = task.params

    def run(speed: float, fail_fast: bool = False) -> dict:
        w = build(spec_at_speed(task.workload, speed))
        try:
            res = replay(w, task.config, p, speed, task.topology, fail_fast=fail_fast)
        except SloMissed:  # an overloaded probe, stopped once its TTFT percentile was surely missed
            return {"speed": speed, "slo_met": False, "stopped_early": True, "ttft_slo_s": math.inf,
                    "tbt_slo_ms": math.nan, "throughput_rps": math.nan}
        return summarize(res, p.slo_ttft_s, p.slo_percentile, p.slo_tbt_ms)

    reference = run(task.reference_speed)

    def probe(speed: float) -> dict:
        return reference if speed == task.reference_speed else run(speed, fail_fast=True)

    out = {"config": task.config, "workload": task.workload.label, "topology": task.topology,
           "dram_gib": p.dram_bytes / 2**30, "reference": reference}
    if task.search_start is not None:
        search = max_speed_under_slo(probe, task.search_start, refine=task.refine)
        out["max_speed"] = search.max_speed
        out["max_qps"] = search.best["throughput_rps"] if search.best else 0.0
        out["at_max"] = search.best
        out["probes"] = [(s["speed"], s["ttft_slo_s"], s["tbt_slo_ms"], s["throughput_rps"]) for s in search.probes]
        # the search's resolution: the lowest failing probe above the answer bounds the truth
        above = [s["speed"] for s in search.probes if not s["slo_met"] and s["speed"] > search.max_speed]
        out["search_step"] = min(above) / search.max_speed if above and search.max_speed > 0 else math.inf
    return out


class CellFailed(RuntimeError):
    """A cell raised in a worker: its error as text (any exception survives the trip back,
    also one whose class cannot be pickled), naming the cell."""


def _run_group(tasks: Sequence[Task]) -> list[dict]:
    out = []
    for t in tasks:
        try:
            out.append(run_task(t))
        except Exception as exc:
            import traceback
            raise CellFailed(f"cell {t.config} / {t.workload.label} / {t.topology} / D {t.params.dram_bytes >> 30} GiB "
                             f"/ GPU pool {t.params.kv_pool_bytes >> 30} GiB failed: {type(exc).__name__}: {exc}\n"
                             f"{traceback.format_exc()}") from None
    return out


def run_grid(tasks: Sequence[Task], *, workers: int | None = None, ray: str | None = None,
             progress: Callable[[int], None] | None = None,
             status: Callable[[str], None] | None = None) -> list[dict]:
    """Run every task; `progress(n)` is called as n more cells finish, `status(text)`
    says what happens before the first one can (compiling, connecting)."""
    status = status or (lambda text: None)
    if ray:
        status(f"connecting to Ray ({ray})")
        return _run_ray(tasks, ray, progress, status)
    workers = workers or os.cpu_count() or 1
    context = fork_context()
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        # Forked workers inherit the compiled firmware: every cell can go on its own. Else
        # a worker compiles per process, so cells of one configuration and workload share one.
        groups[(t.config, t.workload.label) + ((i,) if context is not None else ())].append(i)
    order = sorted(groups, key=lambda g: (_cost(g[0]), g))
    results: list[dict | None] = [None] * len(tasks)
    if workers <= 1 or len(order) <= 1:
        for group in order:
            for i in groups[group]:
                results[i] = run_task(tasks[i])
                if progress:
                    progress(1)
        return results
    if context is not None:
        if any(isinstance(make_system(c), CxlHm) for c in {t.config for t in tasks}):
            status("compiling the CXL-HM firmware (numba)")
        warm_up({t.config for t in tasks})
        status("")
    with ProcessPoolExecutor(max_workers=min(workers, len(order)), mp_context=context) as pool:
        futures = {pool.submit(_run_group, [tasks[i] for i in groups[g]]): g for g in order}
        for fut in as_completed(futures):
            for i, res in zip(groups[futures[fut]], fut.result()):
                results[i] = res
            if progress:
                progress(len(groups[futures[fut]]))
    return results


def fork_context():
    """Forked workers (Linux) inherit what the parent compiled; elsewhere, the default."""
    if sys.platform != "linux":
        return None
    return multiprocessing.get_context("fork")


def warm_up(configs) -> None:
    """Compile the CXL-HM firmware (numba: ~15 s for hymcache, longer on busy cores) once,
    in this process, before the workers fork and inherit it - rather than once per
    worker and cell group. A tiny replay with a small GPU pool and device DRAM goes
    through the access, write-back, hint and prefetch paths (the prefetch path is
    otherwise compiled lazily in the middle of some probe)."""
    device = [c for c in sorted(configs) if isinstance(make_system(c), CxlHm)]
    if not device:
        return
    w = agent(AgentConfig(sessions=6, session_rate=1.0, max_context_tokens=12000))  # a few short sessions
    params = ServingParams(gpu_kv_bytes=2 << 30, dram_bytes=256 << 20)
    for config in device:
        replay(w, config, params, 1.0)


class RayUnavailable(RuntimeError):
    """--ray was asked for and Ray is not installed."""


def _run_ray(tasks: Sequence[Task], address: str, progress, status) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray, an optional extra: pip install 'cxlhm[ray]' (or 'ray>=2.9')") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    status("")
    remote = ray.remote(run_task)
    refs = [remote.remote(t) for t in sorted(tasks, key=lambda t: _cost(t.config))]
    index = {ref: i for i, ref in enumerate(refs)}
    ordered = sorted(range(len(tasks)), key=lambda i: _cost(tasks[i].config))
    results: list[dict | None] = [None] * len(tasks)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            results[ordered[index[ref]]] = ray.get(ref)
            if progress:
                progress(1)
    return results
