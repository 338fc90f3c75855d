"""Route a device's hints through a test's stand-in (a recorder, a delay) in front of
the real one: the mailbox delivers hints with `hint_batch`, so both entry points are
replaced, the batch one calling the stand-in once per entry, in order."""
from __future__ import annotations

from cxlhm.mailbox.hints import DeviceBusy


def route_hints_through(device, hint) -> None:
    def hint_batch(kind, sessions, first_blocks, n_blocks, args, *, lock_timeout: float = -1) -> int:
        declined = 0
        for i, entry in enumerate(zip(sessions.tolist(), first_blocks.tolist(), n_blocks.tolist(), args.tolist())):
            try:
                declined += hint(kind, *entry) is False
            except DeviceBusy as busy:
                raise DeviceBusy(str(busy), delivered=i, declined=declined) from None
        return declined

    device.hint = hint
    device.hint_batch = hint_batch
