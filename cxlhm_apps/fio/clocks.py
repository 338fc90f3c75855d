"""The clocks a cxlhm-fio job can run on.

A job asks its clock what time it is (runtime, ramp time and the bandwidth sample
windows are measured in it); the engine measures each I/O's latency on it.

- WallClock: CLOCK_MONOTONIC. An I/O's latency is the time from its device call to
  that call's return.
- ModelTimeScheduler (``cxlhm_clock=model``, the device opened with ``clock: model``):
  time is the device's timing model (the device's own model clock, read through the
  handle's ModelClockDevice interface); this class only takes the jobs on one device in
  turns. A job with iodepth N is an event loop over N outstanding
  I/Os (ModelLoop): each new I/O is issued at the completion time of the one it
  replaces, and its latency is what the timing model charged for it. Same job, seed
  and device config = bit-identical results, on any machine; the runner never sleeps.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable


class ClockUnavailable(RuntimeError):
    pass


class WallClock:
    name = "wall"

    def now_ns(self) -> int:
        return time.monotonic_ns()


class ModelTimeScheduler:
    """The model time of one device, shared by every job (clone) that uses it: the jobs'
    clock, and the scheduler that takes their I/Os in issue-time order.

    The device needs its accesses in non-decreasing issue time. One job's loop issues
    in that order by construction; several jobs on one device take turns: the loop
    whose next issue time is the earliest (ties: the loop opened first) goes next, so
    the interleaving - and every result - is the same on every run."""
    name = "model"

    def __init__(self, handle):
        self.handle = handle  # host_runtime.driver.DeviceHandle of a device with caps.model_clock
        self._turn = threading.Condition()
        self._next: dict[int, tuple[float, int]] = {}  # loop id -> (next issue time, id)
        self._ids = itertools.count()

    def now_ns(self) -> float:
        return self.handle.now_ns()

    def open_loop(self, iodepth: int) -> "ModelLoop":
        with self._turn:
            loop = ModelLoop(self, next(self._ids), iodepth, self.handle.now_ns())
            self._next[loop.id] = (loop.next_issue_ns(), loop.id)
            return loop

    def _issue(self, loop: "ModelLoop", access: Callable[[float], float]) -> float:
        with self._turn:
            key = (loop.next_issue_ns(), loop.id)
            while len(self._next) > 1 and min(self._next.values()) != key:
                self._turn.wait()
            t = key[0]
            latency = access(t)  # under the turn: no other job issues before this one is charged
            loop._completed(t, latency)
            self._next[loop.id] = (loop.next_issue_ns(), loop.id)
            if len(self._next) > 1:
                self._turn.notify_all()
            return latency

    def _close(self, loop: "ModelLoop") -> None:
        with self._turn:
            if self._next.pop(loop.id, None) is not None:
                self._turn.notify_all()  # the others no longer wait for this one


class ModelLoop:
    """One job's event loop on the model clock: `iodepth` I/O slots, each holding the
    completion time of its latest I/O; the next I/O goes to the slot that frees first,
    at that time (so issue times never decrease)."""

    def __init__(self, clock: ModelTimeScheduler, loop_id: int, iodepth: int, start_ns: float):
        self.clock, self.id = clock, loop_id
        self._free = [float(start_ns)] * max(1, iodepth)  # equal values: already a heap
        self._now = float(start_ns)
        self.closed = False

    def now_ns(self) -> float:
        """The time of the job's latest event: its last issue, or a deadline it reached."""
        return self._now

    def next_issue_ns(self) -> float:
        return self._free[0]

    def issue(self, access: Callable[[float], float]) -> float:
        """Run `access(issue_ns) -> latency_ns` as the next I/O; returns its latency."""
        return self.clock._issue(self, access)

    def _completed(self, issue_ns: float, latency: float) -> None:
        heapq.heapreplace(self._free, issue_ns + latency)
        self._now = max(self._now, issue_ns)

    def set_depth(self, depth: int) -> None:
        """Keep at most `depth` I/Os in flight from the next issue on (fio's latency-target
        search lowers and raises it): fewer slots wait for the latest completions, so the
        next I/O goes once only depth-1 are still out; more are free at the loop's time."""
        with self.clock._turn:
            if self.closed:
                return
            free = sorted(self._free)
            depth = max(1, depth)
            self._free = free[-depth:] if depth <= len(free) else sorted(free + [self._now] * (depth - len(free)))
            self.clock._next[self.id] = (self._free[0], self.id)  # (a sorted list is a heap)
            self.clock._turn.notify_all()

    def reach(self, t_ns: float) -> None:
        """Time passes to `t_ns` (a deadline before the next issue) with I/Os in flight."""
        self._now = max(self._now, min(t_ns, self._free[0]))

    def drain(self) -> float:
        """The job issues no more: time moves to its last completion, and other jobs
        on the device stop waiting for its turn. Returns that time."""
        if not self.closed:
            self.closed = True
            self._now = max(self._now, max(self._free))
            self.clock._close(self)
        return self._now


def model_clock_unavailable() -> str | None:
    """None when the model clock works, else the reason it does not (an error message)."""
    return None


def clock_for(name: str, device_handle=None):
    """The clock a job runs on; `device_handle`: the host driver's handle of its device."""
    if name == "wall":
        return WallClock()
    if name == "model":
        if device_handle is None or not device_handle.caps.model_clock:
            raise ClockUnavailable("cxlhm_clock=model needs a device opened with clock: model")
        return ModelTimeScheduler(device_handle)
    raise ValueError(f"unknown clock {name!r}")
