"""Command-line flags generated from declarations (as vidur generates its command line
from its config dataclasses): one flag per declared option of each registered
implementation, with its help, its default and what it accepts taken from the
declaration, so that an implementation registered by a package (an entry point) or by a
test gets its flags with no edit to any command.

The families that declare options build `GeneratedFlag`s from their declarations
(cxlhm_apps/serving/options.py: the serving registries' config dataclasses;
cxlhm_apps/commands/_device_args.py: the device config's keys, each firmware policy's
`Param`s, the timing model's keys). This module owns what is common:

- `dataclass_fields`: the option fields of a config dataclass and their help (the
  field's ``metadata["help"]``, else the comment on or above its line);
- `read_value`: a flag's text read as one YAML value, exponent-form numbers (``1e-3``)
  included;
- `add_flags` / `add_lazy_flags`: one argument group per implementation; flags whose
  declarations are costly to load (they import compiled code) are added only when the
  help is printed or a dotted flag the parser does not know yet is given, and
  `cached_rows` keeps what the help shows of them on disk;
- the refusals: a value that does not parse names the flag and what it takes
  (`GeneratedFlag.convert`), an unknown ``--<name>.<field>`` names what that name takes
  or which names have options;
- `given`: the values given on the command line, by (family, name).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import io
import json
import os
import re
import tokenize
import typing
from collections.abc import Callable
from pathlib import Path

import yaml

_DEST = "_generated_flags"   # the parser default holding {flag: GeneratedFlag} of the flags added


@dataclasses.dataclass(frozen=True)
class GeneratedFlag:
    flag: str                # --s3fifo.small_ratio
    family: str              # policy, device, workload, system, topology, ...
    name: str                # the implementation (or config section) the option belongs to
    field: str               # the option's key in its declaration
    kind: object             # the declared type (for callers; shown through metavar/accepts)
    default: object
    help: str
    metavar: str = "VALUE"
    accepts: str = ""        # what a value may be, in words
    parse: Callable[[str], object] | None = dataclasses.field(default=None, compare=False)  # text -> value
    show_default: str = ""   # the default as the help shows it

    def convert(self, text: str):
        """The value `text` gives; ValueError naming the flag and what it takes."""
        try:
            return self.parse(text) if self.parse is not None else text
        except ValueError as exc:
            takes = f"; it takes {self.accepts}" if self.accepts and self.accepts not in str(exc) else ""
            raise ValueError(f"{self.flag}: {exc}{takes}") from None


# ---------------------------------------------------------------- declarations
def dataclass_fields(cls, supported: Callable[[object], bool]) -> list[tuple[str, object, str]]:
    """(field, type, help) of every option field of config dataclass `cls`: the init
    fields whose type `supported` takes, except names starting with "_" and fields with
    ``metadata={"cli": False}``."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: no flags rather than no command line
        return []
    out = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_") or f.metadata.get("cli", True) is False:
            continue
        kind = hints.get(f.name)
        if kind is None or not supported(kind):
            continue
        out.append((f.name, kind, str(f.metadata.get("help") or field_comment(cls, f.name))))
    return out


def field_comment(cls, name: str) -> str:
    """The comment on the line that defines field `name` in `cls` (or a base class), or
    the comment lines just above it."""
    for klass in cls.__mro__:
        if name not in getattr(klass, "__annotations__", {}):
            continue
        comments = _comments(klass)
        if name in comments:
            return comments[name]
    return ""


@functools.lru_cache(maxsize=None)
def _comments(klass) -> dict[str, str]:
    """field -> the comment on its line, else the comment lines just above it (cached:
    inspect parses the whole module to find a class)."""
    try:
        source = inspect.getsource(klass)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (OSError, TypeError, tokenize.TokenError, SyntaxError):  # no source (exec'd code, the REPL)
        return {}
    lines = source.splitlines()
    on_line = {tok.start[0]: tok.string.lstrip("#").strip() for tok in tokens if tok.type == tokenize.COMMENT}
    starts = (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE, tokenize.NL)
    out: dict[str, str] = {}
    depth = 0
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif (tok.type == tokenize.NAME and depth == 0 and i + 1 < len(tokens) and tokens[i + 1].string == ":"
              and i > 0 and tokens[i - 1].type in starts and tok.string not in out):
            row = tok.start[0]  # `name: type ...` at the start of a statement: a field
            if row in on_line and lines[row - 1].lstrip()[:1] != "#":
                out[tok.string] = on_line[row]
                continue
            above, r = [], row - 1
            while r >= 1 and lines[r - 1].lstrip().startswith("#"):
                above.insert(0, lines[r - 1].lstrip().lstrip("#").strip())
                r -= 1
            if above:
                out[tok.string] = " ".join(above)
    return out


# ---------------------------------------------------------------- values
_EXPONENT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


def read_value(text: str):
    """`text` read as one YAML value (`40`, `0.5`, `true`, `null`, `{a: 1}`); a number
    in exponent form (`1e-3`, which YAML 1.1 reads as text) is a number. ValueError
    when it is not YAML."""
    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{text!r} is not a value ({getattr(exc, 'problem', None) or 'not YAML'})") from None
    if isinstance(value, str) and _EXPONENT.match(value.strip()):
        return float(value.replace("_", ""))
    return value


def show(value) -> str:
    """A default as YAML writes it: null, true, 0.5."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# ---------------------------------------------------------------- the parser
@dataclasses.dataclass
class _Generated:
    """What one parser knows of its generated flags (kept on the parser)."""
    what: str                                 # "registered X, Y or Z", for the unknown-name error
    group_of: Callable[[GeneratedFlag], tuple[str, str]]
    lazy: list[Callable[[bool], list[GeneratedFlag]]] = dataclasses.field(default_factory=list)
    groups: dict = dataclasses.field(default_factory=dict)


def _state(parser: argparse.ArgumentParser) -> _Generated | None:
    return parser.__dict__.get(_DEST)


def _default_group(flag: GeneratedFlag) -> tuple[str, str]:
    return f"{flag.family} {flag.name} options", f"apply when {flag.name} is selected"


def add_flags(parser: argparse.ArgumentParser, flags: list[GeneratedFlag], *, what: str = "",
              group_of: Callable[[GeneratedFlag], tuple[str, str]] | None = None) -> list[GeneratedFlag]:
    """Add `flags` to `parser`, one argument group per (family, name) (`group_of` gives
    its title and description); return those added. A flag whose option string the
    parser already has (the command's own flag of that name) is left out. `what` names,
    in the error for an unknown ``--<name>.<field>``, what has options ("registered
    workload, serving system or topology")."""
    state = _install(parser, what, group_of)
    added = []
    for f in flags:
        if f.flag in parser._option_string_actions:
            continue
        key = (f.family, f.name)
        group = state.groups.get(key)
        if group is None:
            title, description = state.group_of(f)
            group = state.groups[key] = parser.add_argument_group(title, description)
        default = f.show_default or show(f.default)
        text = f"{f.help + ' ' if f.help else ''}(default {default})" if default else f.help
        group.add_argument(f.flag, dest=f"{_DEST}:{f.flag}", default=argparse.SUPPRESS, metavar=f.metavar,
                           help=text.replace("%", "%%"))
        added.append(f)
    table = dict(parser._defaults.get(_DEST) or {})
    table.update({f.flag: f for f in added})
    parser.set_defaults(**{_DEST: table})
    return added


def add_lazy_flags(parser: argparse.ArgumentParser, load: Callable[[bool], list[GeneratedFlag]], *,
                   what: str = "", group_of: Callable[[GeneratedFlag], tuple[str, str]] | None = None) -> None:
    """Flags whose declarations are costly to load (they import compiled code):
    `load(for_help)` runs, and its flags are added, only when the parser formats its help
    (for_help True: flags that only need to be listed) or is given a ``--<name>.<field>``
    it does not know yet (which they may be, or else the refusal lists them)."""
    _install(parser, what, group_of).lazy.append(load)


def _load_lazy(parser: argparse.ArgumentParser, for_help: bool) -> None:
    state = _state(parser)
    while state is not None and state.lazy:
        add_flags(parser, state.lazy.pop(0)(for_help))


def cache_folder() -> Path:
    """Where `cached_rows` keeps its files: beside the compiled firmware's cache."""
    return Path(os.environ.get("CXLHM_CACHE_DIR", Path.home() / ".cache" / "cxlhm")) / "flags"


def cached_rows(name: str, stamp: str, build: Callable[[], list[dict]]) -> list[dict]:
    """The JSON rows `build()` returns, kept in cache_folder()/<name>-<stamp>.json, so
    that a help that lists declarations whose modules import compiled code need not
    import them while `stamp` (a hash of those modules' files) is unchanged. An unreadable
    or unwritable cache costs only the build."""
    path = cache_folder() / f"{name}-{stamp}.json"
    try:
        rows = json.loads(path.read_text())
        if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
            return rows
    except (OSError, ValueError):
        pass
    rows = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):  # a read-only home, a value JSON cannot hold: no cache
        pass
    return rows


def _install(parser: argparse.ArgumentParser, what: str, group_of) -> _Generated:
    state = _state(parser)
    if state is not None:
        state.what = state.what or what
        return state
    state = parser.__dict__[_DEST] = _Generated(what or "registered implementation", group_of or _default_group)
    parse_known, help_of = parser.parse_known_args, parser.format_help

    def table() -> dict[str, GeneratedFlag]:
        return parser._defaults.get(_DEST) or {}

    def prefixes() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for flag in table():
            if "." in flag:
                out.setdefault(flag.rpartition(".")[0], []).append(flag)
        return out

    def dotted(args) -> list[str]:
        return [a.split("=", 1)[0] for a in args or () if isinstance(a, str) and a.startswith("--") and "." in a]

    def parse_known_args(args=None, namespace=None):
        if state.lazy and any(word.rpartition(".")[0] not in prefixes() for word in dotted(args)):
            _load_lazy(parser, for_help=False)
        namespace, extras = parse_known(args, namespace)
        for word in dotted(extras):
            known = prefixes()
            prefix = word.rpartition(".")[0]
            if prefix in known:
                parser.error(f"unknown option {word}; {prefix[2:]} takes {', '.join(sorted(known[prefix]))}")
            parser.error(f"unknown option {word}: no {state.what} with options is named {prefix[2:]!r}; "
                         f"those with options: {', '.join(sorted(p[2:] for p in known)) or '(none)'}")
        return namespace, extras

    def format_help():
        _load_lazy(parser, for_help=True)
        return short_usage(help_of)

    def format_usage():
        return short_usage(usage_of)

    def short_usage(format_text):
        """The usage line with the generated flags as one item (there may be hundreds;
        the help lists them)."""
        if parser.usage is not None:
            return format_text()
        generated = [a for a in parser._actions if a.dest.startswith(f"{_DEST}:")]
        if not generated:
            return format_text()
        formatter = parser._get_formatter()
        formatter.add_usage(None, [a for a in parser._actions if a not in generated], parser._mutually_exclusive_groups,
                            prefix="")
        dotted_only = all("." in a.option_strings[0] for a in generated)
        parser.usage = formatter.format_help().strip().replace("%", "%%") + \
            (" [--NAME.FIELD VALUE ...]" if dotted_only else " [--KEY VALUE ...] [--NAME.FIELD VALUE ...]")
        try:
            return format_text()
        finally:
            parser.usage = None

    # the subcommand's parser sees its own extras first, so a subcommand refuses them itself
    usage_of = parser.format_usage
    parser.parse_known_args, parser.format_help, parser.format_usage = parse_known_args, format_help, format_usage
    return state


# ---------------------------------------------------------------- the values
def given_flags(args: argparse.Namespace) -> list[tuple[GeneratedFlag, str]]:
    """(flag, text) of every generated flag given on the command line, in flag order."""
    table: dict[str, GeneratedFlag] = getattr(args, _DEST, {}) or {}
    return [(f, text) for flag, f in table.items() if (text := getattr(args, f"{_DEST}:{flag}", None)) is not None]


def given(args: argparse.Namespace, families=None) -> dict[tuple[str, str], dict]:
    """{(family, name): {field: value}} of the generated flags given on the command line
    (only `families`, when given), each converted (ValueError naming the flag)."""
    out: dict[tuple[str, str], dict] = {}
    for f, text in given_flags(args):
        if families is None or f.family in families:
            out.setdefault((f.family, f.name), {})[f.field] = f.convert(text)
    return out
