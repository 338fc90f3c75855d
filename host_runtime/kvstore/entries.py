"""What the store's index holds: one entry per stored chunk, its eviction class, and
the store's error types and put outcomes."""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from host_runtime.kvstore.tenant import Tenant

INDEX_FORMAT = 2        # 2: a clean close ends the journal with a CLEAN_CLOSE record
READABLE_FORMATS = (1, 2)
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



class Entry:
    __slots__ = ("tenant", "key", "hpa", "nbytes", "pins", "plain_pins", "leases", "protects", "active", "paused",
                 "cls", "doomed", "stamp", "fp")

    def __init__(self, tenant: "Tenant", key: bytes, hpa: int, nbytes: int):
        self.tenant, self.key, self.hpa, self.nbytes = tenant, key, hpa, nbytes
        self.pins = self.leases = self.active = self.paused = 0
        self.plain_pins = 0   # of `pins`, those taken by pin() (the rest are pin leases'): only unpin() drops these
        self.protects = 0     # prefetches protecting it from eviction (a removal still frees it at once)
        self.cls = COLD
        self.doomed = False   # removed while leased: freed when the last lease ends
        self.stamp = 0        # recency: the store's access counter at the last use
        self.fp: int | None = None  # fingerprint of its durable bytes (taken at the flush after its commit)

    def eviction_class(self) -> int:
        return ACTIVE if self.active else PAUSED if self.paused else COLD
