"""The `cxlhm` command line. Subcommands live in cxlhm/commands/, one module each."""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from cxlhm import commands
from cxlhm.config import ConfigError


def _command_modules():
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"{commands.__name__}.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cxlhm",
        description="cxlhm: an emulated CXL hybrid-memory device (device DRAM in front of an SSD) "
                    "with swappable firmware policies, a hint mailbox and a KV-cache store.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        p = sub.add_parser(module.NAME, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except ConfigError as exc:
        print(f"cxlhm: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cxlhm ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
