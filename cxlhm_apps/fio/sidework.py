"""Work a job clone's thread hands to a second thread while its engine runs.

The cxlhm engine's stream loop is compiled and runs without the interpreter's lock, and
between two engine calls no I/O is in flight. Making the next chunk of I/Os and recording
the last chunk's latencies took ~3% of a 4k random-read job's wall time there (the disk
idle meanwhile); on this thread they run while the next engine call keeps the disk busy.
Tasks run one at a time, in the order given, so the I/O generator's sequence and the
statistics are what they would be on the clone's own thread. A task starts START_DELAY_S
after it was given: started at once, it held the interpreter's lock while the clone's
thread set up its next engine call (~0.45 ms instead of ~0.1 ms, with no I/O in flight).
"""
from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

START_DELAY_S = 0.001


class SideWork:
    """One thread, tasks in order. `settle()` waits for every task given and raises the
    first error of one; call it before the clone's thread touches what a task writes. A
    task's own future (`submit`'s result) also gives its result or error.
    `usr_s` / `sys_s`: CPU seconds the tasks took (the job's CPU figures include them)."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._given: list[Future] = []
        self._hurry = threading.Event()
        self.usr_s = 0.0
        self.sys_s = 0.0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        # (done ones that failed stay for settle(): a failure is raised where the clone's
        # thread waits for its tasks, never by an unrelated submit)
        self._given = [f for f in self._given if not f.done() or f.exception() is not None]
        future = self._pool.submit(self._timed, time.monotonic() + START_DELAY_S, fn, *args)
        self._given.append(future)
        return future

    def settle(self) -> None:
        given, self._given = self._given, []
        self._hurry.set()  # (the clone's thread waits: a task waiting for its start goes now)
        try:
            for future in given:
                future.result()
        finally:
            self._hurry.clear()

    def close(self) -> None:
        """Wait for what was given (errors are the caller's to collect with settle) and
        end the thread."""
        self._pool.shutdown(wait=True)

    def _timed(self, start: float, fn: Callable[..., Any], *args: Any) -> Any:
        wait = start - time.monotonic()
        if wait > 0:
            self._hurry.wait(wait)
        before = resource.getrusage(resource.RUSAGE_THREAD)
        try:
            return fn(*args)
        finally:
            after = resource.getrusage(resource.RUSAGE_THREAD)
            self.usr_s += after.ru_utime - before.ru_utime
            self.sys_s += after.ru_stime - before.ru_stime
