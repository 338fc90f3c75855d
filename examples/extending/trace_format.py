"""The MSR Cambridge block I/O trace format (SNIA IOTTA), one request per line:

    Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime
    128166372003061629,hm,1,Read,3100352512,4096,13458

Timestamps are Windows file times (100 ns ticks); Type is Read or Write; Offset and
Size are bytes. A request becomes one access per device block it touches, in order,
timestamped relative to the first request kept (a request of size 0 touches no block
and is skipped). .gz and .xz files are read directly.

Registered as `msr`, the commands that read traces take it by name:
``cxlhm mrc --trace hm_1.csv --format msr``, ``cxlhm trace export --input-format msr``.
"""
from __future__ import annotations

import numpy as np

from cxlhm.traces import TraceError, text_lines
from cxlhm.traces.blocktrace import MAX_BLOCK, BlockTrace
from cxlhm.traces.formats import TraceFormat
from cxlhm.traces.mooncake import open_trace_binary

FIELDS = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime"
TYPES = {"read": False, "write": True}


def _number(text: str, what: str, path: str, lineno: int) -> int:
    if not text.strip().isdigit():
        raise TraceError(path, str(lineno), f"{what} must be a non-negative integer, got {text!r}")
    return int(text)


def read_msr(path, *, limit=None, block_size=None, csv_spec=None) -> BlockTrace:
    block_size = block_size or 4096
    blocks: list[int] = []
    writes: list[bool] = []
    times: list[int] = []
    start = None
    with open_trace_binary(str(path)) as handle:
        for lineno, line in enumerate(text_lines(handle, str(path)), 1):
            if not line.strip():
                continue
            fields = line.rstrip("\r\n").split(",")
            if len(fields) != 7:
                raise TraceError(path, str(lineno), f"expected 7 comma-separated fields ({FIELDS}), got {len(fields)}")
            when = _number(fields[0], "Timestamp", path, lineno)
            kind = TYPES.get(fields[3].strip().lower())
            if kind is None:
                raise TraceError(path, str(lineno), f"Type must be Read or Write, got {fields[3]!r}")
            offset = _number(fields[4], "Offset", path, lineno)
            size = _number(fields[5], "Size", path, lineno)
            if size == 0:
                continue
            first, last = offset // block_size, (offset + size - 1) // block_size
            if last > MAX_BLOCK:
                raise TraceError(path, str(lineno), f"Offset + Size reaches block {last}, past the largest "
                                                    f"block id {MAX_BLOCK}")
            start = when if start is None else start
            for block in range(first, last + 1):
                if limit is not None and len(blocks) >= limit:
                    break
                blocks.append(block)
                writes.append(kind)
                times.append((when - start) * 100)
            if limit is not None and len(blocks) >= limit:
                break
    return BlockTrace(np.array(blocks, np.int64), np.array(writes, bool), block_size,
                      timestamps_ns=np.array(times, np.int64), source=str(path))


TRACE_FORMAT = TraceFormat(read_msr, "MSR Cambridge block I/O CSV (SNIA IOTTA); one access per block touched")
