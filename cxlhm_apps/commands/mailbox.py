"""`cxlhm mailbox identify|health|log|poison`: query a device's mailbox, JSON out (like cxl-cli)."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys

import math

from cxlhm_apps.cliutil import CommandError, positive_int
from cxlhm_apps.commands._device_args import add_device_arguments, config_from_args

NAME = "mailbox"
HELP = "send mailbox commands (identify, health, log, poison) and print JSON"
DESCRIPTION = """\
Send standard CXL mailbox commands to a device and print the answers as JSON,
the way cxl-cli does for real memory devices.

  cxlhm mailbox identify                      Identify + Identify Memory Device + geometry
  cxlhm mailbox health                        Get Health Info
  cxlhm mailbox log [cel|UUID]                Get Supported Logs, then the log (default: the CEL)
  cxlhm mailbox poison [--dpa N --length N]   Get Poison List

By default a device is opened from --device/--set for the one query. To query a
device that another process is running, pass its register file with --regs.
"""

# Get Health Info media status values (CXL r3.1 Table 8-133)
MEDIA_STATUS = {0: "normal", 1: "not_ready", 2: "write_persistency_lost", 3: "all_data_lost",
                4: "write_persistency_loss_power_loss", 5: "write_persistency_loss_shutdown",
                6: "write_persistency_loss_imminent", 7: "all_data_loss_power_loss",
                8: "all_data_loss_shutdown", 9: "all_data_loss_imminent"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("identify", "health", "log", "poison"), help="what to ask the device")
    parser.add_argument("log_id", nargs="?", default="cel", help="for `log`: cel (default) or a log UUID")
    parser.add_argument("--regs", metavar="PATH", default=None,
                        help="register file of a running device (default: open one from --device/--set)")
    parser.add_argument("--dpa", type=_non_negative_int, default=0,
                        help="for `poison`: first device physical address")
    parser.add_argument("--length", type=positive_int, default=None,
                        help="for `poison`: bytes to cover (default: to the end)")
    parser.add_argument("--timeout", type=_seconds, default=2.0, help="seconds to wait for each command (0-3600)")
    add_device_arguments(parser)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value <= 3600):
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 3600], got {text!r}")
    return value


def _check_poison_range(args: argparse.Namespace, capacity: int) -> None:
    if args.dpa >= capacity:
        raise CommandError(f"--dpa {args.dpa:#x} is past the device's capacity ({capacity:#x} bytes)")
    if args.length is not None and args.dpa + args.length > capacity:
        raise CommandError(f"--dpa {args.dpa:#x} --length {args.length:#x} runs past the device's capacity "
                           f"({capacity:#x} bytes)")


@contextlib.contextmanager
def _client(args: argparse.Namespace):
    from host_runtime.mailbox import MailboxClient
    if args.regs:
        with MailboxClient(args.regs, timeout=args.timeout) as client:
            yield client
        return
    from host_runtime.driver import open_device
    cfg = config_from_args(args)
    if args.action == "poison":
        _check_poison_range(args, cfg.capacity)  # before opening anything
    with open_device(cfg) as handle:  # its close() closes the mailbox client and the mailbox
        client = handle.mailbox
        client.timeout = args.timeout
        yield client


def _identify(client) -> dict:
    ident, memdev, hybrid = client.identify(), client.identify_memory_device(), client.identify_hybrid()
    return {
        "memdev": hybrid["name"], "regs": client.regs.path, "serial": f"{ident['serial']:#018x}",
        "vendor_id": f"{ident['vendor_id']:#06x}", "device_id": f"{ident['device_id']:#06x}",
        "component_type": "type3" if ident["component_type"] == 3 else ident["component_type"],
        "fw_revision": memdev["fw_revision"], "total_capacity": memdev["total_capacity"],
        "ram_size": memdev["volatile_only_capacity"], "pmem_size": memdev["persistent_only_capacity"],
        "payload_max": ident["max_message_size"], "label_storage_size": memdev["lsa_size"],
        "poison_list_max_records": memdev["poison_list_max_records"],
        "hybrid": {k: hybrid[k] for k in ("capacity", "block_size", "dram_bytes", "policy", "hint_format_version")},
    }


def _health(client) -> dict:
    h = client.health()
    media = MEDIA_STATUS.get(h["media_status"], f"reserved_{h['media_status']}")
    return {"memdev": client.identify_hybrid()["name"], "health": {
        "maintenance_needed": h["maintenance_needed"], "performance_degraded": h["performance_degraded"],
        "hw_replacement_needed": h["hw_replacement_needed"], "media_status": media,
        "media_normal": media == "normal", "media_not_ready": media == "not_ready",
        "temperature": h["temperature"], "life_used_percent": h["life_used_percent"],
        "dirty_shutdowns": h["dirty_shutdowns"], "volatile_errors": h["volatile_errors"],
        "pmem_errors": h["pmem_errors"]}}


def _log(client, log_id: str) -> dict:
    logs = client.supported_logs()
    content = client.log(log_id)
    if isinstance(content, bytes):
        content = content.hex()
    else:
        content = [{"opcode": f"{e['opcode']:#06x}", "name": e["name"], "effects": e["effect_names"]} for e in content]
    return {"supported_logs": logs, "log": log_id, "entries": content}


def run(args: argparse.Namespace) -> int:
    from host_runtime.mailbox import MailboxError
    try:
        with _client(args) as client:
            if args.action == "identify":
                out = _identify(client)
            elif args.action == "health":
                out = _health(client)
            elif args.action == "log":
                out = _log(client, args.log_id)
            else:
                found = client.poison(args.dpa, args.length)
                out = {"poison": {"nr_records": len(found["records"]), **found}}
    except (MailboxError, OSError) as exc:
        print(f"cxlhm mailbox: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0
