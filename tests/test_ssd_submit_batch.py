"""The SSD back end's submit batch (fio's iodepth_batch_submit): however many prepared
I/Os wait before one io_uring_enter() hands them over, every path moves the same bytes,
and none waits forever for SQEs that were never submitted."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from cxlhm.media.dram import DeviceDram
from cxlhm.media.ssd import SsdBackend

BLOCK = 4096
BLOCKS = 64


def _ops(dram: DeviceDram, slots, blocks, write: bool) -> np.ndarray:
    ops = np.zeros((len(slots), 4), np.int64)
    ops[:, 0] = dram.base_address + np.asarray(slots, np.int64) * BLOCK
    ops[:, 1] = BLOCK
    ops[:, 2] = np.asarray(blocks, np.int64) * BLOCK
    ops[:, 3] = int(write)
    return ops


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 40), depth=st.sampled_from([4, 16, 32]),
       order=st.permutations(range(BLOCKS)), seed=st.integers(0, 2**32 - 1))
def test_every_path_moves_the_same_bytes_at_any_submit_batch(tmp_path_factory, batch, depth, order, seed):
    path = tmp_path_factory.mktemp("batch") / "img"
    ssd = SsdBackend(str(path), BLOCKS * BLOCK, depth, submit_batch=batch)
    dram = DeviceDram(BLOCKS, BLOCK)
    try:
        data = np.random.default_rng(seed).integers(0, 256, (BLOCKS, BLOCK), dtype=np.uint8)
        dram.slots[:] = data
        # whole batches: block order[i] gets slot i's bytes
        assert (ssd.submit(_ops(dram, range(BLOCKS), order, True)) == BLOCK).all()
        want = data[np.argsort(order)]  # block b holds the bytes of the slot that wrote it
        dram.slots[:] = 0
        # the closed loop, fewer in flight than the batch at times
        res, _ = ssd.run_closed_loop(_ops(dram, range(BLOCKS), range(BLOCKS), False), min(depth, 7))
        assert (res == BLOCK).all() and np.array_equal(dram.slots, want)
        dram.slots[:] = 0
        # split phase: queue in odd-sized pieces, reap one at a time
        reaped: dict[int, int] = {}
        start = 0
        while start < BLOCKS or len(reaped) < BLOCKS:
            piece = min(BLOCKS - start, 3, ssd.async_room())
            if piece > 0:
                tags = np.arange(start, start + piece, dtype=np.int64)
                start += ssd.queue(_ops(dram, tags, tags, False), tags)
            tags, results = ssd.reap(1)
            reaped.update(zip(tags.tolist(), results.tolist()))
        assert set(reaped) == set(range(BLOCKS)) and set(reaped.values()) == {BLOCK}
        assert np.array_equal(dram.slots, want)
    finally:
        ssd.close()
        dram.close()
