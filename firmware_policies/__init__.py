"""Firmware policies: one module per policy, found by name.

Built-ins are the modules of this package that define ``POLICY`` (adding a policy is
adding a file); third-party packages register more through the
``cxlhm.firmware_policies`` entry-point group (the entry point names a module or
object whose ``POLICY`` attribute, or which itself, is a `Policy`). Both live in one
`cxlhm.registry.Registry`, `REGISTRY`: a broken entry point is reported naming it, and
the other policies still load.
"""
from __future__ import annotations

import pkgutil

from cxlhm.registry import BrokenEntry, Registry, RegistryError, UnknownName
from firmware_policies.base import Param, Policy, PolicyParamError

ENTRY_POINT_GROUP = "cxlhm.firmware_policies"
_NOT_POLICIES = {"base"}


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


REGISTRY: Registry[Policy] = Registry(
    "firmware policy", ENTRY_POINT_GROUP,
    builtins={m.name: f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)
              if not m.name.startswith("_") and m.name not in _NOT_POLICIES},
    check=as_policy, unknown_error=UnknownPolicyName, broken_error=BrokenPolicy)


def available() -> list[str]:
    return REGISTRY.names()


def get(name: str) -> Policy:
    """The Policy registered as `name`; UnknownPolicy lists the known names or names the
    broken entry point."""
    return REGISTRY.get(name)


__all__ = ["REGISTRY", "BrokenPolicy", "Param", "Policy", "PolicyParamError", "UnknownPolicy", "available", "get"]
