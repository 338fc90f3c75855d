"""The back ends, by `backend.kind`: the built-ins below plus what installed packages
publish under the `cxlhm.backends` entry-point group (a `Backend` subclass). Entries
load on first use, so the configuration validates kinds without importing any back end."""
from __future__ import annotations

from cxlhm.registry import Registry, RegistryError


def _as_backend(obj):
    from cxlhm.media.backend import Backend
    if not (isinstance(obj, type) and issubclass(obj, Backend)):
        raise TypeError(f"expected a subclass of cxlhm.media.backend.Backend, got {obj!r}")
    return obj


BACKENDS: Registry = Registry("back end", "cxlhm.backends", check=_as_backend, builtins={
    "ssd": "cxlhm.media.ssd:SsdBackend",
    "memory": "cxlhm.media.memory:MemoryBackend",
})


def backend_kinds() -> list[str]:
    return BACKENDS.names()


def open_backend(cfg):
    """The back end `cfg.backend` describes, opened (and its image locked)."""
    from cxlhm.configerror import ConfigError
    try:
        cls = BACKENDS.get(cfg.backend.kind)
    except RegistryError as exc:  # an entry point that does not load
        raise ConfigError(cfg.source_of("backend.kind"), "backend.kind", str(exc)) from None
    return cls(cfg.backend.path, cfg.capacity, cfg.backend.queue_depth, source=cfg.source_of("backend.path"))
