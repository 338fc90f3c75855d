"""Compile flags shared by cxlhm's compiled loops."""
from __future__ import annotations

import numba


def njit_without_refcounts(fn):
    """numba.njit(nogil=True) without numba's reference counting, for loops that call the
    firmware's kernels once per access over arrays their caller owns and keeps alive:
    the incref/decref of every block-table and policy array around each call (atomic
    operations) would otherwise cost more than the access itself. Such a function must
    not allocate arrays."""
    try:
        return numba.njit(nogil=True, _nrt=False)(fn)
    except (KeyError, TypeError):  # a numba without the private flag: correct, just slower
        return numba.njit(nogil=True)(fn)
