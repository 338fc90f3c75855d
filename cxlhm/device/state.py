"""The state the device's parts share, in one object the device makes once.

Every part of the device (the access path, streamed I/O, write-behind, write-back
waves, write-back and flush, background work, power loss) reads and changes the same
firmware state: the block table, the policy's state, the counters, the logical tick,
all under one lock. `DeviceState` holds exactly that, plus what the configuration
fixes for the device's life and the per-thread scratch; each part gets it in its
constructor, with the few other parts it calls, and owns everything else it keeps.

The lock guards the block table, policy state, counters, poison and checksum tables,
and the in-flight counts here; it is not re-entrant, so releasing it around I/O means
what it says (public methods take it, their `_locked` variants expect it held).
"""
from __future__ import annotations

import time

import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm import policies as firmware_policies
from cxlhm.config import ConfigError, DeviceConfig
from cxlhm.device.errors import DeviceClosed, DeviceFull
from cxlhm.device.footprint import check_fits_in_memory
from cxlhm.device.lock import DeviceLock
from cxlhm.device.media import MediaPath
from cxlhm.device.scratch import Scratch, ThreadState
from cxlhm.media.dram import DeviceDram
from cxlhm.modelclock import ModelClock
from cxlhm.timing import LatencyRecorder, TimingModel

MAX_BATCH_BLOCKS = 4096  # blocks planned per firmware pass (bounds the scratch arrays)


class DeviceState:
    """The firmware state, the lock over it, and the configuration's constants."""

    def __init__(self, cfg: DeviceConfig):
        self.cfg = cfg
        self.capacity, self.block_size = cfg.capacity, cfg.block_size
        self.n_slots = cfg.dram_slots
        try:
            self.policy = firmware_policies.get(cfg.firmware.policy)
        except firmware_policies.UnknownPolicy as exc:
            raise ConfigError(cfg.source_of("firmware.policy"), "firmware.policy", str(exc)) from None
        try:
            self.params = self.policy.resolve_params(cfg.firmware.params)
        except firmware_policies.PolicyParamError as exc:
            raise ConfigError(cfg.source_of("firmware.params"), "firmware.params", str(exc)) from None
        self.write_mode = cfg.firmware.write_mode or self.policy.write_mode
        self.write_mode_code = fw.WRITE_MODE_CODES[self.write_mode]
        self.moves_data = cfg.data == "real"
        self.batch = min(self.n_slots, MAX_BATCH_BLOCKS)  # the most blocks one pass's scratch holds

        check_fits_in_memory(cfg)  # before anything sized by DRAM is allocated
        self.bt = btm.new_block_table(self.n_slots)
        self.ps = self.policy.make_state(self.n_slots, self.params)
        self.counters = C.new_counters()
        self.ticks = np.zeros(1, np.int64)  # the firmware's logical clock: one tick per block access
        self.kernels = fw.kernels_for(self.policy)
        self.timing_model = TimingModel.from_device_config(cfg)  # validated even on the wall clock
        # the model clock (clock: model) charges every access to the timing model; None on the wall clock
        self.model_clock = ModelClock(self.timing_model, self.n_slots) if cfg.clock == "model" else None
        self.t0_ns = time.monotonic_ns()  # the wall clock's origin for the policy's NOW_NS
        # model clock: when the last background work (a round, a prefetch, a write-back) is done
        self.background_done_ns = 0.0
        self.latency: LatencyRecorder | None = None  # per-access latencies, when recorded

        # Planner scratch is per host thread: another thread plans while this one waits
        # for its fills with the lock released (the access path's fill_and_copy).
        self.threads = ThreadState()
        self.lock = DeviceLock()  # (counts its waiters: a stream's slice goes on while there are none)
        self.idle = self.lock.idle  # notified by every access that released the lock, when its slots stop being BUSY
        self.inflight = 0  # accesses (and streams) with BUSY slots and the lock released
        self.inflight_slots = 0  # slots they hold BUSY
        self.closed = False
        self.power_lost = False  # the power went: nothing more reaches the back end or the integrity log

        self.dram = DeviceDram(self.n_slots, self.block_size, data=self.moves_data)
        self.media = MediaPath(None, self.block_size, cfg.backend.retries, self.counters, self.dram)

    @property
    def can_stream(self) -> bool:
        """Whether I/O may be streamed (stream_io): not on the model clock (it charges
        each access whole, in issue order), nor without data, nor on a back end without
        asynchronous I/O (injected faults too)."""
        return self.model_clock is None and self.moves_data and self.media.ssd.caps.async_io

    def scratch(self) -> Scratch:
        """The calling thread's planner scratch."""
        s = self.threads.scratch
        if s is None:
            s = self.threads.scratch = Scratch(self.batch)
        return s

    def batch_limit(self) -> int:
        """Blocks one firmware pass may touch: every one needs a slot it can hold busy."""
        if self.closed:
            raise DeviceClosed("the device is closed")
        limit = min(self.batch, self.n_slots - int(self.bt.scalars[btm.N_PINNED]))
        if limit <= 0:
            raise DeviceFull("every device-DRAM slot is pinned; unpin something first")
        return limit

    def sync_time(self) -> None:
        """Policies read the time (deadlines, pauses) from the block table."""
        if self.model_clock is not None:
            self.bt.scalars[btm.NOW_NS] = int(self.model_clock.now_ns)
        else:
            self.bt.scalars[btm.NOW_NS] = time.monotonic_ns() - self.t0_ns
