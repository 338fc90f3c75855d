"""What keeps a window's image right across a crash: the explicit mode's sidecar files.

A window's image has the explicit mode's metadata file (clean flag, poison list), block
checksums and integrity log (cxlhm/integrity.py), with the same meaning: the fault
service appends DIRTY / SUM / POISON records to the log itself (native/cxlhm_uffd.c)
before the event each one records, and verifies fills against the checksums. So either
mode reopens the other's image - after a clean close or after a kill -9 - and reads the
bytes last written to each block, or poison; never older bytes.

At open (`open_state`, the explicit mode's) the sidecars are checked and the log is
replayed after an unclean shutdown (the blocks it left DIRTY are poisoned); the
checksums and poison list go to the fault service. At a clean close the
records the service appended are replayed over the saved state and saved whole.
"""
from __future__ import annotations

import os

import numpy as np

from cxlhm import sumtable
from cxlhm.config import DeviceConfig
from cxlhm.device.sidecar import Sidecars, log_path, open_state, sums_path
from cxlhm.integrity import BlockChecksums, PoisonTable


class WindowPersistence:
    """The sidecar files of one window's image, from open to close."""

    def __init__(self, image: str | None, cfg: DeviceConfig):
        self.image, self.block_size = image, cfg.block_size
        self.unclean_shutdown_detected = False
        self.poison = PoisonTable()
        self.log_fd = -1
        self._blocks = np.zeros(0, np.int64)  # checksums and poison at open (the fault service reads them)
        self._sums = np.zeros(0, np.uint64)
        self._poisoned = np.zeros(0, np.int64)
        if image is None:
            return
        self.sidecars = Sidecars(image, cfg.capacity, cfg.block_size, cfg.source_of)
        state = open_state(self.sidecars, cfg.backend.lost_sidecar)  # replays the log after a crash
        state.checksums.close()  # from here on the fault service appends, through its own descriptor
        self.unclean_shutdown_detected = state.unclean
        self.poison = state.poison
        self._blocks, self._sums = state.checksums.sums.entries()
        self._poisoned = np.fromiter(self.poison.blocks.keys(), np.int64, len(self.poison.blocks))
        self._poison_at_open = self.poison.to_json()
        self.log_fd = os.open(log_path(image), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def fill_params(self, ffi, p) -> None:
        """Hand the fault service its log, hash function, checksums and poison list."""
        p.log_fd = self.log_fd
        if self.image is None:
            return
        address = sumtable.xxh3_address()
        p.hash = ffi.cast("void *", address) if address else ffi.NULL
        p.sum_blocks, p.sum_values = ffi.cast("int64_t *", self._blocks.ctypes.data), \
            ffi.cast("uint64_t *", self._sums.ctypes.data)
        p.n_sums = self._blocks.shape[0]
        p.poison_blocks, p.n_poison = ffi.cast("int64_t *", self._poisoned.ctypes.data), self._poisoned.shape[0]

    def close(self, *, clean: bool) -> None:
        """After the fault service stopped (its final flush done): with `clean`, replay
        the records it appended over the state at open, save the checksums and mark the
        image clean; else leave the log for the next open's replay."""
        if self.log_fd >= 0:
            os.close(self.log_fd)
            self.log_fd = -1
        if self.image is None or not clean:
            return
        poison = PoisonTable(self._poison_at_open)
        checksums = BlockChecksums(sums_path(self.image), self.block_size)
        checksums.sums.set_many(self._blocks, self._sums)
        checksums.attach_log(log_path(self.image), poison, unclean=True)  # the window's records, in order
        saved = checksums.save()
        checksums.close()
        self.poison = poison
        self.sidecars.write(clean=True, poison=poison, sums=saved)
