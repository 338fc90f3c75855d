"""Compiled closed-loop drivers: `qd` host streams, each issuing its next access when
the previous one completes (fio's iodepth). Used by calibration, the closed-form tests
and the benches; the trace simulator has its own loop over the firmware planner.

Accesses are charged in order of issue time (ties: lower stream first), which is the
order the busy-until timelines need to serve them first come, first served.
"""
from __future__ import annotations

import numpy as np

from cxlhm.jit import njit
from cxlhm.timing.kernels import charge_access

_NO_ROWS = np.zeros((0, 4), np.int64)


@njit(inline="always")
def _less(times, ids, a, b):
    return times[a] < times[b] or (times[a] == times[b] and ids[a] < ids[b])


@njit
def _sift_down(times, ids, n, i):
    while True:
        left = 2 * i + 1
        if left >= n:
            return
        child = left
        if left + 1 < n and _less(times, ids, left + 1, left):
            child = left + 1
        if not _less(times, ids, child, i):
            return
        times[i], times[child] = times[child], times[i]
        ids[i], ids[child] = ids[child], ids[i]
        i = child


@njit(refcounts=True)  # (it allocates its streams' heap)
def closed_loop_reads(params, state, offsets, lengths, from_nand, qd, latency_out):
    """Read op i = [offsets[i], +lengths[i]) of SSD bytes, from NAND when from_nand[i]
    (a device-DRAM miss whose fill is exactly that extent, as a raw SSD read is) or from
    device DRAM otherwise (a hit). Ops go out in order over `qd` streams starting at 0.
    Writes per-op latency (ns) to latency_out; returns the last completion (ns)."""
    n = offsets.shape[0]
    streams = min(qd, n)
    times = np.zeros(streams, np.float64)  # heap of each stream's next issue time
    ids = np.arange(streams)
    fill = np.zeros((1, 4), np.int64)
    makespan = 0.0
    for i in range(n):
        issue = times[0]
        fill[0, 1] = lengths[i]
        fill[0, 2] = offsets[i]
        n_fill = 1 if from_nand[i] else 0
        done = charge_access(params, state, issue, False, lengths[i], fill, n_fill, _NO_ROWS, 0, 0.0, 0)
        latency_out[i] = done - issue
        makespan = max(makespan, done)
        times[0] = done
        _sift_down(times, ids, streams, 0)
    return makespan
