"""Block checksums where compiled code can use them: xxh3-64 of a block of memory, and a
block -> checksum map that numba-compiled loops read (the streamed reads verify each
fill as it lands, without a round trip to Python).

The hash is XXH3_64bits in C, the function Python's `xxhash.xxh3_64_intdigest` runs:
the system's libxxhash where it is there (Debian's libxxhash0, which apt itself depends
on), whose `XXH3_64bits_dispatch` picks AVX2 or AVX-512 code at run time, else the
xxhash wheel's own `XXH3_64bits` (its extension module exports it), built for baseline
x86-64 - 20 GB/s of a cached 64 KiB block on the development VM against the system
library's 30 (`HASH_SOURCE` says which is used). Either is checked against Python's on
samples first; the sums are the same bits whichever runs. Compiled code calls it by a
symbol name that is bound to its address at import (an external function, not a ctypes
pointer baked into the code), so these functions go to numba's on-disk cache like the
firmware's and a later process loads them instead of compiling. `COMPILED_HASH` is False
if neither is there or agrees with Python's: callers then verify in Python (correct,
slower).

The map is an open-addressing hash table in two numpy arrays (linear probing, deletion
by backward shift, no tombstones), grown by rehashing into new arrays at half full.
The integrity layer keeps its checksums in one (cxlhm/integrity.py: there is no other
copy), and its set of blocks logged dirty in another (values unused). All of it changes
and is read under the device lock: by Python, and by a stream's compiled loop, which
records its landed write-backs' checksums and its dirty blocks itself.
"""
from __future__ import annotations

import ctypes
import importlib

import llvmlite.binding as llvm
import numpy as np
import xxhash
from numba import types

from cxlhm.jit import njit

EMPTY = np.int64(-1)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


# where XXH3_64bits may be found, fastest first: (a name for it, library, symbol)
_XXH3_SOURCES = (
    ("libxxhash (dispatching to the CPU's vector unit)", "libxxhash.so.0", "XXH3_64bits_dispatch"),
    ("the xxhash wheel", "xxhash._xxhash", "XXH3_64bits"),
)


def _load_xxh3(sources=_XXH3_SOURCES):
    """(the first of `sources` whose XXH3_64bits agrees with Python's xxhash, its name),
    or (None, None)."""
    sample = np.frombuffer(bytes(range(256)) * 300, np.uint8)
    for name, library, symbol in sources:
        try:
            path = importlib.import_module(library).__file__ if library.startswith("xxhash.") else library
            fn = getattr(ctypes.CDLL(path), symbol)
        except (OSError, AttributeError, ImportError):
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_uint64
        # every length class of XXH3: short, mid-size, and long inputs of whole and partial stripes
        if all(fn(sample.ctypes.data, n) == xxhash.xxh3_64_intdigest(sample[:n])
               for n in (0, 3, 16, 100, 200, 1000, 65536, sample.nbytes)):
            return fn, name
    return None, None


_xxh3, HASH_SOURCE = _load_xxh3()
COMPILED_HASH = _xxh3 is not None
# (address, length) in the C ABI: two integer registers, as (const void *, size_t)
_SYMBOL = "cxlhm_xxh3_64bits"


def xxh3_address() -> int | None:
    """The address of the compiled XXH3_64bits checksums are made with (C code that
    checksums the same way calls it), or None when there is none to call."""
    return ctypes.cast(_xxh3, ctypes.c_void_p).value if COMPILED_HASH else None


if COMPILED_HASH:
    llvm.add_symbol(_SYMBOL, xxh3_address())
_xxh3_64 = types.ExternalFunction(_SYMBOL, types.uint64(types.int64, types.int64))

if COMPILED_HASH:
    @njit(nogil=True)
    def hash_block(addr, nbytes):
        """xxh3-64 of `nbytes` of memory at `addr`."""
        return _xxh3_64(addr, nbytes)
else:
    @njit(nogil=True)
    def hash_block(addr, nbytes):  # never called: COMPILED_HASH tells callers to hash in Python
        return np.uint64(0)


@njit(nogil=True)
def hash_blocks(addrs, nbytes, out):
    """out[i] = xxh3-64 of the `nbytes` at addrs[i]."""
    for i in range(addrs.shape[0]):
        out[i] = hash_block(addrs[i], nbytes)


# ------------------------------------------------------------------ the map
def new_table(capacity: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Empty (keys, values) arrays with room for `capacity` entries at half load."""
    buckets = 1 << max(4, int(2 * capacity - 1).bit_length())
    return np.full(buckets, EMPTY, np.int64), np.zeros(buckets, np.uint64)


@njit(nogil=True, inline="always")
def _home(keys, block):
    return np.int64((np.uint64(block) * _GOLDEN >> np.uint64(17)) & np.uint64(keys.shape[0] - 1))


@njit(nogil=True)
def find(keys, block):
    """Bucket holding `block`, or -1."""
    mask = keys.shape[0] - 1
    i = _home(keys, block)
    while keys[i] != EMPTY:
        if keys[i] == block:
            return i
        i = (i + 1) & mask
    return -1


@njit(nogil=True)
def put(keys, values, block, value):
    """Set block -> value; returns 1 if the block is new (the caller keeps the count and
    grows the table before it is half full)."""
    mask = keys.shape[0] - 1
    i = _home(keys, block)
    while keys[i] != EMPTY:
        if keys[i] == block:
            values[i] = value
            return 0
        i = (i + 1) & mask
    values[i] = value
    keys[i] = block
    return 1


@njit(nogil=True)
def put_many(keys, values, blocks, sums):
    new = 0
    for j in range(blocks.shape[0]):
        new += put(keys, values, blocks[j], sums[j])
    return new


@njit(nogil=True)
def delete(keys, values, block):
    """Remove block; returns 1 if it was there. Backward shift: the entries after it in
    its probe run move up, so no lookup ever needs a tombstone."""
    mask = keys.shape[0] - 1
    i = find(keys, block)
    if i < 0:
        return 0
    j = i
    while True:
        j = (j + 1) & mask
        if keys[j] == EMPTY:
            break
        home = _home(keys, keys[j])
        # keys[j] may fill the hole at i unless its home lies cyclically in (i, j]
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            keys[i] = keys[j]
            values[i] = values[j]
            i = j
    keys[i] = EMPTY
    return 1


@njit(nogil=True)
def rehash(keys, values, new_keys, new_values):
    for i in range(keys.shape[0]):
        if keys[i] != EMPTY:
            put(new_keys, new_values, keys[i], values[i])


@njit(nogil=True)
def find_many(keys, values, blocks, found, sums):
    """found[j], sums[j] for each of `blocks`."""
    for j in range(blocks.shape[0]):
        i = find(keys, blocks[j])
        found[j] = i >= 0
        sums[j] = values[i] if i >= 0 else np.uint64(0)  # (a bare 0 would unify to float64)


@njit(nogil=True)
def delete_many(keys, values, blocks):
    gone = 0
    for j in range(blocks.shape[0]):
        gone += delete(keys, values, blocks[j])
    return gone


@njit(nogil=True)
def add_missing(keys, values, blocks, added):
    """Put each of `blocks` not in the map (value 0) and list it in `added`; returns how
    many (a set's "add, and tell me which were new", in one pass)."""
    n = 0
    for j in range(blocks.shape[0]):
        if find(keys, blocks[j]) < 0:  # (put would zero an entry that is there)
            put(keys, values, blocks[j], np.uint64(0))
            added[n] = blocks[j]
            n += 1
    return n


@njit(nogil=True)
def put_if_room(keys, values, meta, block, value):
    """Compiled code's insert: set block -> value and count it in meta[0], unless that
    would fill the table past half (only the driver grows it). False: nothing changed."""
    if 2 * (meta[0] + 1) > keys.shape[0]:
        return False
    meta[0] += put(keys, values, block, value)
    return True


@njit(nogil=True)
def remove(keys, values, meta, block):
    """Compiled code's delete, counted in meta[0]."""
    meta[0] -= delete(keys, values, block)


@njit(nogil=True)
def entries(keys, values, blocks, sums):
    """Every entry, in bucket order, into blocks[:n] / sums[:n]; returns n."""
    n = 0
    for i in range(keys.shape[0]):
        if keys[i] != EMPTY:
            blocks[n] = keys[i]
            sums[n] = values[i]
            n += 1
    return n


class SumTable:
    """The map, with the bookkeeping Python needs: the entry count (in `meta`, an array,
    so compiled code that inserts and deletes keeps it too) and growth (Python only:
    `reserve` before handing the arrays to compiled code that may insert)."""

    def __init__(self, capacity: int = 1024):
        self.keys, self.values = new_table(capacity)
        self.meta = np.zeros(1, np.int64)  # [entries]

    @property
    def count(self) -> int:
        return int(self.meta[0])

    def __len__(self) -> int:
        return int(self.meta[0])

    def __contains__(self, block: int) -> bool:
        return find(self.keys, block) >= 0

    def get(self, block: int) -> int | None:
        i = find(self.keys, block)
        return None if i < 0 else int(self.values[i])

    def set_many(self, blocks: np.ndarray, sums: np.ndarray) -> None:
        self._room_for(blocks.shape[0])
        self.meta[0] += put_many(self.keys, self.values, blocks, sums)

    def set(self, block: int, value: int) -> None:
        self._room_for(1)
        self.meta[0] += put(self.keys, self.values, block, np.uint64(value))

    def discard(self, block: int) -> bool:
        gone = delete(self.keys, self.values, block)
        self.meta[0] -= gone
        return bool(gone)

    def discard_many(self, blocks: np.ndarray) -> None:
        if blocks.shape[0]:
            self.meta[0] -= delete_many(self.keys, self.values, blocks)

    def add_missing(self, blocks: np.ndarray) -> np.ndarray:
        """Put those of `blocks` (int64) not in the map yet, with value 0; returns them."""
        self._room_for(blocks.shape[0])
        added = np.empty(blocks.shape[0], np.int64)
        n = add_missing(self.keys, self.values, blocks, added)
        self.meta[0] += n
        return added[:n]

    def clear(self) -> None:
        self.keys[:] = EMPTY
        self.meta[0] = 0

    def lookup(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, sums) of `blocks`."""
        found = np.zeros(blocks.shape[0], np.bool_)
        sums = np.zeros(blocks.shape[0], np.uint64)
        find_many(self.keys, self.values, blocks, found, sums)
        return found, sums

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(blocks, sums) of every entry, in no particular order."""
        blocks, sums = np.empty(self.count, np.int64), np.empty(self.count, np.uint64)
        entries(self.keys, self.values, blocks, sums)
        return blocks, sums

    def compiled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, values, meta) as compiled code takes them; valid until the next growth."""
        return self.keys, self.values, self.meta

    def reserve(self, more: int) -> None:
        """Room for `more` inserts by compiled code, which cannot grow the table (the
        table's own inserts grow it as they go)."""
        self._room_for(more)

    def _room_for(self, more: int) -> None:
        if 2 * (self.count + more) <= self.keys.shape[0]:
            return
        keys, values = new_table(2 * (self.count + more))
        rehash(self.keys, self.values, keys, values)
        self.keys, self.values = keys, values


class BlockSet(SumTable):
    """A set of blocks in the same map (its values unused): compiled code adds and removes
    them (put_if_room, remove) as it does checksums."""

    def __iter__(self):
        return iter(self.entries()[0].tolist())
