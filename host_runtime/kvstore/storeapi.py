"""What a tenant asks of its store: the declared API between `Tenant` (and the objects it
hands out: Session, Reservation, PrefetchTicket, PinLease) and `KVStore`.

Applications and adapters call the Tenant (or a KVShim over it), never these methods:
the Tenant normalises keys and buffers and checks that a session is its own, then calls
the store with the tenant as the first argument. The store keeps the shared state (the
allocator, the journal, the lock, eviction across tenants, the hint sink) and does the
work under its lock; the per-tenant bookkeeping it keeps on the Tenant is listed in
Tenant's docstring.

Arguments are already normalised: keys are bytes, buffers are uint8 numpy views
(host_runtime.buffers), sessions belong to the tenant and have not ended.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from host_runtime.kvstore.entries import Entry, PutStatus
    from host_runtime.kvstore.pinleases import PinLease
    from host_runtime.kvstore.tenant import PrefetchTicket, Reservation, Session, Tenant


@runtime_checkable
class TenantStore(Protocol):
    """The store as a Tenant sees it (KVStore implements it)."""

    handle: Any
    """The open device (host_runtime.DeviceHandle): a Reservation writes its bytes in place
    with ``handle.write_from(hpa, view, session=sid)`` and reads them back with
    ``handle.read_view(hpa, view, sid)``."""

    capacity: int
    """Bytes the store manages: a new tenant's default quota and pin budget."""

    # ------------------------------------------------------------ writes
    def reserve(self, tenant: Tenant, key: bytes, nbytes: int, session: Session | None) -> Reservation | PutStatus:
        """An extent for a new chunk of `tenant` (evicting as the policy allows, APPEND hint
        if a session writes it), or PutStatus.EXISTS / IN_FLIGHT / NO_SPACE. ValueError
        for a size the tenant or the store cannot hold."""

    def commit(self, reservation: Reservation) -> bool:
        """Publish a reservation its owner has finished writing (Reservation.commit):
        journaled, indexed, placed for eviction. True."""

    def abort(self, reservation: Reservation) -> None:
        """Free a reservation its owner gave up (Reservation.abort)."""

    # ------------------------------------------------------------ reads
    def read_into(self, tenant: Tenant, key: bytes, views: list[np.ndarray], session: Session | None,
                  exact: bool) -> int | None:
        """Fill `views` in order with the chunk; its size, or None on a miss (or after a
        device read error, which drops the chunk). ValueError if the views hold a
        different size (or, with exact False, less)."""

    def read_many(self, tenant: Tenant, keys: list[bytes], out: np.ndarray, session: Session | None) -> int:
        """The leading run of stored, equal-sized chunks end to end in `out`, in one device
        pass; how many that is."""

    def read_range(self, tenant: Tenant, key: bytes, offset: int, view: np.ndarray) -> bool:
        """Bytes [offset, offset + len(view)) of a chunk; False on a miss."""

    def touch(self, tenant: Tenant, keys: list[bytes]) -> None:
        """Mark the stored keys among `keys` as recently used."""

    def remove(self, tenant: Tenant, key: bytes) -> bool:
        """Delete a key; False if it is not stored."""

    # ------------------------------------------------------------ pins, leases, prefetch
    def pin(self, tenant: Tenant, keys: list[bytes]) -> int:
        """One more pin on each stored key, within the tenant's pin budget; how many."""

    def unpin(self, tenant: Tenant, keys: list[bytes]) -> int:
        """One pin fewer on each key that holds one; how many."""

    def lease_pins(self, tenant: Tenant, keys: list[bytes], lease_s: float, lease_id: Any) -> PinLease:
        """Pins that end by themselves after `lease_s` seconds (pinleases.py); a lease with
        the same id replaces the tenant's earlier one."""

    def release_lease(self, lease: PinLease) -> int:
        """End a lease now (PinLease.release); how many chunks it still pinned."""

    def release_lease_id(self, tenant: Tenant, lease_id: Any) -> int:
        """End the tenant's lease `lease_id`; how many chunks it still pinned (0 if none)."""

    def prefetch(self, tenant: Tenant, keys: list[bytes], session: Session | None, deadline_ns: int) -> PrefetchTicket:
        """NEXT_PREFIX hint for the leading stored keys, which are protected from eviction
        within the tenant's pin budget until the ticket is waited for or dropped."""

    def unprotect(self, tenant: Tenant, entries: list[Entry], nbytes: int) -> None:
        """End a prefetch's protection (the ticket's release, run once)."""

    # ------------------------------------------------------------ sessions
    def open_session(self, tenant: Tenant, name: str | None, prefix: Any) -> Session:
        """A new session of the tenant (random device session id); resumed on `prefix` if given.
        ValueError if the tenant has an open session of that name."""

    def resume_session(self, session: Session, keys: list[bytes]) -> int:
        """Session back to active; SESSION_RESUME with the extents of the leading stored
        keys; how many that is."""

    def session_next_prefix(self, session: Session, keys: list[bytes], deadline_ns: int) -> int:
        """NEXT_PREFIX for the stored keys among `keys`; how many."""

    def pause_session(self, session: Session, expected_pause_ns: int) -> None:
        """Session to paused (its chunks move to the paused eviction class); SESSION_PAUSE."""

    def end_session(self, session: Session) -> None:
        """Session over (its chunks become first eviction candidates); SESSION_END."""


def members(protocol: type = TenantStore) -> list[str]:
    """The names a protocol declares (methods and attributes), sorted."""
    names = {name for name in vars(protocol) if not name.startswith("_")}
    names |= set(getattr(protocol, "__annotations__", {}))
    return sorted(names)
