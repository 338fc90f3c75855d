"""The KV store's consistency audit: the index and the allocator must agree - the
allocator's live extents are exactly those of the stored chunks, the reservations in
progress and the chunks removed while being read (no leak, no overlap), and each tenant's
used bytes add up."""
from __future__ import annotations

from typing import TYPE_CHECKING

from host_runtime.allocator import AllocatorError
from host_runtime.kvstore.entries import IndexCorrupt

if TYPE_CHECKING:
    from host_runtime.kvstore.tenant import Tenant


def check_store(store) -> dict:
    """Audit `store` (a KVStore, its lock held by the caller). Raises IndexCorrupt naming
    the first disagreement; returns counts."""
    try:
        store.alloc.check()
    except AllocatorError as exc:
        raise IndexCorrupt(f"allocator: {exc}") from None
    expected: dict[int, int] = {}
    per_tenant: dict[int, int] = {}

    def claim(hpa: int, nbytes: int, t: Tenant, what: str) -> None:
        size = store.alloc.grains_for(nbytes) * store.grain
        if hpa in expected:
            raise IndexCorrupt(f"{what} at {hpa:#x} is claimed twice")
        expected[hpa] = size
        per_tenant[t.id] = per_tenant.get(t.id, 0) + size

    for t in store._tenant_ids.values():
        for entry in t._index.values():
            claim(entry.hpa, entry.nbytes, t, f"chunk {entry.key.hex()[:16]} of {t.name!r}")
        for res in t._pending.values():
            claim(res.hpa, res.nbytes, t, f"reservation {res.key.hex()[:16]} of {t.name!r}")
    for entry in store._doomed.values():
        claim(entry.hpa, entry.nbytes, entry.tenant, "a removed chunk still being read")
    live = dict(store.alloc.extents())
    if live != expected:
        leaked = sorted(set(live) - set(expected))
        missing = sorted(set(expected) - set(live))
        wrong = sorted(h for h in set(live) & set(expected) if live[h] != expected[h])
        raise IndexCorrupt(f"allocator and index disagree: {len(leaked)} extent(s) allocated but not indexed "
                           f"{[hex(h) for h in leaked[:4]]}, {len(missing)} indexed but not allocated "
                           f"{[hex(h) for h in missing[:4]]}, {len(wrong)} of another size")
    for t in store._tenant_ids.values():
        if t.used_bytes != per_tenant.get(t.id, 0):
            raise IndexCorrupt(f"tenant {t.name!r} counts {t.used_bytes} used bytes, its chunks hold "
                               f"{per_tenant.get(t.id, 0)}")
    return {"extents": len(live), "entries": sum(len(t._index) for t in store._tenant_ids.values()),
            "reservations": sum(len(t._pending) for t in store._tenant_ids.values()),
            "used_bytes": store.alloc.used_bytes}
