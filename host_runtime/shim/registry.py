"""Engine adapters in the project's one registry type: the built-ins below and whatever
packages publish under the entry-point group ``cxlhm.engine_adapters``.

Each adapter module describes itself with an ``ADAPTER = EngineAdapter(...)``: the engine
and interface it implements, the object the engine loads, and how the engine is told
to load it. The registry is what lists adapters (``ADAPTERS.names()``,
``ADAPTERS.load_all()``) and what the adapter tests iterate, so adding a built-in adapter
is its module, one line in ``builtins`` below, and its conformance subclass of
host_runtime.testing.shim.ShimConformance. An outside package publishes its
``ADAPTER`` instead::

    [project.entry-points."cxlhm.engine_adapters"]
    toy = "my_package.toy_adapter:ADAPTER"
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from cxlhm.registry import Registry


@dataclass(frozen=True)
class EngineAdapter:
    """What the registry knows of one engine adapter."""
    engine: str     # the engine and the storage interface the adapter implements
    entry: str      # "module:attr" of what the engine loads (or the user builds)
    loading: str    # how the engine is pointed at it, in one line

    def load_entry(self) -> object:
        """The object `entry` names (the adapter's module imports without its engine)."""
        module, _, attr = self.entry.partition(":")
        obj = importlib.import_module(module)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
        return obj


def _as_adapter(obj) -> EngineAdapter:
    if not isinstance(obj, EngineAdapter):
        raise TypeError(f"expected an EngineAdapter (a module's ADAPTER), got {type(obj).__name__}")
    try:
        obj.load_entry()
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"its entry {obj.entry!r} does not load: {type(exc).__name__}: {exc}") from None
    return obj


ADAPTERS: Registry[EngineAdapter] = Registry("engine adapter", "cxlhm.engine_adapters", check=_as_adapter, builtins={
    "sglang": "host_runtime.shim.sglang:ADAPTER",
    "lmcache": "host_runtime.shim.lmcache:ADAPTER",
    "vllm": "host_runtime.shim.vllm:ADAPTER",
    "mooncake": "host_runtime.shim.mooncake:ADAPTER",
    "hf": "host_runtime.shim.hf:ADAPTER",
})

__all__ = ["ADAPTERS", "EngineAdapter"]
