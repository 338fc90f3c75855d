"""Per-policy compiled glue: the one generator of the modules whose compiled functions
inline a policy's hooks - the firmware kernels (cxlhm/firmware_kernels.py), the streamed
I/O loop (cxlhm/device/stream/loop_kernels.py), the trace simulator's replay loops
(cxlhm/sim_kernels.py) and the window's fault-service cfunc (cxlhm/window/firmware_cfuncs.py).

A glue module's source names its policy on one line, `POLICY_LINE`, and reaches every
hook through that module global. `policy_module(kind, policy, source, what)` makes the
module for one policy:

  - a registered policy (the object `cxlhm.policies.get` hands out under its name): the
    line names it by that name, and the source is written to the compile cache and
    imported from there (`cxlhm.jit.generated_module`), so numba caches what it
    compiles on disk and the next process loads it; the first compile says so on stderr.
  - any other Policy object (one built in a test, say): the line binds the object
    itself and the source is compiled in memory, in every process.

Hooks reach the compiled code as module globals, never as closure cells: numba keys a
closure by its pickled cells, which carry a random id, so a closure is never found in
the disk cache again (cxlhm/jit.py).
"""
from __future__ import annotations

import hashlib
import sys
import threading
import types
from pathlib import Path

from cxlhm import jit
from cxlhm import policies
from cxlhm.policies import Policy

POLICY_LINE = '_policy = policies.get("lru")  # the policy of this copy'

_MODULES: dict[tuple, object] = {}
_LOCK = threading.RLock()  # a module's code asks for another policy module (the kernels) while it loads


def policy_tag(policy: Policy) -> str:
    """A hash of the policy's own source files outside firmware_policies (whose files
    the cache stamp covers already): a third-party policy's edit compiles afresh."""
    digest = hashlib.sha256(policy.name.encode())
    for hook in (policy.on_hit, policy.on_insert, policy.victim, policy.on_evict, policy.on_hint, policy.background,
                 policy.upcoming):
        module = sys.modules.get(getattr(getattr(hook, "py_func", hook), "__module__", ""), None)
        if getattr(module, "__file__", None):
            digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:8]


def policy_module(kind: str, policy: Policy, source: str, what: str):
    """The module `source` (which binds its policy with `POLICY_LINE`) for `policy`, once
    per process (see the module doc). `kind` names the glue in the cache ("firmware",
    "stream", "sim", "window"); `what` is what the first compile is said to compile."""
    if source.count(POLICY_LINE) != 1:
        raise ValueError(f"{kind} glue source must bind its policy on one line: {POLICY_LINE!r}")
    variant = hashlib.sha256(source.encode()).hexdigest()[:12]
    key = (id(policy), kind, variant)
    with _LOCK:
        if key not in _MODULES:
            _MODULES[key] = _make(kind, policy, source, what, variant)
        return _MODULES[key]


def _make(kind: str, policy: Policy, source: str, what: str, variant: str):
    if policies.registered(policy):
        name = f"{kind}_{policy.name}_{policy_tag(policy)}_{variant}"
        jit.compiling_notice(what, jit.cache_dir() / "numba" / jit.STAMP / f"{name}_{jit.STAMP}")
        module = jit.generated_module(name, source.replace(POLICY_LINE, f"_policy = policies.get({policy.name!r})"))
        if module is not None:
            return module
    # an unregistered policy object, or no writable cache folder: compiled in memory, every process
    namespace = {"__name__": f"cxlhm_{kind}_{policy.name}", "_given_policy": policy}
    exec(compile(source.replace(POLICY_LINE, "_policy = _given_policy"), f"<cxlhm {kind} for {policy.name}>", "exec"),
         namespace)
    return types.SimpleNamespace(**namespace)
