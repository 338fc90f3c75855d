"""What a firmware policy is, and where the core finds one by name.

The core (the device, the trace simulator, the window) reaches policies only through
this module: `get(name)` looks the name up in `REGISTRY`, whose built-ins are the modules
of the `firmware_policies` package that define ``POLICY`` (named here as strings and
imported on first use, so the core never imports the policies package) and whose
third-party entries come from the ``cxlhm.firmware_policies`` entry-point group (the entry
point names a module or object whose ``POLICY`` attribute, or which itself, is a
`Policy`). A broken entry point is reported naming it, and the other policies still load.

A policy is one module that builds a `Policy`. Its hooks are numba functions compiled
with ``nopython=True, nogil=True``; the firmware runtime inlines them into its access
kernel, so they run without the interpreter and without the GIL.

Hook signatures (``ps`` is the policy's own state tuple, ``bt`` the block table,
``now`` the firmware's logical clock: one tick per block access):

  on_hit(ps, bt, slot, is_write, now)           a host access found the block resident
  on_insert(ps, bt, slot, is_write, now)        a missed block was just placed in `slot`
  victim(ps, bt, now) -> slot                   pick a resident, evictable slot (-1: none)
  on_evict(ps, bt, slot, now)                   `slot` is about to be emptied
  on_hint(ps, bt, kind, session, first, n, arg, now)
                                                a mailbox hint (optional): kinds in
                                                cxlhm.mailbox.hints; `arg` is the kind's
                                                argument (deadline / expected pause, ns)
  background(ps, bt, now, budget, out) -> n     fill out[i] = (job, block, session) with up
                                                to `budget` JOB_PREFETCH / JOB_FLUSH jobs
                                                (optional); bt.scalars[NOW_NS] is the time
  upcoming(ps, bt, block, slot)                 `block` (resident in `slot`, or -1: a miss)
                                                is accessed a few accesses from now
                                                (optional; the trace simulator, which knows
                                                its trace, calls it): prefetch the cache
                                                lines the hooks will read for it
                                                (cxlhm.jit.prefetch); must change nothing

`victim` must skip slots for which `blocktable.evictable(bt, slot)` is false (pinned,
or busy in the access being planned); the runtime checks and fails loudly if not.

Offline policies (Belady) set ``needs_future=True``: their ``make_state(n_slots, params,
next_use)`` also takes the trace's next-use array (``next_use[t]`` = the logical time
of the next access to the block accessed at time ``t``, or ``NO_NEXT_USE``), indexed by
the hooks' ``now``. Only the trace-driven simulator (`cxlhm.sim`) can provide it.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from cxlhm.jit import njit
from cxlhm.registry import BrokenEntry, Registry, RegistryError, UnknownName

# next_use[] value for "never accessed again"
NO_NEXT_USE = (1 << 62)

# background() job kinds
JOB_PREFETCH = 1
JOB_FLUSH = 2

ENTRY_POINT_GROUP = "cxlhm.firmware_policies"
BUILTIN_PACKAGE = "firmware_policies"
# modules of the built-in package that are policy building blocks, not policies
NOT_POLICIES = frozenset({"base", "lists"})


@njit
def no_hint(ps, bt, kind, session, first_block, n_blocks, arg, now):
    return


@njit
def no_background(ps, bt, now, budget, out):
    return 0


@njit(inline="always")
def no_upcoming(ps, bt, block, slot):
    return


@dataclasses.dataclass(frozen=True)
class Param:
    """A declared policy parameter: its type, default and a one-line help."""
    type: type
    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    check_text: str = ""


class PolicyParamError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    description: str
    make_state: Callable[[int, dict], tuple]  # (n_slots, params) -> tuple of numpy arrays
    on_hit: Callable
    on_insert: Callable
    victim: Callable
    on_evict: Callable
    on_hint: Callable = no_hint
    background: Callable = no_background
    upcoming: Callable = no_upcoming
    params: Mapping[str, Param] = dataclasses.field(default_factory=dict)
    write_mode: str = "write-back"
    needs_future: bool = False  # make_state takes a third argument: the next-use array

    def resolve_params(self, given: Mapping[str, Any] | None) -> dict:
        """Defaults overlaid with `given`, type-checked; errors list the accepted parameters."""
        given = dict(given or {})
        accepted = ", ".join(f"{k} ({p.type.__name__}, default {p.default!r}: {p.help})" for k, p in self.params.items()) or "none"
        out = {k: p.default for k, p in self.params.items()}
        for key, value in given.items():
            if key not in self.params:
                raise PolicyParamError(f"policy {self.name!r} has no parameter {key!r}; accepted: {accepted}")
            p = self.params[key]
            if p.type is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, p.type) or isinstance(value, bool) and p.type is not bool:
                raise PolicyParamError(f"policy {self.name!r} parameter {key!r} must be {p.type.__name__}, got {value!r}")
            if p.check is not None and not p.check(value):
                raise PolicyParamError(f"policy {self.name!r} parameter {key!r} {p.check_text}, got {value!r}")
            out[key] = value
        return out


class UnknownPolicy(RegistryError, KeyError):
    """A policy name that cannot be used: not registered (UnknownPolicyName) or its
    package is broken (BrokenPolicy)."""


class UnknownPolicyName(UnknownName, UnknownPolicy):
    pass


class BrokenPolicy(BrokenEntry, UnknownPolicy):
    pass


def as_policy(obj) -> Policy:
    policy = getattr(obj, "POLICY", obj)
    if not isinstance(policy, Policy):
        raise TypeError(f"{type(policy).__name__} is not a cxlhm Policy (expected a Policy or a module with POLICY)")
    return policy


def _builtin_modules() -> dict[str, str]:
    """{name: "firmware_policies.<name>"} for the built-in package's policy modules,
    found by path (the package is not imported until a policy is asked for)."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return {}
    return {m.name: f"{BUILTIN_PACKAGE}.{m.name}" for m in pkgutil.iter_modules(spec.submodule_search_locations)
            if not m.name.startswith("_") and m.name not in NOT_POLICIES}


REGISTRY: Registry[Policy] = Registry(
    "firmware policy", ENTRY_POINT_GROUP, builtins=_builtin_modules(),
    check=as_policy, unknown_error=UnknownPolicyName, broken_error=BrokenPolicy)


def available() -> list[str]:
    return REGISTRY.names()


def get(name: str) -> Policy:
    """The Policy registered as `name`; UnknownPolicy lists the known names or names the
    broken entry point."""
    return REGISTRY.get(name)


def registered(policy: Policy) -> bool:
    """Is `policy` the object the registry hands out under its name (so generated code
    can name it)?"""
    try:
        return get(policy.name) is policy
    except UnknownPolicy:
        return False
