"""KVStore: the index (key -> extent per tenant), the put / get / remove / pin /
prefetch paths and sessions. Eviction and persistence live in their own modules."""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading

import numpy as np

from host_runtime import kvkeys
from host_runtime.allocator import ExtentAllocator
from host_runtime.kvstore import audit
from host_runtime.kvstore.entries import Entry, PutStatus
from host_runtime.kvstore.eviction import EvictionMixin
from host_runtime.kvstore.hints import HintSink, coalesce, hints_for
from host_runtime.kvstore.journal import Journal, del_record, put_record, tenant_record
from host_runtime.kvstore.persistence import PersistenceMixin
from host_runtime.kvstore.pinleases import LeaseTable, PinLease
from host_runtime.kvstore.tenant import PrefetchTicket, Reservation, Session, Tenant, secret_salt, tenant_identity_bytes

log = logging.getLogger("cxlhm.kvstore")


class KVStore(EvictionMixin, PersistenceMixin):
    """KV chunks in the HDM window of an open device (`host_runtime.DeviceHandle`).

    Applications reach it through `tenant(name)`; the Tenant calls back through the
    methods of the TenantStore API (storeapi.py), which take the tenant (or one of its
    sessions, reservations or leases) as the first argument.

    index_path: where the persistent index lives. Default: next to the device image
      (``<image>.kvindex``); None with a temporary image (nothing would survive anyway).
      Pass ``False`` to keep the index in memory only.
    hints: the HintSink (default: the handle's mailbox hint sink, `handle.hint_sink("mailbox")`;
      pass NullHints() to drop hints).
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
        self._unflushed: dict[tuple[int, bytes], Entry] = {}
        self._doomed: dict[int, Entry] = {}  # hpa -> entry removed while being read (extent freed at the last lease)
        self._stamp = 0
        self._leases = LeaseTable()  # pins that end by themselves (pinleases.py)
        self.compact_factor = compact_factor
        self.counters = {"evictions": 0, "hint_errors": 0, "media_errors": 0, "dropped_on_open": 0,
                         "compactions": 0, "failed_verification": 0}
        self.alloc = ExtentAllocator(self.capacity, self.grain, base=base)
        self._journal: Journal | None = None
        path = self._index_path(index_path)
        if path is not None:
            self._open_index(path)

    # ------------------------------------------------------------ tenants
    def tenant(self, name: str, *, secret: bytes | str | None = None, salt: bytes | str | None = None,
               quota_bytes: int | None = None, reserved_bytes: int | None = None,
               max_pinned_bytes: int | None = None, chunk_bytes: int | None = None) -> Tenant:
        """The tenant called `name`, created on first use.

        Identity: with `secret` (at least 16 bytes, like vLLM's cache_salt), the tenant
        is opened only by whoever presents that secret - the name is a label, the store
        keeps a keyed hash of the secret, never the secret, and the tenant's key salt is
        derived from it, so its keys cannot be computed without it. Without a secret the
        name is the identity (any code holding the store can open it): for a store that
        serves one party. A secret tenant's name cannot be opened without the secret,
        nor a name-identified tenant with one (PermissionError).

        Salt of a name-identified tenant: `salt` if given, else one derived from a
        per-store secret (persisted with the index), so keys a tenant computes are
        stable across restarts and differ between tenants. The limits are the
        operator's: quota (max bytes stored), reservation (bytes global eviction never
        takes it below), pin budget, and a fixed chunk size if any."""
        if not isinstance(name, str) or not name or len(name.encode()) > 255:
            raise ValueError(f"a tenant name is a non-empty string of at most 255 bytes, got {name!r}")
        secret = tenant_identity_bytes(secret, "secret")
        salt = tenant_identity_bytes(salt, "salt")
        if secret is not None:
            if len(secret) < 16:
                raise ValueError(f"a tenant secret is at least 16 bytes (a random token), got {len(secret)}")
            if salt is not None:
                raise ValueError("a tenant with a secret derives its salt from it: pass secret or salt, not both")
        if salt is not None and len(salt) > 255:
            raise ValueError("a tenant salt is at most 255 bytes")
        with self._lock:
            t = self._tenants.get(name)
            if t is None:
                if secret is not None:
                    verifier = self._verifier(secret)
                    t = self._add_tenant(len(self._tenant_ids) + 1, name, secret_salt(secret), verifier)
                    self._log(tenant_record(t.id, name, b"", verifier))
                else:
                    salt = salt if salt is not None else kvkeys.salt_digest(self._secret + name.encode())[:16]
                    t = self._add_tenant(len(self._tenant_ids) + 1, name, salt)
                    self._log(tenant_record(t.id, name, salt))
            elif t.verifier:
                if secret is None or not hmac.compare_digest(self._verifier(secret), t.verifier):
                    raise PermissionError(f"tenant {name!r} is opened with its secret only")
                t.salt = secret_salt(secret)  # not persisted: known only while its owner has opened it
            elif secret is not None:
                raise PermissionError(f"tenant {name!r} exists without a secret; open it by name or use another name")
            elif salt is not None and salt != t.salt:
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

    def _verifier(self, secret: bytes) -> bytes:
        return hmac.new(self._secret, b"cxlhm-tenant:" + secret, hashlib.sha256).digest()

    def _add_tenant(self, tid: int, name: str, salt: bytes | None, verifier: bytes = b"") -> Tenant:
        t = Tenant(self, tid, name, salt or None if verifier else salt)
        t.verifier = verifier
        self._tenants[name] = t
        self._tenant_ids[tid] = t
        return t

    # ------------------------------------------------------------ put path (the TenantStore API from here
    # on, except the private helpers; storeapi.py documents each method)
    def reserve(self, t: Tenant, key: bytes, nbytes: int, session: Session | None) -> Reservation | PutStatus:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"a chunk needs a positive byte count, got {nbytes!r}")
        if t.chunk_bytes is not None and nbytes != t.chunk_bytes:
            raise ValueError(f"tenant {t.name!r} stores {t.chunk_bytes}-byte chunks, got {nbytes} bytes")
        need = self.alloc.grains_for(nbytes) * self.grain
        if need > self.capacity:
            raise ValueError(f"a {nbytes}-byte chunk does not fit the {self.capacity}-byte store")
        self._reap_leases()  # expired pins first, so making room never evicts in their place
        with self._lock:
            if key in t.index:
                return PutStatus.EXISTS
            if key in t.pending:
                return PutStatus.IN_FLIGHT
            evicted: list[bytes] = []  # this tenant's keys evicted for the room (never others')
            hpa = self._make_room(t, need, evicted)
            if hpa is None:
                return PutStatus.NO_SPACE
            t.used_bytes += need
            res = Reservation(t, key, hpa, nbytes, session, evicted)
            t.pending[key] = res
        if session is not None:
            self._hint("append", session.id, [(hpa, nbytes)])
        return res

    def commit(self, res: Reservation) -> bool:
        """Publish a reservation its owner has just finished (Reservation.commit)."""
        t = res.tenant
        with self._lock:
            del t.pending[res.key]
            entry = Entry(t, res.key, res.hpa, res.nbytes)
            self._log(put_record(t.id, res.key, res.hpa, res.nbytes))
            t.index[res.key] = entry
            self._unflushed[(t.id, res.key)] = entry
            self._stamp_entry(entry)
            self._place(entry)
            t.counters["puts"] += 1
            if res.session is not None and res.session.state != Session.ENDED:
                self._ref(res.session, entry)
            self._maybe_compact()
        return True

    def abort(self, res: Reservation) -> None:
        """Free a reservation its owner has just finished (Reservation.abort)."""
        t = res.tenant
        with self._lock:
            del t.pending[res.key]
            t.used_bytes -= self.alloc.free(res.hpa)

    # ------------------------------------------------------------ get path
    def read_into(self, t: Tenant, key: bytes, views: list[np.ndarray], session: Session | None, exact: bool) -> int | None:
        total = sum(v.shape[0] for v in views)
        self._reap_leases()
        with self._lock:
            entry = t.index.get(key)
            if entry is None:
                t.counters["misses"] += 1
                return None
            if total != entry.nbytes and (exact or total < entry.nbytes):
                raise ValueError(f"the buffer holds {total} bytes but the chunk has {entry.nbytes}")
            self._lease(entry, session)
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

    def _lease(self, entry, session: Session | None) -> None:
        """Under the lock: hold `entry` for a read (its extent stays put until _unlease)
        and count the use for eviction and for the session's resume hints."""
        entry.leases += 1
        self._touch_entry(entry)
        if session is not None:
            self._ref(session, entry)

    def read_many(self, t: Tenant, keys: list[bytes], out: np.ndarray, session: Session | None) -> int:
        self._reap_leases()
        with self._lock:
            entries = []
            for key in keys:
                entry = t.index.get(key)
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
                self._lease(entry, session)
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

    def read_range(self, t: Tenant, key: bytes, offset: int, view: np.ndarray) -> bool:
        self._reap_leases()
        with self._lock:
            entry = t.index.get(key)
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

    def _read_failed(self, entries: list[Entry], exc: Exception) -> None:
        """A device read error (media error, poison): the chunks' bytes cannot be
        trusted, so they become misses (dropped); the engine recomputes the KV."""
        log.warning("dropping %d chunk(s) after a device read error: %s", len(entries), exc)
        with self._lock:
            self.counters["media_errors"] += 1
            for entry in entries:
                entry.leases -= 1
                if entry.tenant.index.get(entry.key) is entry:
                    self._delete(entry)
                elif entry.doomed and entry.leases == 0:
                    self._release_extent(entry)

    def touch(self, t: Tenant, keys: list[bytes]) -> None:
        with self._lock:
            for key in keys:
                entry = t.index.get(key)
                if entry is not None:
                    self._touch_entry(entry)

    # ------------------------------------------------------------ remove / pin / prefetch
    def remove(self, t: Tenant, key: bytes) -> bool:
        self._reap_leases()
        with self._lock:
            entry = t.index.get(key)
            if entry is None:
                return False
            self._delete(entry)
            t.counters["removed"] += 1
            return True

    def pin(self, t: Tenant, keys: list[bytes]) -> int:
        """One more pin on each stored key of `t`, within its pin budget (Tenant.pin)."""
        return self._pin_keys(t, keys, True)

    def unpin(self, t: Tenant, keys: list[bytes]) -> int:
        """One pin() fewer on each key of `t` that holds one (Tenant.unpin); a lease's
        pins end with the lease only, so neither takes away the other's."""
        return self._pin_keys(t, keys, False)

    def _pin_keys(self, t: Tenant, keys: list[bytes], pin: bool) -> int:
        self._reap_leases()
        ranges = []  # extents whose device pin state changes (first pin / last unpin)
        done = 0
        with self._lock:
            for key in keys:
                entry = t.index.get(key)
                if entry is not None and (self._pin_entry(entry, ranges) if pin
                                          else entry.plain_pins and self._unpin_entry(entry, ranges)):
                    entry.plain_pins += 1 if pin else -1
                    done += 1
        if ranges:
            self._hint("pin" if pin else "unpin", coalesce(ranges))
        return done

    def _pin_entry(self, entry: Entry, ranges: list) -> bool:
        """Under the lock: one more pin on a stored entry; False if over its tenant's pin budget."""
        t = entry.tenant
        if entry.pins == 0:
            size = self._extent_bytes(entry)
            if t.pinned_bytes + size > t.max_pinned_bytes:
                return False
            self._unplace(entry)
            t.pinned_bytes += size
            ranges.append((entry.hpa, entry.nbytes))
        entry.pins += 1
        return True

    def _unpin_entry(self, entry: Entry, ranges: list) -> bool:
        """Under the lock: one pin fewer; False if the entry holds none (or is gone)."""
        if not entry.pins or entry.tenant.index.get(entry.key) is not entry:
            return False
        entry.pins -= 1
        if entry.pins == 0:
            entry.tenant.pinned_bytes -= self._extent_bytes(entry)
            self._place(entry)
            ranges.append((entry.hpa, entry.nbytes))
        return True

    # ------------------------------------------------------------ pin leases (pinleases.py)
    def lease_pins(self, t: Tenant, keys: list[bytes], lease_s: float, lease_id) -> PinLease:
        lease_s = self._leases.check_duration(lease_s)
        self._reap_leases()
        ranges, released = [], []
        with self._lock:
            old = self._leases.get(t, lease_id) if lease_id is not None else None
            if old is not None:  # the same lookup again: its new pins replace the old ones
                self._drop_lease(old, released)
            entries = []
            for key in keys:
                entry = t.index.get(key)
                if entry is not None and self._pin_entry(entry, ranges):
                    entries.append(entry)
            lease = PinLease(t, lease_id, entries, self._leases.clock() + lease_s)
            if entries:
                self._leases.add(lease)
                self._leases.arm(self._lease_timer)
            else:
                lease.released = True  # nothing to hold
        if released:
            self._hint("unpin", coalesce(released))
        if ranges:
            self._hint("pin", coalesce(ranges))
        return lease

    def release_lease(self, lease: PinLease) -> int:
        ranges: list = []
        with self._lock:
            n = self._drop_lease(lease, ranges)
        if ranges:
            self._hint("unpin", coalesce(ranges))
        return n

    def release_lease_id(self, t: Tenant, lease_id) -> int:
        with self._lock:
            lease = self._leases.get(t, lease_id)
        return 0 if lease is None else self.release_lease(lease)

    def _drop_lease(self, lease: PinLease, ranges: list) -> int:
        """Under the lock: release a lease's pins; returns how many it still held."""
        if lease.released:
            return 0
        lease.released = True
        self._leases.forget(lease)
        return sum(self._unpin_entry(entry, ranges) for entry in lease.entries)

    def _reap_leases(self) -> None:
        """Release every lease past its deadline (cheap when none is due)."""
        if not len(self._leases):
            return
        due = self._leases.earliest()  # read without the lock: a stale answer costs one locked look
        if due is None or due > self._leases.clock():
            return
        ranges: list = []
        with self._lock:
            for lease in self._leases.pop_expired():
                self._drop_lease(lease, ranges)
                lease.tenant.counters["leases_expired"] += 1
        if ranges:
            self._hint("unpin", coalesce(ranges))

    def _lease_timer(self) -> None:
        with self._lock:
            self._leases.timer_fired(threading.current_thread())
        self._reap_leases()
        with self._lock:
            self._leases.arm(self._lease_timer)

    def prefetch(self, t: Tenant, keys: list[bytes], session: Session | None, deadline_ns: int) -> PrefetchTicket:
        with self._lock:
            entries, protected, budget = [], [], t.max_pinned_bytes - t.pinned_bytes - t.protected_bytes
            for key in keys:
                entry = t.index.get(key)
                if entry is None:
                    break
                entries.append(entry)
                size = self._extent_bytes(entry)
                if entry.pins == 0 and size <= budget:  # a pinned chunk needs no protection
                    budget -= size
                    entry.protects += 1
                    protected.append(entry)
            protected_bytes = sum(self._extent_bytes(e) for e in protected)
            t.protected_bytes += protected_bytes
        if entries:
            sid = session.id if session is not None else 0
            self._hint("next_prefix", sid, coalesce((e.hpa, e.nbytes) for e in entries), deadline_ns)
        return PrefetchTicket(t, len(entries), protected, protected_bytes)

    def unprotect(self, t: Tenant, entries: list[Entry], nbytes: int) -> None:
        with self._lock:
            for entry in entries:
                entry.protects -= 1
            t.protected_bytes -= nbytes

    def wait(self, ticket: PrefetchTicket) -> int:
        """End a prefetch's protection; returns how many leading keys it covered."""
        ticket.release()
        return ticket.ready

    # ------------------------------------------------------------ sessions
    def open_session(self, t: Tenant, name: str | None, prefix) -> Session:
        with self._lock:
            if name is None:
                name = f"s{secrets.token_hex(6)}"
            if not isinstance(name, str) or not name:
                raise ValueError(f"a session name is a non-empty string, got {name!r}")
            old = t.open_sessions.get(name)
            if old is not None:
                raise ValueError(f"tenant {t.name!r} already has an open session {name!r}")
            session = Session(t, name, secrets.randbits(62) + 1)
            t.open_sessions[name] = session
        if prefix:
            session.resume(prefix)
        return session

    def resume_session(self, s: Session, keys: list[bytes]) -> int:
        t = s.tenant
        with self._lock:
            t.own_session(s)
            if s.state == Session.PAUSED:
                s.state = Session.ACTIVE
                for entry in s.entries.values():
                    entry.paused -= 1
                    entry.active += 1
                    self._reclass(entry)
            hits = []
            for key in keys:
                entry = t.index.get(key)
                if entry is None:
                    break
                self._ref(s, entry)
                hits.append(entry)
        self._hint("session_resume", s.id, coalesce((e.hpa, e.nbytes) for e in hits))
        return len(hits)

    def session_next_prefix(self, s: Session, keys: list[bytes], deadline_ns: int) -> int:
        t = s.tenant
        with self._lock:
            t.own_session(s)
            hits = [t.index[k] for k in keys if k in t.index]
            for entry in hits:
                self._ref(s, entry)
        if hits:
            self._hint("next_prefix", s.id, coalesce((e.hpa, e.nbytes) for e in hits), deadline_ns)
        return len(hits)

    def pause_session(self, s: Session, expected_pause_ns: int) -> None:
        with self._lock:
            s.tenant.own_session(s)
            if s.state == Session.PAUSED:
                return
            s.state = Session.PAUSED
            for entry in s.entries.values():
                entry.active -= 1
                entry.paused += 1
                self._reclass(entry)
        self._hint("session_pause", [s.id], expected_pause_ns)

    def end_session(self, s: Session) -> None:
        with self._lock:
            if s.state == Session.ENDED:
                return
            s.tenant.own_session(s)
            for entry in s.entries.values():
                if s.state == Session.PAUSED:
                    entry.paused -= 1
                else:
                    entry.active -= 1
                self._reclass(entry)
            s.entries.clear()
            s.state = Session.ENDED
            s.tenant.open_sessions.pop(s.name, None)
        self._hint("session_end", [s.id])

    def _ref(self, s: Session, entry: Entry) -> None:
        """Session s references entry (reads it or wrote it)."""
        if s.entries.get(entry.key) is entry:
            return
        s.entries[entry.key] = entry  # replaces a dead entry of a key stored again
        if s.state == Session.PAUSED:
            entry.paused += 1
        else:
            entry.active += 1
        self._reclass(entry)

    def _unlease(self, entry: Entry) -> None:
        entry.leases -= 1
        if entry.doomed and entry.leases == 0:
            self._release_extent(entry)

    def _delete(self, entry: Entry) -> None:
        """Remove an entry from the index (journaled); its extent is freed now, or when
        its last reader finishes."""
        t = entry.tenant
        self._log(del_record(t.id, entry.key))  # journaled before the extent can be reused
        del t.index[entry.key]
        self._unflushed.pop((t.id, entry.key), None)
        self._unplace(entry)
        if entry.pins:
            t.pinned_bytes -= self._extent_bytes(entry)
            entry.pins = entry.plain_pins = 0
            self._hint("unpin", [(entry.hpa, entry.nbytes)])
        if entry.leases:
            entry.doomed = True
            self._doomed[entry.hpa] = entry
        else:
            self._release_extent(entry)
        self._maybe_compact()

    def _release_extent(self, entry: Entry) -> None:
        self._doomed.pop(entry.hpa, None)
        entry.tenant.used_bytes -= self.alloc.free(entry.hpa)

    # ------------------------------------------------------------ hints
    def _hint(self, method: str, *args) -> None:
        try:
            getattr(self.hints, method)(*args)
        except Exception as exc:  # advisory: a failed hint costs performance, never correctness
            self.counters["hint_errors"] += 1
            log.debug("hint %s failed: %s", method, exc)


    # ------------------------------------------------------------ consistency
    def check(self) -> dict:
        """Check that the index and the allocator agree (host_runtime/kvstore/audit.py);
        raises IndexCorrupt naming the first disagreement, returns counts."""
        with self._lock:
            return audit.check_store(self.alloc, self.grain, list(self._tenant_ids.values()), list(self._doomed.values()))

    # ------------------------------------------------------------ stats
    def stats(self) -> dict:
        with self._lock:
            return {"capacity": self.capacity, "used_bytes": self.alloc.used_bytes, "free_bytes": self.alloc.free_bytes,
                    "entries": sum(len(t.index) for t in self._tenants.values()),
                    "free_extents": self.alloc.free_extents, "largest_free": self.alloc.largest_free(),
                    "tenants": len(self._tenants), **self.counters}

