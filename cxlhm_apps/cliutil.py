"""What every subcommand shares for clean errors and output files.

A command raises CommandError (or ConfigError, TraceError, ValueError from the library)
and cli.main prints it as one line, ``cxlhm <command>: error: ...``, exit status 2.
"""
from __future__ import annotations

import argparse
import os
import stat
import time
from pathlib import Path

from cxlhm.units import parse_size

MAX_TEXT_INPUT = 1 << 20  # bytes: a config or profile is a few KiB; refuse before reading more


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


def check_input_file(path: str, what: str, *, limit: int | None = MAX_TEXT_INPUT) -> None:
    """Refuse what is not a regular file (/dev/zero, a FIFO, a folder) and, with `limit`,
    a file larger than that, before anything reads it."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CommandError(f"{what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CommandError(f"{what} {path}: not a regular file")
    if limit is not None and st.st_size > limit:
        raise CommandError(f"{what} {path}: {st.st_size} bytes; at most {limit} accepted")
