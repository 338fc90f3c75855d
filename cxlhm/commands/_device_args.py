"""Device-selection options shared by every subcommand that opens a device."""
from __future__ import annotations

import argparse

import yaml

from cxlhm.config import ConfigError, DeviceConfig, available_profiles, load_config


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("device")
    group.add_argument("--device", "-d", metavar="PROFILE|FILE.yaml", default=None,
                       help=f"device profile ({', '.join(available_profiles())}) or YAML config; default cmm-h")
    group.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config key, dotted for sections (e.g. --set dram_bytes=64MiB "
                            "--set backend.path=/data/ssd.img); repeatable")
    group.add_argument("--policy", default=None, help="firmware policy (`cxlhm policies` lists them)")


def _nest(dotted: str, value) -> dict:
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _merge(a: dict, b: dict) -> dict:
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(a.get(key), dict):
            _merge(a[key], value)
        else:
            a[key] = value
    return a


def config_from_args(args: argparse.Namespace) -> DeviceConfig:
    overrides: dict = {}
    for item in args.overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", item, "expected KEY=VALUE, e.g. dram_bytes=64MiB")
        _merge(overrides, _nest(key.strip(), yaml.safe_load(text) if text else None))
    if args.policy:
        _merge(overrides, {"firmware": {"policy": args.policy}})
    return load_config(args.device, overrides or None)
