"""The engine-agnostic KV API every adapter is built on.

    shim = KVShim.open({"capacity": "64GiB", "dram_bytes": "256MiB",
                        "backend": {"path": "/mnt/nvme/kv.img"}}, tenant="llama-3-8b")
    n = shim.lookup_prefix(keys)               # leading hits
    hits = shim.exists(keys)                   # per-key hit list (sparse)
    a = shim.allocate(key, nbytes)             # write in place ...
    a.write(layer_bytes, offset); shim.commit(a)   # ... then publish
    shim.put_from(key, tensor_or_array)        # or in one call
    shim.get_into(key, tensor_or_array)        # zero-copy into numpy / CPU torch
    t = shim.prefetch(keys); shim.wait(t)      # NEXT_PREFIX hint + eviction protection
    shim.pin(keys); shim.unpin(keys); shim.remove(keys); shim.stats()

Buffers: numpy arrays, CPU torch tensors of any dtype (bfloat16 included: viewed as
bytes, never copied), bytearray / memoryview / mmap; a list of buffers is a scatter
(get) or gather (put) list laid end to end. Keys: bytes, str or int (kvkeys.normalize_key).

A shim is one tenant's view: every call resolves keys in that tenant's namespace.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from host_runtime import kvkeys
from host_runtime.buffers import byte_view
from host_runtime.kvstore import KVStore, PrefetchTicket, PutStatus, Reservation, Session, Tenant, hints_for

log = logging.getLogger("cxlhm.shim")


class RegisteredBuffers:
    """Host memory ranges an engine registered, so raw-pointer APIs (Mooncake's
    put_from/get_into, SGLang's zero-copy pages) can check a pointer before touching
    it: a bad pointer is a clear error, never a crash."""

    def __init__(self):
        self._ranges: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, ptr: int, size: int) -> None:
        if ptr <= 0 or size <= 0:
            raise ValueError(f"cannot register buffer at {ptr:#x} of {size} bytes")
        with self._lock:
            self._ranges[ptr] = size

    def add_tensor(self, tensor: Any) -> None:
        view = byte_view(tensor, writable=False)
        self.add(view.ctypes.data, view.nbytes)

    def remove(self, ptr: int) -> bool:
        with self._lock:
            return self._ranges.pop(ptr, None) is not None

    def contains(self, ptr: int, size: int) -> bool:
        with self._lock:
            return any(base <= ptr and ptr + size <= base + length for base, length in self._ranges.items())

    def view(self, ptr: int, size: int) -> np.ndarray:
        """A writable numpy view of [ptr, ptr+size); ValueError unless it is registered."""
        if not isinstance(ptr, (int, np.integer)) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"bad buffer pointer/size ({ptr!r}, {size!r})")
        if not self.contains(int(ptr), int(size)):
            raise ValueError(f"[{int(ptr):#x}, +{int(size)}) is not inside a registered buffer")
        return np.ctypeslib.as_array((ctypes.c_ubyte * int(size)).from_address(int(ptr)))

    def __len__(self) -> int:
        return len(self._ranges)


class KVShim:
    """One tenant's engine-facing API over a KVStore."""

    def __init__(self, tenant: Tenant, *, owned: Sequence[Any] = ()):
        self.tenant = tenant
        self.store: KVStore = tenant.store
        self._owned = list(owned)  # things this shim opened and closes (store, then the device handle)
        self._closed = False

    # ------------------------------------------------------------ construction
    @classmethod
    def open(cls, device: Mapping | str | None = None, *, tenant: str = "default",
             index_path: Any = None, hints: str | Any = "mailbox", salt: Any = None,
             tenant_limits: Mapping | None = None) -> "KVShim":
        """Open a device (a profile name, YAML path or dict of overrides, as
        ``host_runtime.open_device``), a store on it and a tenant.

        hints: "mailbox" (start the device's mailbox and send hints through it, the real
        path), "direct" (in-process Device.hint, no mailbox), "none", or a HintSink."""
        from host_runtime.driver import open_device
        handle = open_device(device)
        store = None
        try:
            store = KVStore(handle, index_path=index_path, hints=_hint_sink(handle, hints))
            return cls(store.tenant(tenant, salt=salt, **dict(tenant_limits or {})), owned=[store, handle])
        except BaseException:
            if store is not None:
                _close(store)
            handle.close()
            raise

    # ------------------------------------------------------------ lookups
    def key(self, key: Any) -> bytes:
        return kvkeys.normalize_key(key)

    def lookup_prefix(self, keys: Sequence[Any]) -> int:
        """Number of leading keys stored (a prefix hit length, in chunks)."""
        return self.tenant.lookup_prefix(keys)

    def exists(self, keys: Sequence[Any]) -> list[bool]:
        """Per-key hits, anywhere in the list (a sparse hit bitmap)."""
        return self.tenant.lookup_sparse(keys).tolist()

    def contains(self, key: Any) -> bool:
        return self.tenant.contains(key)

    def size_of(self, key: Any) -> int | None:
        return self.tenant.size_of(key)

    def keys(self) -> list[bytes]:
        return self.tenant.keys()

    # ------------------------------------------------------------ data
    def allocate(self, key: Any, nbytes: int, *, session: Session | str | None = None) -> Reservation | PutStatus:
        """Reserve room for a chunk: write it with ``.write(buf, offset)`` (in place, e.g.
        layer by layer), then ``commit()``. Returns PutStatus.EXISTS / IN_FLIGHT /
        NO_SPACE instead when there is nothing to write or no room."""
        return self.tenant.reserve(key, nbytes, session=self._session(session))

    def commit(self, allocation: Reservation) -> bool:
        """Publish an allocation (lookups see it from now on)."""
        self._check_mine(allocation)
        return allocation.commit()

    def abort(self, allocation: Reservation) -> None:
        self._check_mine(allocation)
        allocation.abort()

    def put_from(self, key: Any, buf: Any, *, session: Session | str | None = None) -> PutStatus:
        return self.tenant.put_from(key, buf, session=self._session(session))

    def get_into(self, key: Any, buf: Any, *, session: Session | str | None = None, exact: bool = True) -> int | None:
        """Fill `buf` with the chunk; returns its size, or None on a miss. ValueError if
        `buf` does not hold exactly (or, with exact=False, at least) the chunk."""
        return self.tenant.get_into(key, buf, session=self._session(session), exact=exact)

    def read_range(self, key: Any, offset: int, buf: Any) -> bool:
        """Read part of a chunk (e.g. one layer of a layer-first chunk). False on a miss."""
        return self.tenant.read_range(key, offset, buf)

    def get_many_into(self, keys: Sequence[Any], out: Any, *, session: Session | str | None = None) -> int:
        """Equal-size chunks end to end in `out`, one device pass; returns the hit prefix length."""
        return self.tenant.get_many_into(keys, out, session=self._session(session))

    # ------------------------------------------------------------ prefetch, pins, removal
    def prefetch(self, keys: Sequence[Any], *, session: Session | str | None = None, deadline_ns: int = 0) -> PrefetchTicket:
        return self.tenant.prefetch(keys, session=self._session(session), deadline_ns=deadline_ns)

    def wait(self, ticket: PrefetchTicket) -> int:
        """Finish a prefetch: returns how many leading keys it found (they may be read now)."""
        if ticket.tenant is not self.tenant:
            raise PermissionError("that prefetch belongs to another tenant")
        return self.store.wait(ticket)

    def pin(self, keys: Sequence[Any]) -> int:
        return self.tenant.pin(keys)

    def unpin(self, keys: Sequence[Any]) -> int:
        return self.tenant.unpin(keys)

    def touch(self, keys: Sequence[Any]) -> None:
        self.tenant.touch(keys)

    def remove(self, keys: Sequence[Any] | Any) -> int:
        """Delete keys (a key or a list); returns how many were stored."""
        if isinstance(keys, (bytes, str, int)) or hasattr(keys, "to_string"):
            keys = [keys]
        return sum(self.tenant.remove(k) for k in keys)

    # ------------------------------------------------------------ sessions
    def session(self, name: str | None = None) -> Session:
        """This tenant's session `name`, opened on first use."""
        if name is not None:
            existing = self.tenant.session(name)
            if existing is not None:
                return existing
        return self.tenant.open_session(name)

    def _session(self, session: Session | str | None) -> Session | None:
        if session is None or isinstance(session, Session):
            return session
        return self.session(str(session))

    # ------------------------------------------------------------ misc
    def stats(self) -> dict:
        store = self.store.stats()
        return {**self.tenant.stats(), "store_used_bytes": store["used_bytes"], "store_free_bytes": store["free_bytes"],
                "hint_errors": store["hint_errors"]}

    def flush(self) -> None:
        self.store.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for thing in self._owned:
            _close(thing)

    def _check_mine(self, allocation: Reservation) -> None:
        if not isinstance(allocation, Reservation) or allocation.tenant is not self.tenant:
            raise PermissionError("that allocation belongs to another tenant")

    def __enter__(self) -> "KVShim":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def device_settings(device: Any, fields: Mapping[str, Any], suffix: str | None) -> Any:
    """An adapter's device settings (a profile name, a YAML path, a dict, or a JSON object
    as a string) with ``{field}`` placeholders filled in. When `suffix` is given (the
    engine runs several ranks, each its own process) an image path naming no field gets
    ``.<suffix>`` appended: two ranks must never open one image."""
    import json
    if isinstance(device, str) and device.lstrip().startswith("{"):
        device = json.loads(device)
    if device is None or isinstance(device, str):
        return device.format(**fields) if isinstance(device, str) else None

    def fill(value):
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value.format(**fields) if isinstance(value, str) else value
    settings = fill(dict(device))
    backend = device.get("backend")
    path = backend.get("path") if isinstance(backend, dict) else None
    if isinstance(path, str) and suffix is not None and "{" not in path:
        settings["backend"]["path"] = f"{path}.{suffix}"
    return settings


def _close(thing: Any) -> None:
    try:
        thing.close()
    except Exception as exc:  # closing one part must not keep the others open
        log.warning("closing %r failed: %s", thing, exc)


def _hint_sink(handle, hints) -> Any:
    """The sink the `hints` option of KVShim.open names (a mailbox it starts is closed
    with the handle)."""
    from host_runtime.hintsinks import HINT_SINKS
    if not isinstance(hints, str):
        return hints
    if hints not in HINT_SINKS:
        raise ValueError(f"hints must be 'mailbox', 'direct', 'none' or a HintSink, got {hints!r}")
    return handle.hint_sink(hints)


__all__ = ["KVShim", "PutStatus", "RegisteredBuffers", "byte_view", "device_settings", "hints_for"]
