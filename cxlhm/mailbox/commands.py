"""The command table: one entry per opcode, one handler per command.

The dispatcher (service.py) looks the opcode up here; an opcode that is not in
the table is answered UNSUPPORTED. For a command with a fixed input size it
checks the payload length (else INVALID_PAYLOAD_LENGTH) before calling the
handler; variable-length commands (the hint batches) check their own. The
Command Effects Log is generated from this table, so it always lists exactly the
commands the device answers, vendor ones included.

How to add a command (say, vendor "Get Device Stats", C101h):
  1. Add the opcode to `Opcode` in opcodes.py:  ``GET_DEVICE_STATS = 0xC101``.
  2. Define its input/output formats in payloads.py (a struct.Struct or a numpy
     dtype), with byte offsets in the comment, and a decoder for the host.
  3. Write the handler, ``def get_device_stats(ctx, payload: bytes) -> bytes``, in
     the module of its command set (standard_commands.py, hint_commands.py, or a
     new one). It gets a private copy of the input payload and returns the output
     payload (at most ctx.payload_size bytes). To fail, raise
     ``CommandFailed(ReturnCode.X, "why")``; any other exception becomes
     INTERNAL_ERROR. Long work: ``return ctx.background.start(op)`` (background.py).
     Treat every input byte as hostile: check lengths, ranges and reserved fields.
  4. Add a `Command` row to `COMMANDS` below: input size (or None), the command
     effects bits for the CEL, and whether it needs the media (open device).
  5. Add a host method in host_runtime/mailbox.py, a row in docs/mailbox.md, and a
     round-trip test; the fuzzer (tests/test_mailbox_fuzz.py) picks the opcode up
     from this table by itself.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from cxlhm.mailbox import hint_commands as H
from cxlhm.mailbox import payloads as P
from cxlhm.mailbox import standard_commands as S
from cxlhm.mailbox.opcodes import Opcode


@dataclasses.dataclass(frozen=True)
class Command:
    opcode: Opcode
    handler: Callable
    input_size: int | None   # exact input payload length; None: the handler checks it
    effects: int = 0         # Command Effects Log bits
    needs_media: bool = False  # answered MEDIA_DISABLED once the device is closed

    @property
    def name(self) -> str:
        return self.opcode.name


_HINT_EFFECTS = P.EFFECT_POLICY_CHANGE_IMMEDIATE
_PREFETCH_EFFECTS = P.EFFECT_POLICY_CHANGE_IMMEDIATE | P.EFFECT_BACKGROUND_OPERATION

COMMANDS: dict[int, Command] = {c.opcode: c for c in (
    Command(Opcode.IDENTIFY, S.identify, 0),
    Command(Opcode.GET_SUPPORTED_LOGS, S.get_supported_logs, 0),
    Command(Opcode.GET_LOG, S.get_log, P.GET_LOG_IN.size),
    Command(Opcode.IDENTIFY_MEMORY_DEVICE, S.identify_memory_device, 0),
    Command(Opcode.GET_HEALTH_INFO, S.get_health_info, 0),
    Command(Opcode.GET_POISON_LIST, S.get_poison_list, P.POISON_IN.size, needs_media=True),
    Command(Opcode.HINT_SESSION_RESUME, H.session_resume, None, _PREFETCH_EFFECTS, needs_media=True),
    Command(Opcode.HINT_NEXT_PREFIX, H.next_prefix, None, _PREFETCH_EFFECTS, needs_media=True),
    Command(Opcode.HINT_APPEND, H.append, None, _HINT_EFFECTS, needs_media=True),
    Command(Opcode.HINT_SESSION_PAUSE, H.session_pause, None, _HINT_EFFECTS, needs_media=True),
    Command(Opcode.HINT_SESSION_END, H.session_end, None, _HINT_EFFECTS, needs_media=True),
    Command(Opcode.HINT_PIN, H.pin, None, _HINT_EFFECTS, needs_media=True),
    Command(Opcode.HINT_UNPIN, H.unpin, None, _HINT_EFFECTS, needs_media=True),
    Command(Opcode.IDENTIFY_HYBRID, S.identify_hybrid, 0),
)}
