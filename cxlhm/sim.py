"""Trace-driven mode: replay a block-access trace through a policy's compiled firmware.

This is the device's own planner (`firmware.kernels_for(policy).plan`) with data movement
switched off: no DRAM arena, no SSD, no copies. Each trace entry is one single-block
access, so the firmware's logical clock (`now`) equals the trace index - which is how
offline policies (Belady) index the trace's next-use array.

The whole replay is one compiled loop (a chunk of the trace per call, so a progress bar
can advance and Ctrl-C works between chunks); no Python runs per access.

    result = simulate("s3fifo", blocks, n_slots=1000, params={"small_ratio": 0.1})
    result.misses, result.miss_ratio

    sim = Simulator("lru", 1000)        # the same, fed in pieces, state inspectable
    sim.replay(blocks[:500]); sim.bt.block; sim.replay(blocks[500:]); sim.result()
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numba
import numpy as np

import firmware_policies
from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm.media.ssd import IO_FIELDS
from cxlhm.traces.blocktrace import next_use as next_use_of
from firmware_policies.base import Policy

CHUNK = 1 << 20  # accesses per compiled call


class SimulationError(RuntimeError):
    """The policy could not place a block (its victim hook found no evictable slot)."""


@dataclasses.dataclass(frozen=True)
class SimResult:
    policy: str
    n_slots: int
    params: dict
    accesses: int
    hits: int
    misses: int
    evictions: int
    writebacks: int
    counters: dict  # every device counter, by name
    wall_s: float  # replay time (wall clock; not part of the deterministic result)

    @property
    def miss_ratio(self) -> float:
        return self.misses / self.accesses if self.accesses else 0.0

    @property
    def accesses_per_s(self) -> float:
        return self.accesses / self.wall_s if self.wall_s > 0 else float("inf")


def _build_replay(kernels: fw.Kernels):
    plan, finish = kernels.plan, fw.finish

    # Compiled without numba's reference counting: the loop only reads and writes
    # arrays its caller owns, and incref/decref of every block-table array around
    # each per-access call would otherwise cost more than the access itself.
    @_njit_without_refcounts
    def replay(bt, ps, counters, clock, blocks, writes, write_mode, start, stop, scratch):
        """Run accesses [start, stop). Returns stop, or the index of the access that
        found no evictable slot."""
        ext_hpa, ext_len, slots, installed, writebacks, fills = scratch
        for i in range(start, stop):
            ext_hpa[0] = blocks[i]
            # ---- one access through the firmware: the timing model hooks in here ----
            ok, k, n_wb, n_fill = plan(bt, ps, counters, clock, ext_hpa, ext_len, writes[i], write_mode,
                                       0, 0, 1, slots, installed, writebacks, fills)
            finish(bt, slots, k)
            # --------------------------------------------------------------------------
            if not ok:
                return i
        return stop

    return replay


def _njit_without_refcounts(fn):
    try:
        return numba.njit(nogil=True, _nrt=False)(fn)
    except (KeyError, TypeError):  # a numba without the private flag: correct, just slower
        return numba.njit(nogil=True)(fn)


def _scratch() -> tuple:
    """One single-block access's buffers (block_size is 1, so an access is one block)."""
    return (np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.uint8),
            np.zeros((1, IO_FIELDS), np.int64), np.zeros((1, IO_FIELDS), np.int64))


_REPLAYS: dict[int, Callable] = {}


def _replay_for(policy: Policy) -> Callable:
    key = id(policy)
    if key not in _REPLAYS:
        _REPLAYS[key] = _build_replay(fw.kernels_for(policy))
    return _REPLAYS[key]


class Simulator:
    """A policy's firmware over `n_slots` DRAM slots, fed accesses with `replay`.

    Its block table (`bt`), policy state (`ps`), counters and clock persist across
    `replay` calls, so a trace can be fed in pieces and inspected in between. Offline
    policies read `next_use`, indexed by the clock (computed by `simulate` when needed)."""

    def __init__(self, policy: str | Policy, n_slots: int, *, params: Mapping[str, Any] | None = None,
                 write_mode: str | None = None, next_use: np.ndarray | None = None):
        self.policy = firmware_policies.get(policy) if isinstance(policy, str) else policy
        self.params = self.policy.resolve_params(params)
        if isinstance(n_slots, bool) or not isinstance(n_slots, (int, np.integer)) or n_slots < 1:
            raise ValueError(f"n_slots must be a positive integer, got {n_slots!r}")
        self.n_slots = int(n_slots)
        mode = write_mode or self.policy.write_mode
        if mode not in fw.WRITE_MODE_CODES:
            raise ValueError(f"write_mode must be one of {', '.join(fw.WRITE_MODE_CODES)}, got {mode!r}")
        self._write_mode = fw.WRITE_MODE_CODES[mode]
        self.bt = btm.new_block_table(self.n_slots)
        if self.policy.needs_future:
            if next_use is None:
                raise ValueError(f"policy {self.policy.name!r} is offline: give the trace's next_use array")
            self.ps = self.policy.make_state(self.n_slots, self.params, np.ascontiguousarray(next_use, np.int64))
        else:
            self.ps = self.policy.make_state(self.n_slots, self.params)
        self.counters = C.new_counters()
        self.clock = np.zeros(1, np.int64)
        self.accesses = 0
        self.wall_s = 0.0
        self._replay = _replay_for(self.policy)
        self._scratch = _scratch()

    def replay(self, blocks: Any, writes: Any = None, progress: Callable[[int], None] | None = None) -> None:
        """Run one single-block access per entry of `blocks` (write where `writes` is true)."""
        blocks = np.ascontiguousarray(blocks, np.int64)
        if blocks.ndim != 1:
            raise ValueError("blocks must be a 1-D array of block ids")
        if blocks.size and blocks.min() < 0:
            raise ValueError(f"block ids must be non-negative; got {int(blocks.min())}")
        writes = np.zeros(blocks.shape[0], np.bool_) if writes is None else np.ascontiguousarray(writes, np.bool_)
        if writes.shape != blocks.shape:
            raise ValueError(f"writes has {writes.shape[0]} entries for {blocks.shape[0]} accesses")
        started = time.perf_counter()
        n = blocks.shape[0]
        try:
            for start in range(0, n, CHUNK):
                stop = min(n, start + CHUNK)
                done = self._replay(self.bt, self.ps, self.counters, self.clock, blocks, writes, self._write_mode,
                                    start, stop, self._scratch)
                self.accesses += done - start
                if done != stop:
                    raise SimulationError(f"policy {self.policy.name!r} found no evictable slot at access "
                                          f"{self.accesses} (block {int(blocks[done])}) with {self.n_slots} slots")
                if progress is not None:
                    progress(stop - start)
        finally:
            self.wall_s += time.perf_counter() - started

    @property
    def resident_blocks(self) -> int:
        return self.n_slots - int(self.bt.scalars[btm.N_FREE])

    def result(self) -> SimResult:
        named = C.as_dict(self.counters)
        return SimResult(policy=self.policy.name, n_slots=self.n_slots, params=self.params, accesses=self.accesses,
                         hits=named["hits"], misses=named["misses"], evictions=named["evictions"],
                         writebacks=named["writebacks"], counters=named, wall_s=self.wall_s)


def simulate(policy: str | Policy, blocks: Any, n_slots: int, *, writes: Any = None,
             params: Mapping[str, Any] | None = None, write_mode: str | None = None,
             next_use: np.ndarray | None = None, progress: Callable[[int], None] | None = None) -> SimResult:
    """Replay `blocks` (block ids, one access each) through `policy` with `n_slots` DRAM slots.

    `writes` marks write accesses (default: all reads). `next_use` is only read by
    offline policies and is computed from `blocks` when not given. `progress(n)` is
    called after every chunk with the number of accesses it ran."""
    policy = firmware_policies.get(policy) if isinstance(policy, str) else policy
    blocks = np.ascontiguousarray(blocks, np.int64)
    if policy.needs_future and next_use is None:
        next_use = next_use_of(blocks)
    elif next_use is not None and len(next_use) != len(blocks):
        raise ValueError(f"next_use has {len(next_use)} entries for {len(blocks)} accesses")
    sim = Simulator(policy, n_slots, params=params, write_mode=write_mode, next_use=next_use)
    sim.replay(blocks, writes, progress)
    return sim.result()
