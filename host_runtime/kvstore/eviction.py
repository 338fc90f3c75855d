"""Store-level eviction: which chunk goes when the window or a tenant's quota is full.
Ended or session-less chunks first, then paused sessions', then active sessions', least
recently used first; never pinned chunks, never chunks being read or written; never a
tenant below its reservation; a tenant over its quota evicts only its own chunks.

`EvictionMixin` is part of KVStore (it works on the store's tenants, allocator and
index under the store's lock); it is kept apart so the policy reads in one place."""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from host_runtime.kvstore.entries import ACTIVE, COLD, PAUSED, Entry

if TYPE_CHECKING:
    from host_runtime.kvstore.tenant import Tenant


class EvictionMixin:
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
    def _oldest_unleased(lru: OrderedDict) -> Entry | None:
        for entry in lru.values():  # oldest first; chunks being read or prefetched are skipped
            if not entry.leases and not entry.protects:
                return entry
        return None

    def _victim_of(self, t: Tenant) -> Entry | None:
        for lru in t.lru:
            entry = self._oldest_unleased(lru)
            if entry is not None:
                return entry
        return None

    def _global_victim(self) -> Entry | None:
        """The least recently used evictable chunk of the lowest class, among tenants
        that stay at or above their reservation without it. O(tenants) per victim."""
        for cls in (COLD, PAUSED, ACTIVE):
            best = None
            for t in self._tenants.values():
                entry = self._oldest_unleased(t.lru[cls])
                if entry is None or t.used_bytes - self._extent_bytes(entry) < t.reserved_bytes:
                    continue
                if best is None or entry.stamp < best.stamp:
                    best = entry
            if best is not None:
                return best
        return None

    def _extent_bytes(self, entry: Entry) -> int:
        return self.alloc.grains_for(entry.nbytes) * self.grain

    def _evict(self, entry: Entry, requester: Tenant, evicted: list[bytes]) -> None:
        owner = entry.tenant
        self._delete(entry)
        self.counters["evictions"] += 1
        owner.counters["evicted"] += 1
        owner.evicted_keys.append(entry.key)  # the owner's adapters report it (vLLM events)
        if owner is requester:
            evicted.append(entry.key)


    # ------------------------------------------------------------ entry bookkeeping
    def _stamp_entry(self, entry: Entry) -> None:
        self._stamp += 1
        entry.stamp = self._stamp

    def _place(self, entry: Entry) -> None:
        """Put an unpinned committed entry on its class's LRU list (as most recent)."""
        if entry.pins:
            return
        entry.cls = entry.eviction_class()
        entry.tenant.lru[entry.cls][entry.key] = entry

    def _unplace(self, entry: Entry) -> None:
        entry.tenant.lru[entry.cls].pop(entry.key, None)

    def _reclass(self, entry: Entry) -> None:
        """Move an entry to the LRU list of its (new) eviction class after a session
        referencing it changed state."""
        cls = entry.eviction_class()
        if cls == entry.cls:
            return
        listed = not entry.pins and entry.tenant.index.get(entry.key) is entry
        if listed:
            self._unplace(entry)
        entry.cls = cls
        if listed:
            entry.tenant.lru[cls][entry.key] = entry

    def _touch_entry(self, entry: Entry) -> None:
        self._stamp_entry(entry)
        if not entry.pins:
            entry.tenant.lru[entry.cls].move_to_end(entry.key)
