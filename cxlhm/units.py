"""Byte-size and duration strings: "4k", "64KiB", "1TiB", "1g", "250ns", "10s"."""
from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}

_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|m|h)?\s*$", re.IGNORECASE)
_TIME_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}


def parse_size(value: int | str, *, kb_base: int = 1024) -> int:
    """Parse a byte count. Integers pass through; suffixes k/m/g/t/p are powers of
    `kb_base` (1024 by default, as in fio), "KiB" style suffixes are always 1024
    and "KB" style suffixes follow kb_base. Raises ValueError naming the input."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a byte size such as 4096, '64KiB' or '1TiB', got {value!r}")
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"expected a byte size such as 4096, '64KiB' or '1TiB', got {value!r}")
    number, prefix, suffix = m.groups()
    base = 1024 if suffix.lower() == "ib" else kb_base
    scaled = float(number) * base ** _SIZE_POWER[prefix.lower()]
    if not scaled.is_integer():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(scaled)


def parse_duration_ns(value: int | float | str, *, default_unit: str = "ns") -> int:
    """Parse a duration into integer nanoseconds; bare numbers use `default_unit`."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        return int(round(value * _TIME_NS[default_unit]))
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as 250ns, 45us or 10s, got {value!r}")
    m = _TIME_RE.match(value)
    if not m:
        raise ValueError(f"expected a duration such as 250ns, 45us or 10s, got {value!r}")
    number, unit = m.groups()
    return int(round(float(number) * _TIME_NS[(unit or default_unit).lower()]))


def format_size(n: int) -> str:
    """Human-readable binary size: 65536 -> '64 KiB', 1536 -> '1.5 KiB'."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} B"
