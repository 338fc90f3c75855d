"""Handlers of the standard (CXL spec) commands. One function per command:
``handler(ctx, payload) -> output bytes``; failures raise CommandFailed.
Input lengths of fixed-size commands are checked by the dispatcher from the table."""
from __future__ import annotations

import hashlib
import uuid
from importlib.metadata import PackageNotFoundError, version

from cxlhm.mailbox import payloads as P
from cxlhm.mailbox import poison
from cxlhm.mailbox.returncodes import CommandFailed, ReturnCode

# No PCI-SIG vendor ID is claimed: 0 marks an emulated device; the device ID spells "HM".
EMULATED_VENDOR_ID = 0x0000
EMULATED_DEVICE_ID = 0x484D

try:
    FW_REVISION = f"cxlhm {version('cxlhm')}"
except PackageNotFoundError:  # running from a source tree that is not installed
    FW_REVISION = "cxlhm dev"


def serial_number(device) -> int:
    """Stable across reopenings of the same image (name, geometry and backing path)."""
    cfg = device.cfg
    key = f"{cfg.name}|{device.capacity}|{device.block_size}|{cfg.backend.path or 'temporary'}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def identify(ctx, payload: bytes) -> bytes:
    """Identify (0001h): the component's PCI identity, serial and message size."""
    return P.IDENTIFY_OUT.pack(EMULATED_VENDOR_ID, EMULATED_DEVICE_ID, EMULATED_VENDOR_ID, EMULATED_DEVICE_ID,
                               serial_number(ctx.device), ctx.payload_size.bit_length() - 1, P.COMPONENT_TYPE_TYPE3)


def _cel(ctx) -> bytes:
    return b"".join(P.CEL_ENTRY.pack(op, cmd.effects) for op, cmd in sorted(ctx.commands.items()))


def get_supported_logs(ctx, payload: bytes) -> bytes:
    """Get Supported Logs (0400h): one log, the Command Effects Log."""
    return P.SUPPORTED_LOGS_HEADER.pack(1) + P.SUPPORTED_LOG_ENTRY.pack(P.CEL_UUID.bytes, len(_cel(ctx)))


def get_log(ctx, payload: bytes) -> bytes:
    """Get Log (0401h): a window [offset, offset + length) of a supported log."""
    raw_uuid, offset, length = P.GET_LOG_IN.unpack(payload)
    if uuid.UUID(bytes=raw_uuid) != P.CEL_UUID:
        raise CommandFailed(ReturnCode.INVALID_LOG, f"no log {uuid.UUID(bytes=raw_uuid)}")
    if length > ctx.payload_size:
        raise CommandFailed(ReturnCode.INVALID_INPUT, f"length {length} exceeds the {ctx.payload_size}-byte payload")
    log = _cel(ctx)
    if offset > len(log) or length > len(log) - offset:
        raise CommandFailed(ReturnCode.INVALID_INPUT, f"[{offset}, +{length}) is outside the {len(log)}-byte log")
    return log[offset:offset + length]


def identify_memory_device(ctx, payload: bytes) -> bytes:
    """Identify Memory Device (4000h). The device keeps its bytes across a clean close
    (like a Global Persistent Flush), so the whole window is reported persistent."""
    units = ctx.device.capacity // P.CAPACITY_UNIT
    return P.IDENTIFY_MEMDEV_OUT.pack(
        FW_REVISION.encode()[:16], units, 0, units, 0,
        0, 0, 0, 0,                     # event log sizes: no event logs yet
        0,                              # no label storage area
        poison.POISON_LIST_MAX_RECORDS.to_bytes(3, "little"),
        0, 0, 0)                        # no poison injection, no poison/QoS capabilities


def get_health_info(ctx, payload: bytes) -> bytes:
    """Get Health Info (4200h). What the emulator cannot know (temperature, wear)
    is reported with the spec's "not implemented" values."""
    media = 0 if ctx.media_ready else 1  # normal / not ready
    dirty = 1 if ctx.device.unclean_shutdown_detected else 0
    return P.HEALTH_OUT.pack(0, media, 0, P.NOT_IMPLEMENTED_U8, P.NOT_IMPLEMENTED_U16, dirty, 0, 0)


def get_poison_list(ctx, payload: bytes) -> bytes:
    """Get Poison List (4300h): records in [DPA, DPA + length*64). See poison.py."""
    dpa, units = P.POISON_IN.unpack(payload)
    dpa &= ~0x3F  # bits [5:0] are reserved
    if units == 0:
        raise CommandFailed(ReturnCode.INVALID_INPUT, "poison list length is 0")
    capacity = ctx.device.capacity
    if dpa >= capacity or units > (capacity - dpa) // P.POISON_UNIT:
        raise CommandFailed(ReturnCode.INVALID_PHYSICAL_ADDRESS, "poison list range is outside the device")
    fits = (ctx.payload_size - P.POISON_OUT_HEADER.size) // P.POISON_RECORD.size
    found = poison.poison_list(ctx.device, dpa, units * P.POISON_UNIT, min(fits, 0xFFFF))
    flags = ((P.POISON_MORE_RECORDS if found.more_records else 0)
             | (P.POISON_OVERFLOW if found.overflow_timestamp is not None else 0)
             | (P.POISON_SCAN_IN_PROGRESS if found.scan_in_progress else 0))
    out = [P.POISON_OUT_HEADER.pack(flags, 0, found.overflow_timestamp or 0, len(found.records))]
    out += [P.POISON_RECORD.pack((r.dpa & ~0x3F) | (r.source & 0x7), r.length // P.POISON_UNIT) for r in found.records]
    return b"".join(out)


def identify_hybrid(ctx, payload: bytes) -> bytes:
    """Vendor Identify Hybrid (C100h): exact geometry (the standard Identify Memory
    Device counts capacity in 256 MiB units) and the firmware policy in use."""
    dev = ctx.device
    return P.IDENTIFY_HYBRID_OUT.pack(
        P.IDENTIFY_HYBRID_VERSION, P.HINT_FORMAT_VERSION, 0, dev.capacity, dev.block_size, dev.cfg.dram_bytes,
        str(dev.cfg.firmware.policy).encode()[:32], str(dev.cfg.name).encode()[:32])
