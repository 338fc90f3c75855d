"""Every mailbox payload format, in one place: host and device both import it.

All fields are little-endian, packed, at the byte offsets the struct formats imply
(docs/mailbox.md tabulates them). Standard formats follow CXL r3.1 §8.2.9; vendor
hint payloads are cxlhm's own:

  hint batch = header (8 bytes) + `count` entries of the opcode's entry format
    header:  +0 u8 version (= HINT_FORMAT_VERSION)   +1 u8 flags (0)
             +2 u16 reserved (0)                      +4 u32 count
  entries (HPA byte ranges; sessions 1 .. 2**63-1; times in ns from arrival):
    SESSION_RESUME, APPEND  session u64, hpa u64, length u64            24 bytes
    NEXT_PREFIX             session u64, hpa u64, length u64, deadline_ns u64   32 bytes
    SESSION_PAUSE           session u64, expected_pause_ns u64          16 bytes
    SESSION_END             session u64                                  8 bytes
    PIN, UNPIN              hpa u64, length u64                         16 bytes

Output of a hint command answered in the foreground (8 bytes): +0 u32 entries
delivered, +4 u32 entries declined (the device did not follow them, e.g. a PIN that
would leave no DRAM for misses). A background batch has no output; its declined
count goes to the vendor extended status of the background command status register.

The payload length must be exactly 8 + count * entry size (else INVALID_PAYLOAD_LENGTH);
a nonzero flags/reserved field or an unknown version is INVALID_INPUT.
"""
from __future__ import annotations

import struct
import uuid

import numpy as np

from cxlhm.mailbox.opcodes import Opcode
from cxlhm.mailbox.returncodes import CommandFailed, ReturnCode

# ---------------------------------------------------------------- standard formats
IDENTIFY_OUT = struct.Struct("<HHHHQBB")            # 0x12: vendor, device, subsys vendor, subsys, serial, max msg log2, component type
SUPPORTED_LOGS_HEADER = struct.Struct("<H6x")        # 0x08: number of entries
SUPPORTED_LOG_ENTRY = struct.Struct("<16sI")         # 0x14: log UUID, log size
GET_LOG_IN = struct.Struct("<16sII")                 # 0x18: log UUID, offset, length
CEL_ENTRY = struct.Struct("<HH")                     # 0x04: opcode, command effects
IDENTIFY_MEMDEV_OUT = struct.Struct("<16sQQQQHHHHI3sHBB")  # 0x43
HEALTH_OUT = struct.Struct("<BBBBHIII")              # 0x12
POISON_IN = struct.Struct("<QQ")                     # 0x10: DPA (64-byte aligned), length in 64-byte units
POISON_OUT_HEADER = struct.Struct("<BBQH20x")        # 0x20: flags, rsvd, overflow timestamp, record count
POISON_RECORD = struct.Struct("<QI4x")               # 0x10: DPA | source [2:0], length in 64-byte units

assert IDENTIFY_OUT.size == 0x12 and IDENTIFY_MEMDEV_OUT.size == 0x43 and HEALTH_OUT.size == 0x12
assert GET_LOG_IN.size == 0x18 and POISON_OUT_HEADER.size == 0x20

COMPONENT_TYPE_TYPE3 = 0x03
CAPACITY_UNIT = 256 << 20   # Identify Memory Device reports capacities in 256 MiB units
POISON_UNIT = 64            # poison list addresses and lengths are in 64-byte units
NOT_IMPLEMENTED_U8 = 0xFF   # health: life used not implemented
NOT_IMPLEMENTED_U16 = 0xFFFF  # health: temperature not implemented

# Poison list flags and record sources
POISON_MORE_RECORDS = 1 << 0
POISON_OVERFLOW = 1 << 1
POISON_SCAN_IN_PROGRESS = 1 << 2
POISON_SOURCE_UNKNOWN, POISON_SOURCE_EXTERNAL, POISON_SOURCE_INTERNAL, POISON_SOURCE_INJECTED = 0, 1, 2, 3
POISON_SOURCE_VENDOR = 7

# Command effects (Command Effects Log entry bits)
EFFECT_CONFIG_CHANGE_COLD_RESET = 1 << 0
EFFECT_CONFIG_CHANGE_IMMEDIATE = 1 << 1
EFFECT_DATA_CHANGE_IMMEDIATE = 1 << 2
EFFECT_POLICY_CHANGE_IMMEDIATE = 1 << 3
EFFECT_LOG_CHANGE_IMMEDIATE = 1 << 4
EFFECT_SECURITY_CHANGE = 1 << 5
EFFECT_BACKGROUND_OPERATION = 1 << 6
EFFECT_NAMES = {
    EFFECT_CONFIG_CHANGE_COLD_RESET: "config_change_cold_reset",
    EFFECT_CONFIG_CHANGE_IMMEDIATE: "config_change_immediate",
    EFFECT_DATA_CHANGE_IMMEDIATE: "data_change_immediate",
    EFFECT_POLICY_CHANGE_IMMEDIATE: "policy_change_immediate",
    EFFECT_LOG_CHANGE_IMMEDIATE: "log_change_immediate",
    EFFECT_SECURITY_CHANGE: "security_change",
    EFFECT_BACKGROUND_OPERATION: "background_operation",
}

CEL_UUID = uuid.UUID("0da9c0b5-bf41-4b78-8f79-96b1623b3f17")  # Command Effects Log (spec)
LOG_NAMES = {"cel": CEL_UUID}

# ---------------------------------------------------------------- vendor formats
IDENTIFY_HYBRID_OUT = struct.Struct("<HHIQQQ32s32s")  # 0x60
IDENTIFY_HYBRID_VERSION = 1

HINT_FORMAT_VERSION = 1
HINT_HEADER = struct.Struct("<BBHI")  # version, flags, reserved, count
HINT_RESULT = struct.Struct("<II")    # entries delivered, entries declined

_U8 = "<u8"
SESSION_RANGE_ENTRY = np.dtype([("session", _U8), ("hpa", _U8), ("length", _U8)])
PREFIX_ENTRY = np.dtype([("session", _U8), ("hpa", _U8), ("length", _U8), ("deadline_ns", _U8)])
PAUSE_ENTRY = np.dtype([("session", _U8), ("expected_pause_ns", _U8)])
SESSION_ENTRY = np.dtype([("session", _U8)])
RANGE_ENTRY = np.dtype([("hpa", _U8), ("length", _U8)])

HINT_ENTRY_FORMATS: dict[Opcode, np.dtype] = {
    Opcode.HINT_SESSION_RESUME: SESSION_RANGE_ENTRY,
    Opcode.HINT_NEXT_PREFIX: PREFIX_ENTRY,
    Opcode.HINT_APPEND: SESSION_RANGE_ENTRY,
    Opcode.HINT_SESSION_PAUSE: PAUSE_ENTRY,
    Opcode.HINT_SESSION_END: SESSION_ENTRY,
    Opcode.HINT_PIN: RANGE_ENTRY,
    Opcode.HINT_UNPIN: RANGE_ENTRY,
}


def max_hint_entries(opcode: int, payload_size: int) -> int:
    """How many entries of `opcode`'s format one command can carry."""
    return (payload_size - HINT_HEADER.size) // HINT_ENTRY_FORMATS[Opcode(opcode)].itemsize


def encode_hint_batch(entries: np.ndarray) -> bytes:
    """Header + entries; `entries` must already have the opcode's entry dtype."""
    return HINT_HEADER.pack(HINT_FORMAT_VERSION, 0, 0, entries.shape[0]) + np.ascontiguousarray(entries).tobytes()


def decode_hint_batch(opcode: int, payload: bytes) -> np.ndarray:
    """The entries of a hint batch, checked against the header; raises CommandFailed."""
    fmt = HINT_ENTRY_FORMATS[Opcode(opcode)]
    if len(payload) < HINT_HEADER.size or (len(payload) - HINT_HEADER.size) % fmt.itemsize:
        raise CommandFailed(ReturnCode.INVALID_PAYLOAD_LENGTH,
                            f"{len(payload)} bytes is not an 8-byte header plus whole {fmt.itemsize}-byte entries")
    version, flags, reserved, count = HINT_HEADER.unpack_from(payload)
    if count != (len(payload) - HINT_HEADER.size) // fmt.itemsize:
        raise CommandFailed(ReturnCode.INVALID_PAYLOAD_LENGTH,
                            f"header says {count} entries, the payload length holds {(len(payload) - HINT_HEADER.size) // fmt.itemsize}")
    if version != HINT_FORMAT_VERSION:
        raise CommandFailed(ReturnCode.INVALID_INPUT, f"hint format version {version}, this device speaks {HINT_FORMAT_VERSION}")
    if flags or reserved:
        raise CommandFailed(ReturnCode.INVALID_INPUT, "reserved header fields must be zero")
    return np.frombuffer(payload, fmt, count=count, offset=HINT_HEADER.size)


# ---------------------------------------------------------------- decoders (host side)
def decode_hint_result(out: bytes) -> tuple[int, int]:
    """(delivered, declined); (0, 0) for an empty output (a background batch)."""
    return HINT_RESULT.unpack_from(out) if len(out) >= HINT_RESULT.size else (0, 0)


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def decode_identify(out: bytes) -> dict:
    vid, did, svid, ssid, serial, max_msg, ctype = IDENTIFY_OUT.unpack_from(out)
    return {"vendor_id": vid, "device_id": did, "subsystem_vendor_id": svid, "subsystem_id": ssid,
            "serial": serial, "max_message_size": 1 << max_msg, "component_type": ctype}


def decode_identify_memory_device(out: bytes) -> dict:
    (fw, total, volatile, persistent, align, info_log, warn_log, fail_log, fatal_log, lsa,
     poison_max, inject_limit, poison_caps, qos_caps) = IDENTIFY_MEMDEV_OUT.unpack_from(out)
    return {"fw_revision": _text(fw), "total_capacity": total * CAPACITY_UNIT,
            "volatile_only_capacity": volatile * CAPACITY_UNIT, "persistent_only_capacity": persistent * CAPACITY_UNIT,
            "partition_align": align * CAPACITY_UNIT,
            "event_log_sizes": {"info": info_log, "warning": warn_log, "failure": fail_log, "fatal": fatal_log},
            "lsa_size": lsa, "poison_list_max_records": int.from_bytes(poison_max, "little"),
            "inject_poison_limit": inject_limit, "poison_caps": poison_caps, "qos_telemetry_caps": qos_caps}


def decode_identify_hybrid(out: bytes) -> dict:
    version, hint_version, _, capacity, block_size, dram, policy, name = IDENTIFY_HYBRID_OUT.unpack_from(out)
    return {"version": version, "hint_format_version": hint_version, "capacity": capacity,
            "block_size": block_size, "dram_bytes": dram, "policy": _text(policy), "name": _text(name)}


def decode_health(out: bytes) -> dict:
    health, media, extra, life, temp, dirty, vol_err, pmem_err = HEALTH_OUT.unpack_from(out)
    return {"maintenance_needed": bool(health & 1), "performance_degraded": bool(health & 2),
            "hw_replacement_needed": bool(health & 4), "media_status": media,
            "life_used_percent": None if life == NOT_IMPLEMENTED_U8 else life,
            "temperature": None if temp == NOT_IMPLEMENTED_U16 else struct.unpack("<h", struct.pack("<H", temp))[0],
            "additional_status": extra, "dirty_shutdowns": dirty,
            "volatile_errors": vol_err, "pmem_errors": pmem_err}


def decode_supported_logs(out: bytes) -> list[dict]:
    (n,) = SUPPORTED_LOGS_HEADER.unpack_from(out)
    n = min(n, (len(out) - SUPPORTED_LOGS_HEADER.size) // SUPPORTED_LOG_ENTRY.size)
    logs = []
    for i in range(n):
        raw, size = SUPPORTED_LOG_ENTRY.unpack_from(out, SUPPORTED_LOGS_HEADER.size + i * SUPPORTED_LOG_ENTRY.size)
        log_id = uuid.UUID(bytes=raw)
        name = next((k for k, v in LOG_NAMES.items() if v == log_id), None)
        logs.append({"uuid": str(log_id), "name": name, "size": size})
    return logs


def decode_cel(data: bytes) -> list[dict]:
    entries = []
    for i in range(len(data) // CEL_ENTRY.size):
        opcode, effects = CEL_ENTRY.unpack_from(data, i * CEL_ENTRY.size)
        entries.append({"opcode": opcode, "name": Opcode.name_of(opcode), "effects": effects,
                        "effect_names": [n for bit, n in EFFECT_NAMES.items() if effects & bit]})
    return entries


def decode_poison_list(out: bytes) -> dict:
    flags, _, overflow_ts, count = POISON_OUT_HEADER.unpack_from(out)
    count = min(count, (len(out) - POISON_OUT_HEADER.size) // POISON_RECORD.size)
    records = []
    for i in range(count):
        address, length = POISON_RECORD.unpack_from(out, POISON_OUT_HEADER.size + i * POISON_RECORD.size)
        records.append({"dpa": address & ~0x3F, "length": length * POISON_UNIT, "source": address & 0x7})
    return {"more_records": bool(flags & POISON_MORE_RECORDS), "overflow": bool(flags & POISON_OVERFLOW),
            "scan_in_progress": bool(flags & POISON_SCAN_IN_PROGRESS),
            "overflow_timestamp": overflow_ts if flags & POISON_OVERFLOW else None, "records": records}
