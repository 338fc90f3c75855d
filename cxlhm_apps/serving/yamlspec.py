"""YAML with line numbers: every error in a workload or job file names the file, the line
and the key, as `cxlhm` does for device configs."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


class Loader(yaml.SafeLoader):
    """YAML 1.1 (PyYAML) reads `1e-3` and `2e9` as text (its floats need a dot); a number
    in exponent form is a number here, as in YAML 1.2 and Python."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_text(text: str):
    """One YAML value or document (a flag's value, a file), with exponent-form numbers."""
    return yaml.load(text, Loader=Loader)


class SpecError(ValueError):
    def __init__(self, source: str, line: int, key: str, message: str):
        self.source, self.line, self.key, self.message = source, line, key, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {key + ': ' if key else ''}{message}")


@dataclasses.dataclass
class Spec:
    """A parsed YAML mapping plus the line of every key (dotted paths)."""
    data: dict
    lines: dict[str, int]
    source: str

    def line(self, path: str) -> int:
        while path and path not in self.lines:
            path = path.rpartition(".")[0]
        return self.lines.get(path, 0)

    def error(self, path: str, message: str) -> SpecError:
        return SpecError(self.source, self.line(path), path, message)

    def section(self, key: str) -> Spec:
        """The mapping under top-level `key` (empty when absent), keeping the file's lines."""
        value = self.data.get(key) or {}
        if not isinstance(value, Mapping):
            raise self.error(key, f"must be a mapping of key: value, got {value!r}")
        prefix = key + "."
        return Spec(dict(value), {k[len(prefix):]: v for k, v in self.lines.items() if k.startswith(prefix)},
                    self.source)

    def check_keys(self, allowed, where: str = "") -> None:
        for key in self.data:
            if key not in allowed:
                raise self.error(key, f"unknown key{' in ' + where if where else ''}; accepted keys: "
                                      f"{', '.join(sorted(allowed))}")


def _lines(node, prefix: str, out: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                path = f"{prefix}{key_node.value}"
                out.setdefault(path, key_node.start_mark.line + 1)
                _lines(value_node, path + ".", out)


def parse_yaml(text: str, source: str) -> Spec:
    try:
        node = yaml.compose(text, Loader=Loader)
        data = load_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(source, mark.line + 1 if mark else 0, "", f"not valid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError(source, 1, "", f"expected a mapping of key: value at the top, got {type(data).__name__}")
    lines: dict[str, int] = {}
    _lines(node, "", lines)
    return Spec(dict(data), lines, source)


def load_yaml(path: str | Path) -> Spec:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(path), 0, "", f"cannot read: {exc.strerror}") from None
    return parse_yaml(text, str(path))


# ---------------------------------------------------------------- value checks
def number(spec: Spec, key: str, value: Any, *, minimum: float | None = None, integer: bool = False,
           exclusive: bool = False) -> float | int:
    ok_type = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type):
        raise spec.error(key, f"must be {'an integer' if integer else 'a number'}, got {value!r}")
    if minimum is not None and (value <= minimum if exclusive else value < minimum):
        raise spec.error(key, f"must be {'>' if exclusive else '>='} {minimum}, got {value!r}")
    return value
