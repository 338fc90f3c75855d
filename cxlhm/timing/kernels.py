"""The compiled timing model: every resource is a busy timeline (timeline.py), and an
operation's completion is its path through them.

Charging `d` ns of work that is ready at `t` on a resource puts it in the first idle
gap of length `d` at or after `t`; work charged earlier keeps its place. Pure
latencies (propagation, DRAM access) delay an operation without holding a resource;
a die is held for tR or tPROG, a channel or the link for the bytes it moves.

Resources:
  link down / link up     host bytes at the link bandwidth, + link latency each way
  device DRAM             bytes at DRAM bandwidth (host transfers, fill landings,
                          write-back reads), + DRAM latency
  NAND channel c          page transfers at the channel rate
  NAND die (c, d)         tR per page read (cache/multi-plane registers let the next
                          read start while the page waits for its channel), tPROG per
                          page program
  write buffer            a FIFO ring of page slots; a slot is reused once the page it
                          held is programmed (a full buffer stalls write-backs)
  controller, FTL         fixed latencies (controller_latency per host access,
                          ssd_command_latency per batch of NAND work)

Placement: a read of SSD byte offset `o` goes to page p = o // page_size, channel
p % channels, die (p // channels) % dies_per_channel (static striping). Writes are
appended to a log, one page after the other over the same striping (a log-structured
FTL), and programmed once a page is full; `charge_flush` programs a partial page.

All functions are numba-compiled with nogil and take only arrays and numbers, so the
firmware planner and the trace loop call them from their own compiled code.
Times are float64 ns: the same calls in the same order give bit-identical results.
Charge in non-decreasing issue time (closed loops and trace replay do): each charge
lets the timelines forget work that ended before its issue time, so a charge issued
earlier than one already made sees the resources as free before that time.
"""
from __future__ import annotations

import numpy as np

from cxlhm.jit import njit
from cxlhm.media.ssd import IO_LEN, IO_OFFSET
from cxlhm.timing import timeline as TL
from cxlhm.timing.params import (
    P_CH_NS_PER_BYTE, P_CHANNELS, P_CTRL_LAT, P_DIES_PER_CHANNEL, P_DRAM_LAT, P_DRAM_NS_PER_BYTE,
    P_HAS_NAND, P_LINK_LAT, P_LINK_NS_PER_BYTE, P_PAGE, P_SSD_CMD_LAT, P_TPROG, P_TR, P_WBUF_PAGES,
)

# ---------------------------------------------------------------- state layout
(S_HORIZON,           # latest issue time charged: no later charge is ready before it
 S_LOG_PAGE,          # next page of the write log
 S_OPEN_FILL,         # bytes buffered in the open (not yet full) log page
 S_OPEN_READY,        # when the last of those bytes arrived
 S_OPEN_SLOT_FREE,    # when the open page's write-buffer slot became free
 S_RING_HEAD,         # write-buffer slot of the open page
 S_LAST_PROGRAM_END,  # all programs charged so far are done by then
 S_NAND_PAGE_READS, S_NAND_PAGE_PROGRAMS,
 S_WRITE_STALL_NS,    # total time write-backs waited for write-buffer space
 N_STATE_SCALARS) = range(11)
# Resources, each a timeline (timeline.py) after the scalars: the link's two directions,
# device DRAM, then the channels, then the dies (channel-major); then the write-buffer
# ring (one float per page slot: when it is free again).
R_LINK_DOWN, R_LINK_UP, R_DRAM, R_FIRST_CHANNEL = range(4)


def state_size(channels: int, dies_per_channel: int, write_buffer_pages: int) -> int:
    resources = R_FIRST_CHANNEL + channels + channels * dies_per_channel
    return N_STATE_SCALARS + resources * TL.SIZE + write_buffer_pages


@njit(inline="always")
def _base(r):
    return N_STATE_SCALARS + r * TL.SIZE


@njit(inline="always")
def _channel(c):
    return _base(R_FIRST_CHANNEL + c)


@njit(inline="always")
def _die(params, c, d):
    channels = np.int64(params[P_CHANNELS])
    return _base(R_FIRST_CHANNEL + channels + c * np.int64(params[P_DIES_PER_CHANNEL]) + d)


@njit(inline="always")
def _ring_index(params, slot):
    channels = np.int64(params[P_CHANNELS])
    resources = R_FIRST_CHANNEL + channels + channels * np.int64(params[P_DIES_PER_CHANNEL])
    return N_STATE_SCALARS + resources * TL.SIZE + slot


# ---------------------------------------------------------------- resources
@njit(inline="always")
def _hold(state, base, ready, duration):
    """Serve `duration` ns on a resource once it is free and the work is ready."""
    return TL.reserve(state, base, state[S_HORIZON], ready, duration)


@njit
def link_up(params, state, ready_ns, nbytes):
    """Device -> host: when the last byte arrives at the host."""
    return _hold(state, _base(R_LINK_UP), ready_ns, nbytes * params[P_LINK_NS_PER_BYTE]) + params[P_LINK_LAT]


@njit
def link_down(params, state, ready_ns, nbytes):
    """Host -> device: when the last byte arrives at the device."""
    return _hold(state, _base(R_LINK_DOWN), ready_ns, nbytes * params[P_LINK_NS_PER_BYTE]) + params[P_LINK_LAT]


@njit
def dram(params, state, ready_ns, nbytes):
    """Move `nbytes` into or out of device DRAM: when they are there."""
    return _hold(state, _base(R_DRAM), ready_ns, nbytes * params[P_DRAM_NS_PER_BYTE]) + params[P_DRAM_LAT]


@njit
def nand_read(params, state, ready_ns, offset, nbytes):
    """Read SSD bytes [offset, offset+nbytes): each page holds its die for tR, then its
    bytes cross the die's channel. Returns when the last byte is off the channels."""
    page = np.int64(params[P_PAGE])
    channels = np.int64(params[P_CHANNELS])
    dies = np.int64(params[P_DIES_PER_CHANNEL])
    t_read = params[P_TR]
    ch_ns = params[P_CH_NS_PER_BYTE]
    end = offset + nbytes
    done = ready_ns
    p = offset // page
    c = p % channels  # then stepped page by page: no division in the loop
    d = (p // channels) % dies
    lo = offset
    while lo < end:
        hi = min(end, (p + 1) * page)
        read_end = _hold(state, _die(params, c, d), ready_ns, t_read)
        done = max(done, _hold(state, _channel(c), read_end, (hi - lo) * ch_ns))
        state[S_NAND_PAGE_READS] += 1.0
        p += 1
        lo = hi
        c += 1
        if c == channels:
            c = 0
            d += 1
            if d == dies:
                d = 0
    return done


@njit
def _program_open_page(params, state):
    """Program the open log page: its bytes cross the channel into the die's cache
    register, then the die is busy for tPROG. The page's write-buffer slot is free
    again when the program ends."""
    channels = np.int64(params[P_CHANNELS])
    page_no = np.int64(state[S_LOG_PAGE])
    c = page_no % channels
    in_die = _hold(state, _channel(c), state[S_OPEN_READY], state[S_OPEN_FILL] * params[P_CH_NS_PER_BYTE])
    die = _die(params, c, (page_no // channels) % np.int64(params[P_DIES_PER_CHANNEL]))
    program_end = _hold(state, die, in_die, params[P_TPROG])
    head = np.int64(state[S_RING_HEAD])
    state[_ring_index(params, head)] = program_end
    state[S_RING_HEAD] = (head + 1) % np.int64(params[P_WBUF_PAGES])
    state[S_LOG_PAGE] = page_no + 1
    state[S_OPEN_FILL] = 0.0
    state[S_LAST_PROGRAM_END] = max(state[S_LAST_PROGRAM_END], program_end)
    state[S_NAND_PAGE_PROGRAMS] += 1.0


@njit
def buffer_write(params, state, ready_ns, nbytes):
    """Hand `nbytes` (ready at `ready_ns`) to the SSD write buffer. Returns when all of
    them were accepted; full pages are programmed in the background."""
    page = params[P_PAGE]
    accepted = ready_ns
    left = float(nbytes)
    while left > 0.0:
        if state[S_OPEN_FILL] == 0.0:  # open the next page: wait for its buffer slot
            state[S_OPEN_SLOT_FREE] = state[_ring_index(params, np.int64(state[S_RING_HEAD]))]
            state[S_OPEN_READY] = 0.0
        arrive = max(ready_ns, state[S_OPEN_SLOT_FREE])
        take = min(left, page - state[S_OPEN_FILL])
        state[S_OPEN_FILL] += take
        left -= take
        state[S_OPEN_READY] = max(state[S_OPEN_READY], arrive)
        accepted = max(accepted, arrive)
        if state[S_OPEN_FILL] == page:
            _program_open_page(params, state)
    state[S_WRITE_STALL_NS] += accepted - ready_ns
    return accepted


@njit
def _write_backs(params, state, ready_ns, writebacks, n_wb):
    """Victims leave device DRAM for the write buffer: when all their slots are free."""
    free = ready_ns
    if params[P_HAS_NAND] == 0.0:
        return free  # a DRAM-only device has nothing to write back to
    for i in range(n_wb):
        nbytes = writebacks[i, IO_LEN]
        out = dram(params, state, ready_ns, nbytes)
        free = max(free, buffer_write(params, state, out, nbytes))
    return free


@njit
def _fills(params, state, ready_ns, slots_free_ns, fills, n_fill):
    """Missing blocks come from NAND (after the FTL/command overhead) and land in their
    slots once the victims' bytes have left. Fills that continue each other on the SSD
    are read as one extent, as a controller merges adjacent LBAs (blocks smaller than
    a NAND page then share one tR). Returns when the last byte has landed."""
    landed = ready_ns
    has_nand = params[P_HAS_NAND] != 0.0
    issue = ready_ns + params[P_SSD_CMD_LAT]
    i = 0
    while i < n_fill:
        offset = fills[i, IO_OFFSET]
        nbytes = fills[i, IO_LEN]
        i += 1
        while i < n_fill and fills[i, IO_OFFSET] == offset + nbytes:
            nbytes += fills[i, IO_LEN]
            i += 1
        if has_nand:
            got = nand_read(params, state, issue, offset, nbytes)
        else:
            got = ready_ns  # DRAM-only: a first touch zero-fills the slot
        landed = max(landed, dram(params, state, max(got, slots_free_ns), nbytes))
    return landed


# ---------------------------------------------------------------- the API
@njit(inline="always")
def _advance(state, issue_ns):
    """Charges come in issue order (the trace loop and closed loops guarantee it), so
    nothing charged from now on is ready before `issue_ns`: older busy intervals can go."""
    if issue_ns > state[S_HORIZON]:
        state[S_HORIZON] = issue_ns


@njit
def charge_access(params, state, issue_ns, is_write, host_bytes, fills, n_fill, writebacks, n_wb,
                  hit_ready_ns, through_bytes):
    """Charge one host access planned by the firmware; returns its completion (ns).

    issue_ns       when the host issued it (model clock)
    is_write       host write (data goes down the link) or read (data comes up)
    host_bytes     bytes the host transfers
    fills, n_fill  the planner's fill rows (SSD reads of missing blocks; len, offset used)
    writebacks, n_wb  the planner's write-back rows (dirty victims)
    hit_ready_ns   earliest time the resident blocks hold valid bytes (a prefetch still
                   landing); 0.0 when nothing is in flight
    through_bytes  bytes to write through to the SSD before the write completes
                   (write-through mode: the blocks written); 0 otherwise
    Path: link (request, + data for writes) -> controller -> write-backs out of DRAM ->
    fills from NAND into DRAM -> host bytes from/to DRAM (not before the victims'
    bytes left their slots) -> [write-through] -> link.
    """
    _advance(state, issue_ns)
    if is_write:
        t = link_down(params, state, issue_ns, host_bytes)
    else:
        t = issue_ns + params[P_LINK_LAT]
    t += params[P_CTRL_LAT]
    slots_free = _write_backs(params, state, t, writebacks, n_wb)
    # A slot whose dirty victim is still leaving takes no new bytes - from a fill or,
    # for a write that overwrites whole blocks (no fill), from the host - before the
    # victim's bytes are out of DRAM and accepted by the write buffer (slots_free: the
    # DRAM read-out, later only when a full buffer had no room for them; never tPROG
    # of the victim's own page). With fills this is already inside their landing time.
    ready = max(t, hit_ready_ns, slots_free)
    if n_fill > 0:
        ready = max(ready, _fills(params, state, t, slots_free, fills, n_fill))
    done = dram(params, state, ready, host_bytes)
    if is_write:
        if through_bytes > 0 and params[P_HAS_NAND] != 0.0:
            done = buffer_write(params, state, dram(params, state, done, through_bytes), through_bytes)
        return done + params[P_LINK_LAT]  # the completion message goes up
    return link_up(params, state, done, host_bytes)


@njit
def charge_background_read(params, state, issue_ns, fills, n_fill, writebacks, n_wb):
    """Prefetch: dirty victims out, blocks from NAND into DRAM, no host transfer.
    Returns when the blocks are resident (pass it as hit_ready_ns to accesses that hit
    them before then). Competes with host accesses for DRAM, channels and dies."""
    _advance(state, issue_ns)
    slots_free = _write_backs(params, state, issue_ns, writebacks, n_wb)
    return _fills(params, state, issue_ns, slots_free, fills, n_fill)


@njit
def charge_background_write(params, state, issue_ns, writebacks, n_wb):
    """Background write-back / flush of dirty blocks: DRAM read + write-buffer accept
    (+ NAND programs as pages fill). Returns when the slots may be reused or marked
    clean; `durable_ns` says when the programs are done."""
    _advance(state, issue_ns)
    return _write_backs(params, state, issue_ns, writebacks, n_wb)


@njit
def charge_flush(params, state, issue_ns):
    """Program the partial log page, if any; returns when every write charged so far is
    durable on NAND (a Global Persistent Flush)."""
    _advance(state, issue_ns)
    if params[P_HAS_NAND] != 0.0 and state[S_OPEN_FILL] > 0.0:
        state[S_OPEN_READY] = max(state[S_OPEN_READY], issue_ns)
        _program_open_page(params, state)
    return max(issue_ns, state[S_LAST_PROGRAM_END])


@njit
def durable_ns(state):
    return state[S_LAST_PROGRAM_END]
