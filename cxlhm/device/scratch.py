"""Per-thread state of a device's host threads: each thread plans its firmware passes in
scratch of its own, so threads need the device lock only for the planning itself."""
from __future__ import annotations

import threading

import numpy as np

from cxlhm import firmware as fw


class ThreadState(threading.local):
    """What each host thread keeps of its own: planner scratch and streamed-read state."""

    def __init__(self):
        self.scratch: Scratch | None = None
        self.stream = None


class Scratch:
    """One host thread's planner scratch: the slots and I/O rows of its pass in flight."""
    __slots__ = ("slots_out", "installed", "writebacks", "fills", "one_hpa", "one_len", "hits", "misses")

    def __init__(self, batch: int):
        self.slots_out = np.zeros(batch, np.int64)
        self.installed = np.zeros(batch, np.uint8)
        self.writebacks = fw.new_io_rows(batch)
        self.fills = fw.new_io_rows(batch)
        self.one_hpa = np.zeros(1, np.int64)  # access_one's extent as arrays
        self.one_len = np.zeros(1, np.int64)
        self.hits = self.misses = 0  # device-block hits and misses of this thread's accesses
