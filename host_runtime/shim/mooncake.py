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

Also ``get_buffer(key)`` / ``batch_get_buffer(keys)`` -> `BufferHandle` (Python's buffer
protocol, ``ptr()``, ``size()``) or None on a miss, which LMCache's Mooncake connector
reads through in its default ``save_chunk_meta`` mode. Every method SGLang's, vLLM's
and LMCache's Mooncake back ends touch on the store is here (tests/test_engine_mooncake.py
finds them by walking those sources).

Using it where an engine builds ``MooncakeDistributedStore()`` (SGLang's, vLLM's and
LMCache's Mooncake backends import it by that name from ``mooncake.store``): call
`install_as_mooncake_store()` before the engine imports it (it serves ``mooncake.store``
with this class as ``MooncakeDistributedStore``, plus ``ReplicateConfig``), or construct
``CxlhmMooncakeStore()`` yourself, and call ``setup(...)`` as for Mooncake; the network
arguments are accepted and ignored, and the device comes from ``CXLHM_MOONCAKE_DEVICE``
(a profile name, a YAML path or a JSON object of device settings; ``{pid}`` in it is
this process's id, so every rank opens its own image) with tenant
``CXLHM_MOONCAKE_TENANT`` (default ``mooncake``). Before ``setup()`` every call answers
INVALID_PARAMS (b"" / None / -1 where Mooncake's answer has that type), as Mooncake's
does.

The open image belongs to the instances using it, not to the process: instances that
name the same device share it (as Mooncake clients share one cluster), and it is closed
when the last of them is closed or garbage-collected. An engine that drops its store
without closing it (SGLang's MooncakeStore.close() does nothing) can so attach again in
the same process, and finds what it stored.

As in Mooncake, zero-copy calls take raw pointers that must lie in a registered
buffer; an unregistered pointer is INVALID_PARAMS, never a wild write. The store copies
with the CPU, so registered buffers must be host memory: `register_buffer` refuses a
GPU pointer (INVALID_PARAMS, with an ERROR naming the way out) when it can tell one -
through torch's CUDA runtime, where torch has CUDA. Engines that register their GPU KV
cache (vLLM's Mooncake store worker) need a host staging buffer in between: register a
pinned host buffer of the same size, copy GPU -> host before a put and host -> GPU
after a get (docs/kvstore.md, "GPU memory").
"""
from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from host_runtime import kvkeys
from host_runtime.kvstore import PutStatus
from host_runtime.shim.api import KVShim, RegisteredBuffers
from host_runtime.shim.registry import EngineAdapter

log = logging.getLogger("cxlhm.shim.mooncake")

OK = 0
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
INTERNAL_ERROR = -1

_PUT_CODES = {PutStatus.STORED: OK, PutStatus.EXISTS: OK, PutStatus.IN_FLIGHT: OK,
              PutStatus.NO_SPACE: NO_AVAILABLE_HANDLE}


class BufferHandle(bytearray):
    """One object's bytes as `get_buffer` / `batch_get_buffer` return them: Python's buffer
    protocol (memoryview, torch.frombuffer, numpy.frombuffer) plus Mooncake's
    ``ptr()`` and ``size()``."""

    def ptr(self) -> int:
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self)) if len(self) else 0

    def size(self) -> int:
        return len(self)


class _OpenImages:
    """Open shims by device setting and tenant, shared by the instances that name them
    and closed by the last one to let go."""

    def __init__(self):
        self._lock = threading.RLock()  # reentrant: a store collected while opening another releases here
        self._open: dict[tuple, list] = {}  # key -> [shim, users]

    def acquire(self, key: tuple, opener) -> KVShim:
        with self._lock:
            held = self._open.get(key)
            if held is not None and not held[0]._closed:
                held[1] += 1
                return held[0]
            shim = opener()
            self._open[key] = [shim, 1]
            return shim

    def release(self, key: tuple) -> None:
        with self._lock:
            held = self._open.get(key)
            if held is None:
                return
            held[1] -= 1
            if held[1] > 0:
                held[0].flush()
                return
            del self._open[key]
        held[0].close()


_IMAGES = _OpenImages()


def _needs_setup(default):
    """Mooncake's answer before setup(): INVALID_PARAMS, in the method's return type."""
    def wrap(method):
        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            if self.shim is None:
                log.error("CxlhmMooncakeStore.%s before setup(): INVALID_PARAMS", method.__name__)
                return default(*args) if callable(default) else default
            return method(self, *args, **kwargs)
        return guarded
    return wrap


def _per_key(value):
    return lambda keys=(), *rest: [value] * len(keys)


class CxlhmMooncakeStore:
    def __init__(self, shim: KVShim | None = None):
        self.shim = shim
        self._image_key: tuple | None = None  # set when setup() opened (or joined) a shared image
        self.buffers = RegisteredBuffers()

    # ------------------------------------------------------------ lifecycle
    def setup(self, *args: Any, **kwargs: Any) -> int:
        """Mooncake's setup (positional or dict form): opens the device named by
        CXLHM_MOONCAKE_DEVICE; the cluster arguments have no meaning here."""
        if self.shim is not None:
            return OK
        device = os.environ.get("CXLHM_MOONCAKE_DEVICE")
        if not device:
            raise ValueError("CxlhmMooncakeStore.setup: set CXLHM_MOONCAKE_DEVICE to a profile name, a YAML "
                             "path or a JSON object of device settings")
        device = device.replace("{pid}", str(os.getpid()))
        settings = json.loads(device) if device.lstrip().startswith("{") else device
        tenant = os.environ.get("CXLHM_MOONCAKE_TENANT", "mooncake")
        hints = os.environ.get("CXLHM_MOONCAKE_HINTS", "mailbox")
        key = (device, tenant, hints)
        self.shim = _IMAGES.acquire(key, lambda: KVShim.open(settings, tenant=tenant, hints=hints))
        self._image_key = key
        return OK

    def setup_dummy(self, *args: Any, **kwargs: Any) -> int:
        return self.setup()

    def get_hostname(self) -> str:
        import socket
        return socket.gethostname()

    def close(self) -> int:
        """Let go of the image (closed when no other instance uses it); a shim passed to
        the constructor is the caller's and is only flushed."""
        shim, key = self.shim, self._image_key
        self.shim, self._image_key = None, None
        if key is not None:
            _IMAGES.release(key)
        elif shim is not None:
            shim.flush()
        return OK

    def __del__(self):
        try:
            if self._image_key is not None:
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to tell
            pass

    # ------------------------------------------------------------ copying APIs
    @_needs_setup(INVALID_PARAMS)
    def put(self, key: str, value: Any, config: Any = None) -> int:
        return self.put_parts(key, value, config=config)

    @_needs_setup(INVALID_PARAMS)
    def put_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        return self._put_code("put", key, lambda: [np.frombuffer(memoryview(p), np.uint8) for p in parts])

    @_needs_setup(b"")
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

    @_needs_setup(None)
    def get_buffer(self, key: str) -> BufferHandle | None:
        """The object's bytes in a new buffer, None when it is not stored."""
        try:
            k = _key(key)
            size = self.shim.size_of(k)
            if size is None:
                return None
            out = BufferHandle(size)
            return out if self.shim.get_into(k, out) is not None else None
        except (ValueError, TypeError) as exc:
            log.debug("get_buffer %r: %s", key, exc)
            return None

    @_needs_setup(_per_key(None))
    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        return [self.get_buffer(k) for k in keys]

    # ------------------------------------------------------------ buffers
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register host memory for the zero-copy calls. A GPU pointer is refused with an
        ERROR (the store copies with the CPU; see the module docstring for staging)."""
        try:
            ptr, size = int(buffer_ptr), int(size)
        except (ValueError, TypeError):
            return INVALID_PARAMS
        kind = pointer_kind(ptr)
        if kind == "device":
            log.error("register_buffer(%#x, %d): a GPU pointer. The cxlhm store copies with the CPU and "
                      "needs host memory: register a pinned host staging buffer instead and copy GPU <-> "
                      "host around put/get (docs/kvstore.md, 'GPU memory'). INVALID_PARAMS", ptr, size)
            return INVALID_PARAMS
        try:
            self.buffers.add(ptr, size)
        except (ValueError, TypeError):
            return INVALID_PARAMS
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        return OK if self.buffers.remove(int(buffer_ptr)) else INVALID_PARAMS

    # ------------------------------------------------------------ single objects
    @_needs_setup(INVALID_PARAMS)
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

    @_needs_setup(INVALID_PARAMS)
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        try:
            view = self.buffers.view(buffer_ptr, size)
            got = self.shim.get_into(_key(key), view, exact=False)
        except (ValueError, TypeError) as exc:  # unregistered pointer, buffer smaller than the object
            log.debug("get_into %r: %s", key, exc)
            return INVALID_PARAMS
        return OBJECT_NOT_FOUND if got is None else got

    @_needs_setup(-1)
    def is_exist(self, key: str) -> int:
        try:
            return 1 if self.shim.contains(_key(key)) else 0
        except (ValueError, TypeError):
            return -1

    @_needs_setup(INVALID_PARAMS)
    def get_size(self, key: str) -> int:
        try:
            size = self.shim.size_of(_key(key))
        except (ValueError, TypeError):
            return INVALID_PARAMS
        return OBJECT_NOT_FOUND if size is None else size

    @_needs_setup(INVALID_PARAMS)
    def remove(self, key: str, force: bool = False) -> int:
        try:
            return OK if self.shim.remove(_key(key)) else OBJECT_NOT_FOUND
        except (ValueError, TypeError):
            return INVALID_PARAMS

    @_needs_setup(INVALID_PARAMS)
    def remove_all(self, force: bool = False) -> int:
        """Removes every object of this tenant; returns how many."""
        return self.shim.remove(self.shim.keys())

    # ------------------------------------------------------------ batches
    @_needs_setup(_per_key(INVALID_PARAMS))
    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], config: Any = None) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self.put_from(k, p, s, config) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    @_needs_setup(_per_key(INVALID_PARAMS))
    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self.get_into(k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    @_needs_setup(_per_key(INVALID_PARAMS))
    def batch_put_from_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]], config: Any = None) -> list[int]:
        """Each key's object gathered from several registered ranges (e.g. K and V pages)."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
            return [INVALID_PARAMS] * len(keys)
        return [self._multi(k, ptrs, sizes, write=True) for k, ptrs, sizes in zip(keys, all_buffer_ptrs, all_sizes)]

    @_needs_setup(_per_key(INVALID_PARAMS))
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

    @_needs_setup(_per_key(-1))
    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        return [self.is_exist(k) for k in keys]

    @_needs_setup(_per_key(-1))
    def batch_probe_key(self, keys: Sequence[str]) -> list[int]:
        """Existence without a lease (newer Mooncake; vLLM 0.34's selective lease probes with
        it, then leases the hit with batch_is_exist). Nothing here leases on a lookup, so
        it answers as batch_is_exist."""
        return [self.is_exist(k) for k in keys]

    @_needs_setup(lambda keys=(), *rest: {})
    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list]:
        """Where each stored object lives, as Mooncake's replica descriptors: one memory
        replica (the device's byte-addressable window) per stored key, none when missing."""
        return {k: [_MemoryReplica()] if self.is_exist(k) == 1 else [] for k in keys}


def pointer_kind(ptr: int) -> str:
    """"device" for a CUDA device pointer, "host" otherwise (pageable, pinned or managed
    host memory, or no CUDA runtime to ask). Asks the CUDA runtime's
    cudaPointerGetAttributes, only when torch is imported and has CUDA (a CPU host never
    loads the runtime)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return "host"
        attributes = _CudaPointerAttributes()
        status = _cudart().cudaPointerGetAttributes(ctypes.byref(attributes), ctypes.c_void_p(ptr))
    except Exception as exc:  # noqa: BLE001 - no runtime to ask: host, as the store assumes
        log.debug("pointer %#x: cannot ask the CUDA runtime (%s)", ptr, exc)
        return "host"
    return "device" if status == 0 and attributes.type == _CUDA_MEMORY_TYPE_DEVICE else "host"


class _CudaPointerAttributes(ctypes.Structure):
    # cudaPointerAttributes; newer runtimes append fields (CUDA 13: reserved words), so room
    # is left after the four this reads - the runtime writing past a short struct crashes
    # the process later
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int),
                ("devicePointer", ctypes.c_void_p), ("hostPointer", ctypes.c_void_p),
                ("room", ctypes.c_uint64 * 32)]


_CUDA_MEMORY_TYPE_DEVICE = 2  # cudaMemoryTypeDevice (cudaMemoryTypeHost 1, Managed 3, Unregistered 0)


@functools.lru_cache(maxsize=1)
def _cudart() -> ctypes.CDLL:
    """The CUDA runtime library this process already runs (torch's), else the system's: a
    second copy of the runtime in one process crashes it at exit."""
    candidates = []
    try:
        with open("/proc/self/maps") as maps:
            candidates += sorted({line.split()[-1] for line in maps if "/libcudart.so" in line})
    except OSError:
        pass
    candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    errors = []
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise OSError("no CUDA runtime library: " + "; ".join(errors[-2:]))


class ReplicateConfig:
    """Mooncake's replication settings; accepted and ignored (one image, no replicas)."""

    def __init__(self):
        self.replica_num = 1
        self.with_soft_pin = False
        self.preferred_segment = ""
        self.preferred_segments: list[str] = []


def install_as_mooncake_store() -> types.ModuleType:
    """Serve ``mooncake.store`` from here: engines that ``from mooncake.store import
    MooncakeDistributedStore, ReplicateConfig`` get CxlhmMooncakeStore. Call it before the
    engine imports its Mooncake back end; returns the module."""
    module = types.ModuleType("mooncake.store")
    module.__doc__ = "cxlhm's stand-in for Mooncake's store (host_runtime.shim.mooncake)"
    module.MooncakeDistributedStore = CxlhmMooncakeStore
    module.ReplicateConfig = ReplicateConfig
    module.BufferHandle = BufferHandle
    sys.modules["mooncake.store"] = module
    parent = sys.modules.get("mooncake")
    if parent is not None:
        parent.store = module
    return module


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


ADAPTER = EngineAdapter(engine="Mooncake store API (MooncakeDistributedStore)",
                        entry="host_runtime.shim.mooncake:CxlhmMooncakeStore",
                        loading="install_as_mooncake_store() before the engine imports mooncake.store")

__all__ = ["BufferHandle", "CxlhmMooncakeStore", "NO_AVAILABLE_HANDLE", "ReplicateConfig", "install_as_mooncake_store",
           "pointer_kind", "INVALID_PARAMS", "OBJECT_ALREADY_EXISTS",
           "OBJECT_NOT_FOUND", "OK"]
