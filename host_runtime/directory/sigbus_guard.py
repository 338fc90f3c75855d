"""A SIGBUS guard for shared-memory mappings that another process may truncate.

A load from a page of a MAP_SHARED file mapping past the file's current end raises
SIGBUS, and no size check before the access can rule that out: the truncation may land
between the check and the load. The guard closes that window: a process-wide SIGBUS
handler (compiled, no Python in it) that, for a fault inside a registered mapping,
maps anonymous zero pages over the whole mapping (mmap MAP_FIXED) and marks it faulted,
then returns, so the load is retried and reads zeros. For a directory table zeros are
empty slots: every lookup in flight misses, and the owner sees the mark at its next
batch and stops using the mapping. A fault anywhere else is not ours: the handler puts
back the action that was installed before it and returns, so the retried access takes
that action (the default kills the process, as it would have without the guard).

The lookups themselves pay nothing: the handler only runs on a fault.

Limits: Linux on x86-64 or aarch64 (glibc's struct sigaction layout, si_addr at byte
16 of siginfo_t); a handler another library installs later over this one without
chaining back takes SIGBUS for itself. Up to MAX_RANGES mappings are guarded at once; a
mapping registered past that runs unguarded (register() says so).
"""
from __future__ import annotations

import ctypes
import mmap
import struct
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

SIGBUS = 7
SA_SIGINFO = 0x4
SA_ONSTACK = 0x08000000
MAX_RANGES = 256
START, END, FAULTED = 0, 1, 2
_SIGACTION_BYTES = 152  # handler, 128-byte mask, flags (+ pad), restorer

_ranges = np.zeros((MAX_RANGES, 3), np.uint64)   # read by the handler through its address
_previous = ctypes.create_string_buffer(_SIGACTION_BYTES)
_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_size_t
_mmap.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_sigaction = _libc.sigaction
_sigaction.restype = ctypes.c_int
_sigaction.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t]

_lock = threading.Lock()
_handler = None


@intrinsic
def _words(typingctx, where):
    """A uint64 pointer to `where` (an address as an integer, or a void pointer)."""
    def codegen(context, builder, signature, args):
        target = ir.IntType(64).as_pointer()
        if isinstance(signature.args[0], types.Integer):
            return builder.inttoptr(args[0], target)
        return builder.bitcast(args[0], target)
    return types.CPointer(types.uint64)(where), codegen


def _compile(ranges_at: int, previous_at: int):
    zero_pages = mmap.PROT_READ | mmap.PROT_WRITE
    anonymous_fixed = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x10  # MAP_FIXED

    @numba.cfunc(types.void(types.int32, types.voidptr, types.voidptr))
    def handler(signo, info, context):
        addr = numba.carray(_words(info), 4)[2]  # siginfo_t.si_addr
        ranges = numba.carray(_words(np.uint64(ranges_at)), MAX_RANGES * 3)
        for i in range(MAX_RANGES):
            start, end = ranges[3 * i], ranges[3 * i + 1]
            if start <= addr and addr < end:
                _mmap(start, end - start, zero_pages, anonymous_fixed, -1, 0)
                ranges[3 * i + 2] = 1
                return
        _sigaction(signo, previous_at, 0)  # not ours: the retried access takes the earlier action

    return handler


def _install() -> None:
    global _handler
    if _handler is not None:
        return
    handler = _compile(_ranges.ctypes.data, ctypes.addressof(_previous))
    action = ctypes.create_string_buffer(_SIGACTION_BYTES)
    struct.pack_into("<Q", action, 0, handler.address)
    struct.pack_into("<i", action, 136, SA_SIGINFO | SA_ONSTACK)
    if _sigaction(SIGBUS, ctypes.addressof(action), ctypes.addressof(_previous)) != 0:
        raise OSError(ctypes.get_errno(), "sigaction(SIGBUS) failed")
    _handler = handler  # (kept alive: the kernel calls its code)


def register(mapping: mmap.mmap) -> int:
    """Guard `mapping` (whole): its slot, for faulted() and unregister(); -1 if every
    slot is taken (the mapping is then unguarded)."""
    view = np.frombuffer(mapping, np.uint8, 1)
    start = view.ctypes.data
    del view
    with _lock:
        _install()
        free = np.flatnonzero(_ranges[:, END] == 0)
        if not free.shape[0]:
            return -1
        slot = int(free[0])
        _ranges[slot, FAULTED] = 0
        _ranges[slot, START] = start
        _ranges[slot, END] = start + len(mapping)
        return slot


def faulted(slot: int) -> bool:
    """Whether a fault in the mapping replaced it with zeros (its file was truncated)."""
    return slot >= 0 and bool(_ranges[slot, FAULTED])


def unregister(slot: int) -> None:
    """Before the mapping is unmapped."""
    if slot >= 0:
        with _lock:
            _ranges[slot, END] = 0
            _ranges[slot, START] = 0
