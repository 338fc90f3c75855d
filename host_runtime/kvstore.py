"""The KV store: content-addressed KV chunks in the HDM window of a cxlhm device.

    store = KVStore(handle)                        # handle = host_runtime.open_device(...)
    alice = store.tenant("alice")                  # a namespace with its own salt
    keys = alice.prefix_keys(tokens, 256)          # chained SHA-256 keys (kvkeys)
    n = alice.lookup_prefix(keys)                  # leading chunks already stored
    alice.put_from(keys[n], chunk_bytes)           # store one chunk (zero-copy from the buffer)
    alice.get_into(keys[0], out)                   # read it back (numpy / torch CPU / any buffer)

    s = alice.open_session()                       # a serving session: hints flow automatically
    s.resume(keys[:n]); s.append(key, data); s.pause(5_000_000); s.end()

What it owns:
* an index key -> extent per tenant, an extent allocator over the window (allocator.py),
  and store-level eviction when the window (or a tenant's quota) is full: ended or
  session-less chunks first, then paused sessions', then active sessions', least
  recently used first; never pinned chunks, never chunks being read or written;
* sessions whose lifecycle emits the request-lifecycle hints (SESSION_RESUME with the
  prefix's extents in prefix order, NEXT_PREFIX, APPEND before writing new KV,
  SESSION_PAUSE, SESSION_END, PIN/UNPIN) through a `HintSink` - the mailbox's
  `HintClient` in production, a recorder in tests - and tags every access with the
  session, so hint-aware firmware (hymcache) can prefetch and buffer;
* a persistent index (an append-only journal next to the device image), so a
  restarted server finds its KV. The crash guarantee (docs/reliability.md): commit()
  publishes a chunk, a later flush() or close() makes it durable. After an unclean
  shutdown, chunks committed after the last completed flush are dropped, and every
  other chunk is checked against the fingerprint taken at its flush (from the device's
  crash-consistent block checksums) and dropped if its blocks changed (principle 4: a
  miss, never wrong bytes); `check()` verifies index and allocator agree;
* tenants: every call goes through a `Tenant`, which only ever sees its own namespace,
  its own sessions and its own pins; keys computed by a tenant carry its salt.
  Capacity pressure evicts by the global policy above, but never below a tenant's
  `reserved_bytes`, and a tenant over its `quota_bytes` evicts only its own chunks.

Metadata work is proportional to the keys a call touches (plus the number of tenants
for a global eviction choice), never to capacity: dicts and LRU lists over live
entries, an O(1) journal append per change, compaction amortised over changes.

Errors: bad input (wrong sizes, unknown keys in remove, oversized keys) raises
ValueError/TypeError with a message; a device media error on a read turns the chunk
into a miss (it is dropped); hint delivery failures are counted, never raised (hints
are advisory).
"""
from __future__ import annotations

import enum
import fcntl
import json
import logging
import os
import secrets
import struct
import threading
import zlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xxhash

from host_runtime import kvkeys
from host_runtime.allocator import AllocatorError, ExtentAllocator
from host_runtime.driver import _byte_view

log = logging.getLogger("cxlhm.kvstore")

INDEX_FORMAT = 1
# Eviction classes, first victims first.
COLD, PAUSED, ACTIVE = 0, 1, 2


class StoreFull(RuntimeError):
    """No room for a chunk even after evicting everything this store may evict."""


class IndexCorrupt(RuntimeError):
    """The persistent index contradicts itself (overlapping extents, wrong window)."""


class PutStatus(enum.Enum):
    STORED = "stored"        # written and published now
    EXISTS = "exists"        # the key is already stored (keys name content: nothing to do)
    IN_FLIGHT = "in_flight"  # another writer holds a reservation for this key
    NO_SPACE = "no_space"    # nothing evictable frees enough room

    @property
    def ok(self) -> bool:
        """The key is (or is about to be) stored."""
        return self in (PutStatus.STORED, PutStatus.EXISTS, PutStatus.IN_FLIGHT)


# ====================================================================== hints
class HintSink(Protocol):
    """Where the store's hints go. host_runtime.mailbox.HintClient implements it (the
    real path, through the CXL mailbox); ranges are (hpa, length) pairs."""

    def session_resume(self, session: int, ranges: Sequence[tuple[int, int]]) -> Any: ...
    def next_prefix(self, session: int, ranges: Sequence[tuple[int, int]], deadline_ns: int = 0) -> Any: ...
    def append(self, session: int, ranges: Sequence[tuple[int, int]]) -> Any: ...
    def session_pause(self, sessions: Sequence[int], expected_pause_ns: int = 0) -> Any: ...
    def session_end(self, sessions: Sequence[int]) -> Any: ...
    def pin(self, ranges: Sequence[tuple[int, int]]) -> Any: ...
    def unpin(self, ranges: Sequence[tuple[int, int]]) -> Any: ...


class NullHints:
    """Drops every hint (a device without a mailbox, or LRU firmware that ignores them)."""

    def session_resume(self, session, ranges): return None
    def next_prefix(self, session, ranges, deadline_ns=0): return None
    def append(self, session, ranges): return None
    def session_pause(self, sessions, expected_pause_ns=0): return None
    def session_end(self, sessions): return None
    def pin(self, ranges): return None
    def unpin(self, ranges): return None


class RecordingHints:
    """Records every hint as (method, args...) and forwards it to `forward` (if any)."""

    def __init__(self, forward: HintSink | None = None):
        self.calls: list[tuple] = []
        self.forward = forward

    def _record(self, name: str, *args):
        self.calls.append((name, *args))
        return getattr(self.forward, name)(*args) if self.forward is not None else None

    def session_resume(self, session, ranges): return self._record("session_resume", session, list(ranges))
    def next_prefix(self, session, ranges, deadline_ns=0): return self._record("next_prefix", session, list(ranges), deadline_ns)
    def append(self, session, ranges): return self._record("append", session, list(ranges))
    def session_pause(self, sessions, expected_pause_ns=0): return self._record("session_pause", list(sessions), expected_pause_ns)
    def session_end(self, sessions): return self._record("session_end", list(sessions))
    def pin(self, ranges): return self._record("pin", list(ranges))
    def unpin(self, ranges): return self._record("unpin", list(ranges))

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]


class DeviceHints:
    """Delivers hints straight to an in-process `cxlhm.device.Device` (no mailbox): for
    benches and tests of firmware behaviour. Production hosts use the mailbox."""

    def __init__(self, device):
        from cxlhm.mailbox.hints import HintKind
        self.device, self.kind = device, HintKind

    def _blocks(self, ranges):
        bs = self.device.block_size
        for hpa, length in ranges:
            if length > 0:
                first = hpa // bs
                yield first, (hpa + length - 1) // bs - first + 1

    def _ranged(self, kind, session, ranges, arg=0):
        return all([self.device.hint(kind, session, first, n, arg) for first, n in self._blocks(ranges)])

    def session_resume(self, session, ranges): return self._ranged(self.kind.SESSION_RESUME, session, ranges)
    def next_prefix(self, session, ranges, deadline_ns=0): return self._ranged(self.kind.NEXT_PREFIX, session, ranges, deadline_ns)
    def append(self, session, ranges): return self._ranged(self.kind.APPEND, session, ranges)
    def session_pause(self, sessions, expected_pause_ns=0):
        return all([self.device.hint(self.kind.SESSION_PAUSE, s, 0, 0, expected_pause_ns) for s in sessions])
    def session_end(self, sessions): return all([self.device.hint(self.kind.SESSION_END, s, 0, 0) for s in sessions])
    def pin(self, ranges): return self._ranged(self.kind.PIN, 0, ranges)
    def unpin(self, ranges): return self._ranged(self.kind.UNPIN, 0, ranges)


def hints_for(handle) -> HintSink:
    """The device handle's mailbox hint client when it has one, else NullHints."""
    return getattr(handle, "hints", None) or NullHints()


def _coalesce(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge ranges that touch (chunks of one prompt are usually allocated back to
    back), keeping their order: smaller hint payloads, same blocks."""
    out: list[list[int]] = []
    for hpa, length in ranges:
        if out and out[-1][0] + out[-1][1] == hpa:
            out[-1][1] += length
        else:
            out.append([hpa, length])
    return [(h, n) for h, n in out]


# ====================================================================== journal
_FRAME = struct.Struct("<II")          # payload length, crc32(payload)
_TENANT = struct.Struct("<IB")         # tenant id, name length (+ name, salt length u8, salt)
_PUT = struct.Struct("<IQQH")          # tenant id, hpa, nbytes, key length (+ key)
_PUTFP = struct.Struct("<IQQQH")       # "Q": a put with its fingerprint: tenant id, hpa, nbytes, fingerprint, key length (+ key)
_FP = struct.Struct("<IQH")            # "V": tenant id, fingerprint, key length (+ key): the chunk's durable bytes
_DEL = struct.Struct("<IH")            # tenant id, key length (+ key)


class _Journal:
    """Append-only index journal: framed records (length, CRC32, payload). A torn or
    corrupt tail (a crash mid-write) ends the replay there; `rewrite` compacts."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.records = 0
        try:  # two stores appending to one journal would corrupt it
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise RuntimeError(f"{path} is in use by another KVStore (close that one first)") from None

    def read_all(self) -> list[bytes]:
        data = self.path.read_bytes()
        out, pos = [], 0
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            payload = data[pos + _FRAME.size: pos + _FRAME.size + length]
            if len(payload) != length or zlib.crc32(payload) != crc:
                break
            out.append(payload)
            pos += _FRAME.size + length
        self.records = len(out)
        return out

    def append(self, payload: bytes) -> None:
        os.write(self.fd, _FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        self.records += 1

    def sync(self) -> None:
        os.fsync(self.fd)

    def rewrite(self, payloads: list[bytes]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(_FRAME.pack(len(p), zlib.crc32(p)) + p for p in payloads))
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
        os.replace(tmp, self.path)
        os.close(self.fd)
        self.fd = fd
        self.records = len(payloads)

    def close(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1


def _put_record(tid: int, key: bytes, hpa: int, nbytes: int, fp: int | None = None) -> bytes:
    if fp is not None:
        return b"Q" + _PUTFP.pack(tid, hpa, nbytes, fp, len(key)) + key
    return b"P" + _PUT.pack(tid, hpa, nbytes, len(key)) + key


def _fp_record(tid: int, key: bytes, fp: int) -> bytes:
    return b"V" + _FP.pack(tid, fp, len(key)) + key


_NO_SUM = (1 << 64) - 1  # stands for a block with no checksum (never written back, or lost)


def chunk_fingerprint(sums: list[int | None]) -> int:
    """A chunk's fingerprint: xxh3-64 over the device's checksums of its blocks, in
    order. Equal fingerprints mean the SSD holds, for every block of the chunk, the
    bytes that were there when it was taken (the device verifies each block it reads
    against the same checksums)."""
    return xxhash.xxh3_64_intdigest(np.array([_NO_SUM if v is None else v for v in sums], np.uint64).tobytes())


def _del_record(tid: int, key: bytes) -> bytes:
    return b"D" + _DEL.pack(tid, len(key)) + key


def _tenant_record(tid: int, name: str, salt: bytes) -> bytes:
    raw = name.encode()
    return b"T" + _TENANT.pack(tid, len(raw)) + raw + bytes([len(salt)]) + salt


# ====================================================================== entries
class _Entry:
    __slots__ = ("tenant", "key", "hpa", "nbytes", "pins", "leases", "active", "paused",
                 "cls", "doomed", "stamp", "fp")

    def __init__(self, tenant: "Tenant", key: bytes, hpa: int, nbytes: int):
        self.tenant, self.key, self.hpa, self.nbytes = tenant, key, hpa, nbytes
        self.pins = self.leases = self.active = self.paused = 0
        self.cls = COLD
        self.doomed = False   # removed while leased: freed when the last lease ends
        self.stamp = 0        # recency: the store's access counter at the last use
        self.fp: int | None = None  # fingerprint of its durable bytes (taken at the flush after its commit)

    def eviction_class(self) -> int:
        return ACTIVE if self.active else PAUSED if self.paused else COLD


class Reservation:
    """An extent reserved for `key`: write it in place, then `commit()` to publish it
    (or `abort()`). Until committed, lookups do not see the key and nothing evicts it.
    `evicted`: keys of this tenant evicted to make room for it."""

    def __init__(self, tenant: "Tenant", key: bytes, hpa: int, nbytes: int, session: "Session | None", evicted: list[bytes]):
        self.tenant, self.key, self.hpa, self.nbytes = tenant, key, hpa, nbytes
        self.session, self.evicted = session, evicted
        self.done = False

    def write(self, data: Any, offset: int = 0) -> int:
        """Write `data` (any buffer) at `offset` inside the extent; returns bytes written."""
        view = _flat_bytes(data, writable=False)
        if self.done:
            raise ValueError("this reservation is already committed or aborted")
        if offset < 0 or offset + view.shape[0] > self.nbytes:
            raise ValueError(f"write of {view.shape[0]} bytes at offset {offset} leaves the "
                             f"{self.nbytes}-byte reservation")
        self.tenant.store.handle.write_from(self.hpa + offset, view, session=self._session_id())
        return view.shape[0]

    def read_into(self, buf: Any, offset: int = 0) -> int:
        view = _flat_bytes(buf, writable=True)
        if offset < 0 or offset + view.shape[0] > self.nbytes:
            raise ValueError(f"read of {view.shape[0]} bytes at offset {offset} leaves the {self.nbytes}-byte reservation")
        self.tenant.store.handle.read_into(self.hpa + offset, view, session=self._session_id())
        return view.shape[0]

    def commit(self) -> bool:
        """Publish the key (lookups see it now; it survives a crash once a later
        KVStore.flush() or close() returned). False if already finished."""
        return self.tenant.store._commit(self)

    def abort(self) -> None:
        self.tenant.store._abort(self)

    def _session_id(self) -> int:
        return self.session.id if self.session is not None else 0

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _flat_bytes(buf: Any, *, writable: bool) -> np.ndarray:
    """A flat uint8 view of a buffer, without copying. Torch tensors are viewed as bytes
    first, so dtypes numpy lacks (bfloat16, float8) work too; they must be on the CPU."""
    if hasattr(buf, "untyped_storage") and hasattr(buf, "is_contiguous"):  # a torch.Tensor
        if buf.device.type != "cpu":
            raise ValueError(f"tensors must be on the CPU (got one on {buf.device}); copy to pinned host memory first")
        if not buf.is_contiguous():
            raise ValueError("the tensor must be contiguous")
        import torch
        flat = buf.detach().reshape(-1)
        buf = (flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)).numpy()
    return _byte_view(buf, writable=writable)


def _buffers(buf: Any, *, writable: bool) -> list[np.ndarray]:
    """One buffer, or a list/tuple of buffers (scatter/gather), as flat byte views."""
    if isinstance(buf, (list, tuple)):
        return [_flat_bytes(b, writable=writable) for b in buf]
    return [_flat_bytes(buf, writable=writable)]


# ====================================================================== sessions
class Session:
    """A serving session of one tenant. Its lifecycle emits hints; its reads and writes
    are tagged with its device session id. States: active -> paused -> active ... -> ended."""

    ACTIVE, PAUSED, ENDED = "active", "paused", "ended"

    def __init__(self, tenant: "Tenant", name: str, sid: int):
        self.tenant, self.name, self.id = tenant, name, sid
        self.state = Session.ACTIVE
        self._entries: dict[bytes, _Entry] = {}  # chunks this session reads or wrote

    # -------- lifecycle
    def resume(self, keys: Sequence[Any]) -> int:
        """The session is back and will re-read `keys` (its prefix, in order): emits
        SESSION_RESUME with the extents of the leading keys that are stored, and
        returns how many that is (the usable prefix)."""
        return self.tenant.store._session_resume(self, [kvkeys.normalize_key(k) for k in keys])

    def next_prefix(self, keys: Sequence[Any], deadline_ns: int = 0) -> int:
        """The session will read `keys` soon (before `deadline_ns`, relative): NEXT_PREFIX
        for those stored. Returns how many are stored."""
        return self.tenant.store._session_next_prefix(self, [kvkeys.normalize_key(k) for k in keys], deadline_ns)

    def append(self, key: Any, data: Any) -> PutStatus:
        """Store a new chunk of this session: APPEND hint for its extent, then the write."""
        return self.tenant.put_from(key, data, session=self)

    def get_into(self, key: Any, buf: Any) -> int | None:
        return self.tenant.get_into(key, buf, session=self)

    def pause(self, expected_pause_ns: int = 0) -> None:
        """The session stops for a while (a tool call, user think time): SESSION_PAUSE."""
        self.tenant.store._session_pause(self, expected_pause_ns)

    def end(self) -> None:
        """The session is over: SESSION_END; its chunks become first eviction candidates."""
        self.tenant.store._session_end(self)

    @property
    def keys(self) -> list[bytes]:
        return list(self._entries)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        if self.state != Session.ENDED:
            self.end()


# ====================================================================== tenants
class Tenant:
    """One tenant's view of the store. Everything a tenant can do goes through here,
    and every call resolves keys and sessions in this tenant's namespace only."""

    def __init__(self, store: "KVStore", tid: int, name: str, salt: bytes):
        self.store, self.id, self.name, self.salt = store, tid, name, salt
        self.quota_bytes = store.capacity
        self.reserved_bytes = 0
        self.max_pinned_bytes = store.capacity
        self.chunk_bytes: int | None = None  # if set, every chunk must be this size
        self._index: dict[bytes, _Entry] = {}
        self._pending: dict[bytes, Reservation] = {}
        self._lru = [OrderedDict(), OrderedDict(), OrderedDict()]  # per eviction class
        self._sessions: dict[str, Session] = {}
        self.used_bytes = 0      # extent bytes of committed + reserved chunks
        self.pinned_bytes = 0
        self.evicted_keys: deque[bytes] = deque(maxlen=1 << 16)  # drained by adapters
        self.counters = {"puts": 0, "gets": 0, "hits": 0, "misses": 0, "evicted": 0, "removed": 0}

    # -------- keys
    def prefix_keys(self, tokens: Any, tokens_per_chunk: int, **kw) -> list[bytes]:
        """Chained prefix keys of `tokens` with this tenant's salt."""
        return kvkeys.prefix_keys(tokens, tokens_per_chunk, salt=self.salt, **kw)

    def segment_keys(self, segments: Sequence[Any]) -> list[bytes]:
        """Position-independent keys of `segments` with this tenant's salt."""
        return kvkeys.segment_keys(segments, salt=self.salt)

    # -------- lookups (probes never change recency)
    def contains(self, key: Any) -> bool:
        return kvkeys.normalize_key(key) in self._index

    def lookup_prefix(self, keys: Sequence[Any]) -> int:
        """How many leading keys are stored (consecutive hits from the start)."""
        index = self._index
        n = 0
        for key in keys:
            if (key if type(key) is bytes else kvkeys.normalize_key(key)) not in index:
                break
            n += 1
        return n

    def lookup_sparse(self, keys: Sequence[Any]) -> np.ndarray:
        """Hit bitmap: which of `keys` are stored, anywhere in the list."""
        index = self._index
        return np.fromiter(((k if type(k) is bytes else kvkeys.normalize_key(k)) in index for k in keys),
                           dtype=bool, count=len(keys))

    def size_of(self, key: Any) -> int | None:
        entry = self._index.get(kvkeys.normalize_key(key))
        return None if entry is None else entry.nbytes

    def extent_of(self, key: Any) -> tuple[int, int] | None:
        """(hpa, nbytes) of a stored key (for engines that move the bytes themselves)."""
        entry = self._index.get(kvkeys.normalize_key(key))
        return None if entry is None else (entry.hpa, entry.nbytes)

    def keys(self) -> list[bytes]:
        return list(self._index)

    # -------- data
    def reserve(self, key: Any, nbytes: int, *, session: Session | None = None) -> Reservation | PutStatus:
        """Reserve an extent for a new chunk (allocate + write in place + commit).
        Returns a Reservation, or EXISTS / IN_FLIGHT / NO_SPACE."""
        return self.store._reserve(self, kvkeys.normalize_key(key), nbytes, self._own(session))

    def put_from(self, key: Any, data: Any, *, session: Session | None = None) -> PutStatus:
        """Store `data` (a buffer, or a list of buffers laid end to end) under `key`."""
        views = _buffers(data, writable=False)
        nbytes = sum(v.shape[0] for v in views)
        res = self.reserve(key, nbytes, session=session)
        if isinstance(res, PutStatus):
            return res
        try:
            offset = 0
            for view in views:
                offset += res.write(view, offset)
        except BaseException:
            res.abort()
            raise
        res.commit()
        return PutStatus.STORED

    def get_into(self, key: Any, buf: Any, *, session: Session | None = None, exact: bool = True) -> int | None:
        """Read the chunk into `buf` (a buffer, or a list of buffers filled in order).
        Returns the bytes read, or None on a miss. `exact`: the buffers must hold
        exactly the chunk (else ValueError); otherwise at least the chunk."""
        return self.store._get_into(self, kvkeys.normalize_key(key), _buffers(buf, writable=True),
                                    self._own(session), exact)

    def get_many_into(self, keys: Sequence[Any], out: Any, *, session: Session | None = None) -> int:
        """Read equal-sized chunks, laid end to end in `out`, in one device pass (one
        SSD batch for all their misses). Reads the leading run of stored keys and
        returns its length (the rest of `out` is untouched)."""
        return self.store._get_many(self, [kvkeys.normalize_key(k) for k in keys], _flat_bytes(out, writable=True),
                                    self._own(session))

    def touch(self, keys: Sequence[Any]) -> None:
        """Mark stored keys as recently used."""
        self.store._touch(self, [kvkeys.normalize_key(k) for k in keys])

    def remove(self, key: Any) -> bool:
        """Delete a key of this tenant. False if it is not stored."""
        return self.store._remove(self, kvkeys.normalize_key(key))

    # -------- pins, prefetch
    def pin(self, keys: Sequence[Any]) -> int:
        """Keep these chunks in the store (never evicted) and ask the device to keep
        them resident. Returns how many were pinned (stored ones, within the tenant's
        pin budget). Pins nest: unpin as many times."""
        return self.store._pin(self, [kvkeys.normalize_key(k) for k in keys], True)

    def unpin(self, keys: Sequence[Any]) -> int:
        return self.store._pin(self, [kvkeys.normalize_key(k) for k in keys], False)

    def prefetch(self, keys: Sequence[Any], *, session: Session | None = None, deadline_ns: int = 0) -> "PrefetchTicket":
        """Protect the leading stored keys from eviction and hint (NEXT_PREFIX) that
        they will be read soon. `wait(ticket)` ends the protection."""
        return self.store._prefetch(self, [kvkeys.normalize_key(k) for k in keys], self._own(session), deadline_ns)

    # -------- sessions
    def open_session(self, name: str | None = None, *, prefix: Sequence[Any] | None = None) -> Session:
        """A new session (its device session id is random, so ids never collide across
        tenants or restarts). With `prefix`, it resumes on those keys at once."""
        return self.store._open_session(self, name, prefix)

    def session(self, name: str) -> Session | None:
        """This tenant's session called `name` (None if it has none by that name)."""
        return self._sessions.get(name)

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    def stats(self) -> dict:
        return {"tenant": self.name, "entries": len(self._index), "used_bytes": self.used_bytes,
                "pinned_bytes": self.pinned_bytes, "sessions": len(self._sessions),
                "quota_bytes": self.quota_bytes, "reserved_bytes": self.reserved_bytes, **self.counters}

    def _own(self, session: Session | None) -> Session | None:
        if session is not None and (not isinstance(session, Session) or session.tenant is not self):
            raise PermissionError("that session belongs to another tenant")
        if session is not None and session.state == Session.ENDED:
            raise ValueError(f"session {session.name!r} has ended")
        return session


class PrefetchTicket:
    def __init__(self, tenant: Tenant, entries: list[_Entry]):
        self.tenant, self._entries = tenant, entries
        self.ready = len(entries)
        self.done = False


# ====================================================================== the store
class KVStore:
    """KV chunks in the HDM window of an open device (`host_runtime.DeviceHandle`).

    index_path: where the persistent index lives. Default: next to the device image
      (``<image>.kvindex``); None with a temporary image (nothing would survive anyway).
      Pass ``False`` to keep the index in memory only.
    hints: the HintSink (default: the handle's mailbox hint client, else NullHints).
    window: (base, size) of the HDM window this store manages (default: all of it).
    grain: allocation unit (default: the device block size; must be a multiple of it).
    """

    def __init__(self, handle, *, index_path: str | os.PathLike | None | bool = None,
                 hints: HintSink | None = None, window: tuple[int, int] | None = None,
                 grain: int | None = None, compact_factor: int = 4):
        self.handle = handle
        self.hints = hints if hints is not None else hints_for(handle)
        base, size = window if window is not None else (0, handle.capacity)
        self.grain = grain or handle.block_size
        if self.grain % handle.block_size:
            raise ValueError(f"grain {self.grain} must be a multiple of the device block size {handle.block_size}")
        if base % self.grain or base < 0 or size <= 0 or base + size > handle.capacity:
            raise ValueError(f"window ({base:#x}, {size:#x}) must be grain-aligned and inside the HDM window")
        self.base, self.capacity = base, size - size % self.grain
        self._lock = threading.RLock()
        self._tenants: dict[str, Tenant] = {}
        self._tenant_ids: dict[int, Tenant] = {}
        self._secret = secrets.token_bytes(16)
        self._unflushed: dict[tuple[int, bytes], _Entry] = {}
        self._doomed: dict[int, _Entry] = {}  # hpa -> entry removed while being read (extent freed at the last lease)
        self._stamp = 0
        self.compact_factor = compact_factor
        self.counters = {"evictions": 0, "hint_errors": 0, "media_errors": 0, "dropped_on_open": 0,
                         "compactions": 0, "failed_verification": 0}
        self.alloc = ExtentAllocator(self.capacity, self.grain, base=base)
        self._journal: _Journal | None = None
        path = self._index_path(index_path)
        if path is not None:
            self._open_index(path)

    # ------------------------------------------------------------ tenants
    def tenant(self, name: str, *, salt: bytes | str | None = None, quota_bytes: int | None = None,
               reserved_bytes: int | None = None, max_pinned_bytes: int | None = None,
               chunk_bytes: int | None = None) -> Tenant:
        """The tenant called `name`, created on first use. Its salt is `salt` if given,
        else one derived from a per-store secret (persisted with the index), so keys a
        tenant computes are stable across restarts and differ between tenants. The
        limits are the operator's: quota (max bytes stored), reservation (bytes global
        eviction never takes it below), pin budget, and a fixed chunk size if any."""
        if not isinstance(name, str) or not name or len(name.encode()) > 255:
            raise ValueError(f"a tenant name is a non-empty string of at most 255 bytes, got {name!r}")
        with self._lock:
            t = self._tenants.get(name)
            if t is None:
                if isinstance(salt, str):
                    salt = salt.encode()
                if salt is not None and len(salt) > 255:
                    raise ValueError("a tenant salt is at most 255 bytes")
                salt = bytes(salt) if salt is not None else kvkeys.salt_digest(self._secret + name.encode())[:16]
                t = self._add_tenant(len(self._tenant_ids) + 1, name, salt)
                self._log(_tenant_record(t.id, name, salt))
            elif salt is not None and (salt.encode() if isinstance(salt, str) else bytes(salt)) != t.salt:
                raise ValueError(f"tenant {name!r} already exists with a different salt")
            for attr, value in (("quota_bytes", quota_bytes), ("reserved_bytes", reserved_bytes),
                                ("max_pinned_bytes", max_pinned_bytes), ("chunk_bytes", chunk_bytes)):
                if value is not None:
                    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                        raise ValueError(f"{attr} must be a non-negative integer, got {value!r}")
                    setattr(t, attr, value)
            return t

    def tenants(self) -> list[str]:
        return list(self._tenants)

    def _add_tenant(self, tid: int, name: str, salt: bytes) -> Tenant:
        t = Tenant(self, tid, name, salt)
        self._tenants[name] = t
        self._tenant_ids[tid] = t
        return t

    # ------------------------------------------------------------ put path
    def _reserve(self, t: Tenant, key: bytes, nbytes: int, session: Session | None) -> Reservation | PutStatus:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"a chunk needs a positive byte count, got {nbytes!r}")
        if t.chunk_bytes is not None and nbytes != t.chunk_bytes:
            raise ValueError(f"tenant {t.name!r} stores {t.chunk_bytes}-byte chunks, got {nbytes} bytes")
        need = self.alloc.grains_for(nbytes) * self.grain
        if need > self.capacity:
            raise ValueError(f"a {nbytes}-byte chunk does not fit the {self.capacity}-byte store")
        with self._lock:
            if key in t._index:
                return PutStatus.EXISTS
            if key in t._pending:
                return PutStatus.IN_FLIGHT
            evicted: list[bytes] = []  # this tenant's keys evicted for the room (never others')
            hpa = self._make_room(t, need, evicted)
            if hpa is None:
                return PutStatus.NO_SPACE
            t.used_bytes += need
            res = Reservation(t, key, hpa, nbytes, session, evicted)
            t._pending[key] = res
        if session is not None:
            self._hint("append", session.id, [(hpa, nbytes)])
        return res

    def _make_room(self, t: Tenant, need: int, evicted: list[bytes]) -> int | None:
        """Allocate `need` bytes for tenant t, evicting as the policy allows."""
        if need > t.quota_bytes:
            return None
        # A tenant over its quota makes room among its own chunks only.
        while t.used_bytes + need > t.quota_bytes:
            victim = self._victim_of(t)
            if victim is None:
                return None
            self._evict(victim, t, evicted)
        while True:
            hpa = self.alloc.allocate(need)
            if hpa is not None:
                return hpa
            victim = self._global_victim()
            if victim is None:
                return None
            self._evict(victim, t, evicted)

    @staticmethod
    def _oldest_unleased(lru: OrderedDict) -> _Entry | None:
        for entry in lru.values():  # oldest first; chunks being read are skipped
            if not entry.leases:
                return entry
        return None

    def _victim_of(self, t: Tenant) -> _Entry | None:
        for lru in t._lru:
            entry = self._oldest_unleased(lru)
            if entry is not None:
                return entry
        return None

    def _global_victim(self) -> _Entry | None:
        """The least recently used evictable chunk of the lowest class, among tenants
        that stay at or above their reservation without it. O(tenants) per victim."""
        for cls in (COLD, PAUSED, ACTIVE):
            best = None
            for t in self._tenants.values():
                entry = self._oldest_unleased(t._lru[cls])
                if entry is None or t.used_bytes - self._extent_bytes(entry) < t.reserved_bytes:
                    continue
                if best is None or entry.stamp < best.stamp:
                    best = entry
            if best is not None:
                return best
        return None

    def _extent_bytes(self, entry: _Entry) -> int:
        return self.alloc.grains_for(entry.nbytes) * self.grain

    def _evict(self, entry: _Entry, requester: Tenant, evicted: list[bytes]) -> None:
        owner = entry.tenant
        self._delete(entry)
        self.counters["evictions"] += 1
        owner.counters["evicted"] += 1
        owner.evicted_keys.append(entry.key)  # the owner's adapters report it (vLLM events)
        if owner is requester:
            evicted.append(entry.key)

    def _commit(self, res: Reservation) -> bool:
        t = res.tenant
        with self._lock:
            if res.done:
                return False
            res.done = True
            del t._pending[res.key]
            entry = _Entry(t, res.key, res.hpa, res.nbytes)
            self._log(_put_record(t.id, res.key, res.hpa, res.nbytes))
            t._index[res.key] = entry
            self._unflushed[(t.id, res.key)] = entry
            self._stamp_entry(entry)
            self._place(entry)
            t.counters["puts"] += 1
            if res.session is not None and res.session.state != Session.ENDED:
                self._ref(res.session, entry)
            self._maybe_compact()
        return True

    def _abort(self, res: Reservation) -> None:
        t = res.tenant
        with self._lock:
            if res.done:
                return
            res.done = True
            del t._pending[res.key]
            t.used_bytes -= self.alloc.free(res.hpa)

    # ------------------------------------------------------------ get path
    def _get_into(self, t: Tenant, key: bytes, views: list[np.ndarray], session: Session | None, exact: bool) -> int | None:
        total = sum(v.shape[0] for v in views)
        with self._lock:
            entry = t._index.get(key)
            if entry is None:
                t.counters["misses"] += 1
                return None
            if total != entry.nbytes and (exact or total < entry.nbytes):
                raise ValueError(f"the buffer holds {total} bytes but the chunk has {entry.nbytes}")
            entry.leases += 1
            self._touch_entry(entry)
            if session is not None:
                self._ref(session, entry)
        sid = session.id if session is not None else 0
        try:
            offset = 0
            for view in views:
                take = min(view.shape[0], entry.nbytes - offset)
                if take <= 0:
                    break
                self.handle.read_view(entry.hpa + offset, view if take == view.shape[0] else view[:take], sid)
                offset += take
        except OSError as exc:  # media error / poison: the bytes are gone, the KV is recomputable
            self._read_failed([entry], exc)
            t.counters["misses"] += 1
            return None
        with self._lock:
            self._unlease(entry)
            t.counters["gets"] += 1
            t.counters["hits"] += 1
        return entry.nbytes

    def _get_many(self, t: Tenant, keys: list[bytes], out: np.ndarray, session: Session | None) -> int:
        with self._lock:
            entries = []
            for key in keys:
                entry = t._index.get(key)
                if entry is None:
                    break
                entries.append(entry)
            if not entries:
                return 0
            size = entries[0].nbytes
            if any(e.nbytes != size for e in entries):
                raise ValueError("get_many_into needs chunks of one size")
            if out.shape[0] < len(entries) * size:
                raise ValueError(f"out holds {out.shape[0]} bytes, {len(entries)} chunks need {len(entries) * size}")
            for entry in entries:
                entry.leases += 1
                self._touch_entry(entry)
                if session is not None:
                    self._ref(session, entry)
        sid = session.id if session is not None else 0
        try:
            self.handle.readv([e.hpa for e in entries], size, out[:len(entries) * size], session=sid)
        except OSError as exc:
            self._read_failed(entries, exc)
            return 0
        with self._lock:
            for entry in entries:
                self._unlease(entry)
            t.counters["gets"] += len(entries)
            t.counters["hits"] += len(entries)
        return len(entries)

    def _read_range(self, t: Tenant, key: bytes, offset: int, view: np.ndarray) -> bool:
        with self._lock:
            entry = t._index.get(key)
            if entry is None:
                return False
            if offset < 0 or offset + view.shape[0] > entry.nbytes:
                raise ValueError(f"[{offset}, +{view.shape[0]}) is outside the {entry.nbytes}-byte chunk")
            entry.leases += 1
        try:
            self.handle.read_into(entry.hpa + offset, view)
        except OSError as exc:
            self._read_failed([entry], exc)
            return False
        with self._lock:
            self._unlease(entry)
        return True

    def _read_failed(self, entries: list[_Entry], exc: Exception) -> None:
        """A device read error (media error, poison): the chunks' bytes cannot be
        trusted, so they become misses (dropped); the engine recomputes the KV."""
        log.warning("dropping %d chunk(s) after a device read error: %s", len(entries), exc)
        with self._lock:
            self.counters["media_errors"] += 1
            for entry in entries:
                entry.leases -= 1
                if entry.tenant._index.get(entry.key) is entry:
                    self._delete(entry)
                elif entry.doomed and entry.leases == 0:
                    self._release_extent(entry)

    def _touch(self, t: Tenant, keys: list[bytes]) -> None:
        with self._lock:
            for key in keys:
                entry = t._index.get(key)
                if entry is not None:
                    self._touch_entry(entry)

    # ------------------------------------------------------------ remove / pin / prefetch
    def _remove(self, t: Tenant, key: bytes) -> bool:
        with self._lock:
            entry = t._index.get(key)
            if entry is None:
                return False
            self._delete(entry)
            t.counters["removed"] += 1
            return True

    def _pin(self, t: Tenant, keys: list[bytes], pin: bool) -> int:
        ranges = []  # extents whose device pin state changes (first pin / last unpin)
        done = 0
        with self._lock:
            for key in keys:
                entry = t._index.get(key)
                if entry is None:
                    continue
                if pin:
                    size = self._extent_bytes(entry)
                    if entry.pins == 0:
                        if t.pinned_bytes + size > t.max_pinned_bytes:
                            continue  # over this tenant's pin budget
                        self._unplace(entry)
                        t.pinned_bytes += size
                        ranges.append((entry.hpa, entry.nbytes))
                    entry.pins += 1
                elif entry.pins:
                    entry.pins -= 1
                    if entry.pins == 0:
                        t.pinned_bytes -= self._extent_bytes(entry)
                        self._place(entry)
                        ranges.append((entry.hpa, entry.nbytes))
                else:
                    continue
                done += 1
        if ranges:
            self._hint("pin" if pin else "unpin", _coalesce(ranges))
        return done

    def _prefetch(self, t: Tenant, keys: list[bytes], session: Session | None, deadline_ns: int) -> PrefetchTicket:
        with self._lock:
            entries = []
            for key in keys:
                entry = t._index.get(key)
                if entry is None:
                    break
                entry.leases += 1
                entries.append(entry)
        if entries:
            sid = session.id if session is not None else 0
            self._hint("next_prefix", sid, _coalesce((e.hpa, e.nbytes) for e in entries), deadline_ns)
        return PrefetchTicket(t, entries)

    def wait(self, ticket: PrefetchTicket) -> int:
        """End a prefetch's protection; returns how many leading keys it covered."""
        with self._lock:
            if not ticket.done:
                ticket.done = True
                for entry in ticket._entries:
                    self._unlease(entry)
        return ticket.ready

    # ------------------------------------------------------------ sessions
    def _open_session(self, t: Tenant, name: str | None, prefix) -> Session:
        with self._lock:
            if name is None:
                name = f"s{secrets.token_hex(6)}"
            if not isinstance(name, str) or not name:
                raise ValueError(f"a session name is a non-empty string, got {name!r}")
            old = t._sessions.get(name)
            if old is not None:
                raise ValueError(f"tenant {t.name!r} already has an open session {name!r}")
            session = Session(t, name, secrets.randbits(62) + 1)
            t._sessions[name] = session
        if prefix:
            session.resume(prefix)
        return session

    def _session_resume(self, s: Session, keys: list[bytes]) -> int:
        t = s.tenant
        with self._lock:
            t._own(s)
            if s.state == Session.PAUSED:
                s.state = Session.ACTIVE
                for entry in s._entries.values():
                    entry.paused -= 1
                    entry.active += 1
                    self._reclass(entry)
            hits = []
            for key in keys:
                entry = t._index.get(key)
                if entry is None:
                    break
                self._ref(s, entry)
                hits.append(entry)
        self._hint("session_resume", s.id, _coalesce((e.hpa, e.nbytes) for e in hits))
        return len(hits)

    def _session_next_prefix(self, s: Session, keys: list[bytes], deadline_ns: int) -> int:
        t = s.tenant
        with self._lock:
            t._own(s)
            hits = [t._index[k] for k in keys if k in t._index]
            for entry in hits:
                self._ref(s, entry)
        if hits:
            self._hint("next_prefix", s.id, _coalesce((e.hpa, e.nbytes) for e in hits), deadline_ns)
        return len(hits)

    def _session_pause(self, s: Session, expected_pause_ns: int) -> None:
        with self._lock:
            s.tenant._own(s)
            if s.state == Session.PAUSED:
                return
            s.state = Session.PAUSED
            for entry in s._entries.values():
                entry.active -= 1
                entry.paused += 1
                self._reclass(entry)
        self._hint("session_pause", [s.id], expected_pause_ns)

    def _session_end(self, s: Session) -> None:
        with self._lock:
            if s.state == Session.ENDED:
                return
            s.tenant._own(s)
            for entry in s._entries.values():
                if s.state == Session.PAUSED:
                    entry.paused -= 1
                else:
                    entry.active -= 1
                self._reclass(entry)
            s._entries.clear()
            s.state = Session.ENDED
            s.tenant._sessions.pop(s.name, None)
        self._hint("session_end", [s.id])

    def _ref(self, s: Session, entry: _Entry) -> None:
        """Session s references entry (reads it or wrote it)."""
        if s._entries.get(entry.key) is entry:
            return
        s._entries[entry.key] = entry  # replaces a dead entry of a key stored again
        if s.state == Session.PAUSED:
            entry.paused += 1
        else:
            entry.active += 1
        self._reclass(entry)

    # ------------------------------------------------------------ entry bookkeeping
    def _stamp_entry(self, entry: _Entry) -> None:
        self._stamp += 1
        entry.stamp = self._stamp

    def _place(self, entry: _Entry) -> None:
        """Put an unpinned committed entry on its class's LRU list (as most recent)."""
        if entry.pins:
            return
        entry.cls = entry.eviction_class()
        entry.tenant._lru[entry.cls][entry.key] = entry

    def _unplace(self, entry: _Entry) -> None:
        entry.tenant._lru[entry.cls].pop(entry.key, None)

    def _reclass(self, entry: _Entry) -> None:
        """Move an entry to the LRU list of its (new) eviction class after a session
        referencing it changed state."""
        cls = entry.eviction_class()
        if cls == entry.cls:
            return
        listed = not entry.pins and entry.tenant._index.get(entry.key) is entry
        if listed:
            self._unplace(entry)
        entry.cls = cls
        if listed:
            entry.tenant._lru[cls][entry.key] = entry

    def _touch_entry(self, entry: _Entry) -> None:
        self._stamp_entry(entry)
        if not entry.pins:
            entry.tenant._lru[entry.cls].move_to_end(entry.key)

    def _unlease(self, entry: _Entry) -> None:
        entry.leases -= 1
        if entry.doomed and entry.leases == 0:
            self._release_extent(entry)

    def _delete(self, entry: _Entry) -> None:
        """Remove an entry from the index (journaled); its extent is freed now, or when
        its last reader finishes."""
        t = entry.tenant
        self._log(_del_record(t.id, entry.key))  # journaled before the extent can be reused
        del t._index[entry.key]
        self._unflushed.pop((t.id, entry.key), None)
        self._unplace(entry)
        if entry.pins:
            t.pinned_bytes -= self._extent_bytes(entry)
            entry.pins = 0
            self._hint("unpin", [(entry.hpa, entry.nbytes)])
        if entry.leases:
            entry.doomed = True
            self._doomed[entry.hpa] = entry
        else:
            self._release_extent(entry)
        self._maybe_compact()

    def _release_extent(self, entry: _Entry) -> None:
        self._doomed.pop(entry.hpa, None)
        entry.tenant.used_bytes -= self.alloc.free(entry.hpa)

    # ------------------------------------------------------------ hints
    def _hint(self, method: str, *args) -> None:
        try:
            getattr(self.hints, method)(*args)
        except Exception as exc:  # advisory: a failed hint costs performance, never correctness
            self.counters["hint_errors"] += 1
            log.debug("hint %s failed: %s", method, exc)

    # ------------------------------------------------------------ persistence
    def _index_path(self, index_path) -> Path | None:
        if index_path is False:
            return None
        if index_path is not None:
            return Path(index_path)
        device = getattr(self.handle, "device", None)
        ssd = getattr(device, "ssd", None)
        if ssd is None or ssd.temporary:
            return None
        return Path(ssd.path + ".kvindex")

    def _meta(self) -> dict:
        return {"format": INDEX_FORMAT, "base": self.base, "capacity": self.capacity, "grain": self.grain,
                "secret": self._secret.hex(), "image": self._image_identity()}

    def _image_identity(self) -> list | None:
        ssd = getattr(getattr(self.handle, "device", None), "ssd", None)
        if ssd is None or ssd.temporary:
            return None
        st = os.stat(ssd.path)
        return [st.st_dev, st.st_ino]

    def _open_index(self, path: Path) -> None:
        existed = path.exists() and path.stat().st_size > 0
        self._journal = _Journal(path)
        try:
            if existed:
                self._replay(self._journal.read_all(), path)
            self._compact()
        except BaseException:
            self._journal.close()
            self._journal = None
            raise

    def _replay(self, payloads: list[bytes], path: Path) -> None:
        if not payloads or payloads[0][:1] != b"M":
            raise IndexCorrupt(f"{path}: not a cxlhm KV index (delete it to start empty)")
        meta = json.loads(payloads[0][1:])
        mine = self._meta()
        for field in ("format", "base", "capacity", "grain"):
            if meta.get(field) != mine[field]:
                raise IndexCorrupt(f"{path}: index was written for {field}={meta.get(field)}, this store has "
                                   f"{mine[field]} (open the store with the same window and grain, or delete the index)")
        if meta.get("image") is not None and mine["image"] is not None and meta["image"] != mine["image"]:
            log.warning("%s: the device image was replaced since the index was written; starting empty", path)
            self._secret = bytes.fromhex(meta["secret"])
            return
        self._secret = bytes.fromhex(meta["secret"])
        unclean = bool(getattr(getattr(self.handle, "device", None), "unclean_shutdown_detected", False))
        tenants: dict[int, tuple[str, bytes]] = {}
        live: dict[tuple[int, bytes], tuple[int, int, int]] = {}
        last_flush = -1
        for pos, p in enumerate(payloads[1:], start=1):
            kind = p[:1]
            if kind == b"T":
                tid, n = _TENANT.unpack_from(p, 1)
                name = p[1 + _TENANT.size: 1 + _TENANT.size + n].decode()
                salt_len = p[1 + _TENANT.size + n]
                salt = p[2 + _TENANT.size + n: 2 + _TENANT.size + n + salt_len]
                tenants[tid] = (name, salt)
            elif kind == b"P":
                tid, hpa, nbytes, n = _PUT.unpack_from(p, 1)
                live[(tid, p[1 + _PUT.size: 1 + _PUT.size + n])] = (hpa, nbytes, pos, None)
            elif kind == b"Q":
                tid, hpa, nbytes, fp, n = _PUTFP.unpack_from(p, 1)
                live[(tid, p[1 + _PUTFP.size: 1 + _PUTFP.size + n])] = (hpa, nbytes, pos, fp)
            elif kind == b"V":
                tid, fp, n = _FP.unpack_from(p, 1)
                key = (tid, p[1 + _FP.size: 1 + _FP.size + n])
                if key in live:
                    live[key] = live[key][:3] + (fp,)
            elif kind == b"D":
                tid, n = _DEL.unpack_from(p, 1)
                live.pop((tid, p[1 + _DEL.size: 1 + _DEL.size + n]), None)
            elif kind == b"F":
                last_flush = pos
        for tid, (name, salt) in sorted(tenants.items()):
            self._add_tenant(tid, name, salt)
        kept = {}
        # After an unclean shutdown every chunk kept is checked against the fingerprint of
        # its durable bytes (taken at the flush after its commit) - metadata only, from the
        # device's crash-consistent block checksums: a chunk whose blocks no longer hold
        # those bytes (lost, torn, or reused for another chunk) is dropped, never served.
        fingerprints = getattr(getattr(self.handle, "device", None), "block_checksums", None) if unclean else None
        bs = self.handle.block_size
        for (tid, key), (hpa, nbytes, pos, fp) in live.items():
            if (unclean and pos > last_flush) or tid not in self._tenant_ids:
                self.counters["dropped_on_open"] += 1  # its bytes may never have reached the SSD
                continue
            if fingerprints is not None:
                first = hpa // bs
                if fp is None or chunk_fingerprint(fingerprints(first, (hpa + nbytes - 1) // bs - first + 1)) != fp:
                    self.counters["dropped_on_open"] += 1
                    self.counters["failed_verification"] += 1
                    continue
            kept[(tid, key)] = (hpa, nbytes, fp)
        try:
            self.alloc = ExtentAllocator.restore(self.capacity, self.grain,
                                                 ((hpa, nbytes) for hpa, nbytes, _ in kept.values()), base=self.base)
        except AllocatorError as exc:
            raise IndexCorrupt(f"{path}: {exc} (delete the index to start empty)") from None
        for (tid, key), (hpa, nbytes, fp) in kept.items():
            t = self._tenant_ids[tid]
            entry = _Entry(t, key, hpa, nbytes)
            entry.fp = fp
            t._index[key] = entry
            t.used_bytes += self._extent_bytes(entry)
            self._stamp_entry(entry)
            self._place(entry)

    def _log(self, payload: bytes) -> None:
        if self._journal is not None:
            self._journal.append(payload)

    def _maybe_compact(self) -> None:
        if self._journal is None:
            return
        live = sum(len(t._index) for t in self._tenants.values())  # O(tenants)
        if self._journal.records > self.compact_factor * (live + len(self._tenants)) + 1024:
            self._compact()

    def _compact(self) -> None:
        """Rewrite the journal as: meta, tenants, durable chunks, FLUSH, not-yet-flushed chunks."""
        if self._journal is None:
            return
        payloads = [b"M" + json.dumps(self._meta()).encode()]
        payloads += [_tenant_record(t.id, t.name, t.salt) for t in self._tenant_ids.values()]
        pending = []
        for t in self._tenant_ids.values():
            for entry in t._index.values():
                (pending if (t.id, entry.key) in self._unflushed else payloads).append(
                    _put_record(t.id, entry.key, entry.hpa, entry.nbytes, entry.fp))
        payloads.append(b"F")
        payloads += pending
        self._journal.rewrite(payloads)
        self.counters["compactions"] += 1

    def flush(self) -> None:
        """Make every committed chunk durable: device flush, then the fingerprints of the
        chunks committed since the last flush, then a journal FLUSH mark (fsynced).
        When flush() returns, every chunk committed before it survives a crash."""
        with self._lock:
            self.handle.flush()
            if self._journal is not None:
                fingerprints = getattr(getattr(self.handle, "device", None), "block_checksums", None)
                if fingerprints is not None and self._unflushed:
                    bs = self.handle.block_size
                    records = []
                    for (tid, key), entry in self._unflushed.items():
                        first = entry.hpa // bs
                        entry.fp = chunk_fingerprint(fingerprints(first, (entry.hpa + entry.nbytes - 1) // bs - first + 1))
                        records.append(_fp_record(tid, key, entry.fp))
                    for record in records:
                        self._journal.append(record)
            self._unflushed.clear()  # everything committed so far is on the SSD now
            if self._journal is not None:
                self._journal.append(b"F")
                self._journal.sync()

    def close(self) -> None:
        """Flush and close the index (the device handle stays open: it is the caller's)."""
        with self._lock:
            if self._journal is None:
                return
            try:
                if not getattr(getattr(self.handle, "device", None), "closed", False):
                    self.flush()
                self._compact()
            finally:
                self._journal.close()
                self._journal = None

    # ------------------------------------------------------------ consistency
    def check(self) -> dict:
        """Check that the index and the allocator agree: the allocator's live extents are
        exactly those of the stored chunks, the reservations in progress and the chunks
        removed while being read (no leak, no overlap), and each tenant's used bytes add
        up. Raises IndexCorrupt naming the first disagreement; returns counts."""
        with self._lock:
            try:
                self.alloc.check()
            except AllocatorError as exc:
                raise IndexCorrupt(f"allocator: {exc}") from None
            expected: dict[int, int] = {}
            per_tenant: dict[int, int] = {}

            def claim(hpa: int, nbytes: int, t: Tenant, what: str) -> None:
                size = self.alloc.grains_for(nbytes) * self.grain
                if hpa in expected:
                    raise IndexCorrupt(f"{what} at {hpa:#x} is claimed twice")
                expected[hpa] = size
                per_tenant[t.id] = per_tenant.get(t.id, 0) + size

            for t in self._tenant_ids.values():
                for entry in t._index.values():
                    claim(entry.hpa, entry.nbytes, t, f"chunk {entry.key.hex()[:16]} of {t.name!r}")
                for res in t._pending.values():
                    claim(res.hpa, res.nbytes, t, f"reservation {res.key.hex()[:16]} of {t.name!r}")
            for entry in self._doomed.values():
                claim(entry.hpa, entry.nbytes, entry.tenant, "a removed chunk still being read")
            live = dict(self.alloc.extents())
            if live != expected:
                leaked = sorted(set(live) - set(expected))
                missing = sorted(set(expected) - set(live))
                wrong = sorted(h for h in set(live) & set(expected) if live[h] != expected[h])
                raise IndexCorrupt(f"allocator and index disagree: {len(leaked)} extent(s) allocated but not indexed "
                                   f"{[hex(h) for h in leaked[:4]]}, {len(missing)} indexed but not allocated "
                                   f"{[hex(h) for h in missing[:4]]}, {len(wrong)} of another size")
            for t in self._tenant_ids.values():
                if t.used_bytes != per_tenant.get(t.id, 0):
                    raise IndexCorrupt(f"tenant {t.name!r} counts {t.used_bytes} used bytes, its chunks hold "
                                       f"{per_tenant.get(t.id, 0)}")
            return {"extents": len(live), "entries": sum(len(t._index) for t in self._tenant_ids.values()),
                    "reservations": sum(len(t._pending) for t in self._tenant_ids.values()),
                    "used_bytes": self.alloc.used_bytes}

    # ------------------------------------------------------------ stats
    def stats(self) -> dict:
        with self._lock:
            return {"capacity": self.capacity, "used_bytes": self.alloc.used_bytes, "free_bytes": self.alloc.free_bytes,
                    "entries": sum(len(t._index) for t in self._tenants.values()),
                    "free_extents": self.alloc.free_extents, "largest_free": self.alloc.largest_free(),
                    "tenants": len(self._tenants), **self.counters}

