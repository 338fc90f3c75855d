"""`cxlhm device serve`: run one emulated device as a pool service that several host
processes attach to (host_runtime.pool_client.PoolHost)."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from cxlhm_apps.commands._device_args import add_device_arguments, config_from_args
from cxlhm.units import parse_size

NAME = "device"
HELP = "serve one device to several host processes (a CXL memory pool)"
DESCRIPTION = """\
Run one emulated CXL-HM device as a service that several host processes attach to at
once, each with its own mailbox register block and its own window of the HDM range.

  cxlhm device grant --state /var/lib/cxlhm-pool host-a=tenant1 host-b=tenant1,tenant2
  cxlhm device serve --socket /tmp/pool.sock --state /var/lib/cxlhm-pool --partition-bytes 1GiB

Each granted host has a key of its own, <state>/hosts/<host>.key (made by `grant` or by
`serve --grant`); give each host only its own file. A host proves its name with it, and
gets only that name's tenants. Without any grant the pool is open to every host that
holds <state>/authkey. The state folder (owned by this user, not writable by others,
one service at a time) keeps the SSD image (unless --set backend.path= says otherwise),
the pool layout, the grants and the keys. SIGTERM or Ctrl-C flushes and closes the
device; a service killed outright loses only what was written since the last flush.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="serve the device on a Unix socket")
    serve.add_argument("--socket", required=True, metavar="PATH", help="Unix socket hosts connect to")
    serve.add_argument("--state", required=True, metavar="DIR", help="folder for the image, layout and authkey")
    serve.add_argument("--partition-bytes", default=None, metavar="SIZE",
                       help="bytes of the HDM range per tenant (default: capacity / 16)")
    serve.add_argument("--mirror-bytes", default="16MiB", metavar="SIZE",
                       help="per tenant: blocks hosts may load without a round trip (default 16MiB)")
    serve.add_argument("--grant", action="append", default=[], metavar="HOST=TENANT[,TENANT...]",
                       help="allow HOST to attach these tenants (repeatable; without any --grant every "
                            "authenticated host may attach any tenant)")
    serve.add_argument("--max-hosts", type=int, default=32, metavar="N", help="hosts attached at once (default 32)")
    serve.add_argument("--max-per-host", type=int, default=None, metavar="N",
                       help="attachments one host name may hold at once (default: a quarter of --max-hosts)")
    serve.add_argument("--max-host-names", type=int, default=0xFFFF, metavar="N",
                       help="host names the pool records in all; an attach under a new name past it is "
                            "refused (default and most 65535: a host's id is 16 bits in content locations)")
    serve.add_argument("--socket-mode", default="600", choices=["600", "660"],
                       help="who may connect: this user's processes (600, default) or its group's too (660); "
                            "each host still proves its own key")
    add_device_arguments(serve)
    grant = sub.add_parser("grant", help="give hosts keys of their own and grant them tenants")
    grant.add_argument("--state", required=True, metavar="DIR", help="the service's state folder")
    grant.add_argument("grants", nargs="+", metavar="HOST=TENANT[,TENANT...]")


def _fail(message: str) -> int:
    print(f"cxlhm device: error: {message}", file=sys.stderr)
    return 2


def _grants(items: list[str]) -> dict[str, list[str]] | None:
    if not items:
        return None
    out: dict[str, list[str]] = {}
    for item in items:
        host, sep, tenants = item.partition("=")
        names = [t for t in tenants.split(",") if t]
        if not sep or not host or not names:
            raise ValueError(f"--grant {item!r}: expected HOST=TENANT[,TENANT...]")
        out.setdefault(host, []).extend(names)
    return out


def authkey(state: Path) -> bytes:
    """The state folder's pool-wide key (an open pool's), made on first use, written
    whole or not at all; an empty or short one is refused, never used."""
    from cxlhm.pool.identity import key_file
    return key_file(state / "authkey")


def _grant(args: argparse.Namespace) -> int:
    from cxlhm.pool import statefiles
    from cxlhm.pool.identity import Identities, IdentityError
    state = Path(args.state)
    try:
        grants = _grants(args.grants)
        statefiles.make_folder(state)
        ids = Identities(state)
        for host, tenants in grants.items():
            ids.grant(host, tenants)
            print(f"cxlhm device: {host} may attach {', '.join(ids.grants[host])}; "
                  f"its key: {state / 'hosts' / (host + '.key')}")
    except (ValueError, OSError) as exc:
        return _fail(str(exc) if not isinstance(exc, OSError) or not exc.strerror or exc.filename is None
                     else f"{exc.filename}: {exc.strerror}")
    print("cxlhm device: a running service reads grants when it starts: restart it to apply them")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "grant":
        return _grant(args)
    from cxlhm.pool import PoolService, statefiles
    from cxlhm.pool.identity import IdentityError
    from cxlhm.pool.layout import LayoutError
    from host_runtime.driver import open_device
    state = Path(args.state)
    try:
        grants = _grants(args.grant)
        mirror = parse_size(args.mirror_bytes)
        partition = parse_size(args.partition_bytes) if args.partition_bytes else None
    except ValueError as exc:
        return _fail(str(exc))
    if args.max_hosts < 1:
        return _fail(f"--max-hosts must be at least 1, got {args.max_hosts}")
    if args.max_per_host is not None and not 1 <= args.max_per_host <= args.max_hosts:
        return _fail(f"--max-per-host must be 1..--max-hosts ({args.max_hosts}), got {args.max_per_host}")
    if not 1 <= args.max_host_names <= 0xFFFF:
        return _fail(f"--max-host-names must be 1..65535, got {args.max_host_names}")
    try:
        statefiles.make_folder(state)
        key = authkey(state)
    except IdentityError as exc:
        return _fail(f"--state {args.state}: {exc}")
    except OSError as exc:
        return _fail(f"--state {args.state}: {exc.strerror or exc}" if not isinstance(exc, statefiles.StateError)
                     else str(exc))
    cfg = config_from_args(args)
    if cfg.backend.path is None:  # persist in the state folder unless told otherwise
        args.overrides.append(f"backend.path={state / 'device.img'}")
        cfg = config_from_args(args)
    try:
        from cxlhm.pool.statefiles import claim_socket
        claim_socket(args.socket)  # before the device opens: a refused path costs nothing
        holder = statefiles.hold_folder(state)  # before the device: a second service is refused, not left to race
        os.close(holder)
    except OSError as exc:
        return _fail(str(exc))
    try:
        handle = open_device(cfg)
    except OSError as exc:
        return _fail(f"cannot open the device: {exc}")
    try:
        service = PoolService(handle, args.socket, state_dir=state, partition_bytes=partition, mirror_bytes=mirror,
                              grants=grants, authkey=key, max_hosts=args.max_hosts,
                              max_sessions_per_host=args.max_per_host, max_host_names=args.max_host_names,
                              socket_mode=int(args.socket_mode, 8)).start()
    except (LayoutError, IdentityError, OSError) as exc:
        handle.close()
        return _fail(str(exc))
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(f"cxlhm device: serving {cfg.name} on {args.socket} (state {state}, "
          f"partition {service.layout.partition_bytes} bytes, {service.layout.max_tenants} tenants max)", flush=True)
    try:
        while not done.wait(0.5):
            pass
    finally:
        service.close()
    return 0
