"""What keeps a window's image right across a crash: the explicit mode's sidecar files.

A window's image has the explicit mode's metadata file (clean flag, poison list), block
checksums and integrity log (cxlhm/integrity.py), with the same meaning: the fault
service appends DIRTY / SUM / POISON records to the log itself (native/cxlhm_uffd.c)
before the event each one records, and verifies fills against the checksums. So either
mode reopens the other's image - after a clean close or after a kill -9 - and reads the
bytes last written to each block, or poison; never older bytes.

At open the log is replayed after an unclean shutdown (the blocks it left DIRTY are
poisoned); the checksums and poison list go to the fault service. At a clean close the
records the service appended are replayed over the saved state and saved whole.
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
from pathlib import Path

import numpy as np

from cxlhm import sumtable
from cxlhm.device import METADATA_FORMAT, metadata_path
from cxlhm.integrity import BlockChecksums, PoisonTable


def _xxh3_address() -> int | None:
    """The address of the xxhash wheel's XXH3_64bits - the function explicit mode's
    checksums are made with - or None when this wheel does not export it."""
    if not sumtable.COMPILED_HASH:
        return None
    lib = ctypes.CDLL(importlib.import_module("xxhash._xxhash").__file__)
    return ctypes.cast(lib.XXH3_64bits, ctypes.c_void_p).value


class WindowPersistence:
    """The sidecar files of one window's image, from open to close."""

    def __init__(self, image: str | None, capacity: int, block_size: int):
        self.image, self.capacity, self.block_size = image, capacity, block_size
        self.unclean_shutdown_detected = False
        self.poison = PoisonTable()
        self.log_fd = -1
        self._saved_poison: dict = {}
        self._keep: list[np.ndarray] = []  # arrays the fault service reads at open
        if image is None:
            return
        path = metadata_path(image)
        if path.exists():
            try:
                meta = json.loads(path.read_text())
                self.unclean_shutdown_detected = not meta.get("clean", False)
                self._saved_poison = meta.get("poison") or {}
                self.poison = PoisonTable(self._saved_poison)
            except (OSError, ValueError, AttributeError):
                self.unclean_shutdown_detected = True
        checksums = BlockChecksums(self._sums_path, block_size)
        checksums.attach_log(self._log_path, self.poison, unclean=self.unclean_shutdown_detected)
        checksums.close()  # from here on the fault service appends, through its own descriptor
        self.recovered = dict(checksums.recovered)
        self._sums = checksums.sums
        self._write_metadata(clean=False)  # until a clean close says otherwise
        self.log_fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    @property
    def _sums_path(self) -> Path:
        return Path(self.image + ".cxlhm.sums")

    @property
    def _log_path(self) -> Path:
        return Path(self.image + ".cxlhm.ilog")

    def fill_params(self, ffi, p) -> None:
        """Hand the fault service its log, hash function, checksums and poison list."""
        p.log_fd = self.log_fd
        if self.image is None:
            return
        address = _xxh3_address()
        p.hash = ffi.cast("void *", address) if address else ffi.NULL
        blocks = np.fromiter(self._sums.keys(), np.int64, len(self._sums))
        sums = np.fromiter(self._sums.values(), np.uint64, len(self._sums))
        poisoned = np.fromiter(self.poison.blocks.keys(), np.int64, len(self.poison.blocks))
        self._keep = [blocks, sums, poisoned]
        p.sum_blocks, p.sum_values, p.n_sums = ffi.cast("int64_t *", blocks.ctypes.data), \
            ffi.cast("uint64_t *", sums.ctypes.data), blocks.shape[0]
        p.poison_blocks, p.n_poison = ffi.cast("int64_t *", poisoned.ctypes.data), poisoned.shape[0]

    def close(self, *, clean: bool) -> None:
        """After the fault service stopped (its final flush done): with `clean`, fold the
        records it appended into the saved checksums and poison list and mark the image
        clean; else leave the log for the next open's replay."""
        if self.log_fd >= 0:
            os.close(self.log_fd)
            self.log_fd = -1
        if self.image is None or not clean:
            return
        poison = PoisonTable(self._saved_poison)
        checksums = BlockChecksums(self._sums_path, self.block_size)
        checksums.attach_log(self._log_path, poison, unclean=True)  # replay: the window's records
        checksums.save()
        checksums.close()
        self.poison = poison
        self._write_metadata(clean=True)

    def _write_metadata(self, *, clean: bool) -> None:
        path = metadata_path(self.image)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"format": METADATA_FORMAT, "capacity": self.capacity,
                                   "block_size": self.block_size, "clean": clean,
                                   "poison": self.poison.to_json()}))
        os.replace(tmp, path)
