"""Mooncake-style JSONL request traces (one request per line):

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

`timestamp` is the arrival time in ms; `hash_ids` are prefix-block hashes over
`block_tokens`-token blocks (512 in the published traces), so equal ids are reusable
KV blocks and a request that extends an earlier id chain is that conversation's next turn.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
from pathlib import Path

import numpy as np

from cxlhm.traces import TraceError, check_trace_file, text_lines

BLOCK_TOKENS = 512
# Shipped with the package (Apache-2.0, see data/README.md), so a pip install or a plain clone can run.
# A str, as every other path a user passes around (`.endswith`, f-strings, argv); the Path is beside it.
DEFAULT_TRACE_PATH = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl.xz"
DEFAULT_TRACE = str(DEFAULT_TRACE_PATH)
MAX_HASH_ID = (1 << 63) - 1  # ids are stored as int64


def open_trace_binary(path: str):
    """`path` opened for reading bytes; .xz and .gz traces are decompressed on the fly."""
    if path.endswith(".xz"):
        return lzma.open(path, "rb")
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


@dataclasses.dataclass(frozen=True)
class Request:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: np.ndarray  # int64


def _field(obj: dict, key: str, path: str, lineno: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(path, str(lineno), f"{key!r} must be a non-negative integer, got {value!r}")
    return value


def read_requests(path: str | Path = DEFAULT_TRACE, limit: int | None = None) -> list[Request]:
    """Read up to `limit` requests. Blank lines are skipped; anything else malformed
    raises TraceError with the line number."""
    path = str(path)
    out: list[Request] = []
    check_trace_file(path)
    try:
        handle = open_trace_binary(path)
    except OSError as exc:
        raise TraceError(path, "0", f"cannot open trace: {exc.strerror}") from None
    with handle:
        for lineno, line in enumerate(_lines(handle, path), 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(path, str(lineno), f"not valid JSON ({exc.msg} at column {exc.colno})") from None
            except RecursionError:
                raise TraceError(path, str(lineno), "JSON nested too deeply") from None
            if not isinstance(obj, dict):
                raise TraceError(path, str(lineno), "expected a JSON object with timestamp, input_length, output_length, hash_ids")
            ids = obj.get("hash_ids")
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and
                                                    0 <= i <= MAX_HASH_ID for i in ids):
                raise TraceError(path, str(lineno), "'hash_ids' must be a list of integers in [0, 2^63)")
            out.append(Request(
                timestamp_ms=_field(obj, "timestamp", path, lineno),
                input_length=_field(obj, "input_length", path, lineno),
                output_length=_field(obj, "output_length", path, lineno),
                hash_ids=np.asarray(ids, np.int64),
            ))
    return out


def _lines(handle, path: str):
    """text_lines, with a damaged compressed file reported as a TraceError naming it."""
    try:
        yield from text_lines(handle, path)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise TraceError(path, "0", f"cannot read trace: {exc}") from None
