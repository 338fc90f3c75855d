"""CSV request traces as libCacheSim reads them: one request per line, columns named
by 1-based index in a libCacheSim-style spec, e.g.

    "time-col=1, obj-id-col=2, obj-size-col=3, op-col=4, delimiter=,, has-header=true"

Only obj-id-col is required. Each object is one device block; a zero in the size column
skips the request (libCacheSim's default). The op column, when given, marks writes:
read/get/gets are reads; write/set/put/add/replace/cas/append/prepend/update are writes.
Non-numeric ids need ``obj-id-is-num=false`` and are numbered in order of appearance.
"""
from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

import numpy as np

from cxlhm.traces import TraceError, text_lines
from cxlhm.traces.blocktrace import BlockTrace, as_block_ids

READ_OPS = frozenset({"read", "get", "gets"})
WRITE_OPS = frozenset({"write", "set", "put", "add", "replace", "cas", "append", "prepend", "update"})
_SPEC_ITEM = re.compile(r"\s*([a-z-]+)\s*=(.*?)\s*(?:,(?=\s*[a-z-]+\s*=)|$)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class CsvSpec:
    obj_id_col: int
    time_col: int | None = None
    size_col: int | None = None
    op_col: int | None = None
    delimiter: str = ","
    has_header: bool | None = None  # None: a header is detected from a non-numeric id field
    obj_id_is_num: bool = True


def parse_csv_spec(text: str) -> CsvSpec:
    """Parse a libCacheSim-style ``key=value, ...`` CSV spec; errors name the key."""
    cols: dict = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _SPEC_ITEM.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot parse CSV spec at {text[pos:]!r}; expected key=value pairs such as "
                             "'time-col=1, obj-id-col=2, delimiter=,'")
        key, value = m.group(1).lower(), m.group(2)
        pos = m.end()
        if key in ("time-col", "obj-id-col", "obj-size-col", "op-col"):
            if not value.strip().isdigit() or int(value) < 1:
                raise ValueError(f"CSV spec {key} must be a 1-based column number, got {value!r}")
            cols[{"time-col": "time_col", "obj-id-col": "obj_id_col", "obj-size-col": "size_col",
                  "op-col": "op_col"}[key]] = int(value)
        elif key == "delimiter":
            value = {"tab": "\t", "\\t": "\t", "space": " "}.get(value, value if value else ",")
            if len(value) != 1:
                raise ValueError(f"CSV spec delimiter must be one character (or tab/space), got {value!r}")
            cols["delimiter"] = value
        elif key in ("has-header", "obj-id-is-num"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"CSV spec {key} must be true or false, got {value!r}")
            cols[key.replace("-", "_")] = value.lower() in ("true", "1")
        else:
            raise ValueError(f"unknown CSV spec key {key!r}; accepted: time-col, obj-id-col, obj-size-col, "
                             "op-col, delimiter, has-header, obj-id-is-num")
    if "obj_id_col" not in cols:
        raise ValueError("CSV spec needs obj-id-col (the 1-based column of the object id)")
    return CsvSpec(**cols)


def _csv_rows(reader, path: str):
    """The reader's rows; its own errors (a bare carriage return inside a field, ...) as a
    TraceError naming the line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(path, str(reader.line_num), f"not CSV: {exc}") from None
        yield row


def read_csv(path: str | Path, spec: CsvSpec | str, *, block_size: int = 4096, limit: int | None = None) -> BlockTrace:
    spec = parse_csv_spec(spec) if isinstance(spec, str) else spec
    path = str(path)
    needed = max(c for c in (spec.obj_id_col, spec.time_col, spec.size_col, spec.op_col) if c is not None)
    ids: list[int] = []
    names: dict[str, int] = {}
    times: list[float] = []
    writes: list[bool] = []
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise TraceError(path, "0", f"cannot open trace: {exc.strerror}") from None
    with handle:
        for lineno, row in enumerate(_csv_rows(csv.reader(text_lines(handle, path), delimiter=spec.delimiter), path), 1):
            if limit is not None and len(ids) >= limit:
                break
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) < needed:
                raise TraceError(path, str(lineno), f"{len(row)} columns, the spec reads column {needed}")
            raw_id = row[spec.obj_id_col - 1].strip()
            if lineno == 1 and (spec.has_header or (spec.has_header is None and spec.obj_id_is_num
                                                   and not _is_uint(raw_id))):
                continue
            if spec.size_col is not None:
                size = _number(row[spec.size_col - 1], "object size", path, lineno)
                if size == 0:
                    continue
            if spec.obj_id_is_num:
                if not _is_uint(raw_id) or int(raw_id) >= 2**64:
                    raise TraceError(path, str(lineno), f"object id {raw_id!r} is not a 64-bit unsigned integer "
                                     "(use obj-id-is-num=false for string ids)")
                ids.append(int(raw_id))
            else:
                ids.append(names.setdefault(raw_id, len(names)))
            if spec.time_col is not None:
                times.append(_number(row[spec.time_col - 1], "time", path, lineno))
            if spec.op_col is not None:
                op = row[spec.op_col - 1].strip().lower()
                if op not in READ_OPS and op not in WRITE_OPS:
                    raise TraceError(path, str(lineno), f"unknown op {op!r}; reads: {', '.join(sorted(READ_OPS))}; "
                                     f"writes: {', '.join(sorted(WRITE_OPS))}")
                writes.append(op in WRITE_OPS)
    blocks = as_block_ids(np.array(ids, np.uint64))
    return BlockTrace(
        blocks=blocks,
        writes=np.array(writes, np.bool_) if spec.op_col is not None else np.zeros(len(ids), np.bool_),
        block_size=block_size,
        timestamps_ns=(np.array(times, np.float64) * 1e9).astype(np.int64) if spec.time_col is not None else None,
        source=path,
    )


def _is_uint(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _number(text: str, what: str, path: str, lineno: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, str(lineno), f"{what} {text.strip()!r} is not a number") from None
    if not value >= 0:
        raise TraceError(path, str(lineno), f"{what} must be non-negative, got {text.strip()!r}")
    return value


# What write_csv writes, as a spec for read_csv (and --csv-spec): a header line, then
# time (seconds), object id, object size (bytes), op (read/write)
WRITTEN_SPEC = "time-col=1, obj-id-col=2, obj-size-col=3, op-col=4, has-header=true"


def write_csv(path: str | Path, trace: BlockTrace, *, obj_size: int | None = None) -> None:
    """Write `trace` as a CSV that read_csv (with WRITTEN_SPEC) and libCacheSim's CSV
    reader (time, obj-id, obj-size, op fields 1-4, a header) both read back: one request
    per access, the object id the block id, `obj_size` bytes (default the block size;
    never 0, which readers skip), times in seconds with nanosecond digits (the access
    index when the trace has no times)."""
    size = trace.block_size if obj_size is None else obj_size
    if size <= 0:
        raise ValueError(f"object size must be positive (readers skip size-0 requests), got {size}")
    stamps = trace.timestamps_ns if trace.timestamps_ns is not None else np.arange(len(trace), dtype=np.int64) * 10**9
    ops = np.where(trace.writes, "write", "read")
    with open(path, "w", newline="") as f:
        f.write("time,obj_id,obj_size,op\n")
        for ns, block, op in zip(stamps.tolist(), trace.blocks.tolist(), ops.tolist()):
            f.write(f"{ns // 10**9}.{ns % 10**9:09d},{block},{size},{op}\n")
