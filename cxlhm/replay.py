"""Replay a Mooncake-style request trace through a device, with real bytes.

Each hash id is one KV chunk of `chunk_bytes` at HPA ``hash_id * chunk_bytes``. A request
reads back every chunk some earlier request stored (its reusable prefix) and stores the
chunks it computed itself - the traffic a KV-cache tier sees under multi-turn serving.
Every chunk carries its hash id and a pattern derived from it, and every read is checked,
so the replay is also an end-to-end integrity test of the device under any policy.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
from tqdm import tqdm

from cxlhm.traces.mooncake import Request
from host_runtime.driver import DeviceHandle


@dataclasses.dataclass
class ReplayResult:
    requests: int = 0
    chunks_read: int = 0
    chunks_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    corrupt_chunks: int = 0
    wall_s: float = 0.0
    device: dict = dataclasses.field(default_factory=dict)


def chunk_pattern(hash_ids: np.ndarray, chunk_bytes: int) -> np.ndarray:
    """(len(ids), chunk_bytes) bytes: the id in the first 8 bytes, then a repeating
    id-dependent pattern, so a chunk read from the wrong place never passes the check."""
    words = chunk_bytes // 8
    out = np.empty((hash_ids.shape[0], words), np.uint64)
    out[:] = np.arange(words, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    out ^= hash_ids.astype(np.uint64)[:, None]
    out[:, 0] = hash_ids.astype(np.uint64)
    return out.view(np.uint8)


def replay(handle: DeviceHandle, requests: list[Request], chunk_bytes: int, *, progress: bool = True) -> ReplayResult:
    result = ReplayResult()
    if chunk_bytes <= 0 or chunk_bytes % 8:
        raise ValueError(f"chunk_bytes must be a positive multiple of 8, got {chunk_bytes}")
    max_id = max((int(r.hash_ids.max()) for r in requests if r.hash_ids.size), default=0)
    if (max_id + 1) * chunk_bytes > handle.capacity:
        raise ValueError(f"hash ids up to {max_id} at {chunk_bytes} bytes per chunk need "
                         f"{(max_id + 1) * chunk_bytes} bytes; the device has {handle.capacity}")
    stored = np.zeros(max_id + 1, bool)
    start = time.perf_counter()
    for req in tqdm(requests, desc="replay", unit="req", disable=not progress, leave=False):
        ids = np.unique(req.hash_ids)  # a request touches each chunk once
        reuse, new = ids[stored[ids]], ids[~stored[ids]]
        if reuse.size:
            got = np.empty((reuse.size, chunk_bytes), np.uint8)
            handle.readv(reuse * chunk_bytes, chunk_bytes, got)
            bad = np.any(got != chunk_pattern(reuse, chunk_bytes), axis=1)
            result.corrupt_chunks += int(bad.sum())
            result.chunks_read += reuse.size
            result.bytes_read += reuse.size * chunk_bytes
        if new.size:
            handle.writev(new * chunk_bytes, chunk_bytes, chunk_pattern(new, chunk_bytes))
            stored[new] = True
            result.chunks_written += new.size
            result.bytes_written += new.size * chunk_bytes
        result.requests += 1
    result.wall_s = time.perf_counter() - start
    result.device = handle.stats()
    return result
