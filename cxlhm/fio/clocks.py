"""The clocks a cxlhm-fio job can run on.

A job asks its clock two things: what time it is (runtime, ramp time and the
bandwidth sample windows are measured in it) and how long each I/O of a batch took.

- WallClock: CLOCK_MONOTONIC; every I/O of a batch completes when the device call
  returns (the device finishes a batch as one firmware pass).
- The model clock (``cxlhm_clock=model``) is not wired up yet; see MODEL CLOCK SEAM below.
"""
from __future__ import annotations

import time

import numpy as np


class ClockUnavailable(RuntimeError):
    pass


class WallClock:
    name = "wall"

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def start_batch(self) -> int:
        return time.monotonic_ns()

    def finish_batch(self, token: int, n: int) -> tuple[np.ndarray, int]:
        """Per-I/O completion latency of the batch started at `token`, and the end time."""
        end = time.monotonic_ns()
        return np.full(n, end - token, np.int64), end


# ============================================================ MODEL CLOCK SEAM
# To enable `cxlhm_clock=model` once the timing model charges device accesses:
#   1. implement ModelClock with the WallClock interface above:
#        now_ns()            -> the device's model time (ns) for this host thread
#        start_batch()       -> a token holding the model issue time of the next device call
#        finish_batch(t, n)  -> (per-extent model completion time - issue time, model end time),
#                               read from what the timing model charged for that call
#      (runtime, ramp_time and bw/iops windows then follow model time automatically, and the
#      runner never sleeps on it);
#   2. return it from clock_for() below;
#   3. make model_clock_unavailable() return None.
# Nothing else in cxlhm/fio needs to change: jobfile.py rejects cxlhm_clock=model while
# model_clock_unavailable() returns a reason, and the engines only talk to the clock.
_MODEL_CLOCK_REASON = ("cxlhm_clock=model is not available yet: the timing model is not wired into "
                       "the device's access path; use cxlhm_clock=wall")


def model_clock_unavailable() -> str | None:
    """None when the model clock works, else the reason it does not (an error message)."""
    return _MODEL_CLOCK_REASON


def clock_for(name: str, device_handle=None):
    if name == "wall":
        return WallClock()
    if name == "model":
        raise ClockUnavailable(_MODEL_CLOCK_REASON)
    raise ValueError(f"unknown clock {name!r}")
# ============================================================ END MODEL CLOCK SEAM
