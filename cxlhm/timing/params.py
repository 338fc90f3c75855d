"""The `timing:` section of a device config: its keys, their parsing and checks, and
the flat float64 array the compiled model reads.

Every key is required (the base profile sets them all, so user files only override
what they change). Latencies are durations (``45us``, ``90ns`` or a number of ns),
bandwidths are bytes per second (``31.5GB/s`` decimal, ``1GiB/s`` binary, or a
number), sizes are bytes (``16KiB``). Zero or negative values are rejected: a free
resource is a modelling error, not a setting.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from cxlhm.config import ConfigError
from cxlhm.units import parse_duration_ns, parse_size

BACKINGS = ("nand", "none")

_BW_RE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmgt]?)(i?)b/s\s*$", re.IGNORECASE)
_BW_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def _duration(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"must be a duration such as 45us or 90ns, got {value!r}")
    ns = float(value) if isinstance(value, (int, float)) else float(parse_duration_ns(value))
    if not ns > 0:
        raise ValueError(f"must be a positive duration, got {value!r}")
    return ns


def _bandwidth(value: Any) -> float:
    """Bytes per second. 'GB/s' is decimal (as vendors and PCIe quote it), 'GiB/s' binary."""
    if isinstance(value, bool):
        raise ValueError(f"must be a bandwidth such as 31.5GB/s, got {value!r}")
    if isinstance(value, (int, float)):
        bps = float(value)
    elif isinstance(value, str) and (m := _BW_RE.match(value)):
        number, prefix, binary = m.groups()
        bps = float(number) * (1024 if binary else 1000) ** _BW_POWER[prefix.lower()]
    else:
        raise ValueError(f"must be a bandwidth such as 31.5GB/s, 800MB/s or a number of bytes/s, got {value!r}")
    if not bps > 0:
        raise ValueError(f"must be a positive bandwidth, got {value!r}")
    return bps


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be a positive integer, got {value!r}")
    if value > 4096:
        raise ValueError(f"must be at most 4096, got {value!r}")
    return value


def _page_size(value: Any) -> int:
    n = parse_size(value)
    if n < 512 or n & (n - 1) or n > 1 << 20:
        raise ValueError(f"must be a power of two from 512 B to 1 MiB, got {value!r}")
    return n


def _buffer_size(value: Any) -> int:
    n = parse_size(value)
    if n <= 0:
        raise ValueError(f"must be a positive byte size, got {value!r}")
    return n


def _backing(value: Any) -> str:
    if value not in BACKINGS:
        raise ValueError(f"must be one of {', '.join(BACKINGS)}; got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Key:
    parse: Any
    help: str
    nand_only: bool = False  # not needed when backing is none (DRAM-only expander)


KEYS: dict[str, Key] = {
    "link_latency": Key(_duration, "CXL link + port latency, one way (charged each direction)"),
    "link_bandwidth": Key(_bandwidth, "CXL link bandwidth per direction"),
    "controller_latency": Key(_duration, "device controller per host access (decode, cache-tag lookup)"),
    "dram_latency": Key(_duration, "device DRAM access latency"),
    "dram_bandwidth": Key(_bandwidth, "device DRAM bandwidth (shared by host transfers, fills, write-backs)"),
    "backing": Key(_backing, "nand: hybrid/SSD device; none: DRAM-only expander (fills are first touches)"),
    "ssd_command_latency": Key(_duration, "FTL lookup + NAND command issue per SSD operation", True),
    "nand_channels": Key(_count, "NAND channels (each a shared bus)", True),
    "nand_dies_per_channel": Key(_count, "NAND dies on each channel (each reads/programs one page at a time)", True),
    "nand_page_size": Key(_page_size, "NAND page: unit of tR/tPROG and of channel/die striping", True),
    "nand_read_latency": Key(_duration, "tR: page read from the array into the die's register", True),
    "nand_program_latency": Key(_duration, "tPROG: page program", True),
    "nand_channel_rate": Key(_bandwidth, "NAND channel transfer rate", True),
    "write_buffer_bytes": Key(_buffer_size, "SSD write buffer: write-backs are accepted here, then programmed", True),
}


@dataclasses.dataclass(frozen=True)
class TimingParams:
    """Parsed timing parameters: times in ns, bandwidths in bytes/s, sizes in bytes."""
    link_latency: float
    link_bandwidth: float
    controller_latency: float
    dram_latency: float
    dram_bandwidth: float
    backing: str
    ssd_command_latency: float
    nand_channels: int
    nand_dies_per_channel: int
    nand_page_size: int
    nand_read_latency: float
    nand_program_latency: float
    nand_channel_rate: float
    write_buffer_bytes: int

    @property
    def dies(self) -> int:
        return self.nand_channels * self.nand_dies_per_channel

    @property
    def write_buffer_pages(self) -> int:
        return self.write_buffer_bytes // self.nand_page_size

    def replace(self, **changes) -> TimingParams:
        return dataclasses.replace(self, **changes)


# Placeholders for NAND keys of a DRAM-only device: never read by the model, but they
# keep the arrays well formed.
_UNUSED_NAND = dict(ssd_command_latency=1.0, nand_channels=1, nand_dies_per_channel=1, nand_page_size=4096,
                    nand_read_latency=1.0, nand_program_latency=1.0, nand_channel_rate=1e9,
                    write_buffer_bytes=4096)


def parse_timing(timing: Mapping, source: str) -> TimingParams:
    """Validate a `timing:` mapping. Errors name `timing.<key>` and `source`."""
    if not isinstance(timing, Mapping):
        raise ConfigError(source, "timing", f"must be a mapping of key: value, got {timing!r}")
    values: dict[str, Any] = {}
    for key, value in timing.items():
        spec = KEYS.get(key) if isinstance(key, str) else None
        if spec is None:
            raise ConfigError(source, f"timing.{key}", f"unknown key; accepted keys here: {', '.join(KEYS)}")
        try:
            values[key] = spec.parse(value)
        except ValueError as exc:
            raise ConfigError(source, f"timing.{key}", str(exc)) from None
    backing = values.setdefault("backing", "nand")
    for key, spec in KEYS.items():
        if key not in values:
            if backing == "none" and spec.nand_only:
                values[key] = _UNUSED_NAND[key]
            else:
                raise ConfigError(source, f"timing.{key}", f"missing ({spec.help}); the profile must set it")
    params = TimingParams(**values)
    if backing == "nand" and params.write_buffer_bytes < params.nand_page_size:
        raise ConfigError(source, "timing.write_buffer_bytes",
                          f"must hold at least one NAND page ({params.nand_page_size} bytes), got {params.write_buffer_bytes}")
    return params


# ---------------------------------------------------------------- the flat array
# Index constants for the params array read by the compiled model. Bandwidths are
# stored as ns per byte so the hot path multiplies instead of dividing.
(P_LINK_LAT, P_LINK_NS_PER_BYTE, P_CTRL_LAT, P_DRAM_LAT, P_DRAM_NS_PER_BYTE, P_HAS_NAND,
 P_SSD_CMD_LAT, P_CHANNELS, P_DIES_PER_CHANNEL, P_PAGE, P_TR, P_TPROG, P_CH_NS_PER_BYTE,
 P_WBUF_PAGES, N_PARAMS) = range(15)


def params_array(p: TimingParams) -> np.ndarray:
    a = np.zeros(N_PARAMS, np.float64)
    a[P_LINK_LAT] = p.link_latency
    a[P_LINK_NS_PER_BYTE] = 1e9 / p.link_bandwidth
    a[P_CTRL_LAT] = p.controller_latency
    a[P_DRAM_LAT] = p.dram_latency
    a[P_DRAM_NS_PER_BYTE] = 1e9 / p.dram_bandwidth
    a[P_HAS_NAND] = 1.0 if p.backing == "nand" else 0.0
    a[P_SSD_CMD_LAT] = p.ssd_command_latency
    a[P_CHANNELS] = p.nand_channels
    a[P_DIES_PER_CHANNEL] = p.nand_dies_per_channel
    a[P_PAGE] = p.nand_page_size
    a[P_TR] = p.nand_read_latency
    a[P_TPROG] = p.nand_program_latency
    a[P_CH_NS_PER_BYTE] = 1e9 / p.nand_channel_rate
    a[P_WBUF_PAGES] = max(1, p.write_buffer_pages)
    return a
