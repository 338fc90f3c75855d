"""Where the store's request-lifecycle hints go: the HintSink protocol and its sinks
(none, a recorder for tests, the in-process device), and range coalescing."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol


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


class RecordingHints:
    """Records every hint as (method, args...) and forwards it to `forward` (if any)."""

    def __init__(self, forward: HintSink | None = None):
        self.calls: list[tuple] = []
        self.forward = forward

    def _record(self, name: str, *args):
        self.calls.append((name, *args))
        return getattr(self.forward, name)(*args) if self.forward is not None else None

    def session_resume(self, session, ranges): return self._record("session_resume", session, list(ranges))
    def next_prefix(self, session, ranges, deadline_ns=0): return self._record("next_prefix", session, list(ranges), deadline_ns)
    def append(self, session, ranges): return self._record("append", session, list(ranges))
    def session_pause(self, sessions, expected_pause_ns=0): return self._record("session_pause", list(sessions), expected_pause_ns)
    def session_end(self, sessions): return self._record("session_end", list(sessions))
    def pin(self, ranges): return self._record("pin", list(ranges))
    def unpin(self, ranges): return self._record("unpin", list(ranges))

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]


class DeviceHints:
    """Delivers hints straight to an in-process `cxlhm.device.Device` (no mailbox): for
    benches and tests of firmware behaviour. Production hosts use the mailbox."""

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


def hints_for(handle) -> HintSink:
    """The device handle's mailbox hint client when it has one, else NullHints."""
    return getattr(handle, "hints", None) or NullHints()


def coalesce(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge ranges that touch (chunks of one prompt are usually allocated back to
    back), keeping their order: smaller hint payloads, same blocks."""
    out: list[list[int]] = []
    for hpa, length in ranges:
        if out and out[-1][0] + out[-1][1] == hpa:
            out[-1][1] += length
        else:
            out.append([hpa, length])
    return [(h, n) for h, n in out]
