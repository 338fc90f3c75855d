"""Pins that end by themselves: a lease pins chunks for at most `lease_s` seconds.

Engines that pin at lookup time do not all unpin: LMCache's remote back end pins through
``batched_async_contains(pin=True)`` and its unpin for a remote back end does nothing.
A plain pin (`Tenant.pin`) lasts until `unpin`, so such an engine would fill the store
with pins. A lease (`Tenant.lease_pins`) is released by whichever comes first:

* its holder: ``lease.release()`` or ``tenant.release_pins(lease_id)`` (an adapter
  does this on the engine's get that follows the lookup);
* a new lease under the same id (a repeated lookup replaces the old one);
* its deadline: the store releases expired leases at the start of every put, get,
  remove and pin of any tenant (before a put evicts, so expired pins never cost a chunk), and a
  timer releases them when nothing calls the store, so no lease outlives its deadline
  by more than the timer's latency.

Leased pins count against the tenant's pin budget (``max_pinned_bytes``) like any pin,
and nest with them: an entry stays pinned while any pin or lease holds it.

`LeaseTable` is the store's bookkeeping, used under the store's lock."""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from host_runtime.kvstore.entries import Entry
    from host_runtime.kvstore.tenant import Tenant

MAX_LEASE_S = 3600.0  # a lease is a short hold; longer holds are plain pins


class PinLease:
    """Chunks pinned until `deadline` (the store's clock), or until released."""

    __slots__ = ("tenant", "lease_id", "entries", "deadline", "released")

    def __init__(self, tenant: Tenant, lease_id: Any, entries: list[Entry], deadline: float):
        self.tenant, self.lease_id, self.entries, self.deadline = tenant, lease_id, entries, deadline
        self.released = False

    @property
    def pinned(self) -> int:
        """How many chunks this lease pinned (stored ones, within the pin budget)."""
        return len(self.entries)

    def release(self) -> int:
        """Unpin now; returns how many chunks were still pinned by it (0 if already released)."""
        return self.tenant.store.release_lease(self)

    def __repr__(self) -> str:
        state = "released" if self.released else f"until {self.deadline:.3f}"
        return f"PinLease({self.tenant.name!r}, {self.lease_id!r}, {len(self.entries)} chunks, {state})"


class LeaseTable:
    """Live leases by deadline and by (tenant, id). Not thread-safe: the store's lock
    guards it. `on_deadline(delay)` is asked to call back when the earliest lease is due."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._heap: list[tuple[float, int, PinLease]] = []
        self._by_id: dict[tuple[int, Any], PinLease] = {}
        self._seq = itertools.count()
        self._timer: threading.Timer | None = None
        self._timer_due = float("inf")

    def __len__(self) -> int:
        return len(self._by_id)

    def check_duration(self, lease_s: Any) -> float:
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not 0 < lease_s <= MAX_LEASE_S:
            raise ValueError(f"a pin lease lasts more than 0 and at most {MAX_LEASE_S:g} seconds, got {lease_s!r}")
        return float(lease_s)

    def get(self, tenant: Tenant, lease_id: Any) -> PinLease | None:
        return self._by_id.get((tenant.id, lease_id))

    def add(self, lease: PinLease) -> None:
        if lease.lease_id is not None:
            self._by_id[(lease.tenant.id, lease.lease_id)] = lease
        else:
            self._by_id[(lease.tenant.id, ("anonymous", id(lease)))] = lease
        heapq.heappush(self._heap, (lease.deadline, next(self._seq), lease))

    def forget(self, lease: PinLease) -> None:
        key = (lease.tenant.id, lease.lease_id if lease.lease_id is not None else ("anonymous", id(lease)))
        if self._by_id.get(key) is lease:
            del self._by_id[key]
        # its heap slot is dropped lazily (pop_expired and next_deadline skip released leases)

    def pop_expired(self) -> list[PinLease]:
        now, due = self.clock(), []
        while self._heap and (self._heap[0][2].released or self._heap[0][0] <= now):
            _, _, lease = heapq.heappop(self._heap)
            if not lease.released:
                due.append(lease)
        return due

    def earliest(self) -> float | None:
        """The earliest deadline in the heap, perhaps a released lease's (no mutation, so
        callable without the store's lock as a cheap "anything due?" check)."""
        heap = self._heap
        try:
            return heap[0][0] if heap else None
        except IndexError:  # emptied meanwhile
            return None

    def next_deadline(self) -> float | None:
        while self._heap and self._heap[0][2].released:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    # ---------------------------------------------------------------- the timer
    def arm(self, callback: Callable[[], None]) -> None:
        """Make sure `callback` runs by the earliest deadline (a daemon timer thread lives
        only while leases do)."""
        due = self.next_deadline()
        if due is None or (self._timer is not None and self._timer_due <= due):
            return
        self.disarm()
        timer = threading.Timer(max(0.0, due - self.clock()) + 0.001, callback)
        timer.daemon = True
        timer.name = "cxlhm-pin-leases"
        self._timer, self._timer_due = timer, due
        timer.start()

    def timer_fired(self, thread: threading.Thread) -> None:
        if self._timer is thread:  # not a timer armed later for an earlier deadline
            self._timer, self._timer_due = None, float("inf")

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_due = None, float("inf")


__all__ = ["MAX_LEASE_S", "LeaseTable", "PinLease"]
