"""The seam between Get Poison List and the device's record of poisoned media.

Until the reliability work lands the device tracks no poison, so the list is empty.
To fill it, give `Device` a method

    poison_records(dpa: int, length: int, max_records: int) -> PoisonList

returning the records that intersect [dpa, dpa + length) (DPA == HPA offset in
this single-region device; byte addresses and lengths, multiples of 64). This
module picks it up, clamps whatever it returns to the asked range and to the
payload, and the command handler encodes it. Nothing else changes.
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


def poison_list(device, dpa: int, length: int, max_records: int) -> PoisonList:
    source = getattr(device, "poison_records", None)
    if source is None:
        return PoisonList()
    found = source(dpa, length, max_records)
    kept = tuple(r for r in found.records if r.length > 0 and r.dpa < dpa + length and r.dpa + r.length > dpa)
    more = found.more_records or len(kept) > max_records
    return dataclasses.replace(found, records=kept[:max_records], more_records=more)
