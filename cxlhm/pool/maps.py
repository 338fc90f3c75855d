"""Closing the shared-memory maps of the pool (mirrors, rings, hit logs)."""
from __future__ import annotations

import mmap


def unmap(mm: mmap.mmap | None) -> None:
    """Close `mm` if it is open. Where a numpy view of it is still alive (a reader that
    has not dropped it yet), closing raises BufferError; the mapping then goes with the
    last view, which is what a reader of a closed segment may rely on."""
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:
        pass
