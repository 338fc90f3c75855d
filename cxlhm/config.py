"""Device configuration: YAML profiles, user files and dict overrides, validated.

A configuration is built from layers, lowest first:

1. the profile (``cxlhm/profiles/<name>.yaml``; ``cmm-h`` unless a layer says ``profile: NAME``),
2. a user YAML file, if one was given,
3. a dict of overrides (API callers, ``--set key=value`` on the command line).

Every layer is checked on its own, so an unknown key or a bad value is reported with
the file (or "overrides") it came from; cross-field checks run on the merged result
and name the layer that last set the offending key.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from cxlhm.configerror import ConfigError  # noqa: F401  (raised here; re-exported for callers)
from cxlhm.units import parse_size

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = "cmm-h"
MIN_BLOCK_SIZE = 4096
MAX_BLOCK_SIZE = 2 << 20



# ---------------------------------------------------------------- value parsers
# Each parser returns the normalised value or raises ValueError saying what is accepted.

def _positive_size(value: Any) -> int:
    n = parse_size(value)
    if n <= 0:
        raise ValueError(f"must be a positive byte size, got {value!r}")
    return n


MAX_CAPACITY = 1 << 60  # file offsets are signed 64-bit; no back end holds more than an EiB


def _capacity(value: Any) -> int:
    n = _positive_size(value)
    if n > MAX_CAPACITY:
        raise ValueError(f"must be at most 1 EiB (2^60 bytes), got {value!r}")
    return n


def _block_size(value: Any) -> int:
    n = _positive_size(value)
    if n & (n - 1) or not MIN_BLOCK_SIZE <= n <= MAX_BLOCK_SIZE:
        raise ValueError(f"must be a power of two from 4 KiB to 2 MiB, got {value!r}")
    return n


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"must be an integer from {lo} to {hi}, got {value!r}")
        return value
    return parse


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {value!r}")
        return value
    return parse


# The device keeps files beside its image, named after it: <image>.cxlhm.json (metadata),
# .cxlhm.sums (checksums), .cxlhm.ilog (integrity log), <image>.kvindex (the KV store),
# each rewritten through a ".tmp" sibling. Their names must fit the file system's limit.
LONGEST_SIDECAR_SUFFIX = ".cxlhm.sums.tmp"
NAME_MAX = 255  # bytes per file name on Linux file systems (ext4, xfs, btrfs, tmpfs)


def _optional_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, Path)) or not str(value):
        raise ValueError(f"must be a file or block-device path, or null for a temporary file; got {value!r}")
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # "~user/..." for a user this machine does not have
        raise ValueError(f"cannot expand the home directory in {value!r}: no such user") from None
    most = NAME_MAX - len(LONGEST_SIDECAR_SUFFIX)
    if len(os.fsencode(path.name)) > most:
        raise ValueError(f"the file name {path.name[:40]!r}... is {len(os.fsencode(path.name))} bytes; the device "
                         f"keeps files named after it beside it (up to {path.name[:8]}...{LONGEST_SIDECAR_SUFFIX}), "
                         f"so it may have at most {most}")
    return str(path)


def _backend_kind(value: Any) -> str:
    from cxlhm.media.registry import BACKENDS, backend_kinds  # names only: no back end is imported
    if value in BACKENDS:  # a built-in answers at once; listing every name scans the installed entry points
        return value
    return _choice(*backend_kinds())(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {value!r}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def _mapping(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping of key: value, got {value!r}")
    return dict(value)


def _optional_write_mode(value: Any) -> str | None:
    return None if value is None else _choice(*WRITE_MODES)(value)


WRITE_MODES = ("write-back", "write-through", "write-buffer")


@dataclasses.dataclass(frozen=True)
class Field:
    parse: Callable[[Any], Any]
    default: Any
    help: str


# The schema: a Field per key, nested dicts for sections. `cxlhm config --keys` prints it.
SCHEMA: dict[str, Any] = {
    "name": Field(_text, "custom", "profile name shown in reports"),
    "description": Field(_text, "", "one line on what this device models"),
    "capacity": Field(_capacity, 1 << 40, "bytes of the HDM window the host sees (sparse: costs nothing until written)"),
    "block_size": Field(_block_size, 64 << 10, "device block: unit of caching and SSD I/O (power of two, 4 KiB-2 MiB)"),
    "dram_bytes": Field(_positive_size, 256 << 20, "device DRAM in front of the SSD"),
    "data": Field(_choice("real", "none"), "real", "real: move real bytes; none: timing-only, no data"),
    "clock": Field(_choice("wall", "model"), "wall", "wall: real elapsed time; model: the timing model"),
    "mode": Field(_choice("explicit", "window"), "explicit", "explicit: load/store API; window: userfaultfd memory window"),
    "seed": Field(_int_range(0, 2**63 - 1), 0, "seed for every random choice the device makes"),
    "backend": {
        "kind": Field(_backend_kind, "ssd", "back end: ssd (O_DIRECT io_uring on a file or block device) | memory "
                                            "(an mmap of the file, or anonymous; for tests)"),
        "path": Field(_optional_path, None, "SSD image file or block device (O_DIRECT); null = temporary file"),
        "queue_depth": Field(_int_range(1, 4096), 128, "io_uring submission queue entries"),
        "retries": Field(_int_range(0, 100), 3, "resubmissions of a failed or short SSD op before the block is poisoned"),
        "faults": Field(_mapping, {}, "fault injection: read/write_error_rate, short_read/write_rate, "
                                      "spike_rate + spike_ns, capacity_bytes (see cxlhm/media/faults.py)"),
        "lost_sidecar": Field(_choice("refuse", "poison", "trust"), "refuse",
                              "a missing or corrupt checksum/metadata file beside the image: refuse to open | poison "
                              "(every block holding data reads as poison until rewritten) | trust (checksum the "
                              "image as it is)"),
    },
    "firmware": {
        "policy": Field(_text, "lru", "firmware policy name (`cxlhm policies` lists them)"),
        "params": Field(_mapping, {}, "policy parameters (checked by the policy)"),
        "write_mode": Field(_optional_write_mode, None, "write-back | write-through | write-buffer (default: the policy's)"),
        "background": Field(_choice("thread", "manual"), "thread",
                            "thread: a firmware thread runs prefetch/flush work while the device is idle; "
                            "manual: only Device.run_background() does (deterministic tests)"),
        "write_behind": Field(_boolean, True,
                              "write-back firmware on the wall clock hands a write of whole blocks of 1 MiB or more "
                              "(a KV chunk) to the SSD at once, without the host waiting; false: written back only "
                              "when evicted or flushed (fewer SSD writes for data deleted or rewritten while cached)"),
    },
    "timing": Field(_mapping, {}, "timing-model parameters (checked by the timing model)"),
}
_LAYER_ONLY_KEYS = {"profile"}  # may appear in any layer, selects the base profile


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    path: str | None
    queue_depth: int
    retries: int = 3
    faults: dict = dataclasses.field(default_factory=dict)
    kind: str = "ssd"
    lost_sidecar: str = "refuse"


@dataclasses.dataclass(frozen=True)
class FirmwareConfig:
    policy: str
    params: dict
    write_mode: str | None
    background: str = "thread"
    write_behind: bool = True


@dataclasses.dataclass(frozen=True)
class DeviceConfig:
    name: str
    description: str
    capacity: int
    block_size: int
    dram_bytes: int
    data: str
    clock: str
    mode: str
    seed: int
    backend: BackendConfig
    firmware: FirmwareConfig
    timing: dict
    sources: tuple[str, ...]  # the layers this came from, lowest first
    provenance: dict  # dotted key -> the layer that set it (for error messages)

    @property
    def n_blocks(self) -> int:
        return self.capacity // self.block_size

    @property
    def dram_slots(self) -> int:
        return self.dram_bytes // self.block_size

    def source_of(self, key: str) -> str:
        return self.provenance.get(key, "defaults")



# ---------------------------------------------------------------- layers

def _check_layer(raw: Any, source: str, schema: dict = SCHEMA, prefix: str = "") -> dict:
    """Validate one layer against the schema; return {dotted_key: parsed_value}."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(source, prefix.rstrip(".") or "<top>", f"must be a mapping of key: value, got {type(raw).__name__}")
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if not prefix and key in _LAYER_ONLY_KEYS:
            continue
        spec = schema.get(key) if isinstance(key, str) else None
        if spec is None:
            accepted = sorted(schema) + (sorted(_LAYER_ONLY_KEYS) if not prefix else [])
            raise ConfigError(source, dotted, f"unknown key; accepted keys here: {', '.join(accepted)}")
        if isinstance(spec, dict):
            flat.update(_check_layer(value, source, spec, dotted + "."))
            continue
        try:
            flat[dotted] = spec.parse(value)
        except ValueError as exc:
            raise ConfigError(source, dotted, str(exc)) from None
    return flat


MAX_CONFIG_BYTES = 1 << 20  # a device config is a few KiB; never read /dev/zero or a huge file


def _read_yaml(path: Path) -> Any:
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(str(path), "<file>", "not a regular file; a device config is a YAML file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(str(path), "<file>", f"{st.st_size} bytes; a config is at most {MAX_CONFIG_BYTES}")
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), "<file>", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), "<file>", f"not UTF-8 text (byte {exc.start})") from None
    try:
        return safe_load_yaml(text)
    except RecursionError:
        raise ConfigError(str(path), "<file>", "YAML nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<file>"
        raise ConfigError(str(path), where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None


def safe_load_yaml(text: str) -> Any:
    """yaml.safe_load that refuses nesting deeper than MAX_YAML_DEPTH (RecursionError)
    before building it: a hostile config must not exhaust the stack."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise RecursionError(f"nested deeper than {MAX_YAML_DEPTH}")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return yaml.safe_load(text)


MAX_YAML_DEPTH = 64


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_path(name: str) -> Path:
    path = PROFILE_DIR / f"{name}.yaml"
    try:
        found = path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        found = False
    if not found:
        raise ConfigError("profile", "profile", f"no profile named {name!r}; available: {', '.join(available_profiles())}")
    return path


@functools.lru_cache(maxsize=None)
def _parsed_profile(path: str) -> Any:
    return _read_yaml(Path(path))


def _profile_layer(path: str) -> Any:
    """A shipped profile, parsed once per process (every load_config reads one, and the
    pure-Python YAML parser takes milliseconds); each caller gets its own copy."""
    return copy.deepcopy(_parsed_profile(path))


def _defaults() -> dict[str, Any]:
    flat: dict[str, Any] = {}

    def walk(schema: dict, prefix: str) -> None:
        for key, spec in schema.items():
            if isinstance(spec, dict):
                walk(spec, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = spec.default
    walk(SCHEMA, "")
    return flat


def load_config(spec: str | Path | Mapping | None = None, overrides: Mapping | None = None) -> DeviceConfig:
    """Build a DeviceConfig from a profile name, a YAML path, or a dict of overrides
    on the default profile, plus optional overrides on top."""
    layers: list[tuple[str, Any]] = []
    if isinstance(spec, Mapping):
        layers.append(("overrides", dict(spec)))
    elif spec is not None:
        text = str(spec)
        if text.endswith((".yaml", ".yml")) or "/" in text:
            path = Path(text)
            layers.append((str(path), _read_yaml(path)))
        else:
            layers.append((str(profile_path(text)), _profile_layer(str(profile_path(text)))))
    if overrides:
        layers.append(("overrides", dict(overrides)))

    base_name = DEFAULT_PROFILE
    for source, raw in layers:
        if isinstance(raw, Mapping) and "profile" in raw:
            if not isinstance(raw["profile"], str):
                raise ConfigError(source, "profile", f"must be a profile name, got {raw['profile']!r}")
            base_name = raw["profile"]
    base_path = str(profile_path(base_name))
    if not any(source == base_path for source, _ in layers):
        layers.insert(0, (base_path, _profile_layer(base_path)))

    values, provenance = _defaults(), {}
    for source, raw in layers:
        layer = _check_layer(raw, source)
        # A layer that switches policy without restating params drops the old policy's params.
        if "firmware.policy" in layer and layer["firmware.policy"] != values["firmware.policy"]:
            values["firmware.params"] = {}
        for key, value in layer.items():
            if key in ("firmware.params", "timing", "backend.faults"):  # mappings merge key by key
                value = {**values[key], **value}
            values[key] = value
            provenance[key] = source
    cfg = DeviceConfig(
        name=values["name"], description=values["description"], capacity=values["capacity"],
        block_size=values["block_size"], dram_bytes=values["dram_bytes"], data=values["data"],
        clock=values["clock"], mode=values["mode"], seed=values["seed"],
        backend=BackendConfig(values["backend.path"], values["backend.queue_depth"], values["backend.retries"],
                              values["backend.faults"], values["backend.kind"], values["backend.lost_sidecar"]),
        firmware=FirmwareConfig(values["firmware.policy"], values["firmware.params"], values["firmware.write_mode"],
                                values["firmware.background"], values["firmware.write_behind"]),
        timing=values["timing"], sources=tuple(s for s, _ in layers), provenance=provenance,
    )
    _check_consistency(cfg)
    return cfg


def _check_consistency(cfg: DeviceConfig) -> None:
    def fail(key: str, message: str) -> None:
        raise ConfigError(cfg.source_of(key), key, message)

    if cfg.capacity % cfg.block_size:
        fail("capacity", f"{cfg.capacity} is not a multiple of block_size {cfg.block_size}")
    if cfg.dram_bytes % cfg.block_size:
        fail("dram_bytes", f"{cfg.dram_bytes} is not a multiple of block_size {cfg.block_size}")
    if cfg.dram_bytes > cfg.capacity:
        fail("dram_bytes", f"device DRAM ({cfg.dram_bytes} bytes) is larger than the capacity ({cfg.capacity} bytes)")
    if cfg.dram_slots < 2:
        fail("dram_bytes", f"must hold at least 2 blocks of {cfg.block_size} bytes, got {cfg.dram_bytes}")
