"""Get Poison List's records: the device's poisoned blocks intersecting a DPA range
(DPA == HPA offset in this single-region device; byte addresses and lengths, multiples
of 64). Every device offers `poison_records(dpa, length, max_records) -> PoisonList`
(the mailbox's view of a device, cxlhm.device.interface.MailboxTarget); `records_of`
builds that list from a set of poisoned blocks, and `poison_list` clamps whatever a
device returned to the asked range and to the payload before the handler encodes it.
"""
from __future__ import annotations

import dataclasses

from cxlhm.mailbox import payloads as P

POISON_LIST_MAX_RECORDS = 256  # reported by Identify Memory Device


@dataclasses.dataclass(frozen=True)
class PoisonRecord:
    dpa: int      # 64-byte aligned
    length: int   # bytes, a multiple of 64
    source: int = P.POISON_SOURCE_UNKNOWN


@dataclasses.dataclass(frozen=True)
class PoisonList:
    records: tuple[PoisonRecord, ...] = ()
    more_records: bool = False
    overflow_timestamp: int | None = None  # set when the device lost records
    scan_in_progress: bool = False


def records_of(poisoned_blocks, block_size: int, dpa: int, length: int, max_records: int) -> PoisonList:
    """The poisoned blocks intersecting [dpa, dpa+length), as whole-block records."""
    blocks = sorted(b for b in poisoned_blocks if b * block_size < dpa + length and (b + 1) * block_size > dpa)
    return PoisonList(records=tuple(PoisonRecord(b * block_size, block_size) for b in blocks[:max_records]),
                      more_records=len(blocks) > max_records)


def poison_list(device, dpa: int, length: int, max_records: int) -> PoisonList:
    found = device.poison_records(dpa, length, max_records)
    kept = tuple(r for r in found.records if r.length > 0 and r.dpa < dpa + length and r.dpa + r.length > dpa)
    more = found.more_records or len(kept) > max_records
    return dataclasses.replace(found, records=kept[:max_records], more_records=more)
