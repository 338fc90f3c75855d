"""The firmware runtime: turns host accesses into block-table updates and SSD I/O.

For every policy, `kernels_for(policy)` compiles one access planner with the policy's
hooks inlined (numba, nopython, nogil). A host access is executed in four steps:

  plan     compiled: hits and misses, victims, and two I/O lists - write-backs of dirty
           victims and fill reads of missing blocks - with every touched slot marked BUSY
  I/O      write-backs first (a victim's slot may be refilled in the same batch),
           then fill reads; each list is one io_uring batch
  copy     compiled memcpy between the caller's buffer and the slots
  finish   compiled: clear BUSY

On the wall clock the device runs the fill reads and the copy without its lock, so
several host threads keep I/O in flight at once; BUSY keeps other threads off those
slots meanwhile (victim() skips them, `touches_busy` makes a planner wait for them).

The same planner runs with data movement switched off (``data: none``): only the
I/O and copy steps are skipped, so timing-only results follow the same code path.
"""
from __future__ import annotations

import ctypes
from collections import namedtuple

import numba
import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm._native import lib as _abi
from cxlhm.media.ssd import IO_FIELDS
from firmware_policies.base import Policy

WRITE_BACK, WRITE_THROUGH, WRITE_BUFFER = 0, 1, 2

# The firmware's C ABI - the operations of the window's fault service, the answers of a
# placement and its modes - is declared once, in native/cxlhm_uffd.h, and read here
# through cffi.
OPS = {name[len("CXLHM_OP_"):]: getattr(_abi, name) for name in dir(_abi) if name.startswith("CXLHM_OP_")}
PLACE_NO_SLOT, PLACE_RESIDENT, PLACE_PLACED = _abi.CXLHM_PLACE_NO_SLOT, _abi.CXLHM_PLACE_RESIDENT, _abi.CXLHM_PLACE_PLACED
MODE_WRITE, MODE_PREFETCH = _abi.CXLHM_MODE_WRITE, _abi.CXLHM_MODE_PREFETCH
WRITE_MODE_CODES = {"write-back": WRITE_BACK, "write-through": WRITE_THROUGH, "write-buffer": WRITE_BUFFER}

Kernels = namedtuple("Kernels", "plan access invalidate hint plan_prefetch background fault_place fault_hit")

_libc = ctypes.CDLL(None)
_memcpy = _libc.memcpy
_memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_memcpy.restype = ctypes.c_void_p


@numba.njit(nogil=True, inline="always")
def _emit(ops, i, base, block_size, slot, block, write):
    ops[i, 0] = base + slot * block_size
    ops[i, 1] = block_size
    ops[i, 2] = block * block_size
    ops[i, 3] = write


@numba.njit(nogil=True, inline="always")
def _copy_extent(base, block_size, slots, k, hpa, left, addr, to_user):
    """memcpy one extent between the buffer at `addr` and its slots, which start at
    slots[k]; returns the index after its last slot. A run of blocks that sit in
    consecutive slots is one memcpy: a big copy is made the way np.copyto makes it
    (glibc switches to non-temporal stores past a size), not 64 KiB at a time."""
    pos = 0
    while left > 0:
        offset = hpa % block_size
        n = min(block_size - offset, left)
        slot_addr = base + slots[k] * block_size + offset
        k += 1
        while n < left and slots[k] == slots[k - 1] + 1:
            n += min(block_size, left - n)
            k += 1
        if to_user:
            _memcpy(addr + pos, slot_addr, n)
        else:
            _memcpy(slot_addr, addr + pos, n)
        pos += n
        hpa += n
        left -= n
    return k


@numba.njit(nogil=True)
def copy_extents(base, block_size, slots, ext_hpa, ext_len, user_addr, to_user):
    """memcpy each extent between the flat user buffer and its slots, in order."""
    k = 0
    pos = 0
    for e in range(ext_hpa.shape[0]):
        k = _copy_extent(base, block_size, slots, k, ext_hpa[e], ext_len[e], user_addr + pos, to_user)
        pos += ext_len[e]


@numba.njit(nogil=True)
def copy_extents_each(base, block_size, slots, ext_first, ext_hpa, ext_len, addrs, which, to_user):
    """copy_extents for the extents listed in `which`, each between its own buffer at
    addrs[e] and its slots, which start at slots[ext_first[e]] (split-phase reads)."""
    for w in range(which.shape[0]):
        e = which[w]
        _copy_extent(base, block_size, slots, ext_first[e], ext_hpa[e], ext_len[e], addrs[e], to_user)


@numba.njit(nogil=True)
def link_read(slots, installed, k, ext_hpa, ext_len, block_size, ext_first, pending, row_ext, row_ptr):
    """After planning a split-phase read (Device.read_start): which fill rows each
    extent waits for. A read plans one fill per newly placed block, in slot order, so
    row r fills the r-th installed position; an extent waits for its own blocks' rows
    and for those of blocks another extent of the read placed (the same block twice).
    Fills ext_first (first slot of each extent), pending (rows each extent waits for)
    and the rows' extents as CSR (row_ext[row_ptr[r]:row_ptr[r + 1]]). Returns the
    number of (row, extent) links."""
    m = ext_hpa.shape[0]
    n_rows = 0
    for p in range(k):
        n_rows += installed[p]
    link_row = np.empty(k, np.int64)
    link_ext = np.empty(k, np.int64)
    n_links = 0
    p = 0
    r = 0
    for e in range(m):
        ext_first[e] = p
        pending[e] = 0
        if ext_len[e] <= 0:
            continue
        count = (ext_hpa[e] + ext_len[e] - 1) // block_size - ext_hpa[e] // block_size + 1
        for _ in range(count):
            row = -1
            if installed[p]:
                row = r
                r += 1
            else:  # a hit: on a block this read placed itself?
                seen = 0
                for q in range(p):
                    if installed[q]:
                        if slots[q] == slots[p]:
                            row = seen
                            break
                        seen += 1
            if row >= 0:
                link_row[n_links] = row
                link_ext[n_links] = e
                n_links += 1
                pending[e] += 1
            p += 1
    for i in range(n_rows + 1):
        row_ptr[i] = 0
    for i in range(n_links):
        row_ptr[link_row[i] + 1] += 1
    for i in range(n_rows):
        row_ptr[i + 1] += row_ptr[i]
    fill = row_ptr[:n_rows].copy()
    for i in range(n_links):
        row_ext[fill[link_row[i]]] = link_ext[i]
        fill[link_row[i]] += 1
    return n_links


@numba.njit(nogil=True)
def rows_read(rows, good, row_ext, row_ptr, pending, failed, ready):
    """Fill rows `rows` of a split-phase read are in (good[i]: right bytes): marks their
    extents failed where not good and puts the extents they complete in `ready`.
    Returns how many."""
    n = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(row_ptr[r], row_ptr[r + 1]):
            e = row_ext[j]
            if not good[i]:
                failed[e] = True
            pending[e] -= 1
            if pending[e] == 0:
                ready[n] = e
                n += 1
    return n


@numba.njit(nogil=True)
def check_extents(ext_hpa, ext_len, capacity, block_size):
    """(index of the first extent outside [0, capacity) or -1, blocks the extents touch)."""
    blocks = 0
    for e in range(ext_hpa.shape[0]):
        hpa = ext_hpa[e]
        n = ext_len[e]
        if hpa < 0 or n < 0 or hpa > capacity - n:
            return e, blocks
        if n > 0:
            blocks += (hpa + n - 1) // block_size - hpa // block_size + 1
    return -1, blocks


@numba.njit(nogil=True)
def touches_busy(bt, ext_hpa, ext_len, block_size):
    """(blocks the access touches, whether one of them is resident and BUSY). Read-only:
    the device calls it before planning while other host threads have accesses in
    flight, and waits when a block is theirs (its slot is being filled or copied)."""
    blocks = 0
    for e in range(ext_hpa.shape[0]):
        n = ext_len[e]
        if n <= 0:
            continue
        first = ext_hpa[e] // block_size
        last = (ext_hpa[e] + n - 1) // block_size
        blocks += last - first + 1
        for block in range(first, last + 1):
            slot = btm.lookup(bt, block)
            if slot >= 0 and bt.flags[slot] & btm.BUSY:
                return blocks, True
    return blocks, False


@numba.njit(nogil=True)
def finish(bt, slots, n):
    """The access is complete: its slots may be victims again."""
    for k in range(n):
        bt.flags[slots[k]] &= ~btm.BUSY


@numba.njit(nogil=True)
def fault_finish(bt, slot):
    """A slot the fault service placed is installed (or given up): no longer BUSY."""
    bt.flags[slot] &= ~btm.BUSY


@numba.njit(nogil=True)
def set_dirty(bt, slot, dirty):
    """The fault service saw a first store to the slot's block (or wrote it back)."""
    if dirty:
        bt.flags[slot] |= btm.DIRTY
    else:
        bt.flags[slot] &= ~btm.DIRTY


@numba.njit(nogil=True)
def collect_dirty(bt, base, block_size, ops, limit):
    """Write-back jobs for up to `limit` dirty, idle slots (clean close, flush)."""
    n = 0
    for slot in range(bt.block.shape[0]):
        if n == limit:
            break
        if bt.flags[slot] & btm.DIRTY and not bt.flags[slot] & btm.BUSY:
            _emit(ops, n, base, block_size, slot, bt.block[slot], 1)
            n += 1
    return n


@numba.njit(nogil=True)
def plan_flush(bt, blocks, base, block_size, ops):
    """Write-back rows for those of `blocks` that are resident, dirty and idle."""
    n = 0
    for i in range(blocks.shape[0]):
        slot = btm.lookup(bt, blocks[i])
        if slot >= 0 and bt.flags[slot] & btm.DIRTY and not bt.flags[slot] & btm.BUSY:
            _emit(ops, n, base, block_size, slot, blocks[i], 1)
            n += 1
    return n


@numba.njit(nogil=True)
def mark_clean(bt, base, block_size, ops, n):
    for i in range(n):
        bt.flags[(ops[i, 0] - base) // block_size] &= ~btm.DIRTY


def _build(policy: Policy):
    on_hit, on_insert, victim, on_evict = policy.on_hit, policy.on_insert, policy.victim, policy.on_evict

    @numba.njit(nogil=True)
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

    @numba.njit(nogil=True)
    def hit_block(bt, ps, counters, slot, is_write, now):
        """A host access found its block resident in `slot`."""
        counters[C.HITS] += 1
        on_hit(ps, bt, slot, is_write, now)  # sees PREFETCHED still set
        if bt.flags[slot] & btm.PREFETCHED:
            counters[C.PREFETCH_USEFUL] += 1
            bt.flags[slot] &= ~btm.PREFETCHED
        bt.stamp[slot] = now

    @numba.njit(nogil=True)
    def miss_block(bt, ps, counters, block, owner, now, is_write):
        """A host access missed `block`: place it (the caller fills the slot and writes
        a DIRTY victim back). Returns place_block's tuple."""
        counters[C.MISSES] += 1
        placed = place_block(bt, ps, counters, block, owner, now, False)
        if placed[0] >= 0:
            on_insert(ps, bt, placed[0], is_write, now)
        return placed

    @numba.njit(nogil=True)
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

    @numba.njit(nogil=True)
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
                    hit_block(bt, ps, counters, slot, is_write, now)
                    if owner != 0:
                        bt.owner[slot] = owner  # shared blocks belong to their latest user
                else:
                    slot, victim_block, victim_flags = miss_block(bt, ps, counters, block, owner, now, is_write)
                    if slot < 0:
                        ok = False
                        break
                    if victim_block >= 0 and victim_flags & btm.DIRTY:
                        _emit(writebacks, n_wb, base, block_size, slot, victim_block, 1)
                        n_wb += 1
                    covers_block = is_write and block * block_size >= hpa and (block + 1) * block_size <= hpa + length
                    if not covers_block:  # partial writes need the old bytes around them
                        _emit(fills, n_fill, base, block_size, slot, block, 0)
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

    @numba.njit(nogil=True)
    def invalidate(bt, ps, slot, now):
        """Drop a slot's block without writing it back (its bytes are not trustworthy)."""
        on_evict(ps, bt, slot, now)
        btm.unmap(bt, slot)
        btm.release_slot(bt, slot)

    @numba.njit(nogil=True)
    def access(bt, ps, counters, clock, ext_hpa, ext_len, is_write, write_mode, owner,
               base, block_size, slots_out, installed_out, writebacks, fills, user_addr, moves_data):
        """plan(), and when the plan needs no SSD I/O (all hits, or misses on a
        timing-only device) also the copy and finish - so a DRAM hit costs one call.
        Returns plan()'s tuple plus `done`; if not done the caller runs the I/O, then
        copy_extents() and finish()."""
        ok, k, n_wb, n_fill = plan(bt, ps, counters, clock, ext_hpa, ext_len, is_write, write_mode, owner,
                                   base, block_size, slots_out, installed_out, writebacks, fills)
        needs_io = moves_data and (n_wb > 0 or n_fill > 0 or (is_write and write_mode == WRITE_THROUGH))
        if not ok or needs_io:
            return ok, k, n_wb, n_fill, False
        if moves_data:
            copy_extents(base, block_size, slots_out, ext_hpa, ext_len, user_addr, not is_write)
        finish(bt, slots_out, k)
        return ok, k, n_wb, n_fill, True

    @numba.njit(nogil=True)
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
                _emit(writebacks, n_wb, base, block_size, slot, victim_block, 1)
                n_wb += 1
            _emit(fills, k, base, block_size, slot, block, 0)
            slots_out[k] = slot
            k += 1
        counters[C.SSD_READS] += k
        counters[C.SSD_READ_BYTES] += k * block_size
        counters[C.WRITEBACKS] += n_wb
        counters[C.SSD_WRITES] += n_wb
        counters[C.SSD_WRITE_BYTES] += n_wb * block_size
        return k, n_wb, k

    # ---- the window's fault service (cxlhm/window): the same hooks, one block per call
    @numba.njit(nogil=True)
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

    @numba.njit(nogil=True)
    def fault_hit(bt, ps, counters, clock, slot, is_write):
        """An access the window's fault service saw on a resident block (a first store,
        or a sampled access). Returns 0 when the slot holds no block any more."""
        now = clock[0]
        clock[0] = now + 1
        if bt.block[slot] < 0:
            return 0
        hit_block(bt, ps, counters, slot, is_write, now)
        return 1

    background_hook = policy.background

    @numba.njit(nogil=True)
    def background(bt, ps, clock, budget, jobs):
        return background_hook(ps, bt, clock[0], budget, jobs)

    on_hint = policy.on_hint

    @numba.njit(nogil=True)
    def hint(bt, ps, clock, kind, session, first_block, n_blocks, arg):
        on_hint(ps, bt, kind, session, first_block, n_blocks, arg, clock[0])

    return Kernels(plan, access, invalidate, hint, plan_prefetch, background, fault_place, fault_hit)


_KERNELS: dict[int, Kernels] = {}


def kernels_for(policy: Policy) -> Kernels:
    """The compiled planner for `policy` (compiled once per process)."""
    key = id(policy)
    if key not in _KERNELS:
        _KERNELS[key] = _build(policy)
    return _KERNELS[key]


def new_io_rows(n: int) -> np.ndarray:
    return np.zeros((n, IO_FIELDS), np.int64)
