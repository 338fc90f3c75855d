"""hymcache: the HyMCache firmware - hint-driven prefix prefetch + opportunistic write buffering.

Recency order is LRU, in two segments: `main` and `demoted` (blocks of ended or
long-paused sessions, and stale prefetches: always the first victims). On top of it:

* prefix prefetch - SESSION_RESUME / NEXT_PREFIX ranges are queued block by block in
  prefix order; background() hands them out while fewer than `prefetch_budget` x DRAM
  slots are *protected*. Entries of ended or already served sessions are cancelled;
  entries that can no longer finish before their deadline (now + fill_ns > deadline)
  are dropped.
* protection - a block a hint says is about to be read (a prefetched block, or one of
  the hinted range already in DRAM) is skipped by victim() until it is read, so prefetch
  never evicts what a resumed session is about to read. Protection ages out (the aging
  rule, so stale prefetches do not pin DRAM or the budget):
    - the session is served: its SESSION_PAUSE or SESSION_END ends the protection of
      every block hinted for it before, and moves those blocks to the demoted segment;
    - time: `prefetch_ttl_ns` after the block was protected (after the NEXT_PREFIX
      deadline, when later) it becomes an ordinary LRU candidate.
  The budget counts protected blocks only, so aged-out prefetches free it.
* write buffering - written (appended) blocks stay dirty in DRAM; background() flushes
  the least recently written dirty blocks when they pass `high_watermark` x buffer,
  down to `low_watermark`, and flushes opportunistically when it has nothing else to
  do. Victims are chosen clean-first (within `victim_scan` of the LRU end), so
  foreground misses do not wait for write-backs unless the buffer is full.

Work per hook is proportional to the blocks it acts on: protected blocks are threaded
on a per-session list (a pause walks only that session's) and on one list in
protection order (the time sweep stops at the first live one); written blocks on a
write-order list that background() walks from its oldest end; resident blocks on their
owner session's list, so SESSION_END and a long pause, which demote every block of the
session, walk that session's blocks only.
"""
from collections import namedtuple

import numpy as np

from cxlhm import blocktable as btm
from cxlhm.jit import njit
from cxlhm.mailbox import hints as H
from firmware_policies import lists as L
from firmware_policies.base import JOB_FLUSH, JOB_PREFETCH, Param, Policy

MAIN, DEMOTED = 0, 1
MAX_PROBES = 64  # session-table probes before a session counts as untracked
ACTIVE, PAUSED, ENDED = 1, 2, 3
NONE = -1
# meta[] indices
Q_HEAD, Q_TAIL, N_PROTECTED, BUDGET_SLOTS, BUFFER_SLOTS, HIGH, LOW, VICTIM_SCAN, FILL_NS, LONG_PAUSE_NS, \
    IDLE_FLUSH, DROPPED_DEADLINE, CANCELLED, TTL_NS, AGED_SERVED, AGED_TTL = range(16)

State = namedtuple("State", [
    "prev", "nxt", "seg", "main", "demoted",          # recency: links, segment per slot, the two lists
    "qb", "qs", "qd", "qg",                           # prefetch queue: block, session, deadline, generation
    "s_keys", "s_state", "s_gen", "s_deadline", "s_ends",  # sessions (hash table; s_ends has an anonymous last row)
    "p_prev", "p_next", "p_sess", "p_expiry",         # protection: per-session list, its session row, expiry (ns)
    "t_prev", "t_next", "t_ends",                     # protected blocks in protection order
    "w_prev", "w_next", "w_in", "w_ends",             # written blocks, least recently written at the tail
    "o_prev", "o_next", "o_row", "o_ends",            # resident blocks by owner session: links, row, list ends
    "meta",
])


def make_state(n_slots, params):
    q = params["queue_blocks"]
    buckets = 1 << max(4, int(2 * params["max_sessions"] - 1).bit_length())
    buffer_slots = max(1, int(n_slots * params["buffer_fraction"]))
    meta = np.zeros(16, np.int64)
    meta[BUDGET_SLOTS] = max(1, int(n_slots * params["prefetch_budget"]))
    meta[BUFFER_SLOTS] = buffer_slots
    meta[HIGH] = max(1, int(buffer_slots * params["high_watermark"]))
    meta[LOW] = int(buffer_slots * params["low_watermark"])
    meta[VICTIM_SCAN] = params["victim_scan"]
    meta[FILL_NS] = params["fill_ns"]
    meta[LONG_PAUSE_NS] = params["long_pause_ns"]
    meta[IDLE_FLUSH] = params["idle_flush"]
    meta[TTL_NS] = params["prefetch_ttl_ns"]
    prev, nxt = L.new_links(n_slots)
    s_ends = np.empty((buckets + 1, 3), np.int64)
    s_ends[:] = L.new_list()

    def links():
        return np.full(n_slots, -1, np.int32)
    return State(
        prev, nxt, np.zeros(n_slots, np.int8), L.new_list(), L.new_list(),
        np.zeros(q, np.int64), np.zeros(q, np.int64), np.zeros(q, np.int64), np.zeros(q, np.int64),
        np.full(buckets, -1, np.int64), np.zeros(buckets, np.int8), np.zeros(buckets, np.int64),
        np.zeros(buckets, np.int64), s_ends,
        links(), links(), links(), np.zeros(n_slots, np.int64),
        links(), links(), L.new_list(),
        links(), links(), np.zeros(n_slots, np.int8), L.new_list(),
        links(), links(), links(), s_ends.copy(),
        meta)


# ---------------------------------------------------------------- sessions

@njit
def _session_bucket(ps, session, insert):
    keys = ps.s_keys
    mask = keys.shape[0] - 1
    i = (session * 0x9E3779B97F4A7C15 >> 17) & mask
    for _ in range(min(keys.shape[0], MAX_PROBES)):  # bounded: a full table costs no more than a busy one
        if keys[i] == session:
            return i
        if keys[i] == -1:
            if insert:
                keys[i] = session
                return i
            return -1
        i = (i + 1) & mask
    return -1  # table full: the hint is dropped (hints are advisory)


@njit
def _set_state(ps, session, state):
    i = _session_bucket(ps, session, True)
    if i >= 0:
        ps.s_state[i] = state
    return i


@njit(inline="always")
def _row_of(ps, session):
    """The protection-list row of a session: its bucket, or the anonymous last row
    (session 0, or a full session table)."""
    i = _session_bucket(ps, session, True) if session != 0 else -1
    return i if i >= 0 else ps.s_ends.shape[0] - 1


# ---------------------------------------------------------------- recency segments

@njit
def _move(ps, slot, segment):
    L.unlink(ps.prev, ps.nxt, ps.demoted if ps.seg[slot] == DEMOTED else ps.main, slot)
    ps.seg[slot] = segment
    L.push_head(ps.prev, ps.nxt, ps.demoted if segment == DEMOTED else ps.main, slot)


# ---------------------------------------------------------------- protection

@njit
def _protect(ps, bt, slot, row):
    """Protect `slot` for the session of `row` (re-protecting moves it there)."""
    if ps.p_sess[slot] >= 0:
        _unprotect(ps, slot)
    now_ns = bt.scalars[btm.NOW_NS]
    ps.p_sess[slot] = row
    L.push_head(ps.p_prev, ps.p_next, ps.s_ends[row], slot)
    L.push_head(ps.t_prev, ps.t_next, ps.t_ends, slot)
    start = now_ns
    if row < ps.s_deadline.shape[0] and ps.s_deadline[row] > start:
        start = ps.s_deadline[row]  # the host said it reads by then
    ps.p_expiry[slot] = start + ps.meta[TTL_NS]
    ps.meta[N_PROTECTED] += 1


@njit
def _unprotect(ps, slot):
    row = ps.p_sess[slot]
    L.unlink(ps.p_prev, ps.p_next, ps.s_ends[row], slot)
    L.unlink(ps.t_prev, ps.t_next, ps.t_ends, slot)
    ps.p_sess[slot] = NONE
    ps.meta[N_PROTECTED] -= 1


@njit
def _serve(ps, bt, session):
    """The session paused or ended: its request was served. Whatever was hinted for it
    and not read is stale: unprotected and demoted (first victims); its queued
    prefetches are cancelled (the generation moves on)."""
    row = _session_bucket(ps, session, True)
    if row < 0:
        return
    ps.s_gen[row] += 1
    ps.s_deadline[row] = 0
    ends = ps.s_ends[row]
    slot = ends[L.TAIL]
    while slot >= 0:
        before = ps.p_prev[slot]
        _unprotect(ps, slot)
        if ps.seg[slot] == MAIN:
            _move(ps, slot, DEMOTED)
        ps.meta[AGED_SERVED] += 1
        slot = before


@njit
def _sweep_expired(ps, now_ns):
    """Unprotect blocks whose protection timed out, oldest protection first (stops at the
    first live one: a later-protected block with an earlier expiry waits a little)."""
    slot = ps.t_ends[L.TAIL]
    while slot >= 0 and ps.p_expiry[slot] <= now_ns:
        before = ps.t_prev[slot]
        _unprotect(ps, slot)
        ps.meta[AGED_TTL] += 1
        slot = before


# ---------------------------------------------------------------- owners

@njit(inline="always")
def _own(ps, bt, slot):
    """Thread `slot` on its owner session's list (moving it from an earlier owner's)."""
    row = _row_of(ps, bt.owner[slot])
    if ps.o_row[slot] == row:
        return
    if ps.o_row[slot] >= 0:
        L.unlink(ps.o_prev, ps.o_next, ps.o_ends[ps.o_row[slot]], slot)
    ps.o_row[slot] = row
    L.push_head(ps.o_prev, ps.o_next, ps.o_ends[row], slot)


@njit(inline="always")
def _disown(ps, slot):
    if ps.o_row[slot] >= 0:
        L.unlink(ps.o_prev, ps.o_next, ps.o_ends[ps.o_row[slot]], slot)
        ps.o_row[slot] = NONE


# ---------------------------------------------------------------- write buffer

@njit(inline="always")
def _mark_written(ps, slot):
    if ps.w_in[slot]:
        L.move_to_head(ps.w_prev, ps.w_next, ps.w_ends, slot)
    else:
        ps.w_in[slot] = 1
        L.push_head(ps.w_prev, ps.w_next, ps.w_ends, slot)


@njit(inline="always")
def _unmark_written(ps, slot):
    if ps.w_in[slot]:
        ps.w_in[slot] = 0
        L.unlink(ps.w_prev, ps.w_next, ps.w_ends, slot)


@njit
def _flush_oldest(ps, bt, out, n, budget, keep):
    """Append FLUSH jobs for the least recently written dirty idle blocks until at most
    `keep` written blocks are left listed (or the budget is used). The list holds blocks
    written since their last flush; ones found clean (flushed by the host, or a
    write-through device) are dropped on the way."""
    ends = ps.w_ends
    slot = ends[L.TAIL]
    while slot >= 0 and n < budget and ends[L.LEN] > keep:
        before = ps.w_prev[slot]
        if not bt.flags[slot] & btm.DIRTY:
            _unmark_written(ps, slot)
        elif not bt.flags[slot] & btm.BUSY:
            out[n, 0], out[n, 1], out[n, 2] = JOB_FLUSH, bt.block[slot], bt.owner[slot]
            n += 1
            _unmark_written(ps, slot)  # the runtime writes it back now
        slot = before
    return n


# ---------------------------------------------------------------- hooks

@njit
def on_hit(ps, bt, slot, is_write, now):
    if ps.p_sess[slot] >= 0:
        _unprotect(ps, slot)  # read: what the protection was for
    _move(ps, slot, MAIN)
    _own(ps, bt, slot)  # the firmware has set its latest user
    if is_write:
        _mark_written(ps, slot)


@njit
def on_insert(ps, bt, slot, is_write, now):
    ps.seg[slot] = MAIN
    L.push_head(ps.prev, ps.nxt, ps.main, slot)
    _own(ps, bt, slot)
    if bt.flags[slot] & btm.PREFETCHED:
        _protect(ps, bt, slot, _row_of(ps, bt.owner[slot]))
    if is_write:
        _mark_written(ps, slot)


@njit
def on_evict(ps, bt, slot, now):
    if ps.p_sess[slot] >= 0:
        _unprotect(ps, slot)
    _unmark_written(ps, slot)
    _disown(ps, slot)
    L.unlink(ps.prev, ps.nxt, ps.demoted if ps.seg[slot] == DEMOTED else ps.main, slot)


@njit
def victim(ps, bt, now):
    meta = ps.meta
    slot = ps.demoted[L.TAIL]
    while slot >= 0:
        if btm.evictable(bt, slot) and ps.p_sess[slot] < 0:
            return slot
        slot = ps.prev[slot]
    # main segment, from the LRU end: clean and unprotected first
    now_ns = bt.scalars[btm.NOW_NS]
    fallback = -1
    scanned = 0
    slot = ps.main[L.TAIL]
    while slot >= 0:
        before = ps.prev[slot]
        if btm.evictable(bt, slot):
            if ps.p_sess[slot] >= 0 and ps.p_expiry[slot] <= now_ns:
                _unprotect(ps, slot)  # timed out: an ordinary candidate again
                meta[AGED_TTL] += 1
            if ps.p_sess[slot] < 0:
                if not bt.flags[slot] & btm.DIRTY:
                    return slot
                if fallback < 0:
                    fallback = slot
        scanned += 1
        if scanned >= meta[VICTIM_SCAN] and fallback >= 0:
            return fallback
        slot = before
    if fallback >= 0:
        return fallback
    slot = ps.t_ends[L.TAIL]  # only protected blocks left: the longest protected goes
    while slot >= 0 and not btm.evictable(bt, slot):
        slot = ps.t_prev[slot]
    return slot


@njit
def _demote_session(ps, bt, session):
    """Move the session's resident blocks to the demoted segment (O(its blocks): its
    owner list); blocks another session's hint protects stay."""
    row = _session_bucket(ps, session, False) if session != 0 else -1
    if row < 0:
        row = ps.o_ends.shape[0] - 1  # untracked (session 0, or the table was full): the shared row
    slot = ps.o_ends[row][L.TAIL]
    while slot >= 0:
        before = ps.o_prev[slot]
        if bt.owner[slot] == session and ps.seg[slot] == MAIN and ps.p_sess[slot] < 0:
            _move(ps, slot, DEMOTED)
        slot = before


@njit
def _enqueue(ps, session, first_block, n_blocks, deadline, gen):
    meta = ps.meta
    cap = ps.qb.shape[0]
    for block in range(first_block, first_block + n_blocks):
        if meta[Q_TAIL] - meta[Q_HEAD] >= cap:
            return  # queue full: the rest of the hint is dropped
        i = meta[Q_TAIL] % cap
        ps.qb[i], ps.qs[i], ps.qd[i], ps.qg[i] = block, session, deadline, gen
        meta[Q_TAIL] += 1


@njit
def on_hint(ps, bt, kind, session, first_block, n_blocks, arg, now):
    meta = ps.meta
    now_ns = bt.scalars[btm.NOW_NS]
    if kind == H.SESSION_RESUME or kind == H.NEXT_PREFIX:
        row = _set_state(ps, session, ACTIVE)
        deadline = now_ns + arg if kind == H.NEXT_PREFIX and arg > 0 else 0
        gen = 0
        if row >= 0:
            gen = ps.s_gen[row]
            ps.s_deadline[row] = deadline
        else:
            row = ps.s_ends.shape[0] - 1
        for block in range(first_block, first_block + n_blocks):
            slot = btm.lookup(bt, block)
            if slot < 0:
                continue
            if ps.seg[slot] == DEMOTED:  # resumed blocks leave the demoted segment
                _move(ps, slot, MAIN)
            # already in DRAM: protect it like a prefetched block (within the budget)
            if ps.p_sess[slot] >= 0 or meta[N_PROTECTED] < meta[BUDGET_SLOTS]:
                _protect(ps, bt, slot, row)
        _enqueue(ps, session, first_block, n_blocks, deadline, gen)
    elif kind == H.APPEND:
        _set_state(ps, session, ACTIVE)
    elif kind == H.SESSION_PAUSE:
        _set_state(ps, session, PAUSED)
        _serve(ps, bt, session)
        if arg >= meta[LONG_PAUSE_NS]:
            _demote_session(ps, bt, session)
    elif kind == H.SESSION_END:
        _set_state(ps, session, ENDED)
        _serve(ps, bt, session)
        _demote_session(ps, bt, session)


@njit
def background(ps, bt, now, budget, out):
    meta, qb, qs, qd, qg = ps.meta, ps.qb, ps.qs, ps.qd, ps.qg
    now_ns = bt.scalars[btm.NOW_NS]
    _sweep_expired(ps, now_ns)
    n = 0
    if ps.w_ends[L.LEN] > meta[HIGH]:  # the write buffer is filling up: drain to the low watermark
        n = _flush_oldest(ps, bt, out, n, budget, meta[LOW])
    cap = qb.shape[0]
    room = meta[BUDGET_SLOTS] - meta[N_PROTECTED]  # each prefetch is protected once placed (on_insert)
    while n < budget and room > 0 and meta[Q_HEAD] < meta[Q_TAIL]:
        i = meta[Q_HEAD] % cap
        meta[Q_HEAD] += 1
        row = _session_bucket(ps, qs[i], False)
        if row >= 0 and (ps.s_state[row] == ENDED or ps.s_gen[row] != qg[i]):
            meta[CANCELLED] += 1  # the session ended or was served meanwhile
            continue
        if qd[i] > 0 and now_ns + meta[FILL_NS] > qd[i]:
            meta[DROPPED_DEADLINE] += 1
            continue
        if btm.lookup(bt, qb[i]) >= 0:
            continue
        out[n, 0], out[n, 1], out[n, 2] = JOB_PREFETCH, qb[i], qs[i]
        n += 1
        room -= 1
    if n == 0 and meta[IDLE_FLUSH] and ps.w_ends[L.LEN] > 0:  # idle: write the buffer back now
        n = _flush_oldest(ps, bt, out, n, budget, 0)
    return n


_fraction = (lambda v: 0.0 < v <= 1.0, "must be in (0, 1]")
_positive = (lambda v: v > 0, "must be positive")

POLICY = Policy(
    name="hymcache",
    description="HyMCache: hint-driven prefix prefetch + opportunistic write buffering over a demoting LRU",
    make_state=make_state, on_hit=on_hit, on_insert=on_insert, victim=victim, on_evict=on_evict,
    on_hint=on_hint, background=background, write_mode="write-buffer",
    params={
        "prefetch_budget": Param(float, 0.5, "max share of DRAM holding protected (hinted, not yet read) blocks",
                                 *_fraction),
        "prefetch_ttl_ns": Param(int, 1_000_000_000, "protection of a hinted, unread block ends this long after it "
                                 "began (or after the NEXT_PREFIX deadline)", *_positive),
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
