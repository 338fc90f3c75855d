"""The trace simulator's replay loops of one policy (cxlhm/sim.py says what they do), with
the policy's planner inlined.

Each policy runs its own copy of this module, made by the glue generator
(cxlhm/policy_glue.py) with the `_policy = ...` line below naming the policy, so the
loops are cached on disk like the firmware kernels.

The trace is in memory, so a loop knows its next accesses: `AHEAD` accesses ahead it
asks the CPU for the block's index bucket, and half as far ahead - the bucket is in
cache by then - it looks the block up and asks for the slot's rows of the arrays in
`rows` (the block table's and the policy state's per-slot arrays, `sim.slot_rows`).
A replay spends most of its time waiting for those cache lines, each access touching
a random slot; the prefetches are hints only (a stale slot costs a wasted line, never a
wrong result), so the planner's work is exactly the device's.
"""
from cxlhm import blocktable as btm
from cxlhm import firmware as fw
from cxlhm import policies
from cxlhm.jit import njit, prefetch
from cxlhm.timing import charge_access
from cxlhm.timing import record as record_latency

_policy = policies.get("lru")  # the policy of this copy
_firmware = fw.kernels_for(_policy)
plan, finish = _firmware.plan, fw.finish
upcoming = _policy.upcoming
WRITE_THROUGH = fw.WRITE_THROUGH

AHEAD = 16  # accesses: measured best of 8, 16, 32 for lru on a 100k-slot Zipf replay
HALF = AHEAD // 2

# the timed loop's clock array (sim.T_NOW, sim.T_END)
T_NOW, T_END = 0, 1


@njit(inline="always")
def prefetch_ahead(bt, ps, blocks, i, rows):
    """Ask for the cache lines access i + AHEAD's lookup and access i + HALF's planning
    will read (see the module doc), and tell the policy what access i + HALF will be
    (its `upcoming` hook prefetches what its hooks will read)."""
    n = blocks.shape[0]
    keys = bt.index_keys
    if i + AHEAD < n:
        bucket = btm.home_bucket(keys, blocks[i + AHEAD])
        prefetch(keys.ctypes.data + bucket * keys.strides[0])
        prefetch(bt.index_slots.ctypes.data + bucket * bt.index_slots.strides[0])
    if i + HALF < n:
        block = blocks[i + HALF]
        slot = btm.lookup_index(keys, bt.index_slots, block)
        if slot >= 0:
            for r in range(rows.shape[0]):
                prefetch(rows[r, 0] + slot * rows[r, 1])
        upcoming(ps, bt, block, slot)


@njit
def replay(bt, ps, counters, clock, blocks, writes, write_mode, start, stop, scratch, rows):
    """Run accesses [start, stop). Returns stop, or the index of the access that
    found no evictable slot."""
    ext_hpa, ext_len, slots, installed, writebacks, fills = scratch
    for i in range(start, stop):
        prefetch_ahead(bt, ps, blocks, i, rows)
        ext_hpa[0] = blocks[i]
        # ---- one access through the firmware (the timed loop below adds the model) ----
        ok, k, n_wb, n_fill = plan(bt, ps, counters, clock, ext_hpa, ext_len, writes[i], write_mode,
                                   0, 0, 1, slots, installed, writebacks, fills)
        finish(bt, slots, k)
        # --------------------------------------------------------------------------
        if not ok:
            return i
    return stop


@njit
def replay_timed(bt, ps, counters, clock, blocks, writes, write_mode, start, stop, scratch, rows, block_size,
                 params, tstate, tclock, issue_ns, open_loop, ring, ring_base, rec_values, rec_meta):
    """replay() plus the timing model, charged exactly as the Device charges an access on
    the model clock for a one-block access of `block_size` bytes: the planner's fill and
    write-back rows (byte offsets, block_size long) go to charge_access; closed loop
    (QD1): an access issues at the model clock and the clock moves to its completion;
    open loop: it issues at max(clock, issue_ns[i]) and the clock stays there. No
    prefetches run here, so no access waits for one (hit_ready_ns = 0). Latencies
    (completion - issue) go to the recorder."""
    ext_hpa, ext_len, slots, installed, writebacks, fills = scratch
    ext_len[0] = block_size
    through = block_size if write_mode == WRITE_THROUGH else 0
    now = tclock[T_NOW]
    end = tclock[T_END]
    for i in range(start, stop):
        prefetch_ahead(bt, ps, blocks, i, rows)
        ext_hpa[0] = blocks[i] * block_size
        is_write = writes[i]
        ok, k, n_wb, n_fill = plan(bt, ps, counters, clock, ext_hpa, ext_len, is_write, write_mode,
                                   0, 0, block_size, slots, installed, writebacks, fills)
        finish(bt, slots, k)
        if not ok:
            tclock[T_NOW] = now
            tclock[T_END] = end
            return i
        if open_loop and issue_ns[i] > now:
            now = issue_ns[i]
        done = charge_access(params, tstate, now, is_write, block_size, fills, n_fill, writebacks, n_wb,
                             0.0, through if is_write else 0)
        record_latency(rec_values, rec_meta, done - now)
        if done > end:
            end = done
        if not open_loop:
            # this access holds its queue slot until `done`; the next access takes the
            # slot freed longest ago, and issues once that one completed
            qd = ring.shape[0]
            ring[(ring_base + i) % qd] = done
            nxt = ring[(ring_base + i + 1) % qd]
            if nxt > now:
                now = nxt
    tclock[T_NOW] = now
    tclock[T_END] = end
    return stop
