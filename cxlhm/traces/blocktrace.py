"""Block traces: what the trace-driven simulator replays, and cxlhm's own file format.

A `BlockTrace` is a sequence of single-block accesses: block ids (int64 >= 0), a write
flag per access, the block size in bytes (to turn byte sizes into slot counts) and,
optionally, a timestamp per access in nanoseconds.

The cxlhm block-trace file (``.cbt``), little-endian::

    offset  size   field
    0       8      magic  b"CXLHMBT\\0"
    8       4      uint32 version (1)
    12      4      uint32 flags: bit 0 = a timestamp column follows the records
    16      8      uint64 block size in bytes
    24      8      uint64 n, the number of accesses
    32      8*n    records, uint64 each: bit 63 = write, bits 0-62 = block id
    32+8n   8*n    (flag bit 0 only) int64 timestamps in nanoseconds

Fixed-width records keep reading a 10M-access trace a single `numpy.fromfile`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from cxlhm.traces import TraceError
from cxlhm.policies import NO_NEXT_USE

MAGIC = b"CXLHMBT\0"
VERSION = 1
FLAG_TIMESTAMPS = 1
HEADER = np.dtype([("magic", "S8"), ("version", "<u4"), ("flags", "<u4"), ("block_size", "<u8"), ("n", "<u8")])
WRITE_BIT = np.uint64(1 << 63)
MAX_BLOCK = (1 << 63) - 2  # -1 marks empty buckets in the block table's index


@dataclasses.dataclass(frozen=True)
class BlockTrace:
    blocks: np.ndarray  # int64 block ids, one access each
    writes: np.ndarray  # bool, True for a write access
    block_size: int  # bytes per block
    timestamps_ns: np.ndarray | None = None
    source: str = ""

    def __post_init__(self):
        if self.blocks.shape != self.writes.shape:
            raise ValueError("blocks and writes must have the same length")
        if self.timestamps_ns is not None and self.timestamps_ns.shape != self.blocks.shape:
            raise ValueError("timestamps_ns must have one entry per access")

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    @property
    def unique_blocks(self) -> int:
        return int(np.unique(self.blocks).shape[0])

    def head(self, n: int) -> "BlockTrace":
        """The first `n` accesses."""
        ts = None if self.timestamps_ns is None else self.timestamps_ns[:n]
        return dataclasses.replace(self, blocks=self.blocks[:n], writes=self.writes[:n], timestamps_ns=ts)

    def next_use(self) -> np.ndarray:
        return next_use(self.blocks)


def next_use(blocks: np.ndarray) -> np.ndarray:
    """next_use[t] = index of the next access to blocks[t] after t, or NO_NEXT_USE."""
    blocks = np.asarray(blocks)
    order = np.argsort(blocks, kind="stable")  # equal ids stay in time order
    same = blocks[order[1:]] == blocks[order[:-1]]
    out = np.full(blocks.shape[0], NO_NEXT_USE, np.int64)
    out[order[:-1][same]] = order[1:][same]
    return out


def as_block_ids(ids: np.ndarray) -> np.ndarray:
    """Block ids (int64) for raw object ids. Ids that fit are kept as they are; if any
    does not (hashed 64-bit ids), all are renumbered densely in sorted order, which
    changes no hit or miss."""
    ids = np.asarray(ids)
    if ids.size == 0:
        return ids.astype(np.int64)
    if ids.dtype.kind == "u" and ids.max() > MAX_BLOCK:
        return np.unique(ids, return_inverse=True)[1].astype(np.int64).reshape(-1)
    return ids.astype(np.int64)


def write_block_trace(path: str | Path, trace: BlockTrace) -> None:
    blocks = np.asarray(trace.blocks, np.int64)
    if blocks.size and (blocks.min() < 0 or blocks.max() > MAX_BLOCK):
        raise ValueError(f"block ids must be within [0, {MAX_BLOCK}]")
    header = np.zeros(1, HEADER)
    header["magic"], header["version"] = MAGIC, VERSION
    header["flags"] = FLAG_TIMESTAMPS if trace.timestamps_ns is not None else 0
    header["block_size"], header["n"] = trace.block_size, blocks.shape[0]
    records = blocks.astype(np.uint64) | np.where(np.asarray(trace.writes, bool), WRITE_BIT, np.uint64(0))
    with open(path, "wb") as f:
        header.tofile(f)
        records.astype("<u8").tofile(f)
        if trace.timestamps_ns is not None:
            np.asarray(trace.timestamps_ns, "<i8").tofile(f)


def read_block_trace(path: str | Path) -> BlockTrace:
    path = str(path)
    try:
        data = np.fromfile(path, np.uint8)
    except OSError as exc:
        raise TraceError(path, "0", f"cannot open trace: {exc.strerror}") from None
    if data.shape[0] < HEADER.itemsize:
        raise TraceError(path, "header", f"file is {data.shape[0]} bytes, shorter than the {HEADER.itemsize}-byte header")
    header = data[:HEADER.itemsize].view(HEADER)[0]
    if bytes(header["magic"]).ljust(8, b"\0") != MAGIC:
        raise TraceError(path, "header", f"not a cxlhm block trace (magic {bytes(header['magic'])!r}, expected {MAGIC!r})")
    if header["version"] != VERSION:
        raise TraceError(path, "header", f"unsupported version {int(header['version'])} (this reader knows {VERSION})")
    flags = int(header["flags"])
    if flags & ~FLAG_TIMESTAMPS:
        raise TraceError(path, "header", f"unknown flag bits {flags & ~FLAG_TIMESTAMPS:#x}")
    block_size = int(header["block_size"])
    if block_size <= 0:
        raise TraceError(path, "header", f"block size must be positive, got {block_size}")
    n = int(header["n"])
    columns = 2 if flags & FLAG_TIMESTAMPS else 1
    body = data.shape[0] - HEADER.itemsize
    if body < 8 * n:
        raise TraceError(path, f"record {body // 8 + 1}",
                         f"truncated: the header promises {n} accesses but the file ends after {body // 8}")
    if columns == 2 and body < 16 * n:
        raise TraceError(path, f"record {(body - 8 * n) // 8 + 1}",
                         f"timestamp missing: the file ends after {(body - 8 * n) // 8} of {n} timestamps")
    if body > 8 * n * columns:
        raise TraceError(path, f"record {n + 1}", f"{body - 8 * n * columns} bytes of trailing data after {n} accesses")
    raw = data[HEADER.itemsize:HEADER.itemsize + 8 * n].view("<u8")
    writes = (raw & WRITE_BIT) != 0
    blocks = (raw & ~WRITE_BIT).astype(np.int64)
    bad = np.flatnonzero(blocks > MAX_BLOCK)
    if bad.size:
        raise TraceError(path, f"record {int(bad[0]) + 1}", f"block id {int(blocks[bad[0]])} is reserved")
    ts = data[HEADER.itemsize + 8 * n:].view("<i8").astype(np.int64) if columns == 2 else None
    return BlockTrace(blocks=blocks, writes=writes, block_size=block_size, timestamps_ns=ts, source=path)
