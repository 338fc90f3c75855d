"""Mooncake JSONL request traces as block traces: every hash id is one KV block.

Requests are flattened in order, each request reading its whole `hash_ids` chain, as a
serving engine re-reads a conversation's prefix. The first touch of an id is a write
(freshly computed KV stored for reuse), later touches are reads. A block holds
`block_tokens` tokens of KV, so the block size is `block_tokens * bytes_per_token`;
the default bytes per token is Llama-3-8B's in fp16 (2 (K, V) x 32 layers x 8 KV heads
x 128 dims x 2 bytes = 128 KiB).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cxlhm.traces.blocktrace import BlockTrace
from cxlhm.traces.mooncake import BLOCK_TOKENS, DEFAULT_TRACE, read_requests

LLAMA3_8B_FP16_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def mooncake_block_trace(path: str | Path = DEFAULT_TRACE, *, limit: int | None = None,
                         block_tokens: int = BLOCK_TOKENS,
                         bytes_per_token: int = LLAMA3_8B_FP16_BYTES_PER_TOKEN) -> BlockTrace:
    """The block accesses of the first `limit` requests (all by default)."""
    requests = read_requests(path, limit)
    counts = np.array([r.hash_ids.shape[0] for r in requests], np.int64)
    blocks = np.concatenate([r.hash_ids for r in requests]) if requests else np.zeros(0, np.int64)
    first_touch = np.zeros(blocks.shape[0], np.bool_)
    if blocks.size:
        first_touch[np.unique(blocks, return_index=True)[1]] = True
    stamps = np.repeat(np.array([r.timestamp_ms for r in requests], np.int64) * 1_000_000, counts)
    return BlockTrace(blocks=blocks.astype(np.int64), writes=first_touch, block_size=block_tokens * bytes_per_token,
                      timestamps_ns=stamps, source=str(path))
