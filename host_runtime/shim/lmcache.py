"""LMCache remote connector on cxlhm.

LMCache's interface (lmcache/v1/storage_backend/connector/base_connector.py,
``RemoteConnector``):
  async exists(key) -> bool            exists_sync(key) -> bool
  async get(key) -> MemoryObj | None   (None: miss)
  async put(key, memory_obj)           (a key already stored is left as is)
  async list() -> [str]                async close()
  batched_contains(keys) -> int        (leading hits: StorageManager slices keys[:n])
  async batched_get(keys) / batched_put(keys, objs), remove_sync(key) -> bool
Keys are LMCache ``CacheEngineKey`` objects (``to_string()`` names them) or strings.

Loading it: both of LMCache's plug-in paths build a connector as
``cls(loop=, local_cpu_backend=, config=)``; the remote-storage-plugin config::

  remote_storage_plugins: ["cxlhm"]
  extra_config:
    remote_storage_plugin.cxlhm.module_path: host_runtime.shim.lmcache
    remote_storage_plugin.cxlhm.class_name: CxlhmRemoteConnector
    remote_storage_plugin.cxlhm.device: {"capacity": "1TiB", "dram_bytes": "256MiB",
                                         "backend": {"path": "/mnt/nvme/lmcache-{worker_id}.img"}}

(or the older ``remote_url: external://host:0/host_runtime.shim.lmcache/?connector_name=
CxlhmRemoteConnector`` with ``extra_config: {cxlhm.device: ...}``). Further keys:
``.tenant`` (default ``lmcache``; LMCache's keys already name model, world size and
worker), ``.index_path``, ``.hints``, ``.pin_lease_s`` and ``.pin_budget`` (below).
``{worker_id}`` / ``{world_size}`` in the image path give each worker its own image (a
path naming neither gets ``.<worker_id>`` appended when there is more than one worker).

Pins: LMCache's async loading looks chunks up with ``batched_async_contains(lookup_id,
keys, pin=True)`` and then reads them with ``batched_get_non_blocking(lookup_id, ...)``;
its unpin for a remote back end does nothing. So a lookup's pins are a lease of the KV
store (kvstore/pinleases.py) named by the lookup id: released after that lookup's get,
replaced by a repeated lookup, and released by the store ``pin_lease_s`` seconds after
the lookup whatever happens (default: LMCache's ``blocking_timeout_secs``, after which
LMCache gives the get up anyway). Pinned bytes stay within ``pin_budget`` (bytes, a size
such as ``"64MiB"``, or a fraction of the store; default 0.25): a lookup over the budget
still hits, its chunks are just not protected from eviction.

Each stored value is LMCache's own remote metadata header (``RemoteMetadata``: length,
memory format, shapes and dtypes of every group) followed by the memory object's
bytes, the layout LMCache's fs connector writes with ``save_chunk_meta`` (its default),
so `get` allocates the right object from the local CPU backend and reads straight into
it. ``RemoteMetadata`` is taken from ``lmcache.v1.protocol`` (0.5.6) or
``lmcache.inprocess.v1.protocol`` (0.5.7 on). Without LMCache, a small header of ours is
used and `get` returns a `BytesMemoryObj` (numpy-backed, ``byte_array``).

Errors: LMCache catches a plug-in's import and construction errors, logs them among its
own messages and runs without the tier. This module logs them at ERROR under
``cxlhm.shim.lmcache`` as well; ``cxlhm doctor --engine lmcache CONFIG`` loads the
plug-in from a config the way LMCache does and names the first error before the engine
starts.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import struct
from typing import Any, Callable

import numpy as np

from host_runtime import kvkeys
from host_runtime.shim.api import KVShim, byte_view, device_settings
from host_runtime.shim.registry import EngineAdapter

log = logging.getLogger("cxlhm.shim.lmcache")

DOCTOR_HINT = "check the config with `cxlhm doctor --engine lmcache CONFIG`"
REMOTE_METADATA_MODULES = ("lmcache.inprocess.v1.protocol", "lmcache.v1.protocol")  # 0.5.7 on, 0.5.6

try:
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector as _Base
except Exception as _exc:  # noqa: BLE001 - without LMCache the connector still works on its own
    _Base = object
    if importlib.util.find_spec("lmcache") is not None:  # installed but broken: LMCache would hide this
        log.error("LMCache is installed but its RemoteConnector does not import (%s: %s): the cxlhm "
                  "connector cannot plug into it; %s", type(_exc).__name__, _exc, DOCTOR_HINT)


def remote_metadata_class() -> type:
    """LMCache's RemoteMetadata, wherever this release keeps it."""
    errors = []
    for name in REMOTE_METADATA_MODULES:
        try:
            cls = getattr(importlib.import_module(name), "RemoteMetadata", None)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if cls is not None:
            return cls
        errors.append(f"{name} has no RemoteMetadata")
    raise ImportError("LMCache's RemoteMetadata was not found (" + "; ".join(errors) + ")")

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
    """Built by LMCache as ``cls(loop=, local_cpu_backend=, config=)`` (the shim is then
    opened from the config), or directly with ``shim=``. `local_cpu_backend`: LMCache's
    LocalCPUBackend (objects for `get` come from its allocator); `allocate`:
    alternatively a callable (shape, dtype, fmt, nbytes) -> memory object. Neither:
    BytesMemoryObj."""

    def __init__(self, loop: Any = None, local_cpu_backend: Any = None, config: Any = None, *,
                 shim: KVShim | None = None, allocate: Callable[..., Any] | None = None):
        try:
            self._build(loop, local_cpu_backend, config, shim, allocate)
        except Exception as exc:
            # LMCache catches this, logs it among its own messages and runs without the tier
            log.error("the cxlhm LMCache connector could not be built: %s: %s; LMCache will run without "
                      "this tier; %s", type(exc).__name__, exc, DOCTOR_HINT)
            raise

    def _build(self, loop, local_cpu_backend, config, shim, allocate) -> None:
        metadata = getattr(local_cpu_backend, "metadata", None)
        self._lmcache_header = _Base is not object and metadata is not None
        if self._lmcache_header:  # LMCache's shapes, dtypes and header size for this model
            self._remote_metadata = remote_metadata_class()
            _Base.__init__(self, config if config is not None else local_cpu_backend.config, metadata)
        self.loop = loop
        self._owns_shim = shim is None
        settings = plugin_settings(config) if shim is None else {}
        self.pin_lease_s = _lease_seconds(settings.get("pin_lease_s"), config)
        if shim is None:
            worker, world = getattr(metadata, "worker_id", 0), getattr(metadata, "world_size", 1)
            shim = KVShim.open(device_settings(settings.get("device"), {"worker_id": worker, "world_size": world},
                                               str(worker) if world > 1 else None), tenant=settings.get("tenant", "lmcache"),
                               index_path=settings.get("index_path"), hints=settings.get("hints", "mailbox"))
            try:
                budget = _pin_budget(settings.get("pin_budget", 0.25), shim.store.capacity)
                shim.store.tenant(shim.tenant.name, max_pinned_bytes=budget)
            except BaseException:
                shim.close()
                raise
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

    def batched_contains(self, keys: list) -> int:
        """How many leading keys are stored (LMCache's StorageManager takes keys[:n])."""
        return self.shim.lookup_prefix([_key(k) for k in keys])

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list, pin: bool = False) -> int:
        """Leading hits; with `pin`, held by a lease named `lookup_id` (released after this
        lookup's batched_get_non_blocking, or pin_lease_s seconds from now)."""
        keys = [_key(k) for k in keys]
        n = self.shim.lookup_prefix(keys)
        if pin and n:
            self.shim.tenant.lease_pins(keys[:n], self.pin_lease_s, lease_id=lookup_id)
        return n

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list) -> list:
        """The leading chunks that are read (LMCache's prefix contract: objects after the
        first miss are released); then the lookup's pins are released."""
        try:
            got = []
            for key in keys:
                obj = self._get(_key(key))
                if obj is None:
                    break
                got.append(obj)
            return got
        finally:
            self.shim.tenant.release_pins(lookup_id)

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
        if self._owns_shim:
            self.shim.close()
        else:
            self.shim.flush()

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        return 0

    # ------------------------------------------------------------ internals
    def _get(self, key: bytes) -> Any:
        if self._lmcache_header:
            return self._get_lmcache(key)
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

    def _get_lmcache(self, key: bytes) -> Any:
        RemoteMetadata = self._remote_metadata
        header = np.empty(self.remote_metadata_bytes, np.uint8)
        if not self.shim.read_range(key, 0, header):
            return None
        try:
            meta = RemoteMetadata.deserialize(bytearray(header.tobytes()))
        except Exception as exc:  # noqa: BLE001 - any undecodable header is not a chunk of ours
            log.error("value of %r has no LMCache header (%s); treating it as a miss", key, exc)
            return None
        if self.shim.size_of(key) != header.nbytes + meta.length:
            log.error("value of %r: header says %d bytes, %d stored; treating it as a miss",
                      key, meta.length, (self.shim.size_of(key) or 0) - header.nbytes)
            return None
        obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
        if obj is None:  # LMCache's allocator is full: a miss, LMCache recomputes
            return None
        payload = _payload(obj, writable=True)
        if payload.nbytes != meta.length or not self.shim.read_range(key, header.nbytes, payload):
            log.error("get %r: the allocated object holds %d bytes, the value %d", key, payload.nbytes, meta.length)
            obj.ref_count_down()
            return None
        return obj

    def _put(self, key: bytes, memory_obj: Any) -> None:
        if self._lmcache_header:
            RemoteMetadata = self._remote_metadata
            payload = _payload(memory_obj, writable=False)
            header = RemoteMetadata(payload.nbytes, memory_obj.get_shapes(), memory_obj.get_dtypes(),
                                    memory_obj.get_memory_format()).serialize()
            status = self.shim.put_from(key, [np.frombuffer(bytes(header), np.uint8), payload])
            if not status.ok:
                log.warning("put %r: %s", key, status.value)
            return
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


def plugin_settings(config: Any) -> dict:
    """This connector's keys from LMCache's extra_config: those of the remote storage
    plugin whose class_name is ours (``remote_storage_plugin.<name>.device``, ...),
    else the ``cxlhm.*`` keys (the external:// path names no plugin)."""
    extra = dict(getattr(config, "extra_config", None) or {})
    prefixes = [key[: -len("class_name")] for key, value in extra.items()
                if key.startswith("remote_storage_plugin.") and key.endswith(".class_name")
                and value == CxlhmRemoteConnector.__name__]
    prefix = prefixes[0] if prefixes else "cxlhm."
    settings = {key[len(prefix):]: value for key, value in extra.items() if key.startswith(prefix)}
    if "device" not in settings:
        raise ValueError(f"LMCache extra_config has no {prefix}device: give the cxlhm device "
                         "(a profile name or settings with backend.path)")
    return settings


def _lease_seconds(value: Any, config: Any) -> float:
    """How long a lookup's pins may last: the setting, else LMCache's blocking timeout."""
    if value is None:
        value = getattr(config, "blocking_timeout_secs", None) or 10
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 0 < seconds <= 3600:
        raise ValueError(f"pin_lease_s must be a number of seconds in (0, 3600], got {value!r}")
    return seconds


def _pin_budget(value: Any, capacity: int) -> int:
    """pin_budget as bytes: a fraction of the store (0..1], a byte count or a size string."""
    from cxlhm.units import parse_size
    if isinstance(value, float) and 0 < value <= 1:
        return int(capacity * value)
    try:
        budget = parse_size(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"pin_budget must be a fraction of the store in (0, 1], a byte count or a size "
                         f"such as '64MiB', got {value!r} ({exc})") from None
    if budget < 0:
        raise ValueError(f"pin_budget must not be negative, got {value!r}")
    return budget


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


ADAPTER = EngineAdapter(engine="LMCache remote connector (RemoteConnector)",
                        entry="host_runtime.shim.lmcache:CxlhmRemoteConnector",
                        loading="remote_storage_plugins: [cxlhm] with module_path host_runtime.shim.lmcache, class_name CxlhmRemoteConnector")

__all__ = ["BytesMemoryObj", "CxlhmRemoteConnector", "plugin_settings", "remote_metadata_class"]
