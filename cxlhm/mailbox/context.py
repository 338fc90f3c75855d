"""What a command handler gets besides its payload: the device and the mailbox's
firmware-side services. Handlers take `(ctx, payload) -> output bytes`."""
from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from cxlhm.mailbox.background import BackgroundEngine

HintDelivery = Callable[[int, int, int, int, int], None]  # (kind, session, first_block, n_blocks, arg)


@dataclasses.dataclass
class CommandContext:
    device: Any
    payload_size: int
    engine: BackgroundEngine
    deliver_hint: HintDelivery
    commands: Mapping[int, Any]          # the command table (for the Command Effects Log)
    background_min_blocks: int           # hint batches covering at least this many blocks run in the background
    background_step_blocks: int          # blocks delivered per background step (progress granularity)

    @property
    def media_ready(self) -> bool:
        return not getattr(self.device, "closed", False)


# How long the firmware waits for the data path before answering a hint BUSY: well
# inside the host's command timeout, so a device busy compiling or moving data makes
# the host resend instead of timing out.
HINT_LOCK_TIMEOUT_S = 0.25


def hint_delivery_for(device) -> HintDelivery:
    """Call Device.hint with the kind-specific argument (deadline, expected pause)
    when it accepts one, and without it otherwise; with a bounded wait for the device
    when it offers one (it raises DeviceBusy then)."""
    hint = device.hint
    try:
        params = inspect.signature(hint).parameters
        takes_arg = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params.values()) >= 5 \
            or any(p.kind is p.VAR_POSITIONAL for p in params.values())
        bounded = "lock_timeout" in params
    except (TypeError, ValueError):
        takes_arg = bounded = False
    if takes_arg and bounded:
        return functools.partial(hint, lock_timeout=HINT_LOCK_TIMEOUT_S)
    if takes_arg:
        return hint
    return lambda kind, session, first_block, n_blocks, arg: hint(kind, session, first_block, n_blocks)
