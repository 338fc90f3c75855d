"""What a firmware policy is: parameters, state, and compiled hooks.

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

`victim` must skip slots for which `blocktable.evictable(bt, slot)` is false (pinned,
or busy in the access being planned); the runtime checks and fails loudly if not.

Offline policies (Belady) set ``needs_future=True``: their ``make_state(n_slots, params,
next_use)`` also takes the trace's next-use array (``next_use[t]`` = the logical time
of the next access to the block accessed at time ``t``, or ``NO_NEXT_USE``), indexed by
the hooks' ``now``. Only the trace-driven simulator (`cxlhm.sim`) can provide it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any
from cxlhm.jit import njit


# next_use[] value for "never accessed again"
NO_NEXT_USE = (1 << 62)

# background() job kinds
JOB_PREFETCH = 1
JOB_FLUSH = 2


@njit
def no_hint(ps, bt, kind, session, first_block, n_blocks, arg, now):
    return


@njit
def no_background(ps, bt, now, budget, out):
    return 0


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
