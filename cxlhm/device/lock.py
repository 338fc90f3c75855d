"""The device lock: threading.Lock's interface, handed over in turn, that keeps count of
the threads waiting for the device - blocked on it, or waiting on a condition of it for
slots to come free - in an array compiled code reads. A stream's loop
(cxlhm/device/stream/loop_kernels.py) holds the lock for a time slice and then gives it up
for the driver's turn between slices; while nobody waits it goes on instead, up to a cap,
since the driver's turn is where the SSD's queue runs dry (~60-260 us every 2 ms slice on
the development machine).

A released threading.Lock goes to whoever asks first, and the thread that released it,
still running (and holding the GIL), asks again within microseconds: a stream taking the
lock slice after slice kept a waiting thread out for the whole stream. So a release with
threads blocked on the lock hands it to the one blocked longest (it stays held, now
theirs), and a thread that asks for it again queues behind them: no thread waits more
than one turn of each thread ahead of it, and nobody polls for the hand-over. A free lock
is still taken at once, without the queue.
"""
from __future__ import annotations

import collections
import threading

import numpy as np


class DeviceLock:
    """threading.Lock's interface (acquire, release, locked, a context manager);
    `idle`, a condition of it; `waiting`: an int64 array, [0] the threads blocked on it
    or waiting on `idle` through wait_idle(), [1] those blocked on it, [2] how many times
    a thread that was blocked on it got it."""
    __slots__ = ("_lock", "_count_lock", "_queue", "waiting", "idle")

    def __init__(self):
        self._lock = threading.Lock()  # held while a thread has the device
        self._count_lock = threading.Lock()  # guards _queue and `waiting` (+= on an array element is no atomic step)
        # per thread blocked on the lock, oldest first: a held lock of its own, which the
        # thread handing the device over releases
        self._queue: collections.deque[threading.Lock] = collections.deque()
        self.waiting = np.zeros(3, np.int64)
        self.idle = threading.Condition(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        turn = threading.Lock()
        turn.acquire()
        with self._count_lock:
            # queued before the second try: a release that ran in between sees the queue
            # (release's last look), so the lock never stays free with this thread asleep
            self._queue.append(turn)
            if self._lock.acquire(False):
                self._queue.remove(turn)
                return True
            self._count(1, blocked=1)
        if turn.acquire(True, timeout):
            return True  # handed over (release counted it)
        with self._count_lock:
            try:
                self._queue.remove(turn)
            except ValueError:
                return True  # handed over as the wait ran out
            self._count(-1, blocked=-1)
        return False

    __enter__ = acquire

    def release(self) -> None:
        if self._queue:
            with self._count_lock:
                if self._queue:
                    if not self._lock.locked():
                        raise RuntimeError("release unlocked lock")
                    self._count(-1, blocked=-1, handed=1)
                    self._queue.popleft().release()  # the lock stays held: theirs now
                    return
        self._lock.release()
        # a thread may have queued itself between the first look and the release: then
        # the free lock is taken back and handed to it
        if self._queue and self._lock.acquire(False):
            self.release()

    def __exit__(self, *exc) -> None:
        self.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def wait_idle(self) -> None:
        """idle.wait() (the lock held, and released meanwhile), counted as waiting: the
        thread is not blocked on the lock, yet it waits for whoever holds it to let
        something go."""
        with self._count_lock:
            self._count(1)
        try:
            self.idle.wait()
        finally:
            with self._count_lock:
                self._count(-1)

    def _count(self, step: int, blocked: int = 0, handed: int = 0) -> None:
        """(with _count_lock held)"""
        self.waiting[0] += step
        self.waiting[1] += blocked
        self.waiting[2] += handed
