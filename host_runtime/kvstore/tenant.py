"""A tenant's view of the store and the objects it hands out: Tenant, Session,
Reservation (write in place, then commit) and PrefetchTicket."""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from host_runtime import kvkeys
from host_runtime.buffers import byte_view, byte_views
from host_runtime.kvstore.entries import Entry, PutStatus

if TYPE_CHECKING:
    from host_runtime.kvstore.pinleases import PinLease
    from host_runtime.kvstore.storeapi import TenantStore


class Reservation:
    """An extent reserved for `key`: write it in place, then `commit()` to publish it
    (or `abort()`). Until committed, lookups do not see the key and nothing evicts it.
    `evicted`: keys of this tenant evicted to make room for it.

    The extent may have held another chunk (another tenant's included): `read_into`
    serves only bytes this reservation wrote (the rest reads as zeros), and only until
    it is committed or aborted - after that the extent belongs to the index (read the
    key through the tenant) or to whoever allocates it next."""

    def __init__(self, tenant: "Tenant", key: bytes, hpa: int, nbytes: int, session: "Session | None", evicted: list[bytes]):
        self.tenant, self.key, self.hpa, self.nbytes = tenant, key, hpa, nbytes
        self.session, self.evicted = session, evicted
        self.done = False
        self._written: list[list[int]] = []  # [start, end) ranges written so far, sorted, disjoint
        self._lock = threading.Lock()  # a write or read never overlaps the commit/abort that ends it

    def _checked_length(self, op: str, view, offset: int) -> int:
        """The length of `view`, which must fit the reservation at `offset`."""
        n = view.shape[0]
        if offset < 0 or offset + n > self.nbytes:
            raise ValueError(f"{op} of {n} bytes at offset {offset} leaves the {self.nbytes}-byte reservation")
        return n

    def write(self, data: Any, offset: int = 0) -> int:
        """Write `data` (any buffer) at `offset` inside the extent; returns bytes written."""
        view = byte_view(data, writable=False)
        n = self._checked_length("write", view, offset)
        with self._lock:
            self._check_open()
            self.tenant.store.handle.write_from(self.hpa + offset, view, session=self._session_id())
            if n:
                self._mark_written(offset, offset + n)
        return n

    def read_into(self, buf: Any, offset: int = 0) -> int:
        """Read back [offset, +len(buf)) of what this reservation wrote; bytes it did not
        write read as zeros (the extent's earlier contents are never exposed)."""
        view = byte_view(buf, writable=True)
        n = self._checked_length("read", view, offset)
        with self._lock:
            self._check_open()
            cursor = offset
            for start, end in self._written:
                lo, hi = max(start, offset), min(end, offset + n)
                if lo >= hi:
                    continue
                view[cursor - offset:lo - offset] = 0
                self.tenant.store.handle.read_view(self.hpa + lo, view[lo - offset:hi - offset], self._session_id())
                cursor = hi
            view[cursor - offset:] = 0
        return n

    def _check_open(self) -> None:
        if self.done:
            raise ValueError("this reservation is already committed or aborted (read a committed key through the tenant)")

    def _mark_written(self, start: int, end: int) -> None:
        merged = []
        for s, e in self._written:
            if e < start or s > end:
                merged.append([s, e])
            else:
                start, end = min(s, start), max(e, end)
        merged.append([start, end])
        merged.sort()
        self._written = merged

    def _finish(self, *, fill_gaps: bool) -> bool:
        """Mark the reservation done (under its lock, so no write is still landing);
        False if it already was. `fill_gaps` (a commit): zero the bytes never written,
        so the published chunk holds nothing of the extent's earlier contents."""
        with self._lock:
            if self.done:
                return False
            if fill_gaps:
                cursor = 0
                for start, end in self._written + [[self.nbytes, self.nbytes]]:
                    if start > cursor:
                        self.tenant.store.handle.write_from(self.hpa + cursor, bytes(start - cursor),
                                                            session=self._session_id())
                    cursor = end
            self.done = True
            return True

    def commit(self) -> bool:
        """Publish the key (lookups see it now; it survives a crash once a later
        KVStore.flush() or close() returned). Bytes never written are zeros. False if
        already finished."""
        return self._finish(fill_gaps=True) and self.tenant.store.commit(self)

    def abort(self) -> None:
        if self._finish(fill_gaps=False):
            self.tenant.store.abort(self)

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



class Session:
    """A serving session of one tenant. Its lifecycle emits hints; its reads and writes
    are tagged with its device session id. States: active -> paused -> active ... -> ended.
    `entries` (key -> Entry of the chunks it reads or wrote) is the store's bookkeeping,
    changed only under the store's lock."""

    ACTIVE, PAUSED, ENDED = "active", "paused", "ended"

    def __init__(self, tenant: "Tenant", name: str, sid: int):
        self.tenant, self.name, self.id = tenant, name, sid
        self.state = Session.ACTIVE
        self.entries: dict[bytes, Entry] = {}  # chunks this session reads or wrote

    # -------- lifecycle
    def resume(self, keys: Sequence[Any]) -> int:
        """The session is back and will re-read `keys` (its prefix, in order): emits
        SESSION_RESUME with the extents of the leading keys that are stored, and
        returns how many that is (the usable prefix)."""
        return self.tenant.store.resume_session(self, [kvkeys.normalize_key(k) for k in keys])

    def next_prefix(self, keys: Sequence[Any], deadline_ns: int = 0) -> int:
        """The session will read `keys` soon (before `deadline_ns`, relative): NEXT_PREFIX
        for those stored. Returns how many are stored."""
        return self.tenant.store.session_next_prefix(self, [kvkeys.normalize_key(k) for k in keys], deadline_ns)

    def append(self, key: Any, data: Any) -> PutStatus:
        """Store a new chunk of this session: APPEND hint for its extent, then the write."""
        return self.tenant.put_from(key, data, session=self)

    def get_into(self, key: Any, buf: Any) -> int | None:
        return self.tenant.get_into(key, buf, session=self)

    def pause(self, expected_pause_ns: int = 0) -> None:
        """The session stops for a while (a tool call, user think time): SESSION_PAUSE."""
        self.tenant.store.pause_session(self, expected_pause_ns)

    def end(self) -> None:
        """The session is over: SESSION_END; its chunks become first eviction candidates."""
        self.tenant.store.end_session(self)

    @property
    def keys(self) -> list[bytes]:
        return list(self.entries)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        if self.state != Session.ENDED:
            self.end()


# ====================================================================== tenants
class Tenant:
    """One tenant's view of the store. Everything a tenant can do goes through here,
    and every call resolves keys and sessions in this tenant's namespace only.

    The Tenant reaches its store only through the declared `TenantStore` API
    (storeapi.py). The store, in turn, keeps this tenant's bookkeeping here and changes
    it only under its lock; to everyone else these are read-only:
      index          key -> Entry of every committed chunk
      pending        key -> Reservation being written
      lru            per eviction class (entries.COLD / PAUSED / ACTIVE), key -> Entry,
                     least recently used first (unpinned committed chunks only)
      open_sessions  name -> Session not yet ended
      used_bytes, pinned_bytes, protected_bytes, counters, evicted_keys (see below)."""

    def __init__(self, store: "TenantStore", tid: int, name: str, salt: bytes):
        self.store, self.id, self.name, self.salt = store, tid, name, salt
        self.verifier = b""  # set for a secret-identified tenant (a keyed hash of its secret)
        self.quota_bytes = store.capacity
        self.reserved_bytes = 0
        self.max_pinned_bytes = store.capacity
        self.chunk_bytes: int | None = None  # if set, every chunk must be this size
        self.index: dict[bytes, Entry] = {}
        self.pending: dict[bytes, Reservation] = {}
        self.lru = [OrderedDict(), OrderedDict(), OrderedDict()]  # per eviction class
        self.open_sessions: dict[str, Session] = {}
        self.used_bytes = 0      # extent bytes of committed + reserved chunks
        self.pinned_bytes = 0
        self.protected_bytes = 0  # extent bytes protected by prefetches not yet waited for
        self.evicted_keys: deque[bytes] = deque(maxlen=1 << 16)  # drained by adapters
        self.counters = {"puts": 0, "gets": 0, "hits": 0, "misses": 0, "evicted": 0, "removed": 0,
                         "leases_expired": 0}

    # -------- keys
    def prefix_keys(self, tokens: Any, tokens_per_chunk: int, **kw) -> list[bytes]:
        """Chained prefix keys of `tokens` with this tenant's salt."""
        return kvkeys.prefix_keys(tokens, tokens_per_chunk, salt=self.salt, **kw)

    def segment_keys(self, segments: Sequence[Any]) -> list[bytes]:
        """Position-independent keys of `segments` with this tenant's salt."""
        return kvkeys.segment_keys(segments, salt=self.salt)

    # -------- lookups (probes never change recency)
    def contains(self, key: Any) -> bool:
        return kvkeys.normalize_key(key) in self.index

    def lookup_prefix(self, keys: Sequence[Any]) -> int:
        """How many leading keys are stored (consecutive hits from the start)."""
        index = self.index
        n = 0
        for key in keys:
            if (key if type(key) is bytes else kvkeys.normalize_key(key)) not in index:
                break
            n += 1
        return n

    def lookup_sparse(self, keys: Sequence[Any]) -> np.ndarray:
        """Hit bitmap: which of `keys` are stored, anywhere in the list."""
        index = self.index
        return np.fromiter(((k if type(k) is bytes else kvkeys.normalize_key(k)) in index for k in keys),
                           dtype=bool, count=len(keys))

    def size_of(self, key: Any) -> int | None:
        entry = self.index.get(kvkeys.normalize_key(key))
        return None if entry is None else entry.nbytes

    def extent_of(self, key: Any) -> tuple[int, int] | None:
        """(hpa, nbytes) of a stored key (for engines that move the bytes themselves)."""
        entry = self.index.get(kvkeys.normalize_key(key))
        return None if entry is None else (entry.hpa, entry.nbytes)

    def keys(self) -> list[bytes]:
        return list(self.index)

    # -------- data
    def reserve(self, key: Any, nbytes: int, *, session: Session | None = None) -> Reservation | PutStatus:
        """Reserve an extent for a new chunk (allocate + write in place + commit).
        Returns a Reservation, or EXISTS / IN_FLIGHT / NO_SPACE."""
        return self.store.reserve(self, kvkeys.normalize_key(key), nbytes, self.own_session(session))

    def put_from(self, key: Any, data: Any, *, session: Session | None = None) -> PutStatus:
        """Store `data` (a buffer, or a list of buffers laid end to end) under `key`."""
        views = byte_views(data, writable=False)
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
        return self.store.read_into(self, kvkeys.normalize_key(key), byte_views(buf, writable=True),
                                    self.own_session(session), exact)

    def read_range(self, key: Any, offset: int, buf: Any) -> bool:
        """Read part of a chunk (e.g. one layer of a layer-first chunk) into `buf`, from
        byte `offset`. False on a miss; ValueError if the range leaves the chunk."""
        return self.store.read_range(self, kvkeys.normalize_key(key), offset, byte_view(buf, writable=True))

    def get_many_into(self, keys: Sequence[Any], out: Any, *, session: Session | None = None) -> int:
        """Read equal-sized chunks, laid end to end in `out`, in one device pass (one
        SSD batch for all their misses). Reads the leading run of stored keys and
        returns its length (the rest of `out` is untouched)."""
        return self.store.read_many(self, [kvkeys.normalize_key(k) for k in keys], byte_view(out, writable=True),
                                    self.own_session(session))

    def touch(self, keys: Sequence[Any]) -> None:
        """Mark stored keys as recently used."""
        self.store.touch(self, [kvkeys.normalize_key(k) for k in keys])

    def remove(self, key: Any) -> bool:
        """Delete a key of this tenant. False if it is not stored."""
        return self.store.remove(self, kvkeys.normalize_key(key))

    # -------- pins, prefetch
    def pin(self, keys: Sequence[Any]) -> int:
        """Keep these chunks in the store (never evicted) and ask the device to keep
        them resident. Returns how many were pinned (stored ones, within the tenant's
        pin budget). Pins nest: unpin as many times."""
        return self.store.pin(self, [kvkeys.normalize_key(k) for k in keys])

    def unpin(self, keys: Sequence[Any]) -> int:
        """Take back one pin() from each of these chunks; returns how many held one. A
        chunk pinned only by a pin lease is left pinned: the lease's pins end with it."""
        return self.store.unpin(self, [kvkeys.normalize_key(k) for k in keys])

    def lease_pins(self, keys: Sequence[Any], lease_s: float, *, lease_id: Any = None) -> "PinLease":
        """Pin these chunks for at most `lease_s` seconds (pinleases.py): for engines that
        pin at lookup and may never unpin. Released by ``lease.release()``,
        ``release_pins(lease_id)``, a new lease under the same id, or its deadline;
        within the tenant's pin budget like any pin (``lease.pinned`` says how many)."""
        return self.store.lease_pins(self, [kvkeys.normalize_key(k) for k in keys], lease_s, lease_id)

    def release_pins(self, lease_id: Any) -> int:
        """Release the lease `lease_id`; returns how many chunks it still pinned (0 if none)."""
        return self.store.release_lease_id(self, lease_id)

    def prefetch(self, keys: Sequence[Any], *, session: Session | None = None, deadline_ns: int = 0) -> "PrefetchTicket":
        """Hint (NEXT_PREFIX) that the leading stored keys will be read soon, and protect
        them from eviction within the tenant's pin budget (pinned plus protected bytes
        stay within max_pinned_bytes). `wait(ticket)` ends the protection."""
        return self.store.prefetch(self, [kvkeys.normalize_key(k) for k in keys], self.own_session(session), deadline_ns)

    # -------- sessions
    def open_session(self, name: str | None = None, *, prefix: Sequence[Any] | None = None) -> Session:
        """A new session (its device session id is random, so ids never collide across
        tenants or restarts). With `prefix`, it resumes on those keys at once."""
        return self.store.open_session(self, name, prefix)

    def session(self, name: str) -> Session | None:
        """This tenant's session called `name` (None if it has none by that name)."""
        return self.open_sessions.get(name)

    def sessions(self) -> list[Session]:
        return list(self.open_sessions.values())

    def stats(self) -> dict:
        return {"tenant": self.name, "entries": len(self.index), "used_bytes": self.used_bytes,
                "pinned_bytes": self.pinned_bytes, "protected_bytes": self.protected_bytes, "sessions": len(self.open_sessions),
                "quota_bytes": self.quota_bytes, "reserved_bytes": self.reserved_bytes, **self.counters}

    def own_session(self, session: Session | None) -> Session | None:
        """`session` itself if it is this tenant's and has not ended (None stays None);
        PermissionError for another tenant's session, ValueError for an ended one."""
        if session is not None and (not isinstance(session, Session) or session.tenant is not self):
            raise PermissionError("that session belongs to another tenant")
        if session is not None and session.state == Session.ENDED:
            raise ValueError(f"session {session.name!r} has ended")
        return session


class PrefetchTicket:
    """What a prefetch did: `ready` leading keys are stored (and were hinted); those the
    tenant's pin budget allowed are protected from eviction until `KVStore.wait(ticket)`
    - or until the ticket is dropped, so a forgotten ticket never protects forever."""

    def __init__(self, tenant: Tenant, ready: int, protected: list[Entry], protected_bytes: int):
        self.tenant, self.ready = tenant, ready
        self.protected = len(protected)
        self._release = weakref.finalize(self, tenant.store.unprotect, tenant, protected, protected_bytes)

    def release(self) -> None:
        """End the protection now (KVStore.wait); later calls do nothing."""
        self._release()

    @property
    def done(self) -> bool:
        return not self._release.alive


def tenant_identity_bytes(value: bytes | str | None, what: str) -> bytes | None:
    """A tenant's secret or salt as bytes (str is UTF-8 encoded); TypeError otherwise."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a tenant {what} is bytes or str, got {type(value).__name__}")


def secret_salt(secret: bytes) -> bytes:
    """The key salt of a secret-identified tenant (derived, so it is never stored)."""
    return kvkeys.salt_digest(b"cxlhm-tenant-salt:" + secret)[:16]
