"""What every fuzz target shares: a per-case hang alarm, the rule for error messages, and
a tally of the cases a target ran and the failures it saw.

A target is a check function over one drawn input: it returns, or raises the target's
documented error with a clear message (the check swallows that), and anything else is
a failure. Under pytest a failure is raised (hypothesis shrinks it); the volume run
(tests/fuzz_volume.py) counts failures and goes on, so it can report "N cases, F
failures" for each input at the end."""
from __future__ import annotations

import contextlib
import signal

from hypothesis import HealthCheck, Phase, event, settings

HANG_S = 20.0  # per case; generous for a loaded 2-core machine
FAST = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


def volume_settings(cases: int) -> settings:
    """Generate only (no shrinking, no replay of a database): every case is a new input
    and a failure is counted, not minimised."""
    return settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))


class Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang(what: str, seconds: float = HANG_S):
    """Fail a case that runs longer than `seconds` (SIGALRM: the main thread only)."""
    def fire(signum, frame):
        raise Hang(f"{what} ran longer than {seconds} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def clear_message(exc: BaseException) -> None:
    """A documented rejection: its message must say something, and not a dump."""
    with contextlib.suppress(Exception):  # event() only works inside a hypothesis test
        event(f"rejected: {type(exc).__name__}")
    text = str(exc)
    assert text and len(text) < 4000, f"unhelpful error message: {text[:200]!r}"


class Tally:
    """Cases a target ran and, in a volume run, the failures it saw (the first few kept
    with their input, so a failure can be reproduced)."""
    KEEP = 5

    def __init__(self, target: str, *, collect: bool = False):
        self.target, self.collect = target, collect
        self.n, self.failed, self.examples = 0, 0, []
        self.progress = None  # called every 1000 cases (a volume run reports as it goes)

    def hit(self, k: int = 1) -> None:
        self.n += k

    def run(self, check, *args, count: bool = True) -> None:
        """One case: `check(*args)`; in a volume run a failure is counted, not raised.
        `count=False`: a check that is not a case of its own (one after a sequence)."""
        self.n += count
        if count and self.progress is not None and self.n % 1000 == 0:
            self.progress()
        if not self.collect:
            check(*args)
            return
        try:
            check(*args)
        except Exception as exc:  # noqa: BLE001 - every kind of failure is what is counted
            self.failed += 1
            if len(self.examples) < self.KEEP:
                self.examples.append(f"{type(exc).__name__}: {str(exc)[:400]} | input: {repr(args)[:600]}")

    def record(self) -> None:
        from test_reliability import record_figure
        record_figure("fuzz", self.target, "cases", self.n, accumulate=True)
