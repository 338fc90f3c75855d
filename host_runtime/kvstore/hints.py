"""Where the store's request-lifecycle hints go: the sinks (host_runtime.hintsinks: the
HintSink protocol, none, the in-process device; a recorder for tests here) and range
coalescing. A handle gives a sink only when asked by name: `hints_for(handle, via)`."""
from __future__ import annotations

from collections.abc import Iterable

from host_runtime.hintsinks import HINT_SINKS, DeviceHints, HintSink, HintSource, NullHints, hints_for


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


__all__ = ["HINT_SINKS", "DeviceHints", "HintSink", "HintSource", "NullHints", "RecordingHints", "coalesce",
           "hints_for"]
