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

from cxlhm.mailbox.hints import HintKind, deliver_each
from cxlhm.mailbox.poison import PoisonList, PoisonRecord, poison_list

SESSION_BITS = 40
SESSION_MASK = (1 << SESSION_BITS) - 1


def device_session(tenant_id: int, session: int) -> int:
    return (tenant_id + 1) << SESSION_BITS | session


class HostPort:
    def __init__(self, device, partitions: list, partition_bytes: int):
        self._device = device                    # the pooled cxlhm Device
        self.partitions = list(partitions)       # TenantPartition, in grant order
        self.partition_bytes = partition_bytes
        self.block_size = device.block_size
        self.capacity = len(self.partitions) * partition_bytes
        self.cfg = device.cfg
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
            ok &= self._deliver(kind, device_session(part.id, session) if session else 0, dev_block, take, arg,
                                lock_timeout)
            block += take
            left -= take
        return ok

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
