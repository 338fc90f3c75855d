"""`cxlhm policies`: the firmware policies this installation knows, with their parameters."""
from __future__ import annotations

import firmware_policies

NAME = "policies"
HELP = "list firmware policies, their one-line descriptions and parameters"
DESCRIPTION = """\
List every firmware policy: the built-ins in firmware_policies/ and those third-party
packages register under the `cxlhm.firmware_policies` entry-point group. Select one with
`firmware: {policy: NAME, params: {...}}` in a device config or `--policy NAME`.
"""


def add_arguments(parser):
    parser.add_argument("names", nargs="*", help="only these policies")


def run(args) -> int:
    names = args.names or firmware_policies.available()
    for name in names:
        try:
            policy = firmware_policies.get(name)
        except firmware_policies.UnknownPolicy as exc:
            print(f"cxlhm policies: {exc}")
            return 2
        tags = [policy.write_mode] + (["offline: trace-driven simulation only"] if policy.needs_future else [])
        print(f"{name:<10} {policy.description} [{'; '.join(tags)}]")
        for key, p in policy.params.items():
            print(f"{'':<10}   {key} ({p.type.__name__}, default {p.default!r}): {p.help}")
    return 0
