"""Write-back of dirty device DRAM to the back end: the flush (every dirty block, made
durable) and the policy's background flushes (a chosen list).

`WriteBack` keeps nothing of its own: it writes what a collect kernel selects from the
block table, marks it clean, and on the model clock charges the writes to the timing
model as background work. The write-behind in flight is settled first (its blocks are
dirty until it lands).
"""
from __future__ import annotations

from cxlhm import firmware as fw
from cxlhm.device.behind import WriteBehind
from cxlhm.device.state import DeviceState
from cxlhm.timing import charge_flush


class WriteBack:
    """Device part: write dirty blocks back (flush, background flushes)."""

    def __init__(self, state: DeviceState, behind: WriteBehind):
        self.state, self.behind = state, behind

    def flush_locked(self) -> tuple[int, int]:
        """Under the lock: write every dirty block back and make it durable. Returns
        (blocks written, blocks whose write-back failed)."""
        state = self.state
        if state.closed:
            return 0, 0
        written, failed = self.write_back(
            lambda bt, _, base, bs, rows: fw.collect_dirty(bt, base, bs, rows, rows.shape[0]), None)
        if state.moves_data:
            state.media.sync()
        clock = state.model_clock
        if clock is not None:  # durable on NAND, like a Global Persistent Flush
            clock.now_ns = max(clock.now_ns, charge_flush(state.timing_model.params, state.timing_model.state,
                                                          clock.now_ns))
        return written, failed

    def write_back(self, collect, blocks) -> tuple[int, int]:
        """Under the lock: write back what `collect(bt, blocks, base, block_size, rows) -> n`
        selects, round after round until it selects nothing; marks those blocks clean.
        Returns (blocks written, blocks whose write-back failed: they stay dirty)."""
        state = self.state
        self.behind.settle()  # (its blocks are dirty until it lands)
        written = failed_blocks = 0
        rows = state.scratch().writebacks
        base, bs = state.dram.base_address, state.block_size
        while True:
            n = collect(state.bt, blocks, base, bs, rows)
            if n == 0:
                break
            if state.moves_data:
                failed = state.media.write_rows(rows[:n], victims=False)
                if failed.any():  # the blocks stay dirty in DRAM; stop instead of retrying forever
                    ok = rows[:n][~failed]
                    fw.mark_clean(state.bt, base, bs, ok, ok.shape[0])
                    written += ok.shape[0]
                    failed_blocks = int(failed.sum())
                    break
            clock = state.model_clock
            if clock is not None:
                done = clock.charge_write_back(clock.now_ns, rows, n)
                state.background_done_ns = max(state.background_done_ns, done)
            fw.mark_clean(state.bt, base, bs, rows, n)
            written += n
            if blocks is not None:
                break  # a block list is done in one round
        state.media.count_writes(written)
        return written, failed_blocks
