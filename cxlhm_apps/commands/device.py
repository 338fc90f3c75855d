"""`cxlhm device serve`: run one emulated device as a pool service that several host
processes attach to (host_runtime.pool_client.PoolHost)."""
from __future__ import annotations

import argparse
import os
import secrets
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

  cxlhm device serve --socket /tmp/pool.sock --state /var/lib/cxlhm-pool \\
        --partition-bytes 1GiB --grant host-a=tenant1 --grant host-b=tenant1,tenant2

The state folder keeps the SSD image (unless --set backend.path= says otherwise), the
pool layout and the authentication key hosts read (<state>/authkey). SIGTERM or Ctrl-C
flushes and closes the device; a service killed outright loses only what was written
since the last flush.
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
    add_device_arguments(serve)


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
    """The state folder's authkey, made on first use (readable by this user only)."""
    path = state / "authkey"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    return path.read_bytes()


def run(args: argparse.Namespace) -> int:
    from cxlhm.pool import PoolService
    from cxlhm.pool.layout import LayoutError
    from host_runtime.driver import open_device
    state = Path(args.state)
    try:
        grants = _grants(args.grant)
        mirror = parse_size(args.mirror_bytes)
        partition = parse_size(args.partition_bytes) if args.partition_bytes else None
    except ValueError as exc:
        return _fail(str(exc))
    try:
        state.mkdir(parents=True, exist_ok=True)
        key = authkey(state)
    except OSError as exc:
        return _fail(f"--state {args.state}: {exc.strerror or exc}")
    cfg = config_from_args(args)
    if cfg.backend.path is None:  # persist in the state folder unless told otherwise
        args.overrides.append(f"backend.path={state / 'device.img'}")
        cfg = config_from_args(args)
    try:
        handle = open_device(cfg)
    except OSError as exc:
        return _fail(f"cannot open the device: {exc}")
    try:
        service = PoolService(handle, args.socket, state_dir=state, partition_bytes=partition, mirror_bytes=mirror,
                              grants=grants, authkey=key).start()
    except (LayoutError, OSError) as exc:
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
