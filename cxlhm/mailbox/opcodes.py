"""Mailbox command opcodes: command set in bits [15:8], command in [7:0].

Standard opcodes are the CXL spec's (r3.1 §8.2.9); 0xC000 and up is the vendor
range, where cxlhm puts its hint commands (set 0xC0) and device-geometry query
(set 0xC1). Host and device both import this module, so the numbers live once.
"""
from __future__ import annotations

from enum import IntEnum


class Opcode(IntEnum):
    # Generic component: Information and Status (set 0x00), Logs (set 0x04)
    IDENTIFY = 0x0001
    GET_SUPPORTED_LOGS = 0x0400
    GET_LOG = 0x0401
    # Memory device: Identify (0x40), Health Info and Alerts (0x42), Media and Poison (0x43)
    IDENTIFY_MEMORY_DEVICE = 0x4000
    GET_HEALTH_INFO = 0x4200
    GET_POISON_LIST = 0x4300
    # Vendor: request-lifecycle hints (set 0xC0), each payload a batch of entries
    HINT_SESSION_RESUME = 0xC000
    HINT_NEXT_PREFIX = 0xC001
    HINT_APPEND = 0xC002
    HINT_SESSION_PAUSE = 0xC003
    HINT_SESSION_END = 0xC004
    HINT_PIN = 0xC005
    HINT_UNPIN = 0xC006
    # Vendor: hybrid-device geometry (set 0xC1)
    IDENTIFY_HYBRID = 0xC100

    @classmethod
    def name_of(cls, value: int) -> str:
        try:
            return cls(value).name
        except ValueError:
            return f"OPCODE_{value:#06x}"
