"""The device's streams as the rest of the device sees them: which threads have a stream
state, how many streams run, and the blocks their dirty victims are writing back.

A stream writes its victims back on its own ring, and until such a write-back has landed
and its checksum is recorded, no one may read the block back from the SSD: the access
path waits for it, background prefetches skip it, the integrity log's compaction keeps
its records. `StreamRegistry` answers those questions for every part, under the device
lock; the stream part (driver.py) registers each thread's state here.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np

from cxlhm.device.state import DeviceState
from cxlhm.device.stream import loop
from cxlhm.device.stream import state as ss
from cxlhm.device.stream.victims import VictimRow, VictimTable

NO_BLOCKS, NO_SUMS = np.zeros(0, np.int64), np.zeros(0, np.uint64)  # (an empty sum table: verify nothing)


class StreamRegistry:
    """Owns the per-thread stream states (weakly: a thread's goes with it) and the count
    of streams running, which the compiled loop reads (while more than one runs, none
    waits at the SSD with the lock held)."""

    def __init__(self, state: DeviceState):
        self.block_size = state.block_size
        # (registering grows the victim table, which no loop may be reading meanwhile)
        self._device_lock = getattr(state, "lock", None) or contextlib.nullcontext()
        self._states: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # per thread: its stream
        # their weak references as others() walks them, gathered again at each register (a
        # state gone since reads None): walking the dictionary itself cost ~1.5 us a turn
        self._refs: list[weakref.ref] = []
        self._registering = threading.Lock()  # (two threads registering at once: the last list has both)
        self.running = np.zeros(1, np.int64)  # stream_io calls running (changed under the lock)
        self.table = VictimTable()  # every registered stream's victims, a row each
        self._rows: dict[int, tuple[weakref.ref, VictimRow]] = {}  # per thread: its state, and that state's row
        self._gone: list[VictimRow] = []  # rows of states gone since the last register (given back then)

    def register(self, stream: ss.StreamState) -> None:
        """The calling thread's stream state (it replaces the thread's last one)."""
        with self._device_lock, self._registering:
            thread = threading.get_ident()
            while self._gone:
                self.table.give_back(self._gone.pop())
            last = self._rows.get(thread)
            if last is not None and last[0]() is not stream:
                self.table.give_back(last[1])  # replaced (or gone): no longer seen by the others
            self._states[thread] = stream
            self._refs = self._states.valuerefs()
            row = stream.victim_row
            if row.arrays[0] is not self.table.matrix:
                self.table.take(row, stream.wb_state.shape[0])
                self._rows[thread] = (weakref.ref(stream, self._gone_callback(row)), row)

    def _gone_callback(self, row: VictimRow):
        def gone(_ref) -> None:
            # (run by whichever thread drops the state: only what needs no lock here)
            row.clear()
            self._gone.append(row)
        return gone

    def others(self, but: ss.StreamState | None) -> list[ss.StreamState]:
        """The threads' stream states but `but` (through the weak references: the
        dictionary's own iteration costs more than the rest of a round trip's look-ups)."""
        return [stream for stream in (ref() for ref in self._refs) if stream is not None and stream is not but]

    def victim_blocks(self, but: ss.StreamState | None = None) -> np.ndarray:
        """Under the lock: the blocks the device's streams (but `but`) are writing back,
        sorted: their bytes are not on the SSD (or their checksums not recorded) yet."""
        # (sorted with their repeats: a look-up finds a block as well.) Each stream keeps
        # its own sorted (note_victims): one of them is the answer as it is (no caller
        # writes to it). The streams' loops read the table itself (victims.touches_others).
        held = self.table.blocks(but.victim_row.arrays[2] if but is not None and self._holds(but) else -1)
        if len(held) < 2:
            return held[0] if held else NO_BLOCKS
        blocks = np.concatenate(held)
        blocks.sort()
        return blocks

    def _holds(self, stream: ss.StreamState) -> bool:
        return stream.victim_row.arrays[0] is self.table.matrix

    def touches_victims(self, hpas, lens) -> bool:
        """Under the lock: whether an access touches a block a stream is writing back
        (a miss on it must wait)."""
        victims = self.victim_blocks()
        if victims.shape[0] == 0:
            return False
        return loop.clean_prefix(np.atleast_1d(np.asarray(hpas, np.int64)),
                                 np.atleast_1d(np.asarray(lens, np.int64)),
                                 self.block_size, victims) < np.atleast_1d(hpas).shape[0]

    def unrecorded_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """Under the lock: the blocks and sums of the streams' write-backs out or landed,
        their checksums not recorded yet (what their SUM records say)."""
        blocks, sums = [NO_BLOCKS], [NO_SUMS]
        for stream in self.others(None):
            out = (stream.wb_state == ss.WB_RING) | (stream.wb_state == ss.WB_LAND) | (stream.wb_state == ss.WB_FAIL)
            blocks.append(stream.wb_rows[out, 2] // self.block_size)
            sums.append(stream.wb_sum[out])
        return np.concatenate(blocks), np.concatenate(sums)
