"""A policy hook that numba cannot compile, said in one line.

Numba's typing errors run to thousands of characters: every nested pipeline it tried,
then the chain of calls from the simulator's compiled loop down to the offending line.
A policy author needs three things from it - which hook, which line of their file, and
numba's own reason - so `explain(exc)` finds them:

    policy lecar: on_insert (lecar.py:81) does not compile: Cannot unify int64 and float64 ...

The hook is the one of a loaded policy whose source lines hold one of the error's
locations; the line is the innermost location in that hook's folder (a helper the hook
calls, in the same package, is named rather than the call). The full text stays on the
exception (`PolicyCompileError.full_text`) for CXLHM_TRACEBACK=1.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from dataclasses import dataclass

HOOKS = ("on_hit", "on_insert", "victim", "on_evict", "on_hint", "background", "upcoming")

# numba names a source location either way: 'File "path", line 28:' or 'at /abs/path (28)'
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_AT_LINE = re.compile(r"\bat (/[^\s()]+) \((\d+)\)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PIPELINE = re.compile(r"^Failed in \w+ mode pipeline \(step: [^)]*\)$")


class PolicyCompileError(ValueError):
    """A policy's hook that does not compile: the user's code, not a cxlhm bug."""

    def __init__(self, policy: str, hook: str, where: str, reason: str, full_text: str):
        self.policy, self.hook, self.where, self.reason, self.full_text = policy, hook, where, reason, full_text
        super().__init__(f"policy {policy}: {hook} ({where}) does not compile: {reason}")


@dataclass(frozen=True)
class _Hook:
    policy: str
    hook: str
    path: str
    first: int
    last: int


def is_compile_error(exc: BaseException) -> bool:
    """True for numba's compile-time errors (without importing numba when nothing did)."""
    errors = sys.modules.get("numba.core.errors")
    return errors is not None and isinstance(exc, errors.NumbaError)


def one_line_reason(text: str) -> str:
    """Numba's reason without its pipeline preamble: the first line that says something,
    with the line after it when it ends in a colon (the signature numba could not match)."""
    lines = [line.strip() for line in _ANSI.sub("", text).splitlines()]
    lines = [line for line in lines if line and not _PIPELINE.match(line)]
    if not lines:
        return "numba could not compile it"
    reason = lines[0]
    if reason.endswith(":") and len(lines) > 1:
        reason = f"{reason} {lines[1]}"
    return " ".join(reason.split())


def locations(text: str) -> list[tuple[str, int]]:
    """Every (absolute path, line) numba names, in the order of its message (innermost first)."""
    found = []
    for m in re.finditer(f"{_FILE_LINE.pattern}|{_AT_LINE.pattern}", _ANSI.sub("", text)):
        path, line = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        found.append((os.path.abspath(path), int(line)))
    return found


def _hooks_of(policies) -> list[_Hook]:
    out = []
    for policy in policies:
        for hook in HOOKS:
            fn = getattr(policy, hook, None)
            fn = getattr(fn, "py_func", fn)
            code = getattr(fn, "__code__", None)
            if code is None:
                continue
            try:
                source, first = inspect.getsourcelines(fn)
            except (OSError, TypeError):
                continue
            out.append(_Hook(policy.name, hook, os.path.abspath(code.co_filename), first, first + len(source) - 1))
    return out


def loaded_policies() -> list:
    """The policies this process has loaded: from the registry's cache and any module
    with a POLICY (an outside package's module may hold one the registry has not cached)."""
    from cxlhm import policies
    from cxlhm.policies import Policy
    seen: dict[int, object] = {}
    for policy in getattr(policies.REGISTRY, "_cache", {}).values():
        seen[id(policy)] = policy
    for module in list(sys.modules.values()):
        policy = getattr(module, "POLICY", None)
        if isinstance(policy, Policy):
            seen[id(policy)] = policy
    return list(seen.values())


def explain(exc: BaseException, policies=None) -> PolicyCompileError | None:
    """The one-line account of a numba error raised while compiling a policy's hook, or
    None when `exc` is not one or names no hook of a loaded policy (then it is a cxlhm bug)."""
    if not is_compile_error(exc):
        return None
    text = str(exc)
    where = locations(text)
    hooks = _hooks_of(loaded_policies() if policies is None else policies)
    for path, line in where:
        for hook in hooks:
            if path == hook.path and hook.first <= line <= hook.last:
                folder = os.path.dirname(hook.path)
                inner = next(((p, n) for p, n in where if os.path.dirname(p) == folder), (path, line))
                return PolicyCompileError(hook.policy, hook.hook, f"{os.path.basename(inner[0])}:{inner[1]}",
                                          one_line_reason(text), text)
    return None
