"""Caller buffers as flat byte views: the one conversion every host-side data path uses
(the driver's load/store, the KV store, the engine shims).

    view = byte_view(buf, writable=True)   # a flat uint8 numpy array over buf's memory
    views = byte_views([a, b], writable=False)

Accepted: anything exporting the buffer protocol (bytes, bytearray, memoryview, mmap,
numpy arrays) or the numpy array interface, and CPU torch tensors of any dtype (viewed
as bytes first, so bfloat16 and float8, which numpy lacks, work too). The memory must
be C-contiguous; nothing is copied.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def byte_view(buf: Any, *, writable: bool) -> np.ndarray:
    """A flat uint8 numpy view of `buf` without copying. TypeError for something that is
    not a buffer; ValueError for a non-contiguous, read-only (when `writable`) or
    non-CPU one."""
    if hasattr(buf, "untyped_storage") and hasattr(buf, "is_contiguous"):  # a torch.Tensor
        buf = _torch_bytes(buf)
    if isinstance(buf, np.ndarray):
        arr = buf
    elif hasattr(buf, "__array_interface__"):
        arr = np.asarray(buf)
    else:
        try:
            arr = np.frombuffer(memoryview(buf), np.uint8)
        except TypeError:
            if not hasattr(buf, "numpy"):
                raise TypeError("expected a buffer (bytes, bytearray, memoryview, numpy array, CPU tensor), "
                                f"got {type(buf).__name__}") from None
            arr = buf.numpy()
    if not arr.flags.c_contiguous:
        raise ValueError("the buffer must be C-contiguous")
    if writable and not arr.flags.writeable:
        raise ValueError("the buffer is read-only; reading into it needs a writable buffer")
    return arr.reshape(-1).view(np.uint8)


def byte_views(buf: Any, *, writable: bool) -> list[np.ndarray]:
    """One buffer, or a list/tuple of buffers (scatter/gather), as flat byte views."""
    if isinstance(buf, (list, tuple)):
        return [byte_view(b, writable=writable) for b in buf]
    return [byte_view(buf, writable=writable)]


def _torch_bytes(tensor: Any) -> np.ndarray:
    if tensor.device.type != "cpu":
        raise ValueError(f"tensors must be on the CPU (got one on {tensor.device}); copy to pinned host memory first")
    if not tensor.is_contiguous():
        raise ValueError("the buffer must be C-contiguous")
    import torch  # only reached when the caller already uses torch
    flat = tensor.detach().reshape(-1)
    return (flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)).numpy()
