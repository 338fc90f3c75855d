"""`cxlhm doctor --engine lmcache CONFIG`: check an engine config before the engine starts."""
from __future__ import annotations

import importlib
import logging
import sys
import traceback
from pathlib import Path

NAME = "doctor"
HELP = "check a serving engine's config that loads the cxlhm tier, before starting the engine"
DESCRIPTION = """\
LMCache loads a remote storage plug-in inside a try block: an ImportError or a
construction error (a mistyped module path, a device setting that does not parse, an
image path that cannot be created) is logged among its own start-up messages and the
engine then runs without the tier, storing nothing. This command does what LMCache does
with CONFIG - reads it with LMCache's own config class, imports each plug-in module and
class it names (remote_storage_plugins with module_path / class_name, or a legacy
external:// remote_url), checks the class is a RemoteConnector, and builds the cxlhm
connector from the config, opening its device as the engine would (an image that does
not exist is created, as the engine would create it) - and stops at the first error,
saying what it is and where.

Exit status: 0 the config loads the cxlhm tier; 2 it does not (the first error printed).

example:
  cxlhm doctor --engine lmcache lmcache.yaml
"""

ENGINES = ("lmcache",)


class DoctorFailed(Exception):
    """The first problem found, worded for the user."""


def add_arguments(parser) -> None:
    parser.add_argument("--engine", required=True, choices=ENGINES, help="the engine whose config CONFIG is")
    parser.add_argument("config", metavar="CONFIG", help="the engine's config file (LMCache: its YAML)")
    parser.add_argument("--no-open", action="store_true",
                        help="check the plug-in and its settings but do not open the device")


def run(args) -> int:
    lines: list[str] = []
    try:
        check_lmcache(args.config, open_device=not args.no_open, report=lines.append)
    except DoctorFailed as exc:
        for line in lines:
            print(f"ok    {line}")
        print(f"FAIL  {exc}")
        # the verdict also on stderr, as every command's error, for whoever reads only that
        print(f"cxlhm doctor: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    for line in lines:
        print(f"ok    {line}")
    print(f"the config loads the cxlhm tier: {args.config}")
    return 0


def check_lmcache(config_path: str, *, open_device: bool = True, report=print) -> list:
    """Check an LMCache config the way LMCache loads it; raises DoctorFailed at the first
    problem. Returns the cxlhm connector classes the config loads."""
    path = Path(config_path)
    if path.is_dir():
        raise DoctorFailed(f"{config_path}: is a folder, not a config file")
    if not path.exists():
        raise DoctorFailed(f"{config_path}: no such file")
    if not path.is_file():
        raise DoctorFailed(f"{config_path}: not a regular file (an engine reads its config from a YAML file)")
    try:
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.storage_backend.connector import parse_remote_url
        from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
    except Exception as exc:  # noqa: BLE001 - any failure to import LMCache is the answer
        raise DoctorFailed(f"LMCache does not import here: {_describe(exc)}") from None
    report(f"LMCache {_version('lmcache')} imports")
    try:
        config = LMCacheEngineConfig.from_file(str(path))
    except Exception as exc:  # noqa: BLE001
        raise DoctorFailed(f"{config_path}: LMCache cannot read it: {_describe(exc)}") from None
    report(f"{config_path} reads as an LMCache config")

    plugins = _plugins(config, parse_remote_url)
    if not plugins:
        raise DoctorFailed(f"{config_path} loads no remote storage plug-in: give remote_storage_plugins with "
                           "extra_config remote_storage_plugin.<name>.module_path / .class_name "
                           "(docs/kvstore.md, LMCache)")
    loaded = []
    for where, module_path, class_name in plugins:
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:  # noqa: BLE001 - LMCache catches these and runs without the tier
            raise DoctorFailed(f"{where}: module {module_path!r} does not import: {_describe(exc)} "
                               "(LMCache would log this and run without the tier)") from None
        cls = getattr(module, class_name, None)
        if cls is None:
            raise DoctorFailed(f"{where}: module {module_path!r} has no {class_name!r}")
        if not (isinstance(cls, type) and issubclass(cls, RemoteConnector)):
            raise DoctorFailed(f"{where}: {module_path}.{class_name} is not an LMCache RemoteConnector "
                               "(LMCache would skip it)")
        report(f"{where}: {module_path}.{class_name} imports and is a RemoteConnector")
        loaded.append(cls)
        from host_runtime.shim.lmcache import CxlhmRemoteConnector
        if issubclass(cls, CxlhmRemoteConnector):
            _check_cxlhm(cls, config, where, open_device, report)
    return loaded


def _plugins(config, parse_remote_url) -> list[tuple[str, str, str]]:
    """(where, module path, class name) of each plug-in LMCache would load from `config`."""
    extra = dict(getattr(config, "extra_config", None) or {})
    found = []
    for name in getattr(config, "remote_storage_plugins", None) or []:
        module_path = extra.get(f"remote_storage_plugin.{name}.module_path")
        class_name = extra.get(f"remote_storage_plugin.{name}.class_name")
        where = f"remote_storage_plugins[{name!r}]"
        if not module_path or not class_name:
            raise DoctorFailed(f"{where}: extra_config lacks remote_storage_plugin.{name}.module_path or "
                               ".class_name (LMCache would skip the plug-in with a warning)")
        found.append((where, module_path, class_name))
    url = getattr(config, "remote_url", None)
    if url and str(url).startswith("external://"):
        parsed = parse_remote_url(url)
        class_name = parsed.query_params.get("connector_name", [""])[0]
        if not class_name:
            raise DoctorFailed(f"remote_url {url!r}: an external:// URL needs ?connector_name=<class>")
        found.append((f"remote_url {url!r}", parsed.path.strip("/"), class_name))
    return found


def _check_cxlhm(cls, config, where: str, open_device: bool, report) -> None:
    from host_runtime.shim.lmcache import plugin_settings
    try:
        settings = plugin_settings(config)
    except ValueError as exc:
        raise DoctorFailed(f"{where}: {exc}") from None
    report(f"{where}: cxlhm settings {sorted(settings)}")
    if not open_device:
        return
    try:
        with _quiet("cxlhm.shim.lmcache"):  # the failure is printed here, once
            connector = cls(loop=None, local_cpu_backend=None, config=config)
    except Exception as exc:  # noqa: BLE001 - exactly what LMCache would swallow
        raise DoctorFailed(f"{where}: building the connector fails: {_describe(exc)} "
                           "(LMCache would log this and run without the tier)") from None
    try:
        shim = connector.shim
        stats = shim.stats()
        report(f"{where}: device opened: {stats['store_free_bytes'] + stats['store_used_bytes']} bytes, tenant "
               f"{stats['tenant']!r} holding {stats['entries']} chunks; pins last {connector.pin_lease_s:g} s, "
               f"at most {shim.tenant.max_pinned_bytes} bytes pinned")
    finally:
        shim.close()


def _describe(exc: BaseException) -> str:
    """The exception and the line of the user's or plug-in's code it came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "importlib" not in f.filename and f.filename != __file__]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "(version unknown)"


class _quiet:
    """Hold a logger's records back while a step runs (its failure is reported instead)."""

    def __init__(self, name: str):
        self.logger = logging.getLogger(name)

    def __enter__(self):
        self.level, self.propagate = self.logger.level, self.logger.propagate
        self.logger.setLevel(logging.CRITICAL + 1)
        return self

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)
        return False

