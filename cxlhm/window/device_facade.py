"""`WindowDevice`: the `Device` interface over a window, so that `open_device` can hand
out the usual `DeviceHandle` in window mode (load/store, read_into, the mailbox's hints)
while numpy, torch and C code use `handle.window` directly. Both paths see the same
bytes: explicit accesses are memcpy through the window's own memory.

Guarantees, the explicit mode's: after a clean close or a crash (kill -9) of the process,
every block reads back as the bytes last written to it or as poison, never older bytes -
in either mode (cxlhm/window/persistence.py). A poisoned block raises SIGBUS when loaded
through the window, `PoisonError` through the explicit API of a device opened in explicit
mode. Not emulated in window mode: power loss (torn writes) and the model clock."""
from __future__ import annotations

import threading
import time

import numpy as np

from cxlhm.config import DeviceConfig
from cxlhm.device.interface import DeviceCaps
from cxlhm.mailbox.hints import deliver_each
from cxlhm.mailbox.poison import PoisonList, records_of
from cxlhm.window.options import WindowOptions
from cxlhm.window.window import Window


class WindowDevice:
    def __init__(self, cfg: DeviceConfig, options: WindowOptions | None = None):
        self.window = Window(cfg, options)
        self.cfg = cfg
        self.capacity, self.block_size, self.n_slots = cfg.capacity, cfg.block_size, cfg.dram_slots
        self.policy = self.window.policy
        self.write_mode = cfg.firmware.write_mode or self.policy.write_mode  # write-through is refused
        self.mailbox = None
        self._mailbox_lock = threading.Lock()
        self._ffi, self._lib = self.window._ffi, self.window._lib

    @property
    def closed(self) -> bool:
        return self.window.closed

    @property
    def unclean_shutdown_detected(self) -> bool:
        return self.window.unclean_shutdown_detected

    @property
    def image_path(self) -> str | None:
        ssd = self.window.ssd
        return None if ssd.temporary else ssd.path

    @property
    def caps(self) -> DeviceCaps:
        # checksums and the integrity log live in the fault service (no block_checksums
        # API here); a temporary image is dropped at close
        return DeviceCaps(persistent=self.window.persistence is not None)

    def warm_up(self) -> None:
        """Nothing to compile late: the fault service's firmware was compiled at open."""

    def poison_records(self, dpa: int, length: int, max_records: int) -> PoisonList:
        """The blocks poisoned when the image was opened (crash recovery); the fault
        service keeps later poison to itself."""
        persistence = self.window.persistence
        blocks = list(persistence.poison.blocks) if persistence is not None else []
        return records_of(blocks, self.block_size, dpa, length, max_records)

    def start_mailbox(self, **options):
        """The CXL mailbox over this device, as Device.start_mailbox: its hint commands
        reach the window's firmware."""
        from cxlhm.mailbox import Mailbox
        with self._mailbox_lock:
            if self.mailbox is None:
                self.mailbox = Mailbox(self, **options).start()
            return self.mailbox

    def check_extent(self, hpa: int, n: int) -> None:
        self.window.check_extent(hpa, n)

    def access(self, ext_hpa, ext_len, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """Copy the extents (laid end to end at user_addr) from or to the window.
        Returns the wall-clock latency in ns. Faults are served by the window."""
        ext_hpa = np.ascontiguousarray(ext_hpa, np.int64).reshape(-1)
        ext_len = np.ascontiguousarray(ext_len, np.int64).reshape(-1)
        for h, n in zip(ext_hpa.tolist(), ext_len.tolist()):
            self.check_extent(h, n)
        start = time.perf_counter_ns()
        pos = 0
        for h, n in zip(ext_hpa.tolist(), ext_len.tolist()):
            self._copy(h, n, user_addr + pos, is_write)
            pos += n
        return float(time.perf_counter_ns() - start)

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None) -> float:
        self.check_extent(hpa, n)
        start = time.perf_counter_ns()
        self._copy(hpa, n, user_addr, is_write)
        return float(time.perf_counter_ns() - start)

    def _copy(self, hpa: int, n: int, user_addr: int, is_write: bool) -> None:
        if self.window.closed:
            self.window._open()
        win = self.window.base_address + hpa
        dst, src = (win, user_addr) if is_write else (user_addr, win)
        # cffi drops the GIL for the call: a fault in the copy waits for the service thread
        self._lib.cxlhm_window_copy(self._ffi.cast("void *", dst), self._ffi.cast("void *", src), n)

    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0) -> bool:
        if self.window.closed:
            return False
        return self.window.hint(kind, session, first_block, n_blocks, arg)

    def hint_batch(self, kind: int, sessions, first_blocks, n_blocks, args, *, lock_timeout: float = -1) -> int:
        """Hints of one kind, in order; returns how many were not followed. Each is one
        call into the fault service's firmware (no interpreter work per hint there),
        which never holds a lock a hint must wait for (`lock_timeout` is not needed)."""
        return deliver_each(self.hint, kind, sessions, first_blocks, n_blocks, args)

    def prefetch(self, blocks, owners=None) -> int:
        return self.window.prefetch_blocks(blocks, owners)

    def run_background(self, budget: int = 32) -> int:
        """The fault-service thread runs background work by itself; nothing to do here."""
        return 0

    def flush(self) -> int:
        return 0 if self.window.closed else self.window.flush()

    def stats(self) -> dict:
        return self.window.stats()

    def thread_hits_misses(self) -> tuple[int, int]:
        """Every thread's: the fault service, not the faulting thread, counts them."""
        counters = self.window.stats()
        return counters["hits"], counters["misses"]

    def close(self) -> None:
        if self.mailbox is not None:  # its thread may be delivering a hint
            self.mailbox.close()
        self.window.close()
