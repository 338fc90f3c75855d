"""Firmware policies: one module per policy, found by name.

Built-ins are the modules of this package that define ``POLICY`` (adding a policy is
adding a file); third-party packages register more through the
``cxlhm.firmware_policies`` entry-point group (the entry point names a module or
object whose ``POLICY`` attribute, or which itself, is a `Policy`).
"""
from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

from firmware_policies.base import Param, Policy, PolicyParamError

ENTRY_POINT_GROUP = "cxlhm.firmware_policies"
_NOT_POLICIES = {"base"}
BUILTIN = {m.name: f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)
           if not m.name.startswith("_") and m.name not in _NOT_POLICIES}


class UnknownPolicy(KeyError):
    def __str__(self) -> str:
        return self.args[0]


def _third_party() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    return sorted(set(BUILTIN) | set(_third_party()))


def get(name: str) -> Policy:
    """The Policy registered as `name`; UnknownPolicy lists the known names."""
    if name in BUILTIN:
        return importlib.import_module(BUILTIN[name]).POLICY
    third = _third_party()
    if name in third:
        obj = third[name].load()
        policy = getattr(obj, "POLICY", obj)
        if not isinstance(policy, Policy):
            raise UnknownPolicy(f"entry point {name!r} ({third[name].value}) is not a cxlhm Policy")
        return policy
    raise UnknownPolicy(f"unknown firmware policy {name!r}; available: {', '.join(available())}")


__all__ = ["Param", "Policy", "PolicyParamError", "UnknownPolicy", "available", "get"]
