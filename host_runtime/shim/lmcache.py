"""LMCache remote connector on cxlhm.

LMCache's interface (lmcache/v1/storage_backend/connector/base_connector.py,
``RemoteConnector``):
  async exists(key) -> bool            exists_sync(key) -> bool
  async get(key) -> MemoryObj | None   (None: miss)
  async put(key, memory_obj)           (a key already stored is left as is)
  async list() -> [str]                async close()
  batched_contains(keys, stop_after_first_not_exits=True) -> [bool]
  async batched_get(keys) / batched_put(keys, objs), remove_sync(key) -> bool
Keys are LMCache ``CacheEngineKey`` objects (``to_string()`` names them) or strings.

Each stored value is a small header (payload size, dtype, memory format, shape)
followed by the memory object's bytes, as LMCache's own remote connectors save
chunk metadata, so `get` can allocate the right object from LMCache's local CPU
backend (``local_cpu_backend.allocate(shape, dtype, fmt)``) and read straight into it.
Without LMCache, `get` returns a `BytesMemoryObj` (numpy-backed, ``byte_array``).
"""
from __future__ import annotations

import logging
import struct
from typing import Any, Callable

import numpy as np

from host_runtime import kvkeys
from host_runtime.shim.api import KVShim, byte_view

log = logging.getLogger("cxlhm.shim.lmcache")

try:
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector as _Base
except Exception:  # noqa: BLE001 - no LMCache here
    _Base = object

_HEADER = struct.Struct("<8sQ24sii4q")  # magic, payload bytes, dtype name, fmt, ndim, shape[4]
_MAGIC = b"CXLHMLMC"


class BytesMemoryObj:
    """What `get` returns without LMCache: the payload as a numpy byte array."""

    def __init__(self, nbytes: int, shape=(), dtype: str = "uint8", fmt: int = 0):
        self.raw = np.empty(nbytes, np.uint8)
        self.meta_shape, self.meta_dtype, self.meta_fmt = tuple(shape), dtype, fmt

    @property
    def byte_array(self) -> memoryview:
        return memoryview(self.raw)

    @property
    def tensor(self):
        return None

    def get_size(self) -> int:
        return self.raw.nbytes


class CxlhmRemoteConnector(_Base):
    """`local_cpu_backend`: LMCache's LocalCPUBackend (objects for `get` come from its
    allocator); `allocate`: alternatively a callable (shape, dtype, fmt, nbytes) ->
    memory object. Neither: BytesMemoryObj."""

    def __init__(self, shim: KVShim, *, local_cpu_backend: Any = None,
                 allocate: Callable[..., Any] | None = None):
        if _Base is not object:
            try:
                _Base.__init__(self, getattr(local_cpu_backend, "config", None), getattr(local_cpu_backend, "metadata", None))
            except TypeError:
                _Base.__init__(self)
        self.shim = shim
        self.local_cpu_backend = local_cpu_backend
        self._allocate = allocate

    # ------------------------------------------------------------ contains
    async def exists(self, key: Any) -> bool:
        return self.exists_sync(key)

    def exists_sync(self, key: Any) -> bool:
        return self.shim.contains(_key(key))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list, stop_after_first_not_exits: bool = True) -> list[bool]:
        hits = self.shim.exists([_key(k) for k in keys])
        if stop_after_first_not_exits and False in hits:
            first = hits.index(False)
            hits[first:] = [False] * (len(hits) - first)
        return hits

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list, pin: bool = False) -> int:
        keys = [_key(k) for k in keys]
        n = self.shim.lookup_prefix(keys)
        if pin and n:
            self.shim.pin(keys[:n])
        return n

    # ------------------------------------------------------------ data
    async def get(self, key: Any) -> Any:
        return self._get(_key(key))

    async def put(self, key: Any, memory_obj: Any) -> None:
        self._put(_key(key), memory_obj)

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list) -> list:
        return [self._get(_key(k)) for k in keys]

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list, memory_objs: list) -> None:
        for key, obj in zip(keys, memory_objs):
            self._put(_key(key), obj)

    def remove_sync(self, key: Any) -> bool:
        return self.shim.remove(_key(key)) == 1

    async def list(self) -> list[str]:
        return [k.decode(errors="replace") for k in self.shim.keys()]

    async def close(self) -> None:
        self.shim.flush()

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        return 0

    # ------------------------------------------------------------ internals
    def _get(self, key: bytes) -> Any:
        header = np.empty(_HEADER.size, np.uint8)
        if not self.shim.read_range(key, 0, header):
            return None
        magic, nbytes, dtype, fmt, ndim, *shape = _HEADER.unpack(header.tobytes())
        if magic != _MAGIC or self.shim.size_of(key) != _HEADER.size + nbytes:
            log.error("value of %r is not an LMCache chunk; treating it as a miss", key)
            return None
        obj = self._new_obj(tuple(shape[:ndim]), dtype.rstrip(b"\0").decode(), fmt, nbytes)
        if obj is None:
            return None
        payload = _payload(obj, writable=True)
        if payload.nbytes != nbytes:
            log.error("get %r: the allocated object holds %d bytes, the value %d", key, payload.nbytes, nbytes)
            return None
        if not self.shim.read_range(key, _HEADER.size, payload):
            return None
        return obj

    def _put(self, key: bytes, memory_obj: Any) -> None:
        payload = _payload(memory_obj, writable=False)
        shape, dtype, fmt = _describe(memory_obj)
        header = _HEADER.pack(_MAGIC, payload.nbytes, dtype.encode()[:24], fmt, len(shape),
                              *(list(shape[:4]) + [0] * (4 - len(shape[:4]))))
        status = self.shim.put_from(key, [np.frombuffer(header, np.uint8), payload])
        if not status.ok:
            log.warning("put %r: %s", key, status.value)

    def _new_obj(self, shape: tuple, dtype: str, fmt: int, nbytes: int) -> Any:
        if self._allocate is not None:
            return self._allocate(shape, dtype, fmt, nbytes)
        if self.local_cpu_backend is not None:
            import torch
            from lmcache.v1.memory_management import MemoryFormat
            return self.local_cpu_backend.allocate(torch.Size(shape), getattr(torch, dtype), MemoryFormat(fmt))
        return BytesMemoryObj(nbytes, shape, dtype, fmt)


def _key(key: Any) -> bytes:
    return kvkeys.normalize_key(key)


def _payload(obj: Any, *, writable: bool) -> np.ndarray:
    """The memory object's bytes as a flat view (its tensor, else its byte_array)."""
    tensor = getattr(obj, "tensor", None)
    return byte_view(tensor if tensor is not None else obj.byte_array, writable=writable)


def _describe(obj: Any) -> tuple[tuple, str, int]:
    """(shape, dtype name, memory format) of an LMCache memory object (or ours)."""
    meta = getattr(obj, "metadata", None) or getattr(obj, "meta", None)
    if meta is not None and hasattr(meta, "shape"):
        fmt = getattr(meta, "fmt", 0)
        return tuple(meta.shape), str(meta.dtype).replace("torch.", ""), int(getattr(fmt, "value", fmt))
    if hasattr(obj, "meta_shape"):
        return obj.meta_shape, obj.meta_dtype, obj.meta_fmt
    return (), "uint8", 0


__all__ = ["BytesMemoryObj", "CxlhmRemoteConnector"]
