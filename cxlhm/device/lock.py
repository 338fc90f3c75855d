"""The device lock: a threading.Lock that keeps count of the threads waiting for the
device - blocked on the lock, or waiting on a condition of it for slots to come free -
in an array compiled code reads. A stream's loop (cxlhm/device/stream/loop_kernels.py) holds
the lock for a time slice and then gives it up for the driver's turn between slices;
while nobody waits it goes on instead, up to a cap, since the driver's turn is where
the SSD's queue runs dry (~60-260 us every 2 ms slice on the development machine).

A released threading.Lock goes to whoever asks first, and the thread that released it,
still running (and holding the GIL), asks again within microseconds: a stream taking the
lock slice after slice kept a waiting thread out for the whole stream. So a thread that
gives the lock up between two turns of its own calls let_waiters_in() first.
"""
from __future__ import annotations

import threading
import time

import numpy as np


class DeviceLock:
    """threading.Lock's interface (acquire, release, locked, a context manager);
    `idle`, a condition of it; `waiting`: an int64 array, [0] the threads blocked on it
    or waiting on `idle` through wait_idle(), [1] those blocked on it, [2] how many times
    a thread that was blocked on it got it."""
    __slots__ = ("_lock", "_count_lock", "waiting", "idle")

    def __init__(self):
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()  # (+= on an array element is no atomic step)
        self.waiting = np.zeros(3, np.int64)
        self.idle = threading.Condition(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        self._count(1, blocked=1)
        got = False
        try:
            got = self._lock.acquire(True, timeout)
            return got
        finally:
            self._count(-1, blocked=-1, handed=int(got))

    __enter__ = acquire

    def release(self) -> None:
        self._lock.release()

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def wait_idle(self) -> None:
        """idle.wait() (the lock held, and released meanwhile), counted as waiting: the
        thread is not blocked on the lock, yet it waits for whoever holds it to let
        something go."""
        self._count(1)
        try:
            self.idle.wait()
        finally:
            self._count(-1)

    def let_waiters_in(self, seconds: float = 0.002) -> None:
        """Called without the lock by a thread about to take it again: wait until the
        threads blocked on it have had it (or `seconds` passed)."""
        deadline = time.monotonic() + seconds
        while self.waiting[1] and time.monotonic() < deadline:
            time.sleep(0.00005)

    def let_one_in(self, seconds: float = 0.0005) -> None:
        """Called without the lock by a thread about to take it again while other threads
        take turns with it (several streams on one device, where someone is nearly always
        blocked on it): wait until one blocked thread has had it (or `seconds` passed)."""
        handed = self.waiting[2]
        deadline = time.monotonic() + seconds
        while self.waiting[1] and self.waiting[2] == handed and time.monotonic() < deadline:
            time.sleep(0.00005)

    def _count(self, step: int, blocked: int = 0, handed: int = 0) -> None:
        with self._count_lock:
            self.waiting[0] += step
            self.waiting[1] += blocked
            self.waiting[2] += handed
