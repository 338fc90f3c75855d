"""What every subcommand shares for clean errors and output files.

A command raises CommandError (or ConfigError, TraceError, ValueError from the library)
and cli.main prints it as one line, ``cxlhm <command>: error: ...``, exit status 2.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from cxlhm.units import parse_size


class CommandError(ValueError):
    """Bad command-line input; the message names the option and what is accepted."""


def positive_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def size_arg(text: str) -> int:
    """A positive byte size (4096, 64KiB) for argparse."""
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive byte size, got {text!r}")
    return value


def check_output_path(path: Path, option: str, *, create_parent: bool = False) -> None:
    """Fail now, not after the work, if `path` cannot be written: its folder must exist
    (or is created, for a default path) and be writable, and `path` must not be a folder."""
    parent = path.parent if str(path.parent) else Path(".")
    if create_parent:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"{option}: cannot create {parent}: {exc.strerror}") from None
    if path.is_dir():
        raise CommandError(f"{option} {path}: is a folder; give a file name such as {path / 'plot.png'}")
    if not parent.is_dir():
        raise CommandError(f"{option} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CommandError(f"{option} {path}: the folder {parent} is not writable")


def default_output_dir(kind: str) -> Path:
    """A new folder for one run's files: $CXLHM_OUT_DIR/<kind>/<timestamp>, or under
    ~/.local/state/cxlhm (XDG_STATE_HOME) - never the current directory."""
    root = os.environ.get("CXLHM_OUT_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"), "cxlhm")
    base = Path(root) / kind / time.strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def hints_ignored(policy_name: str) -> bool:
    """True when the policy has no on_hint hook: every lifecycle hint but PIN/UNPIN (which
    the device carries out itself) reaches the firmware only through on_hint, so such a
    policy runs the same with hints as without."""
    import firmware_policies
    from firmware_policies.base import no_hint
    return firmware_policies.get(policy_name).on_hint is no_hint


def hints_ignored_warning(prog: str, policy_name: str) -> str:
    """The warning for POLICY+hints when the policy takes no hints."""
    return (f"{prog}: warning: {policy_name}+hints: {policy_name} has no on_hint hook, so it ignores the "
            f"lifecycle hints and runs as plain {policy_name} (give the policy an on_hint, see docs/policies.md)")


def compare_ratio(base: float, value: float, *, tolerance: float = 0.005) -> str:
    """How `value` stands to `base` for a figure where lower is better, in words that say
    the direction: "1.52x lower", "1.01x higher", "the same" (within `tolerance`)."""
    if base <= 0 and value <= 0:
        return "the same"
    if value <= 0:
        return "0 (base > 0)"
    if base <= 0:
        return "higher (base 0)"
    ratio = value / base
    if abs(ratio - 1) <= tolerance:
        return "the same"
    return f"{1 / ratio:.2f}x lower" if ratio < 1 else f"{ratio:.2f}x higher"


def device_block_size(profile: str | None = None) -> int:
    """The block size of the device `profile` models (cxlhm's default device without one):
    what one trace record is when the trace does not say (`cxlhm mrc`, `cxlhm trace`)."""
    from cxlhm.config import DEFAULT_PROFILE
    from cxlhm.sim import timing_model
    return timing_model(profile or DEFAULT_PROFILE).block_size


def trace_block_size(path: str, fmt: str | None, given: int | None, profile: str | None = None) -> int | None:
    """The block size to read `path` with: `given`, else None when the format records its
    own (a .cbt trace), else the device's block size."""
    from cxlhm.traces.formats import trace_format
    if given is not None:
        return given
    return None if trace_format(path, fmt).own_block_size else device_block_size(profile)
