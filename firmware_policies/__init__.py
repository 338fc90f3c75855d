"""Firmware policies: one module per policy, found by name.

Built-ins are the modules of this package that define ``POLICY`` (adding a policy is
adding a file); third-party packages register more through the
``cxlhm.firmware_policies`` entry-point group. Both live in one registry,
`cxlhm.policies.REGISTRY`, re-exported here with the rest of the policy interface: the
core finds policies through it and never imports this package.

`firmware_policies.lists` has the slot lists and ghost lists the built-ins are made of,
for outside policies too.
"""
from __future__ import annotations

from cxlhm.policies import (ENTRY_POINT_GROUP, REGISTRY, BrokenPolicy, Param, Policy, PolicyParamError,
                            UnknownPolicy, UnknownPolicyName, as_policy, available, get)

__all__ = ["ENTRY_POINT_GROUP", "REGISTRY", "BrokenPolicy", "Param", "Policy", "PolicyParamError", "UnknownPolicy",
           "UnknownPolicyName", "as_policy", "available", "get"]
