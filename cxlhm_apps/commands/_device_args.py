"""Device-selection options shared by every subcommand that opens a device."""
from __future__ import annotations

import argparse

import yaml

from cxlhm.config import ConfigError, DeviceConfig, available_profiles, load_config, safe_load_yaml


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


def parse_set_value(option: str, item: str):
    """The YAML value of one KEY=VALUE option, or a ConfigError naming the option."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise ConfigError(option, item, "expected KEY=VALUE, e.g. dram_bytes=64MiB")
    try:
        return key.strip(), (safe_load_yaml(text) if text else None)
    except RecursionError:
        raise ConfigError(option, key.strip(), "value nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ConfigError(option, key.strip(), f"not a valid YAML value: {getattr(exc, 'problem', None) or exc}") from None


def config_overrides(args: argparse.Namespace) -> dict:
    """The --set options (and --policy) as one nested dict of overrides."""
    overrides: dict = {}
    for item in args.overrides:
        key, value = parse_set_value("--set", item)
        _merge(overrides, _nest(key, value))
    if getattr(args, "policy", None):
        _merge(overrides, {"firmware": {"policy": args.policy}})
    return overrides


def load_device_config(args: argparse.Namespace, overrides: dict | None) -> DeviceConfig:
    return load_config(args.device, overrides or None)


def config_from_args(args: argparse.Namespace) -> DeviceConfig:
    return load_device_config(args, config_overrides(args))
