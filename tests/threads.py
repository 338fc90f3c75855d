"""Running test threads and forked children that must all finish (a hang is the failure
being tested for)."""
import os
import signal
import threading
import time


def run_all(threads: list[threading.Thread], *, timeout: float = 120, hang: str = "deadlock") -> None:
    """Start every thread, wait up to `timeout` seconds for each, and fail naming `hang`
    if one is still running."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), hang


def wait_child(pid: int, *, timeout: float, kill_after: float | None = None, hang: str = "the child hung") -> int:
    """The wait status of forked child `pid`. `kill_after` (seconds): SIGKILL it then, as a
    crash; past `timeout` it is killed and the test fails naming `hang`."""
    start = time.monotonic()
    killed = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        elapsed = time.monotonic() - start
        if kill_after is not None and not killed and elapsed >= kill_after:
            os.kill(pid, signal.SIGKILL)
            killed = True
        if elapsed > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(hang)
        time.sleep(0.002)
