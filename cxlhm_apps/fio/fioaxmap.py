"""fio 3.33's random map (lib/axmap.c): which cells of a file a pass has done.

A bit per cell in 64-bit words, and above them levels of a bit per word below that is
full, up to a single word, so that the next free cell after a taken one is found in a few
word reads however full the map is (fio's random offsets land on free cells by moving to
the next free one, so taken cells cluster and a flat scan would grow with the file).

What fio's map does and this one does as well: marking a run stops at the first taken
cell; it sets the spare cells of the last word like any other (no run starts past the
map's last cell); a search that finds only spare cells finds nothing.

The map is one flat uint64 array, `words`, and `level_at`: level l's words are
words[level_at[l]:level_at[l + 1]] (level 0 the cells).
"""
from __future__ import annotations

import numba
import numpy as np

_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


def new_map(nr_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """An empty map of nr_bits cells: (words, level_at)."""
    counts = [max(1, -(-nr_bits // 64))]
    while counts[-1] > 1:
        counts.append(-(-counts[-1] // 64))
    level_at = np.zeros(len(counts) + 1, np.int64)
    level_at[1:] = np.cumsum(counts)
    return np.zeros(int(level_at[-1]), np.uint64), level_at


@numba.njit(nogil=True, cache=True, inline="always")
def _lowest_bit(m):
    """The index of m's lowest set bit (m != 0)."""
    n = 0
    if m & np.uint64(0xFFFFFFFF) == 0:
        n += 32
        m >>= np.uint64(32)
    if m & np.uint64(0xFFFF) == 0:
        n += 16
        m >>= np.uint64(16)
    if m & np.uint64(0xFF) == 0:
        n += 8
        m >>= np.uint64(8)
    if m & np.uint64(0xF) == 0:
        n += 4
        m >>= np.uint64(4)
    if m & np.uint64(0x3) == 0:
        n += 2
        m >>= np.uint64(2)
    if m & np.uint64(0x1) == 0:
        n += 1
    return n


@numba.njit(nogil=True, cache=True)
def is_set(words, level_at, nr_bits, b):
    """axmap_isset: a cell past the map's last one counts as free."""
    if b < 0 or b > nr_bits or (b >> 6) >= level_at[1]:
        return False
    return (words[b >> 6] >> np.uint64(b & 63)) & np.uint64(1) != 0


@numba.njit(nogil=True, cache=True)
def _set_bit(words, level_at, b):
    level = 0
    i = b
    top = level_at.shape[0] - 2
    while True:
        w = level_at[level] + (i >> 6)
        words[w] |= np.uint64(1) << np.uint64(i & 63)
        if words[w] != _ONES or level == top:
            return
        level += 1
        i = i >> 6


@numba.njit(nogil=True, cache=True)
def _first_free(words, level_at, idx):
    """The first cell at or after idx whose bit is clear (spare cells included), or -1."""
    top = level_at.shape[0] - 2
    level = 0
    i = idx
    pos = -1
    while True:  # up: the rest of i's word at this level, else the next word that is not full
        n_words = level_at[level + 1] - level_at[level]
        if i >= n_words * 64:
            return -1
        w = i >> 6
        m = ~words[level_at[level] + w] & (_ONES << np.uint64(i & 63))
        if m != 0:
            pos = w * 64 + _lowest_bit(m)
            break
        if level == top:
            for ww in range(w + 1, n_words):
                m = ~words[level_at[level] + ww]
                if m != 0:
                    pos = ww * 64 + _lowest_bit(m)
                    break
            if pos < 0:
                return -1
            break
        i = w + 1
        level += 1
    while level > 0:  # down: a clear bit here is a word below with a clear bit
        level -= 1
        if pos >= level_at[level + 1] - level_at[level]:
            return -1
        pos = pos * 64 + _lowest_bit(~words[level_at[level] + pos])
    return pos


@numba.njit(nogil=True, cache=True)
def next_free(words, level_at, nr_bits, b):
    """axmap_next_free: the first free cell after b, else the first from the map's start; -1 if none."""
    if b >= nr_bits:
        return -1
    start = b + 1
    if start == nr_bits:
        start = 0
    r = _first_free(words, level_at, start)
    if r >= nr_bits:
        r = -1
    if r < 0 and start != 0:
        r = _first_free(words, level_at, 0)
        if r >= nr_bits:
            r = -1
    return r


@numba.njit(nogil=True, cache=True)
def set_run(words, level_at, nr_bits, block, nr):
    """axmap_set_nr: mark up to nr cells from block, stopping at a taken one; how many."""
    done = 0
    k = block
    cells = level_at[1] * 64
    while done < nr:
        if (done == 0 or k % 64 == 0) and (k > nr_bits or k >= cells):
            break
        if (words[k >> 6] >> np.uint64(k & 63)) & np.uint64(1):
            break
        _set_bit(words, level_at, k)
        done += 1
        k += 1
    return done
