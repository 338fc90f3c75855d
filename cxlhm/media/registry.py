"""The registered back ends, by `backend.kind`. An entry names its class as
"module:Class", imported on first use, so the configuration validates kinds without
importing any back end."""
from __future__ import annotations

import importlib

BACKENDS: dict[str, str] = {
    "ssd": "cxlhm.media.ssd:SsdBackend",
    "memory": "cxlhm.media.memory:MemoryBackend",
}


def backend_kinds() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend_class(kind: str):
    """The Backend subclass registered as `kind` (KeyError if none)."""
    module, _, name = BACKENDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def open_backend(cfg):
    """The back end `cfg.backend` describes, opened (and its image locked)."""
    cls = backend_class(cfg.backend.kind)
    return cls(cfg.backend.path, cfg.capacity, cfg.backend.queue_depth, source=cfg.source_of("backend.path"))
