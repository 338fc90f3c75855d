"""hymcache: the HyMCache firmware - hint-driven prefix prefetch + opportunistic write buffering.

Recency order is LRU, in two segments: `main` and `demoted` (blocks of ended or
long-paused sessions, always the first victims). On top of it:

* prefix prefetch - SESSION_RESUME / NEXT_PREFIX ranges are queued block by block in
  prefix order; background() hands them out while fewer than `prefetch_budget` x DRAM
  slots hold prefetched-but-unread blocks, so prefetch never evicts what a resumed
  session is about to read. Entries of ended sessions are cancelled; entries that can
  no longer finish before their deadline (now + fill_ns > deadline) are dropped.
* write buffering - written (appended) blocks stay dirty in DRAM; background() flushes
  the oldest dirty blocks when they pass `high_watermark` x buffer, down to
  `low_watermark`, and flushes opportunistically when it has nothing else to do.
  Victims are chosen clean-first (within `victim_scan` of the LRU end), so foreground
  misses do not wait for write-backs unless the buffer is full.
"""
import numba
import numpy as np

from cxlhm import blocktable as btm
from cxlhm.mailbox import hints as H
from firmware_policies import _lists as L
from firmware_policies.base import JOB_FLUSH, JOB_PREFETCH, Param, Policy

MAIN, DEMOTED = 0, 1
ACTIVE, PAUSED, ENDED = 1, 2, 3
# meta[] indices
Q_HEAD, Q_TAIL, N_PREFETCHED, BUDGET_SLOTS, BUFFER_SLOTS, HIGH, LOW, VICTIM_SCAN, FILL_NS, LONG_PAUSE_NS, \
    IDLE_FLUSH, DROPPED_DEADLINE, CANCELLED = range(13)


def make_state(n_slots, params):
    q = params["queue_blocks"]
    buckets = 1 << max(4, int(2 * params["max_sessions"] - 1).bit_length())
    buffer_slots = max(1, int(n_slots * params["buffer_fraction"]))
    meta = np.zeros(13, np.int64)
    meta[BUDGET_SLOTS] = max(1, int(n_slots * params["prefetch_budget"]))
    meta[BUFFER_SLOTS] = buffer_slots
    meta[HIGH] = max(1, int(buffer_slots * params["high_watermark"]))
    meta[LOW] = int(buffer_slots * params["low_watermark"])
    meta[VICTIM_SCAN] = params["victim_scan"]
    meta[FILL_NS] = params["fill_ns"]
    meta[LONG_PAUSE_NS] = params["long_pause_ns"]
    meta[IDLE_FLUSH] = params["idle_flush"]
    prev, nxt = L.new_links(n_slots)
    return (prev, nxt, np.zeros(n_slots, np.int64),               # links, segment per slot
            L.new_list(), L.new_list(),                            # main, demoted
            np.zeros(q, np.int64), np.zeros(q, np.int64), np.zeros(q, np.int64),  # queue: block, session, deadline
            np.full(buckets, -1, np.int64), np.zeros(buckets, np.int64),           # sessions: id, state
            meta)


@numba.njit(nogil=True)
def _session_bucket(ps, session, insert):
    keys = ps[8]
    mask = keys.shape[0] - 1
    i = (session * 0x9E3779B97F4A7C15 >> 17) & mask
    for _ in range(keys.shape[0]):
        if keys[i] == session:
            return i
        if keys[i] == -1:
            if insert:
                keys[i] = session
                return i
            return -1
        i = (i + 1) & mask
    return -1  # table full: the hint is dropped (hints are advisory)


@numba.njit(nogil=True)
def _session_state(ps, session):
    i = _session_bucket(ps, session, False)
    return ps[9][i] if i >= 0 else 0


@numba.njit(nogil=True)
def _set_state(ps, session, state):
    i = _session_bucket(ps, session, True)
    if i >= 0:
        ps[9][i] = state


@numba.njit(nogil=True)
def _move(ps, slot, segment):
    prev, nxt, seg, main, demoted = ps[0], ps[1], ps[2], ps[3], ps[4]
    L.unlink(prev, nxt, demoted if seg[slot] == DEMOTED else main, slot)
    seg[slot] = segment
    L.push_head(prev, nxt, demoted if segment == DEMOTED else main, slot)


@numba.njit(nogil=True)
def on_hit(ps, bt, slot, is_write, now):
    if bt.flags[slot] & btm.PREFETCHED:
        ps[10][N_PREFETCHED] -= 1
    _move(ps, slot, MAIN)


@numba.njit(nogil=True)
def on_insert(ps, bt, slot, is_write, now):
    ps[2][slot] = MAIN
    L.push_head(ps[0], ps[1], ps[3], slot)
    if bt.flags[slot] & btm.PREFETCHED:
        ps[10][N_PREFETCHED] += 1


@numba.njit(nogil=True)
def on_evict(ps, bt, slot, now):
    if bt.flags[slot] & btm.PREFETCHED:
        ps[10][N_PREFETCHED] -= 1
    L.unlink(ps[0], ps[1], ps[4] if ps[2][slot] == DEMOTED else ps[3], slot)


@numba.njit(nogil=True)
def victim(ps, bt, now):
    prev, demoted, main, meta = ps[0], ps[4], ps[3], ps[10]
    slot = demoted[L.TAIL]
    while slot >= 0:
        if btm.evictable(bt, slot):
            return slot
        slot = prev[slot]
    # main segment, from the LRU end: clean and not awaiting its reader first
    fallback = -1
    scanned = 0
    slot = main[L.TAIL]
    while slot >= 0:
        if btm.evictable(bt, slot) and not bt.flags[slot] & btm.PREFETCHED:
            if not bt.flags[slot] & btm.DIRTY:
                return slot
            if fallback < 0:
                fallback = slot
        scanned += 1
        if scanned >= meta[VICTIM_SCAN] and fallback >= 0:
            return fallback
        slot = prev[slot]
    if fallback >= 0:
        return fallback
    slot = main[L.TAIL]  # only prefetched blocks left: the oldest goes
    while slot >= 0 and not btm.evictable(bt, slot):
        slot = prev[slot]
    return slot


@numba.njit(nogil=True)
def _demote_session(ps, bt, session):
    """Move the session's resident blocks to the demoted segment (O(DRAM slots))."""
    for slot in range(bt.block.shape[0]):
        if bt.block[slot] >= 0 and bt.owner[slot] == session and ps[2][slot] == MAIN:
            _move(ps, slot, DEMOTED)


@numba.njit(nogil=True)
def _enqueue(ps, session, first_block, n_blocks, deadline):
    qb, qs, qd, meta = ps[5], ps[6], ps[7], ps[10]
    cap = qb.shape[0]
    for block in range(first_block, first_block + n_blocks):
        if meta[Q_TAIL] - meta[Q_HEAD] >= cap:
            return  # queue full: the rest of the hint is dropped
        i = meta[Q_TAIL] % cap
        qb[i], qs[i], qd[i] = block, session, deadline
        meta[Q_TAIL] += 1


@numba.njit(nogil=True)
def on_hint(ps, bt, kind, session, first_block, n_blocks, arg, now):
    meta = ps[10]
    now_ns = bt.scalars[btm.NOW_NS]
    if kind == H.SESSION_RESUME or kind == H.NEXT_PREFIX:
        _set_state(ps, session, ACTIVE)
        deadline = now_ns + arg if kind == H.NEXT_PREFIX and arg > 0 else 0
        for block in range(first_block, first_block + n_blocks):  # resumed blocks leave the demoted segment
            slot = btm.lookup(bt, block)
            if slot >= 0 and ps[2][slot] == DEMOTED:
                _move(ps, slot, MAIN)
        _enqueue(ps, session, first_block, n_blocks, deadline)
    elif kind == H.APPEND:
        _set_state(ps, session, ACTIVE)
    elif kind == H.SESSION_PAUSE:
        _set_state(ps, session, PAUSED)
        if arg >= meta[LONG_PAUSE_NS]:
            _demote_session(ps, bt, session)
    elif kind == H.SESSION_END:
        _set_state(ps, session, ENDED)  # queued prefetches of the session are cancelled lazily
        _demote_session(ps, bt, session)


@numba.njit(nogil=True)
def _flush_oldest(ps, bt, out, n, budget, count):
    """Append FLUSH jobs for up to `count` dirty idle blocks, oldest first
    (demoted segment before main)."""
    for ends in (ps[4], ps[3]):
        slot = ends[L.TAIL]
        while slot >= 0 and n < budget and count > 0:
            if bt.flags[slot] & btm.DIRTY and not bt.flags[slot] & btm.BUSY:
                out[n, 0], out[n, 1], out[n, 2] = JOB_FLUSH, bt.block[slot], bt.owner[slot]
                n += 1
                count -= 1
            slot = ps[0][slot]
    return n


@numba.njit(nogil=True)
def background(ps, bt, now, budget, out):
    meta, qb, qs, qd = ps[10], ps[5], ps[6], ps[7]
    now_ns = bt.scalars[btm.NOW_NS]
    n = 0
    dirty = 0
    for slot in range(bt.flags.shape[0]):
        if bt.flags[slot] & btm.DIRTY:
            dirty += 1
    if dirty > meta[HIGH]:  # the write buffer is filling up: drain to the low watermark
        n = _flush_oldest(ps, bt, out, n, budget, dirty - meta[LOW])
    cap = qb.shape[0]
    room = meta[BUDGET_SLOTS] - meta[N_PREFETCHED]
    while n < budget and room > 0 and meta[Q_HEAD] < meta[Q_TAIL]:
        i = meta[Q_HEAD] % cap
        meta[Q_HEAD] += 1
        if _session_state(ps, qs[i]) == ENDED:
            meta[CANCELLED] += 1
            continue
        if qd[i] > 0 and now_ns + meta[FILL_NS] > qd[i]:
            meta[DROPPED_DEADLINE] += 1
            continue
        if btm.lookup(bt, qb[i]) >= 0:
            continue
        out[n, 0], out[n, 1], out[n, 2] = JOB_PREFETCH, qb[i], qs[i]
        n += 1
        room -= 1
    if n == 0 and meta[IDLE_FLUSH] and dirty > 0:  # idle: write the buffer back now
        n = _flush_oldest(ps, bt, out, n, budget, dirty)
    return n


_fraction = (lambda v: 0.0 < v <= 1.0, "must be in (0, 1]")
_positive = (lambda v: v > 0, "must be positive")

POLICY = Policy(
    name="hymcache",
    description="HyMCache: hint-driven prefix prefetch + opportunistic write buffering over a demoting LRU",
    make_state=make_state, on_hit=on_hit, on_insert=on_insert, victim=victim, on_evict=on_evict,
    on_hint=on_hint, background=background, write_mode="write-buffer",
    params={
        "prefetch_budget": Param(float, 0.5, "max share of DRAM holding prefetched, not yet read blocks", *_fraction),
        "buffer_fraction": Param(float, 0.25, "share of DRAM the write buffer may fill before it is drained", *_fraction),
        "high_watermark": Param(float, 0.8, "drain the write buffer above this share of it", *_fraction),
        "low_watermark": Param(float, 0.5, "... down to this share", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
        "victim_scan": Param(int, 32, "LRU-end blocks searched for a clean victim", *_positive),
        "fill_ns": Param(int, 60_000, "expected SSD read time of a block (deadline drops)", *_positive),
        "long_pause_ns": Param(int, 1_000_000_000, "a pause at least this long demotes the session's blocks", *_positive),
        "idle_flush": Param(int, 1, "1: flush the buffer whenever there is no other work", lambda v: v in (0, 1), "must be 0 or 1"),
        "queue_blocks": Param(int, 1 << 16, "prefetch queue capacity in blocks", *_positive),
        "max_sessions": Param(int, 1 << 14, "sessions tracked at once", *_positive),
    },
)
