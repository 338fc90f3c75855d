"""libCacheSim's oracleGeneral binary traces: packed 24-byte little-endian records

    uint32 clock_time   (seconds)
    uint64 obj_id
    uint32 obj_size     (bytes)
    int64  next_access_vtime   (index of the object's next request, -1 if none)

Each object is taken as one device block (object sizes are ignored, as with libCacheSim's
``ignore_obj_size``), and zero-size requests are skipped, as libCacheSim's reader does by
default, so both replay the same request sequence.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cxlhm.traces import TraceError
from cxlhm.traces.blocktrace import BlockTrace, as_block_ids, next_use
from cxlhm.policies import NO_NEXT_USE

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
RECORD = np.dtype([("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"), ("next_access_vtime", "<i8")])
assert RECORD.itemsize == 24


def read_oracle_general(path: str | Path, *, block_size: int = 4096, limit: int | None = None) -> BlockTrace:
    path = str(path)
    try:
        with open(path, "rb") as f:
            if f.read(4) == ZSTD_MAGIC:
                raise TraceError(path, "header", "zstd-compressed; decompress it first (zstd -d FILE)")
        size = Path(path).stat().st_size
        count = size // RECORD.itemsize if limit is None else min(size // RECORD.itemsize, limit)
        records = np.fromfile(path, RECORD, count=count)
    except OSError as exc:
        raise TraceError(path, "0", f"cannot open trace: {exc.strerror}") from None
    if limit is None and size % RECORD.itemsize:
        raise TraceError(path, f"record {count + 1}",
                         f"truncated: {size % RECORD.itemsize} trailing bytes, records are {RECORD.itemsize} bytes")
    bad = np.flatnonzero(records["next_access_vtime"] < -1)
    if bad.size:
        i = int(bad[0])
        raise TraceError(path, f"record {i + 1}",
                         f"next_access_vtime must be -1 (none) or an index, got {int(records['next_access_vtime'][i])}")
    records = records[records["obj_size"] > 0]
    return BlockTrace(blocks=as_block_ids(records["obj_id"]), writes=np.zeros(records.shape[0], np.bool_),
                      block_size=block_size, timestamps_ns=records["clock_time"].astype(np.int64) * 1_000_000_000,
                      source=path)


def write_oracle_general(path: str | Path, trace: BlockTrace, *, obj_size: int | None = None) -> None:
    """Write `trace` with exact next-access indices, so libCacheSim's Belady can read it.
    `obj_size` defaults to the trace's block size."""
    n = len(trace)
    records = np.zeros(n, RECORD)
    if trace.timestamps_ns is not None:
        records["clock_time"] = np.clip(trace.timestamps_ns // 1_000_000_000, 0, 2**32 - 1)
    else:
        records["clock_time"] = np.minimum(np.arange(n), 2**32 - 1)
    records["obj_id"] = trace.blocks
    records["obj_size"] = trace.block_size if obj_size is None else obj_size
    nxt = next_use(trace.blocks)
    records["next_access_vtime"] = np.where(nxt == NO_NEXT_USE, -1, nxt)
    records.tofile(str(path))
