"""Running test threads that must all finish (a hang is the failure being tested for)."""
import threading


def run_all(threads: list[threading.Thread], *, timeout: float = 120, hang: str = "deadlock") -> None:
    """Start every thread, wait up to `timeout` seconds for each, and fail naming `hang`
    if one is still running."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), hang
