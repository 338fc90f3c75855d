"""Mooncake-store style zero-copy API on cxlhm.

Mooncake's ``MooncakeDistributedStore`` (docs/source/python-api-reference/mooncake-store.md):
  register_buffer(buffer_ptr, size) -> 0 | error     unregister_buffer(buffer_ptr)
  put_from(key, buffer_ptr, size, config=None) -> 0 | negative error
  get_into(key, buffer_ptr, size) -> bytes read | negative error (buffer >= object)
  batch_put_from(keys, buffer_ptrs, sizes, config=None) -> [int]
  batch_get_into(keys, buffer_ptrs, sizes) -> [int]
  is_exist(key) / batch_is_exist(keys) -> 1 exists, 0 not, -1 error
  get_size(key) -> bytes | negative, remove(key) -> 0 | negative, close()
  setup(...) / setup_dummy(...) -> 0, put(key, bytes) / put_parts(key, *parts) -> 0,
  get(key) -> bytes (b"" on a miss), batch_put_from_multi_buffers(keys, ptrs, sizes)
  / batch_get_into_multi_buffers(keys, ptrs, sizes) (each key gathered from / scattered
  into several registered ranges), remove(key, force=False), remove_all() -> count,
  get_hostname()
Error codes are Mooncake's (mooncake-store/include/types.h ErrorCode): OBJECT_NOT_FOUND
-704, INVALID_PARAMS -600, NO_AVAILABLE_HANDLE -200 (no space). A put of a key that is
already stored (or being stored by another writer) returns 0, as Mooncake's does: keys
name content, the bytes are already there.

Using it where an engine builds ``MooncakeDistributedStore()`` (SGLang's, vLLM's and
LMCache's Mooncake backends import it by that name from ``mooncake.store``): construct
``CxlhmMooncakeStore()`` instead and call ``setup(...)`` as for Mooncake; the network
arguments are accepted and ignored, and the device comes from ``CXLHM_MOONCAKE_DEVICE``
(a profile name, a YAML path or a JSON object of device settings; ``{pid}`` in it is
this process's id, so every rank opens its own image) with tenant
``CXLHM_MOONCAKE_TENANT`` (default ``mooncake``).

As in Mooncake, zero-copy calls take raw pointers that must lie in a registered
buffer; an unregistered pointer is INVALID_PARAMS, never a wild write.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from host_runtime import kvkeys
from host_runtime.kvstore import PutStatus
from host_runtime.shim.api import KVShim, RegisteredBuffers

log = logging.getLogger("cxlhm.shim.mooncake")

OK = 0
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
INTERNAL_ERROR = -1

_PUT_CODES = {PutStatus.STORED: OK, PutStatus.EXISTS: OK, PutStatus.IN_FLIGHT: OK,
              PutStatus.NO_SPACE: NO_AVAILABLE_HANDLE}


class CxlhmMooncakeStore:
    def __init__(self, shim: KVShim | None = None):
        self.shim = shim
        self._owns_shim = False
        self.buffers = RegisteredBuffers()

    # ------------------------------------------------------------ lifecycle
    def setup(self, *args: Any, **kwargs: Any) -> int:
        """Mooncake's setup (positional or dict form): opens the device named by
        CXLHM_MOONCAKE_DEVICE; the cluster arguments have no meaning here."""
        if self.shim is not None:
            return OK
        import json
        import os
        device = os.environ.get("CXLHM_MOONCAKE_DEVICE")
        if not device:
            raise ValueError("CxlhmMooncakeStore.setup: set CXLHM_MOONCAKE_DEVICE to a profile name, a YAML "
                             "path or a JSON object of device settings")
        device = device.replace("{pid}", str(os.getpid()))
        settings = json.loads(device) if device.lstrip().startswith("{") else device
        self.shim = KVShim.open(settings, tenant=os.environ.get("CXLHM_MOONCAKE_TENANT", "mooncake"),
                                hints=os.environ.get("CXLHM_MOONCAKE_HINTS", "mailbox"))
        self._owns_shim = True
        return OK

    def setup_dummy(self, *args: Any, **kwargs: Any) -> int:
        return self.setup()

    def get_hostname(self) -> str:
        import socket
        return socket.gethostname()

    # ------------------------------------------------------------ copying APIs
    def put(self, key: str, value: Any, config: Any = None) -> int:
        return self.put_parts(key, value, config=config)

    def put_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        return self._put_code("put", key, lambda: [np.frombuffer(memoryview(p), np.uint8) for p in parts])

    def get(self, key: str) -> bytes:
        """The object's bytes, b"" when it is not stored (Mooncake's miss)."""
        try:
            size = self.shim.size_of(_key(key))
            if size is None:
                return b""
            out = np.empty(size, np.uint8)
            return out.tobytes() if self.shim.get_into(_key(key), out) is not None else b""
        except (ValueError, TypeError):
            return b""

    # ------------------------------------------------------------ buffers
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        try:
            self.buffers.add(int(buffer_ptr), int(size))
        except (ValueError, TypeError):
            return INVALID_PARAMS
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        return OK if self.buffers.remove(int(buffer_ptr)) else INVALID_PARAMS

    # ------------------------------------------------------------ single objects
    def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self._put_code("put_from", key, lambda: [self.buffers.view(buffer_ptr, size)])

    def _put_code(self, op: str, key: str, buffers) -> int:
        """Mooncake's return code for storing the bytes `buffers()` gives under `key`: an
        empty or unusable buffer is INVALID_PARAMS, a media error INTERNAL_ERROR."""
        try:
            bufs = buffers()
            if not sum(b.nbytes for b in bufs):
                return INVALID_PARAMS
            return _PUT_CODES[self.shim.put_from(_key(key), bufs if len(bufs) > 1 else bufs[0])]
        except (ValueError, TypeError) as exc:
            log.debug("%s %r: %s", op, key, exc)
            return INVALID_PARAMS
        except OSError as exc:
            log.error("%s %r: %s", op, key, exc)
            return INTERNAL_ERROR

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        try:
            view = self.buffers.view(buffer_ptr, size)
            got = self.shim.get_into(_key(key), view, exact=False)
        except (ValueError, TypeError) as exc:  # unregistered pointer, buffer smaller than the object
            log.debug("get_into %r: %s", key, exc)
            return INVALID_PARAMS
        return OBJECT_NOT_FOUND if got is None else got

    def is_exist(self, key: str) -> int:
        try:
            return 1 if self.shim.contains(_key(key)) else 0
        except (ValueError, TypeError):
            return -1

    def get_size(self, key: str) -> int:
        try:
            size = self.shim.size_of(_key(key))
        except (ValueError, TypeError):
            return INVALID_PARAMS
        return OBJECT_NOT_FOUND if size is None else size

    def remove(self, key: str, force: bool = False) -> int:
        try:
            return OK if self.shim.remove(_key(key)) else OBJECT_NOT_FOUND
        except (ValueError, TypeError):
            return INVALID_PARAMS

    def remove_all(self, force: bool = False) -> int:
        """Removes every object of this tenant; returns how many."""
        return self.shim.remove(self.shim.keys())

    # ------------------------------------------------------------ batches
    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], config: Any = None) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self.put_from(k, p, s, config) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self.get_into(k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    def batch_put_from_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]], config: Any = None) -> list[int]:
        """Each key's object gathered from several registered ranges (e.g. K and V pages)."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self._multi(k, ptrs, sizes, write=True) for k, ptrs, sizes in zip(keys, all_buffer_ptrs, all_sizes)]

    def batch_get_into_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]], prefer_same_node: bool = True) -> list[int]:
        """Each key's object scattered into several registered ranges; bytes read or an error."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self._multi(k, ptrs, sizes, write=False) for k, ptrs, sizes in zip(keys, all_buffer_ptrs, all_sizes)]

    def _multi(self, key: str, ptrs: Sequence[int], sizes: Sequence[int], *, write: bool) -> int:
        try:
            if len(ptrs) != len(sizes) or not len(ptrs):
                return INVALID_PARAMS
            views = [self.buffers.view(p, n) for p, n in zip(ptrs, sizes)]
            if write:
                return _PUT_CODES[self.shim.put_from(_key(key), views)]
            got = self.shim.get_into(_key(key), views)
        except (ValueError, TypeError) as exc:  # unregistered range, sizes that do not add up to the object
            log.debug("%s %r: %s", "put" if write else "get", key, exc)
            return INVALID_PARAMS
        except OSError as exc:
            log.error("%r: %s", key, exc)
            return INTERNAL_ERROR
        return OBJECT_NOT_FOUND if got is None else got

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        return [self.is_exist(k) for k in keys]

    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list]:
        """Where each stored object lives, as Mooncake's replica descriptors: one memory
        replica (the device's byte-addressable window) per stored key, none when missing."""
        return {k: [_MemoryReplica()] if self.is_exist(k) == 1 else [] for k in keys}

    def close(self) -> int:
        if self.shim is not None:
            self.shim.close() if self._owns_shim else self.shim.flush()
        return OK


class _MemoryReplica:
    """The predicates vLLM's Mooncake worker asks of a replica descriptor."""

    def is_memory_replica(self) -> bool:
        return True

    def is_disk_replica(self) -> bool:
        return False

    def is_local_disk_replica(self) -> bool:
        return False


def _key(key: Any) -> bytes:
    return kvkeys.normalize_key(key)


__all__ = ["CxlhmMooncakeStore", "NO_AVAILABLE_HANDLE", "INVALID_PARAMS", "OBJECT_ALREADY_EXISTS",
           "OBJECT_NOT_FOUND", "OK"]
