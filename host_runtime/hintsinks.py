"""Hint sinks: where request-lifecycle hints go, and how a host asks for one.

A device handle gives its sinks only when asked, by name (`DeviceHandle.hint_sink(via)`,
or `hints_for(handle, via)`): "mailbox" starts the device's CXL mailbox and its firmware
thread, "direct" and "none" start nothing. Nothing probes a handle for hints. The KV
store (host_runtime.kvstore) is their main user; the driver hands them out, so they
live below both."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

HINT_SINKS = ("mailbox", "direct", "none")  # what `via` may name


@runtime_checkable
class HintSink(Protocol):
    """Where the store's hints go. host_runtime.mailbox.HintClient implements it (the
    real path, through the CXL mailbox); ranges are (hpa, length) pairs."""

    def session_resume(self, session: int, ranges: Sequence[tuple[int, int]]) -> Any: ...
    def next_prefix(self, session: int, ranges: Sequence[tuple[int, int]], deadline_ns: int = 0) -> Any: ...
    def append(self, session: int, ranges: Sequence[tuple[int, int]]) -> Any: ...
    def session_pause(self, sessions: Sequence[int], expected_pause_ns: int = 0) -> Any: ...
    def session_end(self, sessions: Sequence[int]) -> Any: ...
    def pin(self, ranges: Sequence[tuple[int, int]]) -> Any: ...
    def unpin(self, ranges: Sequence[tuple[int, int]]) -> Any: ...


class NullHints:
    """Drops every hint (a device without a mailbox, or LRU firmware that ignores them)."""

    def session_resume(self, session, ranges): return None
    def next_prefix(self, session, ranges, deadline_ns=0): return None
    def append(self, session, ranges): return None
    def session_pause(self, sessions, expected_pause_ns=0): return None
    def session_end(self, sessions): return None
    def pin(self, ranges): return None
    def unpin(self, ranges): return None


class DeviceHints:
    """Delivers hints straight to an in-process device (`hint()` and `block_size` of a
    cxlhm.device.MailboxTarget; no mailbox): for benches and tests of firmware
    behaviour. Production hosts use the mailbox. A host gets one from
    `DeviceHandle.hint_sink("direct")`."""

    def __init__(self, device):
        from cxlhm.mailbox.hints import HintKind
        self.device, self.kind = device, HintKind

    def _blocks(self, ranges):
        bs = self.device.block_size
        for hpa, length in ranges:
            if length > 0:
                first = hpa // bs
                yield first, (hpa + length - 1) // bs - first + 1

    def _ranged(self, kind, session, ranges, arg=0):
        return all([self.device.hint(kind, session, first, n, arg) for first, n in self._blocks(ranges)])

    def session_resume(self, session, ranges): return self._ranged(self.kind.SESSION_RESUME, session, ranges)
    def next_prefix(self, session, ranges, deadline_ns=0): return self._ranged(self.kind.NEXT_PREFIX, session, ranges, deadline_ns)
    def append(self, session, ranges): return self._ranged(self.kind.APPEND, session, ranges)
    def session_pause(self, sessions, expected_pause_ns=0):
        return all([self.device.hint(self.kind.SESSION_PAUSE, s, 0, 0, expected_pause_ns) for s in sessions])
    def session_end(self, sessions): return all([self.device.hint(self.kind.SESSION_END, s, 0, 0) for s in sessions])
    def pin(self, ranges): return self._ranged(self.kind.PIN, 0, ranges)
    def unpin(self, ranges): return self._ranged(self.kind.UNPIN, 0, ranges)


@runtime_checkable
class HintSource(Protocol):
    """What gives hint sinks on request (host_runtime.DeviceHandle)."""

    def hint_sink(self, via: str = "mailbox") -> HintSink: ...


def hints_for(handle: HintSource, via: str = "mailbox") -> HintSink:
    """The handle's hint sink `via` "mailbox" (its CXL mailbox's hint client: starts the
    mailbox), "direct" (the device's hint() in process) or "none" (NullHints)."""
    if via not in HINT_SINKS:
        raise ValueError(f"hints via must be one of {', '.join(HINT_SINKS)}, got {via!r}")
    if via == "none":
        return NullHints()
    if not isinstance(handle, HintSource):
        raise TypeError(f"{type(handle).__name__} gives no hint sinks (no hint_sink(via)): "
                        "pass the store a HintSink (hints=NullHints() drops them)")
    return handle.hint_sink(via)
