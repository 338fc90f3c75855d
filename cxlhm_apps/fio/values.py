"""fio's value syntax: sizes with kb_base, percentages, times, booleans, ranges and
per-direction lists. Every parser raises ValueError with a message that says what is
accepted; the job-file parser adds the file, line and option to it.

fio's unit rules differ from cxlhm.units on purpose: with kb_base=1024 (fio's
default) ``4k`` is 4096 *and* ``4ki`` is 4000 (fio's "compatibility mode"); with
kb_base=1000 the SI/IEC meanings are the standard ones. Job files written for fio
must mean the same here, so this module follows fio, not cxlhm.units.
"""
from __future__ import annotations

import dataclasses
import re

_SIZE_RE = re.compile(r"^(0x[0-9a-f]+|\d+(?:\.\d*)?|\.\d+)\s*([kmgtpe]?)(i?)(b?)$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}

_TIME_RE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(d|h|m|min|s|sec|ms|msec|us|usec|ns|nsec)?$", re.IGNORECASE)
_TIME_NS = {"d": 86_400 * 10**9, "h": 3_600 * 10**9, "m": 60 * 10**9, "min": 60 * 10**9,
            "s": 10**9, "sec": 10**9, "ms": 10**6, "msec": 10**6, "us": 10**3, "usec": 10**3,
            "ns": 1, "nsec": 1}

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Percent:
    """A size given as a share of the file (``size=20%``), resolved once the file is known."""
    value: float

    def of(self, total: int, align: int = 1) -> int:
        n = int(total * self.value / 100.0)
        return n - n % align if align > 1 else n

    def __str__(self) -> str:
        return f"{self.value:g}%"


def parse_size(text: str, *, kb_base: int = 1024) -> int:
    """A byte count in fio's syntax: ``4096``, ``4k``, ``1m``, ``64KiB``, ``0x1000``."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise ValueError(f"expected a size such as 4096, 4k, 1m or 2g, got {text!r}")
    number, prefix, iec, _byte = m.groups()
    value = int(number, 16) if number.lower().startswith("0x") else float(number)
    # kb_base=1024: k = 1024, ki = 1000 (fio's compatibility mode); kb_base=1000: the reverse.
    binary = (kb_base == 1024) != bool(iec)
    scaled = value * (1024 if binary else 1000) ** _POWERS[prefix.lower()]
    if scaled != int(scaled):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(scaled)


def parse_size_or_percent(text: str, *, kb_base: int = 1024) -> int | Percent:
    stripped = text.strip()
    if stripped.endswith("%"):
        try:
            pct = float(stripped[:-1])
        except ValueError:
            raise ValueError(f"expected a percentage such as 20%, got {text!r}") from None
        if not 0 < pct <= 100:
            raise ValueError(f"a percentage must be in (0, 100], got {text!r}")
        return Percent(pct)
    return parse_size(stripped, kb_base=kb_base)


def parse_int(text: str) -> int:
    """A plain integer (decimal or 0x hex), no units."""
    s = text.strip()
    try:
        return int(s, 16) if s.lower().startswith(("0x", "-0x")) else int(s)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def parse_time_ns(text: str, *, default_unit: str = "s") -> int:
    """A duration; bare numbers are seconds unless `default_unit` says otherwise."""
    m = _TIME_RE.match(text.strip())
    if not m:
        raise ValueError(f"expected a time such as 10, 10s, 500ms, 2m or 1h, got {text!r}")
    number, unit = m.groups()
    return int(round(float(number) * _TIME_NS[(unit or default_unit).lower()]))


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


def parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def parse_size_range(text: str, *, kb_base: int = 1024) -> tuple[int, int]:
    """``4k-64k`` or ``4k:64k`` (swapped if given high-low, as fio does); a single size is a
    range of one."""
    s = text.strip()
    for sep in ("-", ":"):
        if sep in s:
            lo_text, _, hi_text = s.partition(sep)
            lo, hi = parse_size(lo_text, kb_base=kb_base), parse_size(hi_text, kb_base=kb_base)
            return (lo, hi) if lo <= hi else (hi, lo)
    n = parse_size(s, kb_base=kb_base)
    return n, n


def split_directions(text: str) -> list[str | None]:
    """Split a per-direction value into [read, write, trim] texts, following fio: a value
    not terminated by a comma also applies to the directions after it, an empty field
    keeps the default (None). ``8k,32k`` -> 8k, 32k, 32k; ``8k,32k,`` -> 8k, 32k, default;
    ``,8k`` -> default, 8k, 8k."""
    parts = text.split(",")
    if len(parts) > 3:
        raise ValueError(f"at most three comma-separated values (read,write,trim), got {text!r}")
    out: list[str | None] = []
    for i in range(3):
        if i < len(parts):
            out.append(parts[i].strip() or None)
        elif len(parts) > 0 and parts[-1].strip():
            out.append(parts[-1].strip())  # an unterminated last value carries forward
        else:
            out.append(None)
    return out
