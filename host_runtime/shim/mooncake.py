"""Mooncake-store style zero-copy API on cxlhm.

Mooncake's ``MooncakeDistributedStore`` (docs/source/python-api-reference/mooncake-store.md):
  register_buffer(buffer_ptr, size) -> 0 | error     unregister_buffer(buffer_ptr)
  put_from(key, buffer_ptr, size, config=None) -> 0 | negative error
  get_into(key, buffer_ptr, size) -> bytes read | negative error (buffer >= object)
  batch_put_from(keys, buffer_ptrs, sizes, config=None) -> [int]
  batch_get_into(keys, buffer_ptrs, sizes) -> [int]
  is_exist(key) / batch_is_exist(keys) -> 1 exists, 0 not, -1 error
  get_size(key) -> bytes | negative, remove(key) -> 0 | negative, close()
Error codes are Mooncake's (mooncake-store/include/types.h ErrorCode): OBJECT_NOT_FOUND
-704, OBJECT_ALREADY_EXISTS -705 (also for a key another writer is storing now),
INVALID_PARAMS -600, NO_AVAILABLE_HANDLE -200 (no space).

As in Mooncake, zero-copy calls take raw pointers that must lie in a registered
buffer; an unregistered pointer is INVALID_PARAMS, never a wild write.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

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

_PUT_CODES = {PutStatus.STORED: OK, PutStatus.EXISTS: OBJECT_ALREADY_EXISTS,
              PutStatus.IN_FLIGHT: OBJECT_ALREADY_EXISTS, PutStatus.NO_SPACE: NO_AVAILABLE_HANDLE}


class CxlhmMooncakeStore:
    def __init__(self, shim: KVShim):
        self.shim = shim
        self.buffers = RegisteredBuffers()

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
        try:
            view = self.buffers.view(buffer_ptr, size)
            if size <= 0:
                return INVALID_PARAMS
            return _PUT_CODES[self.shim.put_from(_key(key), view)]
        except (ValueError, TypeError) as exc:
            log.debug("put_from %r: %s", key, exc)
            return INVALID_PARAMS
        except OSError as exc:
            log.error("put_from %r: %s", key, exc)
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

    def remove(self, key: str) -> int:
        try:
            return OK if self.shim.remove(_key(key)) else OBJECT_NOT_FOUND
        except (ValueError, TypeError):
            return INVALID_PARAMS

    # ------------------------------------------------------------ batches
    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], config: Any = None) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self.put_from(k, p, s, config) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self.get_into(k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        return [self.is_exist(k) for k in keys]

    def close(self) -> int:
        self.shim.flush()
        return OK


def _key(key: Any) -> bytes:
    return kvkeys.normalize_key(key)


__all__ = ["CxlhmMooncakeStore", "NO_AVAILABLE_HANDLE", "INVALID_PARAMS", "OBJECT_ALREADY_EXISTS",
           "OBJECT_NOT_FOUND", "OK"]
