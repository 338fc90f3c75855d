"""The firmware kernels of one policy: plan, access, prefetch, hints, background work and
the window's fault-service entry points, with the policy's hooks inlined.

Each policy runs its own copy of this module, made by the glue generator
(cxlhm/policy_glue.py) with the `_policy = ...` line below naming the policy, so the
hooks are module globals and numba caches the compiled kernels on disk (the generator's
docstring says why not closures). The shared pieces - extents, copies, finish - are in cxlhm/firmware.py.
"""
import numpy as np

from cxlhm import blocktable as btm
from cxlhm import policies
from cxlhm import counters as C
from cxlhm.firmware import DONE, DONE_BUT_COPY, MODE_PREFETCH, MODE_WRITE, NOT_DONE, PLACE_NO_SLOT, PLACE_PLACED, \
    PLACE_RESIDENT, WRITE_THROUGH, emit_row, copy_extents, finish
from cxlhm.jit import njit

_policy = policies.get("lru")  # the policy of this copy
on_hit, on_insert, victim, on_evict = _policy.on_hit, _policy.on_insert, _policy.victim, _policy.on_evict
on_hint, background_hook = _policy.on_hint, _policy.background


@njit
def place_block(bt, ps, counters, block, owner, now, for_prefetch):
    """Find a slot for a missing block - a free one, else the policy's victim - and
    map the block there. A victim evicted for a prefetch goes into the ghost table
    (a later host miss on it is pollution). Returns (slot or -1 when nothing is
    evictable, the victim's block or -1, the victim's flags before eviction); the
    caller writes a DIRTY victim back."""
    victim_block = -1
    victim_flags = np.uint8(0)
    slot = btm.take_free_slot(bt)
    if slot < 0:
        slot = victim(ps, bt, now)
        if slot < 0 or not btm.evictable(bt, slot):
            return -1, victim_block, victim_flags
        on_evict(ps, bt, slot, now)
        counters[C.EVICTIONS] += 1
        victim_block = bt.block[slot]
        victim_flags = bt.flags[slot]
        if victim_flags & btm.PREFETCHED:
            counters[C.PREFETCH_UNUSED] += 1
        if for_prefetch:
            btm.ghost_add(bt, victim_block)
        btm.unmap(bt, slot)
    if btm.ghost_take(bt, block) and not for_prefetch:
        counters[C.PREFETCH_POLLUTION] += 1  # a host miss on a block a prefetch pushed out
    btm.install(bt, slot, block, owner, now)
    return slot, victim_block, victim_flags

@njit
def hit_block(bt, ps, counters, slot, is_write, now):
    """A host access found its block resident in `slot`."""
    counters[C.HITS] += 1
    on_hit(ps, bt, slot, is_write, now)  # sees PREFETCHED still set
    if bt.flags[slot] & btm.PREFETCHED:
        counters[C.PREFETCH_USEFUL] += 1
        bt.flags[slot] &= ~btm.PREFETCHED
    bt.stamp[slot] = now

@njit
def miss_block(bt, ps, counters, block, owner, now, is_write):
    """A host access missed `block`: place it (the caller fills the slot and writes
    a DIRTY victim back). Returns place_block's tuple."""
    counters[C.MISSES] += 1
    placed = place_block(bt, ps, counters, block, owner, now, False)
    if placed[0] >= 0:
        on_insert(ps, bt, placed[0], is_write, now)
    return placed

@njit
def prefetch_block(bt, ps, counters, block, owner, now):
    """Bring `block` in ahead of use: PLACE_RESIDENT when it already is (redundant),
    PLACE_NO_SLOT when nothing is evictable, else PLACE_PLACED with the slot
    PREFETCHED (a later host hit counts as useful) and BUSY until its fill is done.
    Returns (status, slot, victim block, victim flags)."""
    slot = btm.lookup(bt, block)
    if slot >= 0:
        counters[C.PREFETCH_REDUNDANT] += 1
        return PLACE_RESIDENT, slot, np.int64(-1), np.uint8(0)
    slot, victim_block, victim_flags = place_block(bt, ps, counters, block, owner, now, True)
    if slot < 0:
        return PLACE_NO_SLOT, slot, victim_block, victim_flags
    bt.flags[slot] |= btm.PREFETCHED | btm.BUSY
    on_insert(ps, bt, slot, False, now)
    counters[C.PREFETCH_ISSUED] += 1
    return PLACE_PLACED, slot, victim_block, victim_flags

@njit
def plan(bt, ps, counters, clock, ext_hpa, ext_len, is_write, write_mode, owner,
         base, block_size, slots_out, installed_out, writebacks, fills):
    """Plan one host access over extents [ext_hpa[e], +ext_len[e]).
    Fills slots_out (one per block touched, in order), installed_out (1 where the
    block was newly placed, so its slot holds no valid bytes until I/O and copy
    finish), writebacks and fills
    (struct cxlhm_io rows). Returns (ok, n_slots_used, n_writebacks, n_fills);
    ok is False when DRAM had no evictable slot: the caller must still run the
    I/O planned so far (victims already unmapped) and release the busy slots."""
    k = 0
    n_wb = 0
    n_fill = 0
    ok = True
    for e in range(ext_hpa.shape[0]):
        if not ok:
            break
        hpa = ext_hpa[e]
        length = ext_len[e]
        if length <= 0:
            continue
        if is_write:
            counters[C.HOST_WRITES] += 1
            counters[C.HOST_WRITE_BYTES] += length
        else:
            counters[C.HOST_READS] += 1
            counters[C.HOST_READ_BYTES] += length
        first = hpa // block_size
        last = (hpa + length - 1) // block_size
        for block in range(first, last + 1):
            if not ok:
                break
            now = clock[0]
            clock[0] = now + 1
            slot = btm.lookup(bt, block)
            installed_out[k] = slot < 0
            if slot >= 0:
                if bt.flags[slot] & btm.DIRTY:  # the write buffer absorbs this access
                    if is_write:  # the block's earlier bytes will never reach the SSD
                        counters[C.WRITE_COALESCED_BYTES] += (min(hpa + length, (block + 1) * block_size)
                                                              - max(hpa, block * block_size))
                    else:
                        counters[C.BUFFER_READ_HITS] += 1
                if owner != 0:
                    bt.owner[slot] = owner  # shared blocks belong to their latest user (on_hit sees it)
                hit_block(bt, ps, counters, slot, is_write, now)
            else:
                slot, victim_block, victim_flags = miss_block(bt, ps, counters, block, owner, now, is_write)
                if slot < 0:
                    ok = False
                    break
                if victim_block >= 0 and victim_flags & btm.DIRTY:
                    emit_row(writebacks, n_wb, base, block_size, slot, victim_block, 1)
                    n_wb += 1
                covers_block = is_write and block * block_size >= hpa and (block + 1) * block_size <= hpa + length
                if not covers_block:  # partial writes need the old bytes around them
                    emit_row(fills, n_fill, base, block_size, slot, block, 0)
                    n_fill += 1
            bt.flags[slot] |= btm.BUSY
            bt.stamp[slot] = now
            if is_write and write_mode != WRITE_THROUGH:
                bt.flags[slot] |= btm.DIRTY
            slots_out[k] = slot
            k += 1
    counters[C.FILL_READS] += n_fill
    counters[C.WRITEBACKS] += n_wb
    counters[C.FG_WRITEBACKS] += n_wb
    counters[C.SSD_READS] += n_fill
    counters[C.SSD_WRITES] += n_wb
    counters[C.SSD_READ_BYTES] += n_fill * block_size
    counters[C.SSD_WRITE_BYTES] += n_wb * block_size
    return ok, k, n_wb, n_fill

@njit
def invalidate(bt, ps, slot, now):
    """Drop a slot's block without writing it back (its bytes are not trustworthy)."""
    on_evict(ps, bt, slot, now)
    btm.unmap(bt, slot)
    btm.release_slot(bt, slot)

@njit
def access(bt, ps, counters, clock, ext_hpa, ext_len, is_write, write_mode, owner,
           base, block_size, slots_out, installed_out, writebacks, fills, user_addr, moves_data,
           copy_at_most):
    """plan(), and when the plan needs no SSD I/O (all hits, or misses on a
    timing-only device) also the copy (of at most `copy_at_most` bytes) and finish -
    so a DRAM hit costs one call. Returns plan()'s tuple plus `done`: NOT_DONE (the
    caller runs the I/O, then copy_extents() and finish()), DONE, or DONE_BUT_COPY
    (finished, the longer copy left to the caller, which still holds the device lock:
    no other pass can take the slots before it is made)."""
    ok, k, n_wb, n_fill = plan(bt, ps, counters, clock, ext_hpa, ext_len, is_write, write_mode, owner,
                               base, block_size, slots_out, installed_out, writebacks, fills)
    needs_io = moves_data and (n_wb > 0 or n_fill > 0 or (is_write and write_mode == WRITE_THROUGH))
    if not ok or needs_io:
        return ok, k, n_wb, n_fill, NOT_DONE
    done = DONE
    if moves_data:
        if ext_len.sum() > copy_at_most:
            done = DONE_BUT_COPY
        else:
            copy_extents(base, block_size, slots_out, ext_hpa, ext_len, user_addr, not is_write)
    finish(bt, slots_out, k)
    return ok, k, n_wb, n_fill, done

@njit
def plan_prefetch(bt, ps, counters, clock, blocks, owners, base, block_size,
                  slots_out, writebacks, fills):
    """Bring `blocks` into DRAM ahead of use (background work). Resident blocks are
    skipped; each placed block is PREFETCHED (so a later host hit counts as useful)
    and BUSY until finish(). Stops at the first block with no slot to take.
    Returns (n_slots_used, n_writebacks, n_fills)."""
    k = 0
    n_wb = 0
    for i in range(blocks.shape[0]):
        block = blocks[i]
        status, slot, victim_block, victim_flags = prefetch_block(bt, ps, counters, block, owners[i], clock[0])
        if status == PLACE_RESIDENT:
            continue
        if status == PLACE_NO_SLOT:
            counters[C.PREFETCH_DROPPED] += blocks.shape[0] - i
            break
        if victim_block >= 0 and victim_flags & btm.DIRTY:
            emit_row(writebacks, n_wb, base, block_size, slot, victim_block, 1)
            n_wb += 1
        emit_row(fills, k, base, block_size, slot, block, 0)
        slots_out[k] = slot
        k += 1
    counters[C.SSD_READS] += k
    counters[C.SSD_READ_BYTES] += k * block_size
    counters[C.WRITEBACKS] += n_wb
    counters[C.SSD_WRITES] += n_wb
    counters[C.SSD_WRITE_BYTES] += n_wb * block_size
    return k, n_wb, k

# ---- the window's fault service (cxlhm/window): the same hooks, one block per call
@njit
def fault_place(bt, ps, counters, clock, block, mode, owner, out):
    """A slot for `block`, which a fault (or a prefetch, with MODE_PREFETCH) needs.
    PLACE_RESIDENT: out[0] is its slot. PLACE_PLACED: out[0] the slot (BUSY until
    fault_finish), out[1] the evicted block or -1, out[2] its flags (the caller
    writes a DIRTY one back and drops its pages). PLACE_NO_SLOT: nothing evictable."""
    now = clock[0]
    if mode & MODE_PREFETCH:  # background work: not a host access, the clock does not tick
        status, slot, victim_block, victim_flags = prefetch_block(bt, ps, counters, block, owner, now)
        if status == PLACE_NO_SLOT:
            counters[C.PREFETCH_DROPPED] += 1
    else:
        clock[0] = now + 1
        slot = btm.lookup(bt, block)
        if slot >= 0:
            out[0] = slot
            return PLACE_RESIDENT
        status = PLACE_NO_SLOT
        slot, victim_block, victim_flags = miss_block(bt, ps, counters, block, owner, now, (mode & MODE_WRITE) != 0)
        if slot >= 0:
            status = PLACE_PLACED
            bt.flags[slot] |= btm.BUSY  # never a victim until its pages are installed
            counters[C.FILL_READS] += 1
    out[0] = slot
    out[1] = victim_block
    out[2] = victim_flags
    return status

@njit
def fault_hit(bt, ps, counters, clock, slot, is_write):
    """An access the window's fault service saw on a resident block (a first store,
    or a sampled access). Returns 0 when the slot holds no block any more."""
    now = clock[0]
    clock[0] = now + 1
    if bt.block[slot] < 0:
        return 0
    hit_block(bt, ps, counters, slot, is_write, now)
    return 1

@njit
def background(bt, ps, clock, budget, jobs):
    return background_hook(ps, bt, clock[0], budget, jobs)

@njit
def hint(bt, ps, clock, kind, session, first_block, n_blocks, arg):
    on_hint(ps, bt, kind, session, first_block, n_blocks, arg, clock[0])


@njit
def hints(bt, ps, clock, kind, sessions, first_blocks, n_blocks, args):
    """A batch of hints of one kind, in order, in one call: a mailbox command's entries
    cost one dispatch, not one each. PIN / UNPIN are the runtime's, never passed here."""
    for i in range(sessions.shape[0]):
        on_hint(ps, bt, kind, sessions[i], first_blocks[i], n_blocks[i], args[i], clock[0])
