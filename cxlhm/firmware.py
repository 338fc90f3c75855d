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

from collections import namedtuple
from pathlib import Path

import numba
import numpy as np
from numba.core import cgutils
from numba.extending import intrinsic

from cxlhm import blocktable as btm
from cxlhm import policy_glue as glue
from cxlhm.jit import njit
from cxlhm import counters as C
from cxlhm._native import lib as _abi
from cxlhm.media.ssd import IO_FIELDS
from cxlhm.policies import Policy

WRITE_BACK, WRITE_THROUGH, WRITE_BUFFER = 0, 1, 2

# What the access kernel did with a pass that needs no SSD I/O (see firmware_kernels.access).
NOT_DONE, DONE, DONE_BUT_COPY = 0, 1, 2

# The firmware's C ABI - the operations of the window's fault service, the answers of a
# placement and its modes - is declared once, in native/cxlhm_uffd.h, and read here
# through cffi.
OPS = {name[len("CXLHM_OP_"):]: getattr(_abi, name) for name in dir(_abi) if name.startswith("CXLHM_OP_")}
PLACE_NO_SLOT, PLACE_RESIDENT, PLACE_PLACED = _abi.CXLHM_PLACE_NO_SLOT, _abi.CXLHM_PLACE_RESIDENT, _abi.CXLHM_PLACE_PLACED
MODE_WRITE, MODE_PREFETCH = _abi.CXLHM_MODE_WRITE, _abi.CXLHM_MODE_PREFETCH
WRITE_MODE_CODES = {"write-back": WRITE_BACK, "write-through": WRITE_THROUGH, "write-buffer": WRITE_BUFFER}

Kernels = namedtuple("Kernels", "plan access invalidate hint hints plan_prefetch background fault_place fault_hit")


@intrinsic
def memcpy(typingctx, dst, src, n):
    """memcpy(dst, src, n) between integer addresses. An LLVM memcpy (a call to libc's
    for a size known only at run time), not a ctypes pointer: compiled code that holds
    a ctypes function's address cannot be cached on disk."""
    if not all(isinstance(t, numba.types.Integer) for t in (dst, src, n)):
        return None

    def codegen(context, builder, signature, args):
        d = builder.inttoptr(args[0], cgutils.voidptr_t)
        s = builder.inttoptr(args[1], cgutils.voidptr_t)
        cgutils.raw_memcpy(builder, d, s, args[2], 1)
        return context.get_dummy_value()
    return numba.types.void(dst, src, n), codegen


@njit(inline="always")
def emit_row(ops, i, base, block_size, slot, block, write):
    ops[i, 0] = base + slot * block_size
    ops[i, 1] = block_size
    ops[i, 2] = block * block_size
    ops[i, 3] = write


@njit(inline="always")
def next_run(base, block_size, slots, k, hpa, left, most):
    """The next copy of an extent whose next byte is `hpa` (`left` bytes to go) and whose
    next slot is slots[k]: the blocks that sit in consecutive slots, up to `most` bytes
    (at least one block's part). Returns (its address in device DRAM, its bytes, the
    index after its last slot)."""
    offset = hpa % block_size
    n = min(block_size - offset, left)
    slot_addr = base + slots[k] * block_size + offset
    k += 1
    while n < left and n < most and slots[k] == slots[k - 1] + 1:
        n += min(block_size, left - n)
        k += 1
    return slot_addr, n, k


@njit(inline="always")
def _copy_extent(base, block_size, slots, k, hpa, left, addr, to_user):
    """memcpy one extent between the buffer at `addr` and its slots, which start at
    slots[k]; returns the index after its last slot. A run of blocks that sit in
    consecutive slots is one memcpy: a big copy is made the way np.copyto makes it
    (glibc switches to non-temporal stores past a size), not 64 KiB at a time."""
    pos = 0
    while left > 0:
        slot_addr, n, k = next_run(base, block_size, slots, k, hpa, left, left)
        if to_user:
            memcpy(addr + pos, slot_addr, n)
        else:
            memcpy(slot_addr, addr + pos, n)
        pos += n
        hpa += n
        left -= n
    return k


@njit
def copy_extents(base, block_size, slots, ext_hpa, ext_len, user_addr, to_user):
    """memcpy each extent between the flat user buffer and its slots, in order."""
    k = 0
    pos = 0
    for e in range(ext_hpa.shape[0]):
        k = _copy_extent(base, block_size, slots, k, ext_hpa[e], ext_len[e], user_addr + pos, to_user)
        pos += ext_len[e]


@njit
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


@njit
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


@njit
def finish(bt, slots, n):
    """The access is complete: its slots may be victims again."""
    for k in range(n):
        bt.flags[slots[k]] &= ~btm.BUSY


@njit
def fault_finish(bt, slot):
    """A slot the fault service placed is installed (or given up): no longer BUSY."""
    bt.flags[slot] &= ~btm.BUSY


@njit
def set_dirty(bt, slot, dirty):
    """The fault service saw a first store to the slot's block (or wrote it back)."""
    if dirty:
        bt.flags[slot] |= btm.DIRTY
    else:
        bt.flags[slot] &= ~btm.DIRTY


@njit
def collect_dirty(bt, base, block_size, ops, limit):
    """Write-back jobs for up to `limit` dirty, idle slots (clean close, flush)."""
    n = 0
    for slot in range(bt.block.shape[0]):
        if n == limit:
            break
        if bt.flags[slot] & btm.DIRTY and not bt.flags[slot] & btm.BUSY:
            emit_row(ops, n, base, block_size, slot, bt.block[slot], 1)
            n += 1
    return n


@njit
def plan_flush(bt, blocks, base, block_size, ops):
    """Write-back rows for those of `blocks` that are resident, dirty and idle."""
    n = 0
    for i in range(blocks.shape[0]):
        slot = btm.lookup(bt, blocks[i])
        if slot >= 0 and bt.flags[slot] & btm.DIRTY and not bt.flags[slot] & btm.BUSY:
            emit_row(ops, n, base, block_size, slot, blocks[i], 1)
            n += 1
    return n


@njit
def mark_clean(bt, base, block_size, ops, n):
    for i in range(n):
        bt.flags[(ops[i, 0] - base) // block_size] &= ~btm.DIRTY


_KERNELS: dict[int, Kernels] = {}
_TEMPLATE = Path(__file__).with_name("firmware_kernels.py")


def kernels_for(policy: Policy) -> Kernels:
    """The firmware kernels of `policy` (cxlhm/firmware_kernels.py through the glue
    generator, cxlhm/policy_glue.py): compiled once per install and cached on disk for a
    registered policy, once per process for any other."""
    key = id(policy)
    if key not in _KERNELS:
        module = policy_module(_TEMPLATE, "firmware", policy, f"the {policy.name} firmware")
        _KERNELS[key] = Kernels(*(getattr(module, name) for name in Kernels._fields))
    return _KERNELS[key]


def policy_module(template: Path, kind: str, policy: Policy, what: str):
    """`policy`'s copy of the glue module in file `template` (see cxlhm/policy_glue.py)."""
    return glue.policy_module(kind, policy, Path(template).read_text(), what)


def new_io_rows(n: int) -> np.ndarray:
    return np.zeros((n, IO_FIELDS), np.int64)
