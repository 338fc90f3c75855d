"""What a command handler gets besides its payload: the device and the mailbox's
firmware-side services. Handlers take `(ctx, payload) -> output bytes`."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cxlhm.mailbox.background import BackgroundRunner


@dataclasses.dataclass
class CommandContext:
    device: Any  # a cxlhm.device.MailboxTarget
    payload_size: int
    background: BackgroundRunner
    commands: Mapping[int, Any]          # the command table (for the Command Effects Log)
    background_min_blocks: int           # hint batches covering at least this many blocks run in the background
    background_step_blocks: int          # blocks delivered per background step (progress granularity)

    @property
    def media_ready(self) -> bool:
        return not self.device.closed


# How long the firmware waits for the data path before answering a hint BUSY: well
# inside the host's command timeout, so a device busy compiling or moving data makes
# the host resend instead of timing out.
HINT_LOCK_TIMEOUT_S = 0.25
