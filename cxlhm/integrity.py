"""End-to-end integrity of the SSD back end: per-block checksums and the poison list.

Checksums: when the device writes a block to the SSD it records the block's xxh3-64;
every later SSD read of that block is verified against it, and a mismatch is poison,
never data. Blocks the device never wrote (sparse zeros, or an image laid out by
someone else) have no checksum and are not checked. Memory: one Python dict entry
(~100 bytes) per block ever written back; on disk 16 bytes per block.

Poison: a block whose current bytes the device cannot produce (a failed read after
retries, a checksum mismatch, a write-back that failed so its latest bytes are lost).
Reads of it fail with PoisonError until the host overwrites the whole block.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xxhash


class PoisonError(OSError):
    """The device cannot return the bytes last written to this range."""


def checksum(data) -> int:
    return xxhash.xxh3_64_intdigest(data)


class BlockChecksums:
    def __init__(self, path: Path | None, block_size: int = 0):
        self.path, self.block_size = path, block_size
        self.sums: dict[int, int] = {}
        if path is not None and path.exists():
            try:
                with np.load(path) as saved:
                    # sums of another block size describe other byte ranges: unusable
                    if int(saved["block_size"]) == block_size:
                        self.sums = dict(zip(saved["blocks"].tolist(), saved["sums"].tolist()))
            except (OSError, ValueError, KeyError):
                self.sums = {}  # unreadable: verify nothing rather than refuse to open

    def matches(self, block: int, data) -> bool:
        expected = self.sums.get(block)
        return expected is None or expected == checksum(data)

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, block_size=np.int64(self.block_size), blocks=np.fromiter(self.sums.keys(), np.int64, len(self.sums)),
                     sums=np.fromiter(self.sums.values(), np.uint64, len(self.sums)))
        os.replace(tmp, self.path)


class PoisonTable:
    """block -> why it is poisoned."""

    def __init__(self, saved: dict | None = None):
        self.blocks: dict[int, str] = {int(k): str(v) for k, v in (saved or {}).items()}

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def add(self, block: int, reason: str) -> None:
        self.blocks[block] = reason

    def first_poisoned(self, first_block: int, last_block: int) -> int:
        """The first poisoned block in [first_block, last_block], or -1."""
        if last_block - first_block < len(self.blocks):
            return next((b for b in range(first_block, last_block + 1) if b in self.blocks), -1)
        hits = [b for b in self.blocks if first_block <= b <= last_block]
        return min(hits) if hits else -1

    def clear(self, block: int) -> None:
        self.blocks.pop(block, None)

    def to_json(self) -> dict:
        return {str(b): r for b, r in self.blocks.items()}
