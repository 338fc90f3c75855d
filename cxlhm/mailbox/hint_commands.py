"""Handlers of the vendor hint commands (C000h-C006h).

Each payload is a batch of entries (formats in payloads.py). A handler decodes the
batch, validates every entry (sessions, HPA ranges, times) before delivering any,
converts byte ranges to device blocks, and delivers one hint per entry in payload
order through the device's ``hint_batch``. A bad entry rejects the whole
command with INVALID_INPUT and its 1-based index in the vendor extended status.

Batches of SESSION_RESUME / NEXT_PREFIX that cover many blocks
(>= ctx.background_min_blocks) run as a background command, so the host gets
control back at once and can poll percent complete. While one runs, every other
hint command is answered BUSY: hints are ordered (an END must not overtake the
RESUME it ends), and the host retries after the background command finishes.
"""
from __future__ import annotations

import numpy as np

from cxlhm.mailbox import payloads as P
from cxlhm.mailbox.background import BackgroundStarted
from cxlhm.mailbox.context import HINT_LOCK_TIMEOUT_S
from cxlhm.mailbox.hints import DeviceBusy, HintKind
from cxlhm.mailbox.opcodes import Opcode
from cxlhm.mailbox.returncodes import CommandFailed, ReturnCode

INT64_MAX = np.uint64(2**63 - 1)
MAX_ENTRIES_PER_STEP = 64  # bounds one background step even when ranges are tiny


class HintBatch:
    """Validated hints, ready to deliver: parallel lists (Python ints, so delivery
    does not pay numpy scalar conversions per entry)."""

    def __init__(self, kind: HintKind, session, first_block, n_blocks, arg):
        self.kind = int(kind)
        self.columns = tuple(np.ascontiguousarray(c, np.int64) for c in (session, first_block, n_blocks, arg))
        self.session, self.first_block = session.tolist(), first_block.tolist()
        self.n_blocks, self.arg = n_blocks.tolist(), arg.tolist()
        # progress weight: blocks covered (at least 1, so range-less hints count)
        self.weight = np.maximum(n_blocks, 1).tolist()
        self.total_weight = int(sum(self.weight))

    def __len__(self) -> int:
        return len(self.session)

    def deliver(self, ctx, start: int, stop: int) -> int:
        """Deliver entries [start, stop) in one firmware call; returns how many the
        device declined. _Busy when the data path held the device too long."""
        try:
            return ctx.device.hint_batch(self.kind, *(c[start:stop] for c in self.columns),
                                         lock_timeout=HINT_LOCK_TIMEOUT_S)
        except DeviceBusy as busy:
            raise _Busy(start + busy.delivered, busy.declined) from None


class _Busy(Exception):
    """The device stayed busy: entries before `index` were delivered (`declined` of them
    declined). A foreground command answers BUSY (the host resends the batch: hints are
    advisory, a repeated one is harmless); a background one resumes at `index`."""

    def __init__(self, index: int, declined: int):
        super().__init__(index)
        self.index, self.declined = index, declined


class HintDeliveryOperation:
    """A big hint batch delivered in steps by the background runner."""

    def __init__(self, ctx, opcode: int, batch: HintBatch):
        self.ctx, self.opcode, self.batch = ctx, opcode, batch
        self.next = 0
        self.done_weight = 0
        self.declined = 0

    @property
    def ext_status(self) -> int:
        """Reported in the background status register when the operation ends."""
        return min(self.declined, 0xFFFF)

    def step(self) -> int:
        if not self.ctx.media_ready:
            raise CommandFailed(ReturnCode.MEDIA_DISABLED, "the device closed during the background command")
        batch, start = self.batch, self.next
        stop, taken = start, 0
        while stop < len(batch) and stop - start < MAX_ENTRIES_PER_STEP and taken < self.ctx.background_step_blocks:
            taken += batch.weight[stop]
            stop += 1
        try:
            self.declined += batch.deliver(self.ctx, start, stop)
        except _Busy as busy:  # the rest of this step is retried at the next one
            self.declined += busy.declined
            stop = busy.index
            taken = sum(batch.weight[start:stop])
        self.next, self.done_weight = stop, self.done_weight + taken
        if stop >= len(batch):
            return 100
        return min(99, self.done_weight * 100 // max(1, batch.total_weight))


# ---------------------------------------------------------------- validation
def _reject(bad: np.ndarray, what: str) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CommandFailed(ReturnCode.INVALID_INPUT, f"entry {i}: {what}", ext_status=min(i + 1, 0xFFFF))


def _sessions(entries: np.ndarray) -> np.ndarray:
    s = entries["session"]
    _reject((s == 0) | (s > INT64_MAX), "session must be 1 .. 2**63-1")
    return s.astype(np.int64)


def _times(values: np.ndarray, name: str) -> np.ndarray:
    _reject(values > INT64_MAX, f"{name} must be below 2**63 ns")
    return values.astype(np.int64)


def _blocks(ctx, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HPA byte ranges -> (first block, block count), every touched block included.
    Empty, outside-the-window and wrapping ranges are invalid input."""
    hpa, length = entries["hpa"], entries["length"]
    capacity = np.uint64(ctx.device.capacity)
    _reject(length == 0, "empty range")
    _reject(hpa >= capacity, "range starts outside the HDM window")
    # capacity - hpa cannot wrap now; hpa + length might, so compare the other way round
    _reject(length > capacity - hpa, "range runs past the end of the HDM window")
    block = np.uint64(ctx.device.block_size)
    first = hpa // block
    last = (hpa + length - np.uint64(1)) // block
    return first.astype(np.int64), (last - first + np.uint64(1)).astype(np.int64)


def _no_range(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n, np.int64), np.zeros(n, np.int64)


def _run(ctx, opcode: int, batch: HintBatch, *, may_background: bool) -> bytes | BackgroundStarted:
    """Deliver now (output: delivered, declined) or start a background delivery."""
    if not ctx.media_ready:
        raise CommandFailed(ReturnCode.MEDIA_DISABLED, "the device is closed")
    if ctx.background.running:
        raise CommandFailed(ReturnCode.BUSY, "a background hint command is still being delivered")
    if may_background and len(batch) and batch.total_weight >= ctx.background_min_blocks:
        return ctx.background.start(HintDeliveryOperation(ctx, opcode, batch))
    try:
        declined = batch.deliver(ctx, 0, len(batch))
    except _Busy:
        raise CommandFailed(ReturnCode.BUSY, "the device's data path is busy; resend") from None
    return P.HINT_RESULT.pack(len(batch) - declined, declined)


# ---------------------------------------------------------------- handlers
def session_resume(ctx, payload: bytes):
    """SESSION_RESUME: these sessions are back; their ranges will be re-read, in order."""
    e = P.decode_hint_batch(Opcode.HINT_SESSION_RESUME, payload)
    session = _sessions(e)
    first, n = _blocks(ctx, e)
    batch = HintBatch(HintKind.SESSION_RESUME, session, first, n, np.zeros(len(e), np.int64))
    return _run(ctx, Opcode.HINT_SESSION_RESUME, batch, may_background=True)


def next_prefix(ctx, payload: bytes):
    """NEXT_PREFIX: these ranges will be read within deadline_ns (0: no deadline)."""
    e = P.decode_hint_batch(Opcode.HINT_NEXT_PREFIX, payload)
    session = _sessions(e)
    deadline = _times(e["deadline_ns"], "deadline_ns")
    first, n = _blocks(ctx, e)
    batch = HintBatch(HintKind.NEXT_PREFIX, session, first, n, deadline)
    return _run(ctx, Opcode.HINT_NEXT_PREFIX, batch, may_background=True)


def append(ctx, payload: bytes):
    """APPEND: new KV of these sessions is being written to these ranges."""
    e = P.decode_hint_batch(Opcode.HINT_APPEND, payload)
    session = _sessions(e)
    first, n = _blocks(ctx, e)
    batch = HintBatch(HintKind.APPEND, session, first, n, np.zeros(len(e), np.int64))
    return _run(ctx, Opcode.HINT_APPEND, batch, may_background=False)


def session_pause(ctx, payload: bytes):
    """SESSION_PAUSE: these sessions stop for about expected_pause_ns (0: unknown)."""
    e = P.decode_hint_batch(Opcode.HINT_SESSION_PAUSE, payload)
    session = _sessions(e)
    pause = _times(e["expected_pause_ns"], "expected_pause_ns")
    batch = HintBatch(HintKind.SESSION_PAUSE, session, *_no_range(len(e)), pause)
    return _run(ctx, Opcode.HINT_SESSION_PAUSE, batch, may_background=False)


def session_end(ctx, payload: bytes):
    """SESSION_END: these sessions are over."""
    e = P.decode_hint_batch(Opcode.HINT_SESSION_END, payload)
    session = _sessions(e)
    batch = HintBatch(HintKind.SESSION_END, session, *_no_range(len(e)), np.zeros(len(e), np.int64))
    return _run(ctx, Opcode.HINT_SESSION_END, batch, may_background=False)


def _pin_like(ctx, payload: bytes, opcode: Opcode, kind: HintKind):
    e = P.decode_hint_batch(opcode, payload)
    first, n = _blocks(ctx, e)
    zeros = np.zeros(len(e), np.int64)
    return _run(ctx, opcode, HintBatch(kind, zeros, first, n, zeros), may_background=False)


def pin(ctx, payload: bytes):
    """PIN: keep these ranges resident (session 0)."""
    return _pin_like(ctx, payload, Opcode.HINT_PIN, HintKind.PIN)


def unpin(ctx, payload: bytes):
    """UNPIN: release earlier PINs of these ranges."""
    return _pin_like(ctx, payload, Opcode.HINT_UNPIN, HintKind.UNPIN)
