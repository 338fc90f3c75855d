"""The main job: replay a multi-turn request trace through the KV store and the host
runtime, the way a serving engine would use the device, with real bytes.

Each trace hash id is one KV chunk of `chunk_bytes`, stored in a `host_runtime.KVStore`
on the device (one tenant; the id's 8 bytes are its key). Conversations are recovered
from the hash-id chains (`cxlhm.traces.sessions`); each becomes a KV-store session, whose
lifecycle is what the host runtime turns into mailbox hints when hints are on:

* the request arrives at its trace timestamp T: the runtime looks its prefix up and
  sends SESSION_RESUME for the leading chunks the session already stored, and
  NEXT_PREFIX (deadline: the load time) for any other stored chunk the request reuses;
* at T + `lead_ns` (queueing and scheduling before prefill) it loads every stored chunk
  the request reuses in one batch - the KV-load latency we report, the part of TTFT the
  device adds - and checks every byte;
* it stores the chunks the request computed (APPEND, then the write), then the session
  pauses (SESSION_PAUSE) until its next turn; a session idle for `idle_end_ns` is ended
  (SESSION_END), as a server expires an idle conversation - the replay never uses its
  knowledge of which turn is a conversation's last. A conversation that comes back after
  that opens a new session; its KV is still in the store.

Without hints the store talks to the device through plain loads and stores only (the
generic firmware sees addresses, no lifecycle). On the model clock (`clock: model`) the
timeline is the trace's: idle gaps go to the firmware's background work (prefetches,
write-backs) and latencies come from the timing model, so results depend only on the
configuration and the trace, never on this machine. On the wall clock there is no
timeline to place hints ahead of loads: the hints go out just before each load and
latencies are this machine's.
"""
from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable, Sequence

import numpy as np

from cxlhm.traces.mooncake import Request
from cxlhm.traces.sessions import Turn
from host_runtime.kvstore import KVStore, NullHints, PutStatus, StoreFull
from host_runtime.kvstore.hints import coalesce

MS = 1_000_000
ARRIVE, LOAD, IDLE = 0, 1, 2  # event kinds; at equal times the arrival (and its hints) goes first


@dataclasses.dataclass
class MissionResult:
    label: str
    policy: str
    hints: bool
    clock: str
    verified: bool                   # False with data: none (no bytes to check)
    requests: int = 0
    sessions: int = 0
    load_latency_ns: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # per request that loads
    chunks_loaded: int = 0
    load_hits: int = 0               # block accesses of the loads served from device DRAM
    load_misses: int = 0
    chunks_written: int = 0
    chunks_not_stored: int = 0       # the store had no room (never with the default capacity)
    chunks_missing: int = 0          # stored chunks the store no longer had at load (evicted or dropped)
    corrupt_chunks: int = 0          # chunks read back with wrong bytes
    hint_errors: int = 0
    wall_s: float = 0.0
    device: dict = dataclasses.field(default_factory=dict)

    @property
    def load_hit_ratio(self) -> float:
        total = self.load_hits + self.load_misses
        return self.load_hits / total if total else 0.0

    @property
    def write_absorption(self) -> float:
        """Share of the bytes the host wrote whose SSD write, if any, no host access
        waited for (buffered in DRAM and written back in the background, or never)."""
        d = self.device
        written = d.get("host_write_bytes", 0)
        on_host_path = d.get("fg_writebacks", 0) * d.get("block_size", 0)
        return 1.0 - on_host_path / written if written else 0.0


def chunk_pattern(hash_ids: np.ndarray, chunk_bytes: int) -> np.ndarray:
    """(len(ids), chunk_bytes) bytes: the id in the first 8 bytes, then a repeating
    id-dependent pattern, so a chunk read from the wrong place never passes the check."""
    words = chunk_bytes // 8
    out = np.empty((hash_ids.shape[0], words), np.uint64)
    out[:] = np.arange(words, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    out ^= hash_ids.astype(np.uint64)[:, None]
    out[:, 0] = hash_ids.astype(np.uint64)
    return out.view(np.uint8)


class _MailboxHints:
    """The mailbox hint client as the KV store's hint sink, the way a batching runtime
    drives it: prefetch hints wait until the device has queued them (a replay on the
    model clock stays deterministic), and the APPEND hints of one request's new chunks
    are collected while they are reserved and go out as one command before any is
    written (`send_appends`)."""

    def __init__(self, client):
        self._client = client
        self._appends: dict[int, list[tuple[int, int]]] = {}

    def session_resume(self, session, ranges):
        return self._client.session_resume(session, ranges, wait=True)

    def next_prefix(self, session, ranges, deadline_ns=0):
        return self._client.next_prefix(session, ranges, deadline_ns, wait=True)

    def append(self, session, ranges):
        self._appends.setdefault(session, []).extend(ranges)

    def send_appends(self) -> None:
        pending, self._appends = self._appends, {}
        for session, ranges in pending.items():
            self._client.append(session, coalesce(ranges))

    def __getattr__(self, name):
        return getattr(self._client, name)


def _key(hash_id: int) -> bytes:
    return int(hash_id).to_bytes(8, "big")


def replay_mission(handle, requests: Sequence[Request], turns: Sequence[Turn], *, chunk_bytes: int,
                   hints: bool, lead_ns: int, idle_end_ns: int = 600_000 * MS, label: str = "", progress: Callable[[int], None] | None = None
                   ) -> MissionResult:
    """Replay `requests` (with their recovered `turns`) through a KV store on the open
    device `handle` (see the module doc). Returns the figures `cxlhm run` prints."""
    if chunk_bytes <= 0 or chunk_bytes % 8:
        raise ValueError(f"chunk_bytes must be a positive multiple of 8, got {chunk_bytes}")
    cfg = handle.config
    model = cfg.clock == "model"
    verify = cfg.data == "real"
    if hints:  # compile the hint path now: a first run would otherwise compile it under the mailbox's timeouts
        handle.warm_up()
        handle.hint_sink("direct").session_end([0])  # session 0 is "no session": a no-op that compiles on_hint
    sink = _MailboxHints(handle.hint_sink("mailbox")) if hints else None
    store = KVStore(handle, index_path=False, hints=sink or NullHints())
    tenant = store.tenant("trace", chunk_bytes=chunk_bytes)
    result = MissionResult(label or cfg.firmware.policy, cfg.firmware.policy, hints, cfg.clock, verify,
                           sessions=len({t.session for t in turns}))
    sessions: dict[int, object] = {}
    arrived: dict[int, int] = {}  # conversation -> its requests so far (an idle timer checks none came since)
    stored: set[int] = set()
    latencies: list[float] = []
    events: list[tuple[float, int, int]] = []
    for i, req in enumerate(requests):
        arrival = float(req.timestamp_ms) * MS
        heapq.heappush(events, (arrival, ARRIVE, i))
        heapq.heappush(events, (arrival + lead_ns, LOAD, i))
    pending: dict[int, np.ndarray] = {}  # request index -> the stored ids it will load
    pending_idle: dict[int, int] = {}  # request index -> its conversation's requests when it was served
    horizon = max(float(r.timestamp_ms) * MS for r in requests) + lead_ns
    start = time.perf_counter()
    while events:
        t, kind, i = heapq.heappop(events)
        req, turn = requests[i], turns[i]
        if model:
            handle.advance_to(t)
        if kind == IDLE:
            if turn.session in sessions and arrived[turn.session] == pending_idle.pop(i):
                sessions.pop(turn.session).end()
            continue
        session = sessions.get(turn.session)
        if session is None:
            session = sessions[turn.session] = tenant.open_session(f"s{turn.session}")
        ids = req.hash_ids
        if kind == ARRIVE:
            arrived[turn.session] = arrived.get(turn.session, 0) + 1
            # the host runtime looks up what it can reuse and tells the device now
            seen = np.fromiter((h in stored for h in ids.tolist()), bool, ids.size)
            reuse = _unique_in_order(ids[seen])
            pending[i] = reuse
            if not model:
                continue  # no timeline to place the hints on: they go out at the load
            _announce(session, ids, reuse, lead_ns)
            continue
        reuse = pending.pop(i)
        if not model:
            _announce(session, ids, reuse, lead_ns)
        if reuse.size:
            _load(handle, tenant, session, reuse, chunk_bytes, verify, model, result, latencies)
        new = _unique_in_order(np.array([h for h in ids.tolist() if h not in stored], np.int64))
        if new.size:
            _store_new(tenant, session, sink, new, chunk_bytes, stored, result)
        session.pause()
        if t + idle_end_ns <= horizon:  # expiries after the last request would only skew the totals
            pending_idle[i] = arrived[turn.session]
            heapq.heappush(events, (t + idle_end_ns, IDLE, i))
        result.requests += 1
        if progress is not None:
            progress(1)
    result.wall_s = time.perf_counter() - start
    result.load_latency_ns = np.asarray(latencies, np.float64)
    result.hint_errors = store.counters["hint_errors"]
    result.device = {**handle.stats(), "block_size": handle.block_size}
    store.close()
    return result


def _unique_in_order(ids: np.ndarray) -> np.ndarray:
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)]


def _announce(session, ids: np.ndarray, reuse: np.ndarray, lead_ns: int) -> None:
    """The lifecycle hints of an arriving request: SESSION_RESUME for its leading stored
    chunks (the conversation so far), NEXT_PREFIX for the other stored chunks it reuses."""
    if not reuse.size:
        return
    keys = [_key(h) for h in ids.tolist()]
    leading = session.resume(keys)
    resumed = set(ids[:leading].tolist())
    rest = [_key(h) for h in reuse.tolist() if h not in resumed]
    if rest:
        session.next_prefix(rest, deadline_ns=max(1, int(lead_ns)))


def _store_new(tenant, session, sink, new: np.ndarray, chunk_bytes: int, stored: set[int],
               result: MissionResult) -> None:
    """Reserve room for the request's new chunks (their APPEND hints go out together),
    then write and commit each."""
    data = chunk_pattern(new, chunk_bytes)
    reservations = []
    for row, h in enumerate(new.tolist()):
        try:
            res = tenant.reserve(_key(h), chunk_bytes, session=session)
        except StoreFull:
            res = PutStatus.NO_SPACE
        if isinstance(res, PutStatus):
            result.chunks_not_stored += res is not PutStatus.EXISTS
            continue
        reservations.append((h, row, res))
    if sink is not None:
        sink.send_appends()
    for h, row, res in reservations:
        try:
            res.write(data[row])
        except BaseException:
            res.abort()
            raise
        res.commit()
        stored.add(h)
        result.chunks_written += 1


def _load(handle, tenant, session, reuse: np.ndarray, chunk_bytes: int, verify: bool, model: bool,
          result: MissionResult, latencies: list[float]) -> None:
    out = np.empty((reuse.size, chunk_bytes), np.uint8)
    before = handle.stats()
    t0 = handle.now_ns() if model else time.perf_counter_ns()
    got = tenant.get_many_into([_key(h) for h in reuse.tolist()], out, session=session)
    t1 = handle.now_ns() if model else time.perf_counter_ns()
    after = handle.stats()
    latencies.append(t1 - t0)
    result.chunks_loaded += got
    result.load_hits += after["hits"] - before["hits"]
    result.load_misses += after["misses"] - before["misses"]
    result.chunks_missing += reuse.size - got  # a miss in the store, never wrong bytes
    if verify and got:
        bad = np.any(out[:got] != chunk_pattern(reuse[:got], chunk_bytes), axis=1)
        result.corrupt_chunks += int(bad.sum())
