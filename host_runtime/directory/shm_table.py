"""The compiled open-addressing table behind the shared-memory directory.

Each slot is six uint64 words: seq, key0, key1, w0, w1, w2 (the location words, see
location.py; kind 0 in w0 means empty, TOMBSTONE a removed entry). Linear probing
from a mixed hash of the key, at most `max_probe` slots.

Readers take no lock: a slot's seq is odd while a writer changes it (seqlock), so a
reader that sees an odd or changed seq retries and, after a few tries, reports a
miss (the directory is best-effort; the chunk read verifies anyway). Writers are
serialised by the caller (one writer lock per table, across processes).
"""
from __future__ import annotations

import numba
import numpy as np

SEQ, K0, K1, W0, W1, W2 = range(6)
SLOT_WORDS = 6
KIND_SHIFT = np.uint64(56)
TOMBSTONE = np.uint64(0xFF)
RETRIES = 8


@numba.njit(inline="always")
def _mix(k0, k1):
    # splitmix64 finaliser over both halves: keys are digests, but a caller's keys may
    # share their first 8 bytes
    z = k0 ^ (k1 * np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(nogil=True, cache=True)
def lookup(table, max_probe, keys, hit, words):
    mask = np.uint64(table.shape[0] - 1)
    for i in range(keys.shape[0]):
        k0, k1 = keys[i, 0], keys[i, 1]
        h = _mix(k0, k1) & mask
        hit[i] = False
        for _ in range(RETRIES):
            torn = False
            for p in range(max_probe):
                j = (h + np.uint64(p)) & mask
                seq = table[j, SEQ]
                if seq & np.uint64(1):
                    torn = True
                    break
                kind = table[j, W0] >> KIND_SHIFT
                if kind == 0:
                    break
                if kind != TOMBSTONE and table[j, K0] == k0 and table[j, K1] == k1:
                    a, b, c = table[j, W0], table[j, W1], table[j, W2]
                    if table[j, SEQ] != seq or table[j, K0] != k0 or table[j, K1] != k1:
                        torn = True
                        break
                    words[i, 0], words[i, 1], words[i, 2] = a, b, c
                    hit[i] = True
                    break
            if not torn:
                break
    return 0


@numba.njit(inline="always")
def _find(table, mask, max_probe, k0, k1):
    """(slot of the key or -1, first free/tombstone slot in the probe window or -1)."""
    h = _mix(k0, k1) & mask
    free = -1
    for p in range(max_probe):
        j = (h + np.uint64(p)) & mask
        kind = table[j, W0] >> KIND_SHIFT
        if kind == 0:
            if free < 0:
                free = np.int64(j)
            return -1, free
        if kind == TOMBSTONE:
            if free < 0:
                free = np.int64(j)
        elif table[j, K0] == k0 and table[j, K1] == k1:
            return np.int64(j), free
    return -1, free


@numba.njit(inline="always")
def _write(table, j, k0, k1, a, b, c):
    table[j, SEQ] |= np.uint64(1)  # odd: readers back off (already odd: stays so until the end)
    table[j, K0], table[j, K1] = k0, k1
    table[j, W1], table[j, W2] = b, c
    table[j, W0] = a
    table[j, SEQ] += np.uint64(1)


@numba.njit(nogil=True, cache=True)
def publish(table, max_probe, keys, words, counts):
    """counts: [live, tombstones]. Returns how many keys were stored."""
    mask = np.uint64(table.shape[0] - 1)
    stored = 0
    for i in range(keys.shape[0]):
        k0, k1 = keys[i, 0], keys[i, 1]
        j, free = _find(table, mask, max_probe, k0, k1)
        if j < 0:
            if free < 0:
                continue  # probe window full: dropped (best-effort)
            j = free
            if table[j, W0] >> KIND_SHIFT == TOMBSTONE:
                counts[1] -= 1
            counts[0] += 1
        _write(table, j, k0, k1, words[i, 0], words[i, 1], words[i, 2])
        stored += 1
    return stored


@numba.njit(nogil=True, cache=True)
def remove(table, max_probe, keys, expected, use_expected, counts):
    mask = np.uint64(table.shape[0] - 1)
    removed = 0
    for i in range(keys.shape[0]):
        j, _ = _find(table, mask, max_probe, keys[i, 0], keys[i, 1])
        if j < 0:
            continue
        if use_expected and (table[j, W0] != expected[i, 0] or table[j, W1] != expected[i, 1]
                             or table[j, W2] != expected[i, 2]):
            continue
        _write(table, j, table[j, K0], table[j, K1], TOMBSTONE << KIND_SHIFT, np.uint64(0), np.uint64(0))
        counts[0] -= 1
        counts[1] += 1
        removed += 1
    return removed


@numba.njit(nogil=True, cache=True)
def repair(table):
    """After a writer was killed inside a batch: every slot it left half-written (odd
    seq) becomes a removed entry with an even seq; returns (live, tombstones, repaired)
    counted over the whole table."""
    live = tombstones = repaired = 0
    for j in range(table.shape[0]):
        if table[j, SEQ] & np.uint64(1):
            table[j, W1], table[j, W2] = np.uint64(0), np.uint64(0)
            table[j, W0] = TOMBSTONE << KIND_SHIFT
            table[j, SEQ] += np.uint64(1)
            repaired += 1
        kind = table[j, W0] >> KIND_SHIFT
        if kind == TOMBSTONE:
            tombstones += 1
        elif kind != 0:
            live += 1
    return live, tombstones, repaired
