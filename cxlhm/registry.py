"""One registry type for every pluggable family (firmware policies, CLI commands, trace
formats, ...): a name maps to an implementation, from the built-ins given at construction
plus whatever installed packages publish under the family's entry-point group.

    POLICIES = Registry("firmware policy", "cxlhm.firmware_policies",
                        builtins={"lru": "firmware_policies.lru:POLICY"}, check=as_policy)
    POLICIES.names()          # built-ins and entry points, sorted
    POLICIES.get("lru")       # the implementation (loaded on first use, then cached)
    loaded, broken = POLICIES.load_all()   # every implementation that loads, and what did not
    POLICIES.register("mru", "mypkg.mru")  # add one in-process (a test, a script): no package installed
    POLICIES.unregister("mru")

An installed package adds to a family through the entry-point group; a test or a script
adds through `register` ("module:attr", imported on first use) or `add` (the object),
and takes it out with `unregister` (docs/extending.md lists every family).

Built-ins and entry points load lazily: a broken third-party package costs nothing until
its name is asked for, and then it is reported as a `BrokenEntry` naming the entry point
(``group``, name and ``module:attr``) and the error, never as a bare ImportError from
somewhere inside it. `load_all()` keeps going past broken entries, so a listing shows the
rest. A built-in of the same name wins over an entry point (a package cannot shadow it).
"""
from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

T = TypeVar("T")

Loader = str | Callable[[], object]  # "module:attr" / "module", or a zero-argument factory


class RegistryError(LookupError):
    def __str__(self) -> str:  # KeyError-like classes would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownName(RegistryError):
    """No implementation is registered under the name; the message lists the known ones."""


class BrokenEntry(RegistryError):
    """An implementation that is registered but cannot be loaded or is the wrong kind."""

    def __init__(self, message: str, *, name: str, source: str):
        super().__init__(message)
        self.name, self.source = name, source

    def __reduce__(self):  # survives the trip out of a worker process (name and source are keywords)
        return _rebuild_broken, (type(self), str(self), self.name, self.source)


def _rebuild_broken(cls, message, name, source):
    return cls(message, name=name, source=source)


def _import_target(spec: str) -> object:
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Name -> implementation for one family (see the module doc).

    `check(obj)` turns what a loader returned into the implementation (e.g. takes a
    module's ``POLICY`` attribute) or raises TypeError/ValueError saying why it is not one;
    the registry wraps that into a BrokenEntry naming the source."""

    def __init__(self, family: str, group: str | None = None, *, builtins: Mapping[str, Loader] | None = None,
                 check: Callable[[object], T] | None = None, unknown_error: type[UnknownName] = UnknownName,
                 broken_error: type[BrokenEntry] = BrokenEntry):
        self.family, self.group = family, group
        self._check = check or (lambda obj: obj)
        self._unknown, self._broken = unknown_error, broken_error
        self._cache: dict[str, T] = {}
        self._lock = threading.RLock()  # a loader may look another name up
        self._builtins: dict[str, tuple[Callable[[], object], str]] = {}
        for name, loader in (builtins or {}).items():
            self.register(name, loader)

    # -- registration ------------------------------------------------------------------
    def register(self, name: str, loader: Loader, *, replace: bool = False) -> None:
        """Add a built-in: a "module:attr" (or "module") string imported on first use,
        or a zero-argument factory."""
        if name in self._builtins and not replace:
            raise ValueError(f"{self.family} {name!r} is already registered")
        if isinstance(loader, str):
            spec = loader
            self._builtins[name] = (lambda: _import_target(spec), f"built-in {self.family} {name!r} ({spec})")
        elif callable(loader):
            self._builtins[name] = (loader, f"built-in {self.family} {name!r}")
        else:
            raise TypeError(f"register({name!r}, ...): expected a 'module:attr' string or a factory, "
                            f"got {type(loader).__name__}")
        self._cache.pop(name, None)

    def add(self, name: str, implementation: T, *, replace: bool = False) -> None:
        """Add a built-in that is the implementation itself."""
        self.register(name, lambda: implementation, replace=replace)

    def unregister(self, name: str) -> None:
        self._builtins.pop(name, None)
        self._cache.pop(name, None)

    # -- lookup ------------------------------------------------------------------------
    def entry_points(self) -> dict[str, EntryPoint]:
        """The installed entry points of this family's group, by name (none without a group)."""
        if not self.group:
            return {}
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def builtin_names(self) -> list[str]:
        return sorted(self._builtins)

    def names(self) -> list[str]:
        return sorted(set(self._builtins) | set(self.entry_points()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._builtins or name in self.entry_points())

    def source(self, name: str) -> str:
        """Where `name` comes from: "built-in" or "entry point GROUP:NAME = VALUE"."""
        if name in self._builtins:
            return "built-in"
        ep = self.entry_points().get(name)
        if ep is None:
            raise self._unknown(self._unknown_message(name))
        return f"entry point {self.group}:{ep.name} = {ep.value}"

    def get(self, name: str) -> T:
        """The implementation registered as `name` (cached after the first load).
        UnknownName lists the known names; BrokenEntry names the source and the error."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        with self._lock:
            if name in self._cache:
                return self._cache[name]
            obj = self._load(name)
            self._cache[name] = obj
            return obj

    def load_all(self, names: Iterable[str] | None = None) -> tuple[dict[str, T], list[BrokenEntry]]:
        """({name: implementation} for every name that loads, [BrokenEntry for the rest])."""
        loaded: dict[str, T] = {}
        broken: list[BrokenEntry] = []
        for name in (self.names() if names is None else names):
            try:
                loaded[name] = self.get(name)
            except BrokenEntry as exc:
                broken.append(exc)
        return loaded, broken

    # -- internals ---------------------------------------------------------------------
    def _unknown_message(self, name: str) -> str:
        return f"unknown {self.family} {name!r}; available: {', '.join(self.names()) or '(none)'}"

    def _load(self, name: str) -> T:
        if name in self._builtins:
            load, source = self._builtins[name]
        else:
            ep = self.entry_points().get(name)
            if ep is None:
                raise self._unknown(self._unknown_message(name))
            source = f"entry point {ep.name!r} ({ep.value}) in group {self.group}"
            load = ep.load
        try:
            obj = load()
        except Exception as exc:  # a third-party module may raise anything at import
            raise self._broken(f"{self.family} {source} failed to load: {type(exc).__name__}: {exc}",
                               name=name, source=source) from exc
        try:
            return self._check(obj)
        except (TypeError, ValueError) as exc:
            raise self._broken(f"{self.family} {source} is not usable: {exc}", name=name, source=source) from exc
