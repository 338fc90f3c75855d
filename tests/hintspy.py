"""Route a device's hints through a test's stand-in (a recorder, a delay) in front of
the real one: the mailbox delivers hints with `hint_batch`, so both entry points are
replaced, the batch one calling the stand-in once per entry, in order."""
from __future__ import annotations

from cxlhm.mailbox.hints import deliver_each


def route_hints_through(device, hint) -> None:
    device.hint = hint
    device.hint_batch = lambda kind, *columns, lock_timeout=-1: deliver_each(hint, kind, *columns)
