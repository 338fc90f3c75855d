"""Trace-driven mode: replay a block-access trace through a policy's compiled firmware.

This is the device's own planner (`firmware.kernels_for(policy).plan`) with data movement
switched off: no DRAM arena, no SSD, no copies. Each trace entry is one single-block
access, so the firmware's logical clock (`now`) equals the trace index - which is how
offline policies (Belady) index the trace's next-use array.

The whole replay is one compiled loop (a chunk of the trace per call, so a progress bar
can advance and Ctrl-C works between chunks); no Python runs per access. The loop is
per-policy glue (cxlhm/sim_kernels.py, compiled once per install): since the trace is
in memory, it prefetches the index bucket and the slot's table rows of the accesses a
few steps ahead, which is where a replay's time goes (cache misses, one random slot per
access).

    result = simulate("s3fifo", blocks, n_slots=1000, params={"small_ratio": 0.1})
    result.misses, result.miss_ratio

    sim = Simulator("lru", 1000)        # the same, fed in pieces, state inspectable
    sim.replay(blocks[:500]); sim.bt.block; sim.replay(blocks[500:]); sim.result()

With `timing` (a profile name, a TimingModel or a mapping of `timing:` keys) every access
is also charged to the timing model inside the same compiled loop, as a Device with
`clock: model, data: none` charges it: closed loop at QD1 (each access issues when the
previous one completes) or open loop (`issue_ns`, e.g. a trace's timestamps). Blocks
are then `block_size` bytes (the profile's unless given) and the result carries
model-clock time and latency percentiles (`SimResult.timing`):

    r = simulate("lru", blocks, 1000, timing="cmm-h")
    r.timing["model_ns"], r.timing["p99_ns"]
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from pathlib import Path

import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm import policies
from cxlhm.config import load_config
from cxlhm.media.ssd import IO_FIELDS
from cxlhm.policies import Policy
from cxlhm.timing import LatencyRecorder, TimingModel
from cxlhm.traces.blocktrace import next_use as next_use_of

CHUNK = 1 << 20  # accesses per compiled call
LATENCY_SAMPLES = 1 << 20  # latency records kept by default (an evenly spaced sample beyond that)
MAX_QUEUE_DEPTH = 4096  # closed-loop accesses in flight (NVMe queues hold at most 64Ki; fio's limit is 65536)
PERCENTILES = {"p50_ns": 50.0, "p90_ns": 90.0, "p99_ns": 99.0, "p999_ns": 99.9}

# The timed loop's clock array: the model clock (when the next closed-loop access issues,
# never before the latest issue time) and the latest completion so far.
T_NOW, T_END, N_TCLOCK = range(3)


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
    # Model-clock results when the simulator has a timing model (None otherwise), all
    # bit-identical run to run: model_ns (the latest completion), mean_ns, min_ns,
    # max_ns, p50_ns, p90_ns, p99_ns, p999_ns, latencies (accesses recorded),
    # sampled (records the percentiles come from), sample_every, block_size, loop
    # ("closed" or "open"), and the model's nand_page_reads, nand_page_programs,
    # write_stall_ns, durable_ns.
    timing: dict | None = None

    @property
    def miss_ratio(self) -> float:
        return self.misses / self.accesses if self.accesses else 0.0



def _scratch() -> tuple:
    """One single-block access's buffers (block_size is 1, so an access is one block)."""
    return (np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.uint8),
            np.zeros((1, IO_FIELDS), np.int64), np.zeros((1, IO_FIELDS), np.int64))


_TEMPLATE = Path(__file__).with_name("sim_kernels.py")


def _replay_for(policy: Policy, timed: bool = False) -> Callable:
    """`policy`'s replay loop (cxlhm/sim_kernels.py through the glue generator, so it is
    compiled once per install for a registered policy)."""
    module = fw.policy_module(_TEMPLATE, "sim", policy, f"the {policy.name} trace replay")
    return module.replay_timed if timed else module.replay


def _leaves(tree) -> list[np.ndarray]:
    if isinstance(tree, np.ndarray):
        return [tree]
    if isinstance(tree, tuple):
        return [leaf for child in tree for leaf in _leaves(child)]
    return []


def slot_rows(bt: btm.BlockTable, ps: tuple, n_slots: int) -> np.ndarray:
    """(address, row stride) of every array the planner reads at a hit's slot: the block
    table's flags and stamp and each array of the policy state with one row per slot
    (the replay prefetches a slot's rows ahead of its access, cxlhm/sim_kernels.py).
    The arrays must outlive the replay (the Simulator holds them)."""
    arrays = [bt.flags, bt.stamp, *(a for a in _leaves(ps) if a.ndim >= 1 and a.shape[0] == n_slots)]
    return np.array([(a.ctypes.data, a.strides[0]) for a in arrays], np.int64).reshape(-1, 2)


def timing_model(timing: str | os.PathLike | TimingModel | Mapping[str, Any]) -> TimingModel:
    """A TimingModel from a profile name (or YAML path), a mapping of `timing:` keys
    (overrides on the default profile's), or a TimingModel (returned as is)."""
    if isinstance(timing, TimingModel):
        return timing
    if isinstance(timing, Mapping):
        return TimingModel.from_device_config(load_config({"timing": dict(timing)}))
    if isinstance(timing, (str, os.PathLike)):
        return TimingModel.from_device_config(load_config(timing))
    raise TypeError(f"timing must be a profile name, a TimingModel or a mapping of timing keys, got {timing!r}")


class Simulator:
    """A policy's firmware over `n_slots` DRAM slots, fed accesses with `replay`.

    Its block table (`bt`), policy state (`ps`), counters and clock persist across
    `replay` calls, so a trace can be fed in pieces and inspected in between. Offline
    policies read `next_use`, indexed by the clock (computed by `simulate` when needed).

    `timing` (a profile name such as "cmm-h", a mapping of `timing:` keys over the
    default profile's, or a TimingModel, charged in place) charges every access to the
    timing model in the compiled loop; `block_size` (default: the profile's, or the
    TimingModel's) is the bytes per block. `queue_depth` (closed loop only): accesses in
    flight - access i issues when access i - queue_depth completed, so QD1 is one after the
    other. `latency_samples` bounds the latency records
    kept for percentiles (beyond it an evenly spaced, deterministic sample is kept; see
    cxlhm/timing/recorder.py). The model clock, the model's timelines and the records
    persist across `replay` calls like the rest of the state."""

    def __init__(self, policy: str | Policy, n_slots: int, *, params: Mapping[str, Any] | None = None,
                 write_mode: str | None = None, next_use: np.ndarray | None = None,
                 timing: str | TimingModel | Mapping[str, Any] | None = None, block_size: int | None = None,
                 latency_samples: int = LATENCY_SAMPLES, queue_depth: int = 1):
        self.policy = policies.get(policy) if isinstance(policy, str) else policy
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
        self._scratch = _scratch()
        self._rows = slot_rows(self.bt, self.ps, self.n_slots)
        self.timing: TimingModel | None = None
        self.latency: LatencyRecorder | None = None
        self._open_loop = False
        if timing is None:
            if block_size is not None:
                raise ValueError("block_size only matters with a timing model (timing=...)")
            self._replay = _replay_for(self.policy)
            return
        self.timing = timing_model(timing)
        bs = self.timing.block_size if block_size is None else block_size
        if isinstance(bs, bool) or not isinstance(bs, (int, np.integer)) or bs < 1:
            raise ValueError(f"block_size must be a positive number of bytes, got {bs!r}")
        self.block_size = int(bs)
        self.latency = LatencyRecorder(latency_samples)
        self._tclock = np.zeros(N_TCLOCK, np.float64)
        if isinstance(queue_depth, bool) or not isinstance(queue_depth, (int, np.integer)) or \
                not 1 <= queue_depth <= MAX_QUEUE_DEPTH:
            raise ValueError(f"queue_depth must be an integer from 1 to {MAX_QUEUE_DEPTH}, got {queue_depth!r}")
        self.queue_depth = int(queue_depth)
        self._ring = np.zeros(self.queue_depth, np.float64)  # completion times of the accesses in flight
        self._replay = _replay_for(self.policy, timed=True)

    def replay(self, blocks: Any, writes: Any = None, progress: Callable[[int], None] | None = None,
               issue_ns: Any = None) -> None:
        """Run one single-block access per entry of `blocks` (write where `writes` is true).

        With a timing model, `issue_ns` (one per access, ns on the model clock, e.g. a
        trace's timestamps) makes the loop open: each access issues then (or when the
        previous one issued, if later - as the Device's clock never goes back), whether
        or not earlier ones completed. Without it each access issues when the previous
        one completed (QD1)."""
        blocks = np.ascontiguousarray(blocks, np.int64)
        if blocks.ndim != 1:
            raise ValueError("blocks must be a 1-D array of block ids")
        if blocks.size and blocks.min() < 0:
            raise ValueError(f"block ids must be non-negative; got {int(blocks.min())}")
        writes = np.zeros(blocks.shape[0], np.bool_) if writes is None else np.ascontiguousarray(writes, np.bool_)
        if writes.shape != blocks.shape:
            raise ValueError(f"writes has {writes.shape[0]} entries for {blocks.shape[0]} accesses")
        if self.timing is None:
            if issue_ns is not None:
                raise ValueError("issue_ns needs a timing model (timing=...)")
            self._run(blocks, progress, lambda start, stop: self._replay(
                self.bt, self.ps, self.counters, self.clock, blocks, writes, self._write_mode, start, stop,
                self._scratch, self._rows))
            return
        if blocks.size and int(blocks.max()) > np.iinfo(np.int64).max // self.block_size - 1:
            raise ValueError(f"block id {int(blocks.max())} times block_size {self.block_size} overflows int64")
        open_loop = issue_ns is not None
        if open_loop:
            issue_ns = np.ascontiguousarray(issue_ns, np.float64)
            if issue_ns.shape != blocks.shape:
                raise ValueError(f"issue_ns has {issue_ns.size} entries for {blocks.shape[0]} accesses")
            if issue_ns.size and not (np.isfinite(issue_ns).all() and issue_ns.min() >= 0):
                raise ValueError("issue_ns must be finite, non-negative times in ns")
            self._open_loop = True
        else:
            issue_ns = np.zeros(0, np.float64)
        t = self.timing
        self._run(blocks, progress, lambda start, stop: self._replay(
            self.bt, self.ps, self.counters, self.clock, blocks, writes, self._write_mode, start, stop,
            self._scratch, self._rows, self.block_size, t.params, t.state, self._tclock, issue_ns, open_loop, self._ring,
            self.accesses - start, self.latency.values, self.latency.meta))

    def _run(self, blocks: np.ndarray, progress, run_chunk) -> None:
        started = time.perf_counter()
        n = blocks.shape[0]
        try:
            for start in range(0, n, CHUNK):
                stop = min(n, start + CHUNK)
                done = run_chunk(start, stop)
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

    @property
    def model_now_ns(self) -> float:
        """The model clock (when a closed-loop access would issue next); 0 without timing."""
        return float(self._tclock[T_NOW]) if self.timing is not None else 0.0

    @property
    def latencies(self) -> np.ndarray:
        """The recorded per-access latencies (ns, in access order): all of them while
        there are at most `latency_samples`, else an evenly spaced sample."""
        if self.latency is None:
            raise ValueError("no timing model: latencies are recorded with timing=...")
        return self.latency.samples

    def timing_result(self) -> dict | None:
        if self.timing is None:
            return None
        rec = self.latency
        pct = rec.percentiles(tuple(PERCENTILES.values()))
        summary = rec.summary(())
        out = {"model_ns": float(self._tclock[T_END]), "mean_ns": summary["mean"], "min_ns": summary["min"],
               "max_ns": summary["max"]}
        out.update({name: pct[p] for name, p in PERCENTILES.items()})
        out.update(latencies=rec.count, sampled=int(rec.samples.size), sample_every=rec.every,
                   block_size=self.block_size, loop="open" if self._open_loop else "closed",
                   queue_depth=None if self._open_loop else self.queue_depth)
        out.update(self.timing.stats())
        return out

    def result(self) -> SimResult:
        named = C.as_dict(self.counters)
        return SimResult(policy=self.policy.name, n_slots=self.n_slots, params=self.params, accesses=self.accesses,
                         hits=named["hits"], misses=named["misses"], evictions=named["evictions"],
                         writebacks=named["writebacks"], counters=named, wall_s=self.wall_s,
                         timing=self.timing_result())


def simulate(policy: str | Policy, blocks: Any, n_slots: int, *, writes: Any = None,
             params: Mapping[str, Any] | None = None, write_mode: str | None = None,
             next_use: np.ndarray | None = None, progress: Callable[[int], None] | None = None,
             timing: str | TimingModel | Mapping[str, Any] | None = None, block_size: int | None = None,
             issue_ns: Any = None, latency_samples: int = LATENCY_SAMPLES, queue_depth: int = 1) -> SimResult:
    """Replay `blocks` (block ids, one access each) through `policy` with `n_slots` DRAM slots.

    `writes` marks write accesses (default: all reads). `next_use` is only read by
    offline policies and is computed from `blocks` when not given. `progress(n)` is
    called after every chunk with the number of accesses it ran. `timing`, `block_size`,
    `latency_samples`, `queue_depth`: see Simulator; `issue_ns`: see Simulator.replay."""
    policy = policies.get(policy) if isinstance(policy, str) else policy
    blocks = np.ascontiguousarray(blocks, np.int64)
    if policy.needs_future and next_use is None:
        next_use = next_use_of(blocks)
    elif next_use is not None and len(next_use) != len(blocks):
        raise ValueError(f"next_use has {len(next_use)} entries for {len(blocks)} accesses")
    sim = Simulator(policy, n_slots, params=params, write_mode=write_mode, next_use=next_use, timing=timing,
                    block_size=block_size, latency_samples=latency_samples, queue_depth=queue_depth)
    sim.replay(blocks, writes, progress, issue_ns=issue_ns)
    return sim.result()
