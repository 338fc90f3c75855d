"""`cxlhm policies`: the firmware policies this installation knows, with their parameters."""
from __future__ import annotations

import sys

import firmware_policies
from firmware_policies.base import no_hint

NAME = "policies"
HELP = "list firmware policies, their one-line descriptions and parameters"
DESCRIPTION = """\
List every firmware policy: the built-ins in firmware_policies/ and those third-party
packages register under the `cxlhm.firmware_policies` entry-point group. Select one with
`firmware: {policy: NAME, params: {...}}` in a device config or `--policy NAME`.
An entry point that fails to load is listed by name with its error; the rest are listed.
Exit status 1 when any failed to load, 2 for an unknown name.
"""


def add_arguments(parser):
    parser.add_argument("names", nargs="*", help="only these policies")


def run(args) -> int:
    names = args.names or firmware_policies.available()
    unknown = [n for n in names if n not in firmware_policies.REGISTRY]
    if unknown:
        print(f"cxlhm policies: error: unknown firmware policy {unknown[0]!r}; available: "
              f"{', '.join(firmware_policies.available())}", file=sys.stderr)
        return 2
    broken = 0
    for name in names:
        try:
            policy = firmware_policies.get(name)
        except firmware_policies.BrokenPolicy as exc:
            print(f"{name:<10} BROKEN: {exc}")
            print(f"cxlhm policies: error: {exc}", file=sys.stderr)
            broken += 1
            continue
        tags = [policy.write_mode] + (["offline: trace-driven simulation only"] if policy.needs_future else [])
        tags.append("takes hints (on_hint)" if policy.on_hint is not no_hint else "no on_hint: ignores hints")
        print(f"{name:<10} {policy.description} [{'; '.join(tags)}]")
        for key, p in policy.params.items():
            print(f"{'':<10}   {key} ({p.type.__name__}, default {p.default!r}): {p.help}")
    return 1 if broken else 0
