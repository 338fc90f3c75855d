"""Write-backs in waves: a write that replaces whole blocks and evicts dirty victims
overlaps its CPU work with its victims' write-back (MediaPath.write_back_in_waves), one
wave on the SSD while the slots the previous wave freed take the new bytes.
"""
from __future__ import annotations

import numpy as np

from cxlhm.device.stream import copyengine
from cxlhm import firmware as fw
from cxlhm.device.state import DeviceState

# A write that evicts dirty victims writes them back in waves (WriteWaves.plan), at
# most MAX_WAVES of at least WAVE_BYTES each. bench/bench_kvstore.py times the same raw
# write made that way: on the development machine's virtio disk 4 waves of a 32 MiB write
# took what one batch takes (14.5 vs 14.3 ms), 2 waves of a 2 MiB write 1.02 vs 1.25 ms;
# its 32 MiB puts into a full DRAM went from 0.67x of a raw write (one batch) to 0.83-0.84x.
WAVE_BYTES = 1 << 20
MAX_WAVES = 4


class WriteWaves:
    """Device part: writes whose victims go back in waves. It keeps nothing between
    passes: a pass's waves are cut from its own scratch."""

    def __init__(self, state: DeviceState):
        self.state = state

    def plan(self, hpas, lens, full_write: bool, k: int, n_wb: int, n_fill: int, s) -> list[np.ndarray] | None:
        """A large write that replaces whole blocks and evicts dirty victims can overlap
        its CPU work with its write-backs (MediaPath.write_back_in_waves): its victims,
        cut in waves by the part of the write whose slots they free. None when the pass
        does not qualify: not a whole-block write of one extent without fills, on the
        wall clock with data, of at least two waves of WAVE_BYTES that fit the ring."""
        state = self.state
        bs = state.block_size
        if (not full_write or n_fill or not n_wb or hpas.shape[0] != 1 or state.model_clock is not None
                or not state.moves_data or not state.media.ssd.caps.async_io
                or state.write_mode_code == fw.WRITE_THROUGH or hpas[0] % bs or lens[0] % bs):
            return None
        n_waves = min(MAX_WAVES, n_wb * bs // WAVE_BYTES)
        if n_waves < 2 or -(-n_wb // n_waves) > state.media.ssd.async_room():
            return None
        rows = s.writebacks[:n_wb]
        slots = s.slots_out[:k]
        order = np.argsort(slots)
        position = order[np.searchsorted(slots[order], (rows[:, 0] - self.state.dram.base_address) // bs)]
        wave = np.searchsorted(_wave_bounds(k, n_waves), position, side="right") - 1
        return [rows[wave == w] for w in range(n_waves)]

    def write(self, waves: list[np.ndarray], hpas, user_addr: int, k: int, s) -> None:
        """Write back the victims wave by wave; as each wave lands, copy the host's bytes
        into the slots it freed. The new blocks are logged dirty after every victim's
        checksum record (a victim may be one of them, placed again by this pass)."""
        bounds = _wave_bounds(k, len(waves))
        bs = self.state.block_size

        def copy_in(w: int) -> None:
            lo, hi = int(bounds[w]), int(bounds[w + 1])
            copyengine.copy_extents(self.state.dram.base_address, bs, s.slots_out[lo:hi],
                                    np.array([hpas[0] + lo * bs], np.int64), np.array([(hi - lo) * bs], np.int64),
                                    user_addr + lo * bs, False)

        media = self.state.media
        media.write_back_in_waves(waves, copy_in)
        if media.checksums.log is not None:
            media.checksums.note_dirty_array(self.state.bt.block[s.slots_out[:k]])


def _wave_bounds(k: int, n_waves: int) -> np.ndarray:
    """Where each wave's part of a pass's k slots starts (and the last ends): wave w frees
    the slots of positions [bounds[w], bounds[w + 1]) for the new bytes."""
    return np.arange(n_waves + 1, dtype=np.int64) * k // n_waves
