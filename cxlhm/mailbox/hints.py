"""Request-lifecycle hint kinds: the one place their numbers are defined.

The mailbox's vendor hint commands turn each batch entry into
``device.hint(kind, session, first_block, n_blocks[, arg])``; a firmware policy's
compiled ``on_hint`` switches on `kind`. Policies compare against the plain-int
constants below (numba folds module-level ints into compiled code as constants).

Delivery contract (what a policy may rely on):
  * `session` is in 1 .. 2**63-1 (0 means "no session": PIN/UNPIN carry 0).
  * A range is a run of device blocks ``first_block .. first_block + n_blocks - 1``
    covering every block the host's HPA byte range touches, fully inside the window.
    Kinds without a range (SESSION_PAUSE, SESSION_END) carry ``first_block = n_blocks = 0``.
  * `arg` is kind-specific, nanoseconds relative to the command's arrival:
    NEXT_PREFIX: the deadline by which the host expects to read the range (0: none);
    SESSION_PAUSE: the expected pause before the session resumes (0: unknown).
    (Delivered only when Device.hint accepts a fifth argument.)
  * Entries of one command arrive in payload order; all or none of a command's
    entries are delivered (the whole batch is validated first).
"""
from __future__ import annotations

from enum import IntEnum


class HintKind(IntEnum):
    SESSION_RESUME = 1  # a paused session is back: its prefix will be re-read, in order
    NEXT_PREFIX = 2     # this range will be read soon (before a deadline)
    APPEND = 3          # new KV is being written here, append-only
    SESSION_PAUSE = 4   # the session stops for a while (e.g. a tool call)
    SESSION_END = 5     # the session is over: its blocks are the best victims
    PIN = 6             # keep this range resident until UNPIN
    UNPIN = 7


SESSION_RESUME = int(HintKind.SESSION_RESUME)
NEXT_PREFIX = int(HintKind.NEXT_PREFIX)
APPEND = int(HintKind.APPEND)
SESSION_PAUSE = int(HintKind.SESSION_PAUSE)
SESSION_END = int(HintKind.SESSION_END)
PIN = int(HintKind.PIN)
UNPIN = int(HintKind.UNPIN)


class DeviceBusy(RuntimeError):
    """The data path held the device longer than a hint's caller would wait (the mailbox
    answers BUSY and the host resends)."""

    def __init__(self, message: str = "", *, delivered: int = 0, declined: int = 0):
        super().__init__(message)
        self.delivered, self.declined = delivered, declined  # of a batch, before the wait ran out


def deliver_each(hint, kind: int, sessions, first_blocks, n_blocks, args, **options) -> int:
    """hint_batch() for a device that takes hints one at a time: `hint(kind, session,
    first_block, n_blocks, arg, **options)` per entry, in order; returns how many were
    declined. DeviceBusy from one entry is re-raised saying how many went through first."""
    declined = 0
    for i, entry in enumerate(zip(sessions.tolist(), first_blocks.tolist(), n_blocks.tolist(), args.tolist())):
        try:
            declined += hint(kind, *entry, **options) is False
        except DeviceBusy as busy:
            raise DeviceBusy(str(busy), delivered=i, declined=declined) from None
    return declined
