"""The pool service's tenants: each one's service-side state, and how a new one is made
without holding up the other hosts.

A new tenant's partition is written with zeros and flushed before any host gets it (the
device then holds a zero block's checksum for every block of it, so a byte flipped on the
image in a block no host wrote is poison when read, never data). That pass takes as long
as the partition is large, so it runs outside the service's lock: the partition is
reserved under the lock (another new tenant gets another), filled by the attach that
asked first, then recorded under the lock. A host asking for a tenant being prepared
waits for that tenant alone; the other hosts' attaches and requests go on. A fill that
fails releases the reservation (nothing recorded, the space free again) and every attach
waiting for it is refused with the reason.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from cxlhm.pool.layout import Layout, LayoutError, TenantPartition
from cxlhm.pool.mirror import MirrorWriter
from cxlhm.pool.port import PinBudget


class Tenant:
    """Service-side state of one partition: its mirror, its pin budget, and the lock
    that orders device changes against mirror updates."""

    def __init__(self, partition: TenantPartition, mirror: MirrorWriter, pins: PinBudget):
        self.partition, self.mirror, self.pins = partition, mirror, pins
        self.lock = threading.Lock()
        self.dirty = False  # written since the last device flush


class Preparing:
    """A tenant whose partition is being filled: what the attaches asking for it wait on."""

    def __init__(self, partition: TenantPartition):
        self.partition = partition
        self.finished = threading.Event()
        self.tenant: Tenant | None = None
        self.error: str | None = None
        self.waiters = 0

    def wait(self) -> Tenant:
        self.finished.wait()
        if self.tenant is None:
            raise LayoutError(self.error)
        return self.tenant


def zero_fill(handle, partition: TenantPartition, size: int, piece: int, stop: threading.Event) -> None:
    """Write the partition with zeros in pieces of `piece` bytes, then flush the device;
    a service that closes meanwhile stops it (OSError: the tenant is not recorded)."""
    zeros = np.zeros(min(size, piece), np.uint8)
    for off in range(0, size, zeros.shape[0]):
        if stop.is_set():
            raise OSError("the service is closing")
        handle.write_from(partition.base + off, zeros[:min(zeros.shape[0], size - off)])
    handle.flush()


class TenantTable:
    """Tenant name -> Tenant. `lock` is the service's lock, which guards `layout` too;
    `fill(partition)` prepares a new partition (outside `lock`), `make(partition)` gives
    a partition its Tenant (mirror, pins: no I/O)."""

    def __init__(self, layout: Layout, lock: threading.Lock, fill: Callable[[TenantPartition], None],
                 make: Callable[[TenantPartition], Tenant]):
        self.layout, self._lock, self._fill, self._make = layout, lock, fill, make
        self.ready: dict[str, Tenant] = {}
        self.preparing: dict[str, Preparing] = {}

    def get(self, name: str) -> Tenant:
        """The tenant, made first if new (the caller must not hold the lock).
        LayoutError: no partition is free, or preparing it failed."""
        found, mine = self.claim(name)
        if isinstance(found, Tenant):
            return found
        if not mine:
            try:
                return found.wait()
            finally:
                with self._lock:
                    found.waiters -= 1
        try:
            self._fill(found.partition)
            tenant = self._make(found.partition)
        except BaseException as exc:
            self.abandon(found, exc)
            if isinstance(exc, Exception):
                raise LayoutError(found.error) from exc
            raise
        self.complete(found, tenant)
        return tenant

    def claim(self, name: str) -> tuple[Tenant | Preparing, bool]:
        """(the tenant, False), (its preparation in progress, False) or (a new
        preparation that the caller must complete or abandon, True)."""
        with self._lock:
            found = self.ready.get(name)
            if found is None and name in self.layout.tenants:  # recorded by an earlier life of the service
                found = self.ready[name] = self._make(self.layout.tenants[name])
            if found is not None:
                return found, False
            job = self.preparing.get(name)
            if job is not None:
                job.waiters += 1
                return job, False
            job = self.preparing[name] = Preparing(self.layout.reserve(name))
            return job, True

    def complete(self, job: Preparing, tenant: Tenant) -> None:
        name = job.partition.name
        with self._lock:
            self.layout.record(name)
            self.ready[name] = tenant
            del self.preparing[name]
        job.tenant = tenant
        job.finished.set()

    def abandon(self, job: Preparing, exc: BaseException) -> None:
        name = job.partition.name
        with self._lock:
            self.layout.release(name)
            del self.preparing[name]
        job.error = (f"tenant {name!r}: preparing its partition failed ({exc or type(exc).__name__}); "
                     "nothing was recorded, attach again to retry")
        job.finished.set()
