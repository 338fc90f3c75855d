"""One host's view of the pooled device, as its own mailbox sees it.

Each host gets a register block of its own (a Mailbox over a HostPort). The port shows
the host only the partitions of the tenants it was granted, laid end to end in grant
order (that is the host's HDM window: host address k * partition_bytes + x is byte x
of its k-th tenant), and turns every hint into the device's terms before the firmware
sees it: ranges move to the partition's device blocks, and session ids are qualified
by tenant, so the firmware sees all hosts' hints without two tenants' sessions ever
colliding, and a session resumed on another host of the same tenant is the same
session to the firmware. Geometry answers (Identify) describe the host's window.
"""
from __future__ import annotations

import threading

from cxlhm.mailbox.hints import HintKind, deliver_each
from cxlhm.mailbox.poison import PoisonList, PoisonRecord, poison_list

SESSION_BITS = 40
SESSION_MASK = (1 << SESSION_BITS) - 1


def device_session(tenant_id: int, session: int) -> int:
    return (tenant_id + 1) << SESSION_BITS | session


class PinBudget:
    """The device blocks one tenant holds pinned (PIN until UNPIN), shared by every
    host of the tenant: a PIN that would take the tenant past `limit` blocks is declined
    (advisory, like any hint), so no tenant can pin the device's DRAM away from the others."""

    def __init__(self, limit: int):
        self.limit = limit
        self.blocks: set[int] = set()
        self._lock = threading.Lock()

    @property
    def pinned(self) -> int:
        return len(self.blocks)

    def take(self, first_block: int, n_blocks: int) -> list[int] | None:
        """Reserve the range's blocks not pinned yet (None: over the budget)."""
        with self._lock:
            new = [b for b in range(first_block, first_block + n_blocks) if b not in self.blocks] \
                if n_blocks <= self.limit else None
            if new is None or len(self.blocks) + len(new) > self.limit:
                return None
            self.blocks.update(new)
            return new

    def give_back(self, blocks) -> None:
        with self._lock:
            self.blocks.difference_update(blocks)


class HostPort:
    def __init__(self, device, partitions: list, partition_bytes: int, pins: dict | None = None):
        self._device = device                    # the pooled cxlhm Device
        self.partitions = list(partitions)       # TenantPartition, in grant order
        self.partition_bytes = partition_bytes
        self.block_size = device.block_size
        self.capacity = len(self.partitions) * partition_bytes
        self.cfg = device.cfg
        self.pins = pins or {}  # tenant id -> PinBudget
        self.hints_delivered = 0
        self.hints_declined = 0

    # what the mailbox's firmware thread asks of a device (cxlhm.device.MailboxTarget)
    @property
    def closed(self) -> bool:
        return self._device.closed

    @property
    def unclean_shutdown_detected(self) -> bool:
        return self._device.unclean_shutdown_detected

    def warm_up(self) -> None:
        self._device.warm_up()

    def hint_batch(self, kind: int, sessions, first_blocks, n_blocks, args, *, lock_timeout: float = -1) -> int:
        """Each hint through hint(), which moves it into the device's terms; DeviceBusy
        (from the device, after `lock_timeout` s) says how many went through before."""
        return deliver_each(self.hint, kind, sessions, first_blocks, n_blocks, args, lock_timeout=lock_timeout)

    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0, *,
             lock_timeout: float = -1) -> bool:
        if session > SESSION_MASK:
            self.hints_declined += 1
            return False  # advisory: a session id the port cannot qualify is dropped, not an error
        per = self.partition_bytes // self.block_size
        ok = True
        if n_blocks == 0:  # range-less (pause, end): the session in every tenant of this host
            for part in self.partitions:
                ok &= self._deliver(kind, device_session(part.id, session) if session else 0, 0, 0, arg, lock_timeout)
            return ok
        block, left = first_block, n_blocks
        while left > 0:  # a range across two of the host's partitions is two device ranges
            k, within = divmod(block, per)
            take = min(left, per - within)
            part = self.partitions[k]
            dev_block = part.base // self.block_size + within
            ok &= self._deliver_budgeted(kind, part.id, device_session(part.id, session) if session else 0,
                                         dev_block, take, arg, lock_timeout)
            block += take
            left -= take
        return ok

    def _deliver_budgeted(self, kind, tenant_id, session, first_block, n_blocks, arg, lock_timeout) -> bool:
        budget = self.pins.get(tenant_id)
        if budget is None or int(kind) not in (HintKind.PIN, HintKind.UNPIN):
            return self._deliver(kind, session, first_block, n_blocks, arg, lock_timeout)
        if int(kind) == HintKind.UNPIN:
            followed = self._deliver(kind, session, first_block, n_blocks, arg, lock_timeout)
            budget.give_back(range(first_block, first_block + n_blocks))
            return followed
        new = budget.take(first_block, n_blocks)
        if new is None:
            self.hints_declined += 1
            return False  # past the tenant's pin budget: declined
        try:
            followed = self._deliver(kind, session, first_block, n_blocks, arg, lock_timeout)
        except BaseException:
            budget.give_back(new)
            raise
        if not followed:
            budget.give_back(new)
        return followed

    def _deliver(self, kind, session, first_block, n_blocks, arg, lock_timeout) -> bool:
        followed = self._device.hint(int(kind), session, first_block, n_blocks, arg, lock_timeout=lock_timeout) \
            is not False
        if followed:
            self.hints_delivered += 1
        else:
            self.hints_declined += 1
        return followed

    def poison_records(self, dpa: int, length: int, max_records: int) -> PoisonList:
        records = []
        for k, part in enumerate(self.partitions):  # the device's records, moved into the host's window
            lo, hi = max(dpa, k * self.partition_bytes), min(dpa + length, (k + 1) * self.partition_bytes)
            if lo >= hi:
                continue
            found = poison_list(self._device, part.base + lo - k * self.partition_bytes, hi - lo, max_records)
            records += [PoisonRecord(r.dpa - part.base + k * self.partition_bytes, r.length, r.source)
                        for r in found.records]
        return PoisonList(tuple(records[:max_records]), more_records=len(records) > max_records)


__all__ = ["HintKind", "HostPort", "device_session"]
