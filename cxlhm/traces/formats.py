"""Trace formats by name: one loader per format, and a guess from the file name.

    trace = load_trace("w.oracleGeneral.bin", "oracle-general", block_size=4096)

Formats live in a `cxlhm.registry.Registry`; a package adds one through the
``cxlhm.trace_formats`` entry-point group, naming a `TraceFormat` (or a module whose
``TRACE_FORMAT`` is one).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from cxlhm.registry import Registry
from cxlhm.traces import check_trace_file
from cxlhm.traces.blocktrace import BlockTrace, read_block_trace
from cxlhm.traces.lcs_csv import read_csv
from cxlhm.traces.mooncake_blocks import mooncake_block_trace
from cxlhm.traces.oracle_general import read_oracle_general

DEFAULT_CSV_SPEC = "time-col=1, obj-id-col=2"


def _cxlhm(path, *, limit, block_size, csv_spec):
    trace = read_block_trace(path)
    trace = trace if limit is None else trace.head(limit)
    return trace if block_size is None else _with_block_size(trace, block_size)


def _oracle(path, *, limit, block_size, csv_spec):
    return read_oracle_general(path, block_size=block_size or 4096, limit=limit)


def _csv(path, *, limit, block_size, csv_spec):
    return read_csv(path, csv_spec or DEFAULT_CSV_SPEC, block_size=block_size or 4096, limit=limit)


def _mooncake(path, *, limit, block_size, csv_spec):
    trace = mooncake_block_trace(path, limit=None)
    trace = trace if limit is None else trace.head(limit)  # limit counts accesses, not requests
    return trace if block_size is None else _with_block_size(trace, block_size)


def _with_block_size(trace: BlockTrace, block_size: int) -> BlockTrace:
    return dataclasses.replace(trace, block_size=block_size)


@dataclasses.dataclass(frozen=True)
class TraceFormat:
    """load(path, *, limit, block_size, csv_spec) -> BlockTrace, and a one-line description.
    `own_block_size`: the file states its block size (a cxlhm block trace does), so a reader
    keeps it unless told otherwise; other formats name objects and take the device's."""
    load: Callable[..., BlockTrace]
    description: str
    own_block_size: bool = False


def _as_trace_format(obj) -> TraceFormat:
    fmt = getattr(obj, "TRACE_FORMAT", obj)
    if not isinstance(fmt, TraceFormat):
        raise TypeError(f"{type(fmt).__name__} is not a cxlhm TraceFormat")
    return fmt


FORMATS: Registry[TraceFormat] = Registry("trace format", "cxlhm.trace_formats", check=_as_trace_format)
for _name, _load, _text in (
        ("cxlhm", _cxlhm, "cxlhm block trace (.cbt; see cxlhm/traces/blocktrace.py)"),
        ("oracle-general", _oracle, "libCacheSim oracleGeneral binary, 24-byte records"),
        ("csv", _csv, "libCacheSim-style CSV; columns from --csv-spec"),
        ("mooncake", _mooncake, "Mooncake JSONL requests; each hash id is one block")):
    FORMATS.add(_name, TraceFormat(_load, _text, own_block_size=_name == "cxlhm"))
_ALIASES = {"cbt": "cxlhm", "oraclegeneral": "oracle-general", "oracle_general": "oracle-general",
            "jsonl": "mooncake", "lcs-csv": "csv"}


def format_names() -> list[str]:
    return FORMATS.names()


def guess_format(path: str | Path) -> str:
    name = Path(path).name.lower()
    for compressed in (".xz", ".gz"):  # the Mooncake reader opens these directly
        name = name.removesuffix(compressed)
    if name.endswith(".cbt"):
        return "cxlhm"
    if "oraclegeneral" in name or name.endswith(".bin"):
        return "oracle-general"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    if name.endswith((".jsonl", ".json")):
        return "mooncake"
    raise ValueError(f"cannot tell the format of {path} from its name; give one of: {', '.join(format_names())}")


def trace_format(path: str | Path, fmt: str | None = None) -> TraceFormat:
    """The TraceFormat `fmt` names (guessed from `path` when None); ValueError lists the known ones."""
    key = (fmt or guess_format(path)).lower()
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(format_names())}")
    try:
        return FORMATS.get(key)
    except LookupError as exc:  # a broken third-party format, named by the registry
        raise ValueError(str(exc)) from None


def load_trace(path: str | Path, fmt: str | None = None, *, limit: int | None = None,
               block_size: int | None = None, csv_spec: str | None = None) -> BlockTrace:
    """Read `path` as `fmt` (guessed from the name when None). `limit` keeps the first
    accesses; `block_size` overrides the trace's bytes per block."""
    fmt_obj = trace_format(path, fmt) if fmt is None else None  # a name that cannot be guessed, before the file
    check_trace_file(str(path))
    fmt_obj = fmt_obj or trace_format(path, fmt)
    return fmt_obj.load(str(path), limit=limit, block_size=block_size, csv_spec=csv_spec)
