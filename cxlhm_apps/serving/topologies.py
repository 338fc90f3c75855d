"""Serving topologies by name: how a replay lays prefill and decode over GPUs.

A topology is an engine class with scheduler.Engine's interface - constructed as
``Engine(workload, config, params, speed, gpu, fail_fast)``, ``run()`` returning a
ReplayResult, a ``topology`` name - kept in the project's registry: the built-ins below
(`colocated`: one GPU prefills and decodes, scheduler.Engine; `disagg`: GPU 0 prefills,
GPU 1 decodes, disagg.DisaggEngine) plus whatever installed packages publish under the
entry-point group ``cxlhm.serving_topologies``. Loaded on first use, so neither engine
module imports the other's.
"""
from __future__ import annotations

from cxlhm.registry import Registry, RegistryError
from cxlhm_apps.serving.params import ServingParams


def _as_engine(obj):
    if not isinstance(obj, type) or not callable(getattr(obj, "run", None)):
        raise TypeError(f"{obj!r} is not an engine class with run() (see cxlhm_apps.serving.scheduler.Engine)")
    return obj


TOPOLOGIES: Registry = Registry("serving topology", "cxlhm.serving_topologies", check=_as_engine, builtins={
    "colocated": "cxlhm_apps.serving.scheduler:Engine",
    "disagg": "cxlhm_apps.serving.disagg:DisaggEngine",
})
BOTH = ("colocated", "disagg")   # what `--topology both` runs


def engine_for(topology: str):
    """The engine class registered as `topology` (ValueError naming the known ones, or
    the broken entry point)."""
    try:
        return TOPOLOGIES.get(topology)
    except RegistryError as exc:
        raise ValueError(str(exc)) from None


def parse_topologies(text: str) -> list[str]:
    """`both`, or comma-separated registered names; each is checked now."""
    names = list(BOTH) if text == "both" else [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError(f"no topology given; known: {', '.join(TOPOLOGIES.names())}, or both")
    for name in names:
        engine_for(name)
    return names


def replay(workload, config: str, params: ServingParams = ServingParams(), speed: float = 1.0,
           topology: str = "colocated", gpu=None, *, fail_fast: bool = False):
    """Replay `workload` at `speed` through configuration `config` on `topology`.
    `fail_fast`: raise scheduler.SloMissed as soon as the TTFT percentile of params' SLO
    is surely missed (the max-QPS search's overloaded probes, which otherwise run their
    growing queues to the end)."""
    return engine_for(topology)(workload, config, params, speed, gpu, fail_fast).run()
