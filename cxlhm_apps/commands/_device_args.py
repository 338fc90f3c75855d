"""Device-selection options shared by every subcommand that opens a device.

Besides `--device PROFILE|FILE`, `--policy NAME` and `--set KEY=VALUE`, the flags are
generated from the declarations (cxlhm_apps/generated_flags.py):

  --<key> VALUE              each top-level key of the device config (cxlhm.config.SCHEMA),
                             spelled with dashes: --dram-bytes 64MiB, --clock model
  --<section>.<key> VALUE    each key of its backend and firmware sections, as the YAML
                             spells it: --backend.kind memory, --firmware.write_mode write-through
  --timing.<key> VALUE       each timing-model key (cxlhm.timing.params.KEYS)
  --<policy>.<param> VALUE   each parameter a registered firmware policy declares
                             (`Policy.params`), built-ins and entry points alike:
                             --s3fifo.small_ratio 0.2

A value is read as YAML (`0.2`, `true`, `{read_error_rate: 0.01}`) and checked by the
key's own parser, or by the policy; a key that takes text takes the text as it is. A
policy's flags apply when that policy is the one the device runs (`--policy`, `--set
firmware.policy=`, or the profile/YAML file; `cxlhm run`: one of `--configs`) and are
refused otherwise. The generated flags are overrides above `--set`. The timing and policy
flags import compiled code to be listed, so they are added to the parser only when the
help is printed or such a flag is given; and what the help shows of them is kept on disk
(generated_flags.cached_rows), keyed by the files that declare them, so that a help
imports no compiled code either.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

import yaml

import cxlhm.config
from cxlhm.config import SCHEMA, ConfigError, DeviceConfig, available_profiles, load_config, safe_load_yaml
from cxlhm.units import format_size
from cxlhm_apps import generated_flags as gf

DEVICE = "device"        # family of the config's own keys
POLICY = "policy"        # family of the firmware policies' parameters
TIMING = "timing"        # the config section of the timing model's keys
POLICY_ENTRY_POINTS = "cxlhm.firmware_policies"  # cxlhm.policies.ENTRY_POINT_GROUP (that module imports numba)
WHAT = "firmware policy or device config section"
# config keys that have their own flags: --policy, the policies' --<policy>.<param>, --timing.<key>
NOT_FLAGS = {"firmware.policy", "firmware.params", "timing"}


def add_device_arguments(parser: argparse.ArgumentParser, command_defaults: dict[str, str] | None = None) -> None:
    """The device options; `command_defaults` ({dotted key: text}) are the defaults the
    command itself applies over the profile, as its help shows them."""
    group = parser.add_argument_group("device")
    group.add_argument("--device", "-d", metavar="PROFILE|FILE.yaml", default=None,
                       help=f"device profile ({', '.join(available_profiles())}) or YAML config; default cmm-h")
    group.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config key, dotted for sections (e.g. --set dram_bytes=64MiB "
                            "--set backend.path=/data/ssd.img); repeatable; the generated flags below override it")
    group.add_argument("--policy", default=None, help="firmware policy (`cxlhm policies` lists them)")
    flags = config_flags()
    for key, text in (command_defaults or {}).items():
        flags = [dataclasses.replace(f, show_default=f"{text} in this command") if
                 (f"{f.name}.{f.field}" if f.name else f.field) == key else f for f in flags]
    gf.add_flags(parser, flags, what=WHAT, group_of=_group)
    gf.add_lazy_flags(parser, lambda for_help: _declared(for_help, (TIMING, POLICY)))


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """Only the policies' `--<policy>.<param>` flags (a command that runs policies without a device)."""
    gf.add_lazy_flags(parser, lambda for_help: _declared(for_help, (POLICY,)), what="firmware policy",
                      group_of=_group)


def _group(flag: gf.GeneratedFlag) -> tuple[str, str]:
    if flag.family == POLICY:
        return (f"firmware policy {flag.name} parameters",
                f"apply when {flag.name} is the policy that runs (chosen by --policy or the profile; "
                "cxlhm run: --configs; cxlhm mrc: --policies)")
    if flag.name:
        return f"device config: {flag.name} section", f"the config's {flag.name}.* keys"
    return "device config", "the config's keys (as --set KEY=VALUE)"


# ---------------------------------------------------------------- the flags
def _profile_default(dotted: str, metavar: str) -> str:
    """The default profile's value of a config key, as the help shows it."""
    try:
        cfg = _default_config()
    except (ConfigError, OSError):  # a broken install: the help still lists the flags
        return "the profile's"
    section, _, key = dotted.rpartition(".")
    value = getattr(cfg, key) if not section else \
        cfg.timing.get(key) if section == "timing" else getattr(getattr(cfg, section), key)
    if metavar == "SIZE" and isinstance(value, int):
        value = format_size(value).replace(" ", "")
    return f"{gf.show(value)} in {cfg.name}"


@functools.lru_cache(maxsize=1)
def _default_config() -> DeviceConfig:
    return load_config()


def config_flags() -> list[gf.GeneratedFlag]:
    """A flag per key of the device config's schema, but for NOT_FLAGS."""
    out = []
    for key, spec in SCHEMA.items():
        for section, field, decl in ([(key, k, d) for k, d in spec.items()] if isinstance(spec, dict)
                                     else [("", key, spec)]):
            dotted = f"{section}.{field}" if section else field
            if dotted in NOT_FLAGS or key in NOT_FLAGS:
                continue
            accepts = _accepts(decl.parse)
            out.append(gf.GeneratedFlag(
                f"--{dotted}" if section else f"--{field.replace('_', '-')}", DEVICE, section, field, None,
                decl.default, decl.help, metavar=_metavar(accepts), accepts=accepts, parse=_key_parser(decl.parse),
                show_default=_profile_default(dotted, _metavar(accepts))))
    return out


def timing_flags() -> list[gf.GeneratedFlag]:
    from cxlhm.timing.params import KEYS
    out = []
    for key, decl in KEYS.items():
        accepts = _accepts(decl.parse)
        out.append(gf.GeneratedFlag(f"--timing.{key}", DEVICE, TIMING, key, None, None, decl.help,
                                    metavar=_metavar(accepts), accepts=accepts,
                                    parse=_key_parser(decl.parse, as_written=True),
                                    show_default=_profile_default(f"timing.{key}", _metavar(accepts))))
    return out


def policy_flags() -> list[gf.GeneratedFlag]:
    """A flag per declared parameter of every firmware policy that loads (a broken entry
    point gets none; selecting it names the error)."""
    from cxlhm.policies import REGISTRY
    loaded, _ = REGISTRY.load_all()
    taken = {name for name, spec in SCHEMA.items() if isinstance(spec, dict)} | {"timing"}
    out = []
    for name, policy in sorted(loaded.items()):
        prefix = f"policy:{name}" if name in taken else name  # a policy named like a config section
        for param, decl in policy.params.items():
            accepts = {int: "an integer", float: "a number", bool: "true or false", str: "text"}.get(
                decl.type, decl.type.__name__) + (f" ({decl.check_text})" if decl.check_text else "")
            out.append(gf.GeneratedFlag(
                f"--{prefix}.{param}", POLICY, name, param, decl.type, decl.default, decl.help,
                metavar={int: "INT", float: "NUM", bool: "{true,false}", str: "TEXT"}.get(decl.type, "VALUE"),
                accepts=accepts, parse=_param_parser(name, param, decl.type)))
    return out


class _Probe:
    def __repr__(self) -> str:
        return "?"


def _accepts(parse) -> str:
    """What a config key's parser accepts, in words: its error for a value of no type."""
    try:
        parse(_Probe())
    except (ValueError, TypeError) as exc:
        text = str(exc)
    else:
        return ""
    for tail in (", got ?", "; got ?"):
        text = text.replace(tail, "")
    for head in ("must be ", "expected "):
        text = text[len(head):] if text.startswith(head) else text
    return text


def _metavar(accepts: str) -> str:
    if accepts.startswith("one of "):
        return "{" + accepts[len("one of "):].replace(", ", ",") + "}"
    for words, metavar in (("true or false", "{true,false}"), ("byte size", "SIZE"), ("integer", "INT"),
                           ("mapping", "YAML-MAP"), ("path", "PATH"), ("duration", "DURATION"),
                           ("bandwidth", "BANDWIDTH"), ("string", "TEXT")):
        if words in accepts:
            return metavar
    return "VALUE"


def _key_parser(parse, *, as_written: bool = False):
    """text -> the key's value: the text read as YAML, else as it is (a name that YAML
    reads as a number or a boolean); checked by the key's parser, and then the parsed
    value, or (`as_written`: the timing keys, which the config keeps as written, 45us)
    the value as given."""
    def convert(text: str):
        try:
            candidates = [gf.read_value(text)]
        except ValueError:
            candidates = []
        if not candidates or candidates[0] != text:
            candidates.append(text)
        for i, value in enumerate(candidates):
            try:
                parsed = parse(value)
            except ValueError:
                if i == len(candidates) - 1:
                    if i > 0:  # the error of the value as YAML reads it
                        parse(candidates[0])
                    raise
                continue
            return value if as_written else parsed
    return convert


def _param_parser(name: str, param: str, kind: type):
    def convert(text: str):
        from cxlhm.policies import get
        value = text if kind is str else gf.read_value(text)
        try:
            return get(name).resolve_params({param: value})[param]
        except ValueError as exc:  # PolicyParamError: the policy's own words
            raise ValueError(str(exc)) from None
    return convert


def _timing_parser(key: str):
    def parse(value):
        from cxlhm.timing.params import KEYS
        return KEYS[key].parse(value)
    return _key_parser(parse, as_written=True)


# ---------------------------------------------------------------- the help's cache
_KINDS = {"int": int, "float": float, "bool": bool, "str": str}
_ROW = ("flag", "family", "name", "field", "default", "help", "metavar", "accepts", "show_default")


def _declared(for_help: bool, which: tuple[str, ...]) -> list[gf.GeneratedFlag]:
    """The timing and/or policy flags: for a help in a process that has not imported
    the policies (so neither numba), what the cache keeps of them."""
    def load() -> list[gf.GeneratedFlag]:
        return (timing_flags() if TIMING in which else []) + (policy_flags() if POLICY in which else [])
    if not for_help or "cxlhm.policies" in sys.modules:  # in-process registrations count; numba is loaded
        return load()
    rows = gf.cached_rows(f"device-{'-'.join(which)}", _declarations_stamp(),
                          lambda: [{**{k: getattr(f, k) for k in _ROW}, "kind": getattr(f.kind, "__name__", None)}
                                   for f in load()])
    try:
        return [_flag_of(row) for row in rows]
    except (KeyError, TypeError):  # a cache file of another shape: the declarations themselves
        return load()


def _flag_of(row: dict) -> gf.GeneratedFlag:
    kind = _KINDS.get(row["kind"])
    parse = _param_parser(row["name"], row["field"], kind) if row["family"] == POLICY else _timing_parser(row["field"])
    return gf.GeneratedFlag(**{k: row[k] for k in _ROW}, kind=kind, parse=parse)


def _declarations_stamp() -> str:
    """A hash of what the timing and policy flags come from: the built-in policies' and
    the timing model's files, the profiles, and the installed policy entry points."""
    core = Path(cxlhm.config.__file__).resolve().parent
    files = [core / "policies.py", core / "config.py", core / "timing" / "params.py", *core.glob("profiles/*.yaml")]
    spec = importlib.util.find_spec("firmware_policies")  # finds the package without importing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        files += Path(folder).glob("*.py")
    stats = []
    for path in sorted(files):
        try:
            st = path.stat()
        except OSError:
            continue
        stats.append((str(path), st.st_mtime_ns, st.st_size))
    eps = sorted((ep.name, ep.value, getattr(ep.dist, "version", "") if ep.dist else "")
                 for ep in entry_points(group=POLICY_ENTRY_POINTS))
    return hashlib.sha256(repr((stats, eps)).encode()).hexdigest()[:20]


# ---------------------------------------------------------------- the values
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
    """The --set options, --policy and the generated config flags as one nested dict of
    overrides (the policies' parameters: `policy_params`)."""
    overrides: dict = {}
    for item in args.overrides:
        key, value = parse_set_value("--set", item)
        _merge(overrides, _nest(key, value))
    if getattr(args, "policy", None):
        _merge(overrides, {"firmware": {"policy": args.policy}})
    for (family, section), values in gf.given(args, {DEVICE}).items():
        _merge(overrides, {section: values} if section else values)
    return overrides


def policy_params(args: argparse.Namespace) -> dict[str, dict]:
    """{policy: {param: value}} of the `--<policy>.<param>` flags given."""
    return {name: values for (_, name), values in gf.given(args, {POLICY}).items()}


def check_policies_selected(args: argparse.Namespace, selected: list[str], how: str) -> None:
    """Refuse a `--<policy>.<param>` of a policy the command does not run (`how` says
    what selected `selected` and how to select another)."""
    for f, _ in gf.given_flags(args):
        if f.family == POLICY and f.name not in selected:
            raise ValueError(f"{f.flag}: firmware policy {f.name} is not selected: {how.format(name=f.name)}")


def with_policy_params(overrides: dict, params: dict) -> dict:
    """`overrides` with `params` (the selected policy's flags) over its firmware.params."""
    if not params:
        return overrides
    firmware = dict(overrides.get("firmware") or {})
    firmware["params"] = {**(firmware.get("params") or {}), **params}
    return {**overrides, "firmware": firmware}


def load_device_config(args: argparse.Namespace, overrides: dict | None) -> DeviceConfig:
    """The config `args` describe with `overrides`; a check that fails on a key a
    generated flag set names that flag."""
    try:
        return load_config(args.device, overrides or None)
    except ConfigError as exc:
        if exc.source == "overrides":
            for f, _ in gf.given_flags(args):
                if exc.key == (f"{f.name}.{f.field}" if f.name else f.field) or \
                        f.family == POLICY and exc.key == "firmware.params":
                    raise ConfigError(f.flag, exc.key, exc.message) from None
        raise


def config_from_args(args: argparse.Namespace) -> DeviceConfig:
    overrides = config_overrides(args)
    cfg = load_device_config(args, overrides)
    params = policy_params(args)
    if params:
        policy = cfg.firmware.policy
        check_policies_selected(args, [policy], f"the device runs {policy} (from {cfg.source_of('firmware.policy')}"
                                                "); select it with --policy {name}")
        cfg = load_device_config(args, with_policy_params(overrides, params[policy]))
    return cfg


def device_flag_argv(args: argparse.Namespace, policies: list[str] | None = None) -> list[str]:
    """The generated flags given, as command-line words (for a child process running
    the same device); policy flags only of `policies`, when given."""
    out = []
    for f, text in gf.given_flags(args):
        if f.family != POLICY or policies is None or f.name in policies:
            out += [f.flag, text]
    return out
