"""Command-line options of every registered serving implementation, generated from its
config dataclass (as vidur generates its command line from its dataclasses).

Each workload, serving system and topology in the registries - built-ins and entry
points alike - gets one flag per option field of its config dataclass:

    --<name>.<field> VALUE        e.g. --coding-agent.turns 40, --lmcache-local.load_mode layerwise

`<field>` is the dataclass field, spelled as the YAML key of a workload file. Where two
families register the same name, both qualify it: `--<family>:<name>.<field>` (family
workload, system or topology). The config dataclass of each family:

  workload  `WorkloadKind.config` (the YAML keys of `kind: <name>` files)
  system    the registered object itself, when it is a dataclass instance; its values
            are the flags' defaults
  topology  the engine class's `Options` attribute, a dataclass (the engine reads the
            configured instance as `self.options`)

Option fields are those with a type `workloads.parse_value` takes (int, float, str, bool,
Dist, int | None, Literal[...]), except names starting with "_" and fields with
``metadata={"cli": False}``. A flag's help is the field's ``metadata["help"]``, else the
comment on (or just above) its line in the class's source. Values are read as YAML
scalars (`40`, `0.5`, `true`); a distribution as a number (constant) or a YAML mapping,
``{dist: lognormal, median: 33, sigma: 0.6}``; text fields and choices take the text as
it is. A flag applies only when its implementation is selected (`--workload`,
`--configs`, `--topology`); an ill-typed value, a flag of an unselected implementation
and an unknown `--<name>.<field>` are refused, naming the flag and what is accepted.

The machinery (fields and their help, the argument groups, the refusals) is shared with
the device commands' generated flags: cxlhm_apps/generated_flags.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable

import yaml

from cxlhm_apps import generated_flags as gf
from cxlhm_apps.generated_flags import field_comment  # noqa: F401  (part of this module's interface)
from cxlhm_apps.serving.workloads import Dist, parse_value, supported
from cxlhm_apps.serving.yamlspec import Spec, SpecError, load_text

OptionFlag = gf.GeneratedFlag   # flag, family, name, field, kind (the field's type), default, help
WHAT = "registered workload, serving system or topology"


@dataclasses.dataclass(frozen=True)
class Family:
    key: str                                 # workload | system | topology
    selector: str                            # the flag that selects implementations
    registry: Callable[[], object]           # the family's Registry
    config_of: Callable[[object], tuple]     # implementation -> (dataclass, defaults instance)


def _workload_registry():
    from cxlhm_apps.serving.workloads import WORKLOADS
    return WORKLOADS


def _system_registry():
    from cxlhm_apps.serving.configs import SYSTEMS
    return SYSTEMS


def _topology_registry():
    from cxlhm_apps.serving.topologies import TOPOLOGIES
    return TOPOLOGIES


def _workload_config(kind) -> tuple:
    return kind.config, kind.config()


def _system_config(obj) -> tuple:
    return (type(obj), obj) if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else (None, None)


def _topology_config(engine) -> tuple:
    cls = getattr(engine, "Options", None)
    return (cls, cls()) if dataclasses.is_dataclass(cls) else (None, None)


FAMILIES = (Family("workload", "--workload", _workload_registry, _workload_config),
            Family("system", "--configs", _system_registry, _system_config),
            Family("topology", "--topology", _topology_registry, _topology_config))


# ---------------------------------------------------------------- the fields
def option_fields(cls) -> list[tuple[str, object, str]]:
    """(field, type, help) of every option field of config dataclass `cls`."""
    return gf.dataclass_fields(cls, supported)


# ---------------------------------------------------------------- the flags
def option_flags() -> list[OptionFlag]:
    """Every generated flag, from every implementation that loads (a broken entry point
    gets none here; selecting it names the error)."""
    found: list[tuple[Family, str, type, object]] = []
    for family in FAMILIES:
        loaded, _ = family.registry().load_all()
        for name, impl in sorted(loaded.items(), key=lambda item: (_order(item[1]), item[0])):
            cls, defaults = family.config_of(impl)
            if cls is not None:
                found.append((family, name, cls, defaults))
    families_of: dict[str, set] = {}
    for family, name, _, _ in found:
        families_of.setdefault(name, set()).add(family.key)
    flags = []
    for family, name, cls, defaults in found:
        prefix = name if len(families_of[name]) == 1 else f"{family.key}:{name}"
        for field, kind, help_text in option_fields(cls):
            flag = f"--{prefix}.{field}"
            default = getattr(defaults, field, None)
            flags.append(OptionFlag(flag, family.key, name, field, kind, default, help_text, metavar=_metavar(kind),
                                    accepts=describe(kind), parse=_parser_of(flag, field, kind),
                                    show_default=_show(default)))
    return flags


def _order(impl) -> int:
    """Listing position from the registry's metadata (a workload's order, a system's Meta)."""
    order = getattr(impl, "order", None)
    if order is None:
        order = getattr(getattr(impl, "meta", None), "order", 50)
    return order if isinstance(order, int) else 50


def describe(kind) -> str:
    """What a flag of type `kind` accepts, in words."""
    if kind is Dist:
        return ("a number (a constant) or a distribution: {dist: lognormal, median: M, sigma: S}, "
                "{dist: uniform, low: L, high: H}, {dist: exponential, mean: M} or {dist: constant, value: V}")
    if typing.get_origin(kind) is typing.Literal:
        return f"one of {', '.join(map(str, typing.get_args(kind)))}"
    return {bool: "true or false", int: "an integer >= 0", float: "a number >= 0", str: "text"}.get(
        kind, "an integer >= 1 or null")


def _metavar(kind) -> str:
    if typing.get_origin(kind) is typing.Literal:
        return "{" + ",".join(map(str, typing.get_args(kind))) + "}"
    return {Dist: "DIST", bool: "{true,false}", int: "INT", float: "NUM", str: "TEXT"}.get(kind, "INT|null")


def _show(value) -> str:
    if isinstance(value, Dist):
        return {"constant": f"{value.a:g}", "lognormal": f"lognormal median {value.a:g} sigma {value.b:g}",
                "uniform": f"uniform {value.a:g}..{value.b:g}",
                "exponential": f"exponential mean {value.a:g}"}[value.kind]
    return gf.show(value)


def _parser_of(flag: str, field: str, kind) -> Callable[[str], object]:
    """text -> the field's value, checked as a workload file's value is (ValueError)."""
    def parse(text: str):
        if kind is str or typing.get_origin(kind) is typing.Literal:
            value = text
        else:
            try:
                value = load_text(text)
            except yaml.YAMLError:
                raise ValueError(f"{text!r} is not a value") from None
        try:
            return parse_value(Spec({field: value}, {}, flag), field, value, kind)
        except SpecError as exc:
            raise ValueError(exc.message) from None
    return parse


def add_option_flags(parser: argparse.ArgumentParser) -> list[OptionFlag]:
    """One argument group per implementation with options, one flag per option field;
    an unknown `--<name>.<field>` is refused naming what that implementation takes."""
    return gf.add_flags(parser, option_flags(), what=WHAT)


# ---------------------------------------------------------------- the values
def convert(flag: OptionFlag, text: str):
    """The value of `flag` given as `text` (ValueError naming the flag and what it takes)."""
    return flag.convert(text)


def from_args(args: argparse.Namespace) -> dict[tuple[str, str], dict]:
    """{(family, name): {field: value}} of the generated flags given on the command line,
    each value checked against its field and each implementation's config built once
    (its own checks, e.g. __post_init__, name the flags)."""
    keys = {f.key for f in FAMILIES}
    out = gf.given(args, keys)
    given: dict[tuple[str, str], list[str]] = {}
    for f, _ in gf.given_flags(args):
        given.setdefault((f.family, f.name), []).append(f.flag)
    for (family_key, name), values in out.items():
        family = next(fam for fam in FAMILIES if fam.key == family_key)
        cls, defaults = family.config_of(family.registry().get(name))
        try:
            dataclasses.replace(defaults, **values)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{', '.join(given[(family_key, name)])}: {exc}") from None
    return out


def check_selected(options: dict[tuple[str, str], dict], selected: dict[str, list[str]]) -> None:
    """Refuse a flag of an implementation that is not selected (`selected`: family ->
    the names its selector chose), which would otherwise be silently ignored."""
    for (family_key, name), values in options.items():
        chosen = selected.get(family_key, [])
        if name not in chosen:
            family = next(fam for fam in FAMILIES if fam.key == family_key)
            flags = ", ".join(f"--{name}.{field}" for field in values)
            raise ValueError(f"{flags}: {family_key} {name} is not selected ({family.selector} "
                             f"{','.join(chosen) or '(none)'}); add {name} to {family.selector}")


def as_params_options(options: dict[tuple[str, str], dict], families=("system", "topology")) -> tuple:
    """The options a replay reads from ServingParams.options: ((family, name, ((field,
    value), ...)), ...), hashable and picklable, for the families given."""
    return tuple(sorted((fam, name, tuple(sorted(values.items()))) for (fam, name), values in options.items()
                        if fam in families))
