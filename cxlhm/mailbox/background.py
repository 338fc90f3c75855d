"""Background commands: long work that returns "background command started" at once
and reports its progress in the background command status register.

The firmware thread runs one bounded `step()` of the current operation between
doorbell checks, so foreground commands keep being answered while it proceeds,
and writes the percent complete after every step. When the operation ends the
register holds percent 100 and the final return code, and bit 0 of the mailbox
status register (background operation) drops; a host polls either (CXL r3.1
§8.2.8.4.6-7). One background operation runs at a time: a second one is
answered BUSY, as the spec requires.

To make new long work a background command, implement `BackgroundOperation`
(`opcode`, `step() -> percent`, raising CommandFailed to fail; an optional
`ext_status` is reported with the final return code) and return
`ctx.background.start(op)` from the command's handler.
"""
from __future__ import annotations

import logging
from typing import Protocol

from cxlhm.mailbox import registers as R
from cxlhm.mailbox.returncodes import CommandFailed, ReturnCode

log = logging.getLogger("cxlhm.mailbox")


class BackgroundOperation(Protocol):
    opcode: int

    def step(self) -> int:
        """Do a bounded slice of the work; return percent complete (100 = done)."""


class BackgroundStarted:
    """What a handler returns when its work continues in the background."""

    __slots__ = ("operation",)

    def __init__(self, operation: BackgroundOperation):
        self.operation = operation


class BackgroundRunner:
    """Runs the background commands: the one running operation, a bounded step at a
    time, and the background command status register that reports it. (A runner, not
    an engine: nothing here moves data.) Only the firmware thread calls it, so it needs
    no lock."""

    def __init__(self, regs: R.RegisterFile):
        self.regs = regs
        self.current: BackgroundOperation | None = None
        self.completed = 0  # operations finished (any return code), for tests and stats

    @property
    def running(self) -> bool:
        return self.current is not None

    def start(self, op: BackgroundOperation) -> BackgroundStarted:
        if self.current is not None:
            raise CommandFailed(ReturnCode.BUSY, f"background command {self.current.opcode:#06x} is still running")
        self.current = op
        self.regs.background_status = R.encode_background(op.opcode, 0, ReturnCode.SUCCESS)
        return BackgroundStarted(op)

    def step(self) -> None:
        op = self.current
        if op is None:
            return
        try:
            percent = max(0, min(100, int(op.step())))
        except CommandFailed as exc:
            self._finish(op, exc.rc, exc.ext_status)
            return
        except Exception:  # firmware must survive its own bugs: report, do not crash
            log.exception("background command %#06x failed", op.opcode)
            self._finish(op, ReturnCode.INTERNAL_ERROR)
            return
        if percent >= 100:
            self._finish(op, ReturnCode.SUCCESS, getattr(op, "ext_status", 0))
        else:
            self.regs.background_status = R.encode_background(op.opcode, percent, ReturnCode.SUCCESS)

    def _finish(self, op: BackgroundOperation, rc: ReturnCode, ext: int = 0) -> None:
        # Percent first, then drop the "running" bit: a host that sees the bit clear
        # must find the final return code already in place.
        self.regs.background_status = R.encode_background(op.opcode, 100, rc, ext)
        self.current = None
        self.completed += 1
        self.regs.status = self.regs.status & ~R.STATUS_BACKGROUND
