"""The device's model clock (`clock: model`): every host access and every piece of
background work is charged to the timing model (cxlhm/timing) in issue order, so
results depend only on the configuration, the seed and the trace - never on the
machine the emulation runs on.

Time only moves when the host says so: a synchronous access issues at the current
time and the clock moves to its completion; an access or a hint may also name its
issue time (a replayed trace, an fio job with iodepth > 1), and the idle gap before it
is given to the firmware's background work (Device.advance_to).
"""
from __future__ import annotations

import numpy as np

from cxlhm import counters as C
from cxlhm.jit import njit
from cxlhm.timing import TimingModel, charge_access, charge_background_read, charge_background_write


@njit
def _ready_of_hits(slot_ready, slots, installed, k, issue_ns, counters):
    """Latest landing time of prefetched blocks this access hits; counts late prefetches
    (hit while still in flight) and the time the host waited for them."""
    ready = 0.0
    for i in range(k):
        if installed[i]:
            continue
        r = slot_ready[slots[i]]
        if r > issue_ns:
            counters[C.PREFETCH_LATE] += 1
            counters[C.PREFETCH_LATE_NS] += np.int64(r - issue_ns)
            if r > ready:
                ready = r
    return ready


@njit
def _set_ready(slot_ready, slots, k, when):
    for i in range(k):
        slot_ready[slots[i]] = when


class ModelClock:
    """The model clock's time (`now_ns`: when the last operation issued so far completes)
    and the charges that move it, each made to the device's timing model."""

    def __init__(self, timing: TimingModel, n_slots: int):
        self.timing = timing
        self.now_ns = 0.0
        self.slot_ready = np.zeros(n_slots, np.float64)  # when a prefetched slot's bytes land

    def issue(self, issue_ns: float | None) -> float:
        """The issue time of the next operation: `issue_ns`, never before the clock."""
        if issue_ns is not None and issue_ns > self.now_ns:
            self.now_ns = float(issue_ns)
        return self.now_ns

    def charge_access(self, issue_ns, is_write, host_bytes, fills, n_fill, writebacks, n_wb,
                      slots, installed, k, through_bytes, counters) -> float:
        hit_ready = _ready_of_hits(self.slot_ready, slots, installed, k, issue_ns, counters)
        done = charge_access(self.timing.params, self.timing.state, issue_ns, is_write, host_bytes,
                             fills, n_fill, writebacks, n_wb, hit_ready, through_bytes)
        return done

    def charge_prefetch(self, issue_ns, fills, n_fill, writebacks, n_wb, slots, k) -> float:
        done = charge_background_read(self.timing.params, self.timing.state, issue_ns, fills, n_fill, writebacks, n_wb)
        _set_ready(self.slot_ready, slots, k, done)
        return done

    def charge_write_back(self, issue_ns, rows, n) -> float:
        return charge_background_write(self.timing.params, self.timing.state, issue_ns, rows, n)
