"""`TimingModel`: the validated parameters plus the arrays the compiled kernels use,
and the closed-form figures the model is built to reproduce (docs/timing.md)."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cxlhm.timing import kernels as K
from cxlhm.timing.params import TimingParams, params_array, parse_timing


class TimingModel:
    """One device's timing model. `params` (float64, read-only for the kernels) and
    `state` (float64, the busy-until timelines) are what compiled code takes:

        done = kernels.charge_access(model.params, model.state, issue_ns, ...)
    """

    def __init__(self, settings: TimingParams, block_size: int):
        self.settings = settings
        self.block_size = block_size
        self.params = params_array(settings)
        self.state = np.zeros(K.state_size(settings.nand_channels, settings.nand_dies_per_channel,
                                           max(1, settings.write_buffer_pages)), np.float64)

    @classmethod
    def from_config(cls, timing: Mapping, block_size: int, source: str) -> TimingModel:
        """Validate a `timing:` mapping (errors name `timing.<key>` and `source`)."""
        return cls(parse_timing(timing, source), block_size)

    @classmethod
    def from_device_config(cls, cfg) -> TimingModel:
        return cls.from_config(cfg.timing, cfg.block_size, cfg.source_of("timing"))

    def reset(self) -> None:
        """Every resource idle at time 0, write log empty."""
        self.state[:] = 0.0

    # Python-side conveniences (control plane, tests); hot paths call the kernels.
    def charge_access(self, issue_ns: float, is_write: bool, host_bytes: int, fills=None, writebacks=None,
                      hit_ready_ns: float = 0.0, through_bytes: int = 0) -> float:
        fills = _rows(fills)
        writebacks = _rows(writebacks)
        return K.charge_access(self.params, self.state, float(issue_ns), bool(is_write), int(host_bytes),
                               fills, fills.shape[0], writebacks, writebacks.shape[0],
                               float(hit_ready_ns), int(through_bytes))

    def charge_background_read(self, issue_ns: float, fills, writebacks=None) -> float:
        fills, writebacks = _rows(fills), _rows(writebacks)
        return K.charge_background_read(self.params, self.state, float(issue_ns), fills, fills.shape[0],
                                        writebacks, writebacks.shape[0])

    def charge_background_write(self, issue_ns: float, writebacks) -> float:
        writebacks = _rows(writebacks)
        return K.charge_background_write(self.params, self.state, float(issue_ns), writebacks, writebacks.shape[0])

    def charge_flush(self, issue_ns: float) -> float:
        return K.charge_flush(self.params, self.state, float(issue_ns))

    def stats(self) -> dict:
        """Model counters: NAND page reads/programs, write-buffer stall time."""
        return {
            "nand_page_reads": int(self.state[K.S_NAND_PAGE_READS]),
            "nand_page_programs": int(self.state[K.S_NAND_PAGE_PROGRAMS]),
            "write_stall_ns": float(self.state[K.S_WRITE_STALL_NS]),
            "durable_ns": float(self.state[K.S_LAST_PROGRAM_END]),
        }

    # ------------------------------------------------------------ closed forms
    def hit_read_latency_ns(self, nbytes: int) -> float:
        """Unloaded read served from device DRAM."""
        p = self.settings
        return 2 * p.link_latency + p.controller_latency + p.dram_latency + nbytes / p.dram_bandwidth * 1e9 \
            + nbytes / p.link_bandwidth * 1e9

    def miss_read_latency_ns(self, nbytes: int) -> float:
        """Unloaded read of `nbytes` (within one NAND page) fetched from NAND: the QD1
        random-read latency of the SSD path. = hit path + FTL + tR + channel transfer +
        landing in DRAM."""
        p = self.settings
        return self.hit_read_latency_ns(nbytes) + p.ssd_command_latency + p.nand_read_latency \
            + nbytes / p.nand_channel_rate * 1e9 + p.dram_latency + nbytes / p.dram_bandwidth * 1e9

    def random_read_iops_limit(self, nbytes: int) -> float:
        """Saturation of small random reads spread evenly: the dies (one tR each) or the
        channels (one transfer each), whichever is lower."""
        p = self.settings
        return min(p.dies / p.nand_read_latency * 1e9,
                   p.nand_channels * p.nand_channel_rate / nbytes)

    def sequential_read_bandwidth_limit(self) -> float:
        """Bytes/s of large reads from NAND: channels, dies (a page per tR), the link,
        or device DRAM (each byte lands in DRAM and is read out again)."""
        p = self.settings
        return min(p.nand_channels * p.nand_channel_rate, p.dies * p.nand_page_size / p.nand_read_latency * 1e9,
                   p.link_bandwidth, p.dram_bandwidth / 2)

    def write_back_bandwidth_limit(self) -> float:
        """Bytes/s of sustained write-backs: each die programs a page per tPROG (cache
        program: the next page crosses the channel while the die programs), unless the
        channels or device DRAM are slower."""
        p = self.settings
        return min(p.dies * p.nand_page_size / p.nand_program_latency * 1e9,
                   p.nand_channels * p.nand_channel_rate, p.dram_bandwidth)


def _rows(rows) -> np.ndarray:
    if rows is None:
        return np.zeros((0, 4), np.int64)
    rows = np.ascontiguousarray(rows, np.int64)
    if rows.ndim != 2 or rows.shape[1] != 4:
        raise ValueError("I/O rows must be an (n, 4) int64 array [buf, len, offset, write]")
    return rows
