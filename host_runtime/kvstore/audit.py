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


def check_store(alloc, grain: int, tenants: list[Tenant], doomed: list) -> dict:
    """Audit a store (its lock held by the caller): its allocator `alloc` (allocation unit
    `grain`), its tenants, and `doomed`, the entries removed while being read. Raises
    IndexCorrupt naming the first disagreement; returns counts."""
    try:
        alloc.check()
    except AllocatorError as exc:
        raise IndexCorrupt(f"allocator: {exc}") from None
    expected: dict[int, int] = {}
    per_tenant: dict[int, int] = {}

    def claim(hpa: int, nbytes: int, t: Tenant, what: str) -> None:
        size = alloc.grains_for(nbytes) * grain
        if hpa in expected:
            raise IndexCorrupt(f"{what} at {hpa:#x} is claimed twice")
        expected[hpa] = size
        per_tenant[t.id] = per_tenant.get(t.id, 0) + size

    for t in tenants:
        for entry in t.index.values():
            claim(entry.hpa, entry.nbytes, t, f"chunk {entry.key.hex()[:16]} of {t.name!r}")
        for res in t.pending.values():
            claim(res.hpa, res.nbytes, t, f"reservation {res.key.hex()[:16]} of {t.name!r}")
    for entry in doomed:
        claim(entry.hpa, entry.nbytes, entry.tenant, "a removed chunk still being read")
    live = dict(alloc.extents())
    if live != expected:
        leaked = sorted(set(live) - set(expected))
        missing = sorted(set(expected) - set(live))
        wrong = sorted(h for h in set(live) & set(expected) if live[h] != expected[h])
        raise IndexCorrupt(f"allocator and index disagree: {len(leaked)} extent(s) allocated but not indexed "
                           f"{[hex(h) for h in leaked[:4]]}, {len(missing)} indexed but not allocated "
                           f"{[hex(h) for h in missing[:4]]}, {len(wrong)} of another size")
    for t in tenants:
        if t.used_bytes != per_tenant.get(t.id, 0):
            raise IndexCorrupt(f"tenant {t.name!r} counts {t.used_bytes} used bytes, its chunks hold "
                               f"{per_tenant.get(t.id, 0)}")
    return {"extents": len(live), "entries": sum(len(t.index) for t in tenants),
            "reservations": sum(len(t.pending) for t in tenants),
            "used_bytes": alloc.used_bytes}
