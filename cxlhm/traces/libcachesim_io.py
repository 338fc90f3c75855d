"""Traces to and from libCacheSim's formats, by name.

    export_trace(trace, "w.oracleGeneral.bin", "oracleGeneral")   # libCacheSim reads it
    trace = import_trace("w.csv", "csv", csv_spec="time-col=1, obj-id-col=2")

Both formats carry objects, not blocks: a block becomes an object of `obj_size` bytes
(the block size by default; 1 makes libCacheSim's cache sizes count objects), and an
object read back becomes a block (its size ignored, as libCacheSim's
``ignore_obj_size``). oracleGeneral stores whole seconds and each request's next-access
index (what libCacheSim's Belady reads); it has no op, so writes come back as reads. CSV
keeps nanoseconds and the op.
"""
from __future__ import annotations

from pathlib import Path

from cxlhm.traces import check_trace_file
from cxlhm.traces.blocktrace import BlockTrace
from cxlhm.traces.lcs_csv import WRITTEN_SPEC, parse_csv_spec, read_csv, write_csv
from cxlhm.traces.oracle_general import read_oracle_general, write_oracle_general

FORMATS = ("oracleGeneral", "csv")
_NAMES = {"oraclegeneral": "oracleGeneral", "oracle-general": "oracleGeneral", "oracle_general": "oracleGeneral",
          "csv": "csv", "lcs-csv": "csv"}


def format_name(text: str) -> str:
    """The canonical name of a libCacheSim format ("oracleGeneral" or "csv")."""
    name = _NAMES.get(text.strip().lower())
    if name is None:
        raise ValueError(f"unknown libCacheSim trace format {text!r}; accepted: {', '.join(FORMATS)}")
    return name


def export_trace(trace: BlockTrace, path: str | Path, fmt: str, *, obj_size: int | None = None) -> str:
    """Write `trace` to `path` in libCacheSim format `fmt`; returns the canonical format name."""
    name = format_name(fmt)
    if obj_size is not None and obj_size <= 0:
        raise ValueError(f"object size must be positive (readers skip size-0 requests), got {obj_size}")
    if name == "oracleGeneral":
        write_oracle_general(path, trace, obj_size=obj_size)
    else:
        write_csv(path, trace, obj_size=obj_size)
    return name


def import_trace(path: str | Path, fmt: str, *, csv_spec: str | None = None, block_size: int = 4096,
                 limit: int | None = None) -> BlockTrace:
    """Read a libCacheSim trace as a BlockTrace (CSV columns from `csv_spec`, by default
    those export_trace writes)."""
    name = format_name(fmt)
    check_trace_file(str(path))  # a device or a FIFO would be read forever
    if name == "oracleGeneral":
        return read_oracle_general(path, block_size=block_size, limit=limit)
    return read_csv(path, csv_spec or WRITTEN_SPEC, block_size=block_size, limit=limit)


def libcachesim_reader(path: str | Path, fmt: str, *, csv_spec: str | None = None):
    """A `libcachesim.TraceReader` over the same requests import_trace reads (objects as
    unit-size blocks). Needs the `libcachesim` package (the test extra)."""
    import libcachesim as lcs
    params = lcs.ReaderInitParam(ignore_obj_size=True)
    if format_name(fmt) == "oracleGeneral":
        return lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE, params)
    spec = parse_csv_spec(csv_spec or WRITTEN_SPEC)
    params.delimiter = spec.delimiter
    params.has_header = bool(spec.has_header)
    params.has_header_set = spec.has_header is not None
    params.obj_id_is_num = spec.obj_id_is_num
    params.obj_id_is_num_set = True
    params.obj_id_field = spec.obj_id_col
    for field, col in (("time_field", spec.time_col), ("obj_size_field", spec.size_col), ("op_field", spec.op_col)):
        if col is not None:
            setattr(params, field, col)
    return lcs.TraceReader(str(path), lcs.TraceType.CSV_TRACE, params)
