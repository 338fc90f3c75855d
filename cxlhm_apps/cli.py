"""The `cxlhm` command line. Subcommands live in cxlhm_apps/commands/, one module each;
packages add more through the ``cxlhm.commands`` entry-point group (a module with NAME,
HELP, add_arguments(parser) and run(args); optionally split_argv(words) -> (words for its
parser, the rest, as args.extra_words)). A command that fails to load is reported on
stderr by its entry point and the others still work.

Exit status: 0 done; 2 bad input, including a firmware policy whose hook numba cannot
compile (one line: policy, hook, file:line, numba's reason); 70 a cxlhm bug; 130 interrupted;
141 the reader of the output left. CXLHM_TRACEBACK=1 shows the full traceback instead
(for a policy that does not compile: numba's whole text).
"""
from __future__ import annotations

import argparse
import os
import pkgutil
import sys

from cxlhm import compile_errors
from cxlhm_apps import commands
from cxlhm.config import ConfigError
from cxlhm.registry import Registry


def _as_command(module):
    missing = [a for a in ("NAME", "HELP", "add_arguments", "run") if not hasattr(module, a)]
    if missing:
        raise TypeError(f"{getattr(module, '__name__', module)!r} is not a cxlhm command (missing {', '.join(missing)})")
    return module


COMMANDS: Registry = Registry(
    "command", "cxlhm.commands", check=_as_command,
    builtins={info.name.replace("_", "-"): f"{commands.__name__}.{info.name}"
              for info in pkgutil.iter_modules(commands.__path__) if not info.name.startswith("_")})


def _command_modules(names=None):
    loaded, broken = COMMANDS.load_all(names)
    for exc in broken:
        print(f"cxlhm: warning: {exc}", file=sys.stderr)
    return [loaded[name] for name in sorted(loaded)]


def _named_command(argv: list[str]) -> str | None:
    """The command `argv` runs, when its first word names one: only that command's module
    is imported then (each pulls in its own libraries; all of them took over a second)."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cxlhm",
        description="cxlhm: an emulated CXL hybrid-memory device (device DRAM in front of an SSD) "
                    "with swappable firmware policies, a hint mailbox and a KV-cache store.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules(None if only is None else [only]):
        p = sub.add_parser(module.NAME, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _named_command(argv)
    parser = build_parser(command)
    # a command may take words argparse cannot (fio's job options): it splits them off first
    split = getattr(COMMANDS.get(command), "split_argv", None) if command is not None else None
    rest: list[str] = []
    if split is not None:
        own, rest = split(argv[1:])
        argv = [argv[0], *own]
    args = parser.parse_args(argv)
    if split is not None:
        args.extra_words = rest
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    prog = f"cxlhm {args.command}"
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cxlhm ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (ConfigError, LookupError, ValueError, OSError, OverflowError, MemoryError, RecursionError) as exc:
        # bad input: the message names the input (a file, a key, an option) and what is accepted
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: still one line for the user, the traceback on request
        if os.environ.get("CXLHM_TRACEBACK"):
            raise
        policy_error = compile_errors.explain(exc)
        if policy_error is not None:  # a policy's hook numba cannot compile: the policy's code, exit 2
            print(f"{prog}: error: {policy_error} (set CXLHM_TRACEBACK=1 for numba's full text)", file=sys.stderr)
            return 2
        print(f"{prog}: error: internal error {type(exc).__name__}: {_one_line(exc)} "
              "(set CXLHM_TRACEBACK=1 to see where)", file=sys.stderr)
        return 70


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, MemoryError):
        text = "out of memory" + (f" ({text})" if str(exc) else "")
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
