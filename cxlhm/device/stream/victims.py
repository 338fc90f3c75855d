"""The streams' victim table: per registered stream, the blocks of its dirty victims whose
write-back rows are in use (staged, on the ring, landed with the checksum unrecorded),
sorted, as the stream last let the device lock go - one row of one shared matrix.

The compiled loop of every stream looks its next I/O's blocks up in the other streams'
rows (`touches_others`), and each stream writes its own row in place at the end of its
turn (`note`): nothing is gathered, concatenated or allocated per turn. (Gathering the
other streams' arrays into one sorted array before each turn cost ~15-20 us of the
interpreter with the lock held, with 4 streams taking ~1 ms turns.)

`VictimTable` owns the matrix and hands out its rows; it grows the matrix (a new one,
the rows copied, every holder pointed at it) when a stream with more write-back rows or
one stream more registers, with the device lock held: no loop is reading it then.
"""
from __future__ import annotations

import numpy as np

from cxlhm.jit import njit

WB_FREE = 0  # (state.py's WB_FREE: a write-back row not in use)


class VictimRow:
    """A stream's row of the table: `arrays` is what the compiled loop takes,
    (matrix, counts, slot): its own blocks are matrix[slot, :counts[slot]]."""
    __slots__ = ("arrays",)

    def __init__(self, width: int):
        self.arrays = (np.zeros((1, max(1, width)), np.int64), np.zeros(1, np.int64), 0)

    def blocks(self) -> np.ndarray:
        """The stream's victims' blocks as it last noted them, sorted (a view)."""
        matrix, counts, slot = self.arrays
        return matrix[slot, :counts[slot]]

    def note(self, wb_rows, wb_state, block_size: int, in_use: bool) -> None:
        """The blocks of the write-back rows in use, sorted, into the row (in place)."""
        matrix, counts, slot = self.arrays
        if in_use:
            note(wb_rows, wb_state, block_size, matrix, counts, slot)
        else:
            counts[slot] = 0

    def clear(self) -> None:
        matrix, counts, slot = self.arrays
        counts[slot] = 0


class VictimTable:
    """The shared matrix and its rows, one per registered stream (the caller serializes
    take/give with the streams' runs: the device lock)."""

    def __init__(self):
        self.matrix = np.zeros((0, 1), np.int64)
        self.counts = np.zeros(0, np.int64)
        self._holders: dict[int, VictimRow] = {}  # slot -> the row handed out for it
        self._free: list[int] = []

    def take(self, row: VictimRow, width: int) -> None:
        """Give `row` a slot of the table (at least `width` wide), keeping what it holds."""
        held = row.blocks().copy()
        if not self._free or self.matrix.shape[1] < width:
            self._grow(self.matrix.shape[0] + (not self._free), max(width, self.matrix.shape[1]))
        slot = self._free.pop()
        self.matrix[slot, :held.shape[0]] = held
        self.counts[slot] = held.shape[0]
        row.arrays = (self.matrix, self.counts, slot)
        self._holders[slot] = row

    def give_back(self, row: VictimRow) -> None:
        """A row's stream is gone (or replaced): its slot holds nothing and goes back, and
        the row is a row of its own again (whatever it does next touches no other's)."""
        slot = row.arrays[2]
        if row.arrays[1] is self.counts and self._holders.get(slot) is row:
            del self._holders[slot]
            self.counts[slot] = 0
            self._free.append(slot)
            row.arrays = VictimRow(1).arrays

    def _grow(self, slots: int, width: int) -> None:
        matrix = np.zeros((slots, width), np.int64)
        counts = np.zeros(slots, np.int64)
        old = self.matrix.shape[0]
        matrix[:old, :self.matrix.shape[1]] = self.matrix
        counts[:old] = self.counts
        self.matrix, self.counts = matrix, counts
        for slot, row in self._holders.items():
            row.arrays = (matrix, counts, slot)
        self._free.extend(range(slots - 1, old - 1, -1))

    def blocks(self, but: int = -1) -> list[np.ndarray]:
        """The rows' blocks (views), each sorted, but slot `but`'s; empty rows left out."""
        return [self.matrix[slot, :n] for slot, n in enumerate(self.counts.tolist()) if n and slot != but]


@njit(refcounts=True)  # (the sort takes a scratch buffer)
def note(wb_rows, wb_state, block_size, matrix, counts, slot):
    """matrix[slot, :n] = the blocks of the write-back rows in use, sorted; counts[slot] = n."""
    n = 0
    for r in range(wb_state.shape[0]):
        if wb_state[r] != WB_FREE:
            matrix[slot, n] = wb_rows[r, 2] // block_size
            n += 1
    matrix[slot, :n].sort()
    counts[slot] = n


@njit(cache=False)
def touches_others(victims, hpa, length, block_size):
    """Whether [hpa, hpa+length) touches a block in another stream's row of the table
    (`victims`: this stream's VictimRow.arrays)."""
    matrix, counts, own = victims
    first = hpa // block_size
    last = (hpa + length - 1) // block_size
    for slot in range(counts.shape[0]):
        n = counts[slot]
        if n == 0 or slot == own:
            continue
        row = matrix[slot, :n]
        j = np.searchsorted(row, first)
        if j < n and row[j] <= last:
            return True
    return False
