"""The load/store window: the HDM range as plain memory.

    win = open_window({"capacity": "1TiB", "dram_bytes": "256MiB", "block_size": "64KiB",
                       "backend": {"path": "out/ssd.img"}})
    kv = win.ndarray(0x1000_0000, (1024, 4096), np.float16)   # a numpy array on the device
    t = torch.frombuffer(win.memoryview(0, 1 << 20), dtype=torch.uint8)
    win.prefetch(0x1000_0000, kv.nbytes)                      # installed ahead: no faults
    win.close()                                               # flushes written bytes

A `Window` owns its device: block table, policy state, staging buffers, SSD back end,
and the native fault-service thread (native/cxlhm_uffd.c) that fills, evicts and
samples blocks. The SSD image has the explicit mode's format (the byte at HPA h is at
file offset h) and its sidecar files - metadata, checksums, integrity log
(cxlhm/window/persistence.py) - so either mode reopens the other's device, after a
clean close or a crash, with the same guarantee: the bytes last written, or poison.
"""
from __future__ import annotations

import atexit
import gc
import os
import threading
import warnings
import weakref

import numpy as np

from cxlhm import policies as firmware_policies
from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm.config import ConfigError, DeviceConfig
from cxlhm.device import AccessOutOfRange, DeviceClosed, MediaError
from cxlhm.mailbox.hints import HintKind
from cxlhm.media import native
from cxlhm.media.dram import DeviceDram
from cxlhm.media.ssd import SsdBackend
from cxlhm.window import firmware_cfuncs as fc
from cxlhm.window.availability import USER_MODE_ONLY, STAGE_OTHER, WindowUnavailable, explain
from cxlhm.window.options import WindowOptions
from cxlhm.window.persistence import WindowPersistence
from cxlhm.policies import JOB_FLUSH, JOB_PREFETCH

MS = 1_000_000
# Open windows, held strongly: the service thread uses the firmware arrays through raw
# pointers, so a window must not be garbage-collected before close() stopped it.
_OPEN: "set[Window]" = set()


class _WindowMemory:
    """What numpy arrays over the window hang on (their `.base`): it keeps the window
    alive, and the window counts the live ones before it gives its range back."""
    __slots__ = ("__array_interface__", "window", "__weakref__")

    def __init__(self, window: "Window", address: int, shape: tuple, dtype: np.dtype):
        self.window = window
        self.__array_interface__ = {"data": (address, False), "shape": shape, "typestr": dtype.str,
                                    "descr": dtype.descr, "version": 3}


class Window:
    """The HDM window of one emulated device as ordinary memory. Thread-safe."""

    def __init__(self, cfg: DeviceConfig, options: WindowOptions | None = None):
        options = options or WindowOptions()
        self.cfg, self.options = cfg, options
        self.capacity, self.block_size, self.n_slots = cfg.capacity, cfg.block_size, cfg.dram_slots
        self._check_config(cfg)
        self.policy = firmware_policies.get(cfg.firmware.policy)
        params = self.policy.resolve_params(cfg.firmware.params)
        try:
            self.granule = options.granule_for(self.block_size)
            self.n_staging = options.staging_for(self.n_slots, self.block_size)
            self.sample_bytes = options.sample_bytes_for(self.block_size)
        except ValueError as exc:
            raise ConfigError("window options", "options", str(exc)) from None
        self._ffi, self._lib = native.load()

        self.bt = btm.new_block_table(self.n_slots)
        self.ps = self.policy.make_state(self.n_slots, params)
        self.counters = C.new_counters()
        self.clock = np.zeros(1, np.int64)
        self.firmware = fc.FirmwareBridge(self.policy, self.bt, self.ps, self.counters, self.clock)
        self._jobs = np.zeros((64, 3), np.int64)
        self._args = np.zeros(8, np.int64)  # firmware call scratch, under _call_lock
        self._out = np.zeros(8, np.int64)
        self._call_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._views: "weakref.WeakSet[_WindowMemory]" = weakref.WeakSet()
        self.closed = False
        self.unclean_shutdown_detected = False

        self.ssd = SsdBackend(cfg.backend.path, self.capacity, cfg.backend.queue_depth,
                              source=cfg.source_of("backend.path"))
        self.staging = DeviceDram(self.n_staging, self.block_size)
        self.staging.slots[:] = 0  # fault the staging pages in now, not inside the first reads
        self._final_counters: dict[str, int] | None = None
        self._w = None
        self.persistence = None
        try:
            self.persistence = WindowPersistence(None if self.ssd.temporary else self.ssd.path, cfg)
            self.unclean_shutdown_detected = self.persistence.unclean_shutdown_detected
            self._w = self._open_native()
        except BaseException:
            if self._w is not None:
                self._lib.cxlhm_window_close(self._w, 0, self._ffi.NULL, 0)
            if self.persistence is not None:  # nothing was written: the image is as it was
                self.persistence.close(clean=not self.unclean_shutdown_detected)
            self.ssd.close()
            self.staging.close()
            raise
        self.base_address = int(self._ffi.cast("uintptr_t", self._lib.cxlhm_window_base(self._w)))
        self.user_mode_only = bool(self._lib.cxlhm_window_user_mode_only(self._w))
        if self.user_mode_only:
            warnings.warn(USER_MODE_ONLY, RuntimeWarning, stacklevel=2)
        rc = self._lib.cxlhm_window_start(self._w)
        if rc < 0:
            self.close()
            raise OSError(-rc, f"cannot start the fault-service thread: {os.strerror(-rc)}")
        _OPEN.add(self)

    @staticmethod
    def _check_config(cfg: DeviceConfig) -> None:
        if cfg.data != "real":
            raise ConfigError(cfg.source_of("data"), "data", "mode: window maps real memory; it needs data: real")
        if cfg.clock != "wall":
            raise ConfigError(cfg.source_of("clock"), "clock", "mode: window runs on the wall clock: loads and "
                              "stores to resident pages never reach the device model; use clock: wall")
        if cfg.firmware.write_mode == "write-through":
            raise ConfigError(cfg.source_of("firmware.write_mode"), "firmware.write_mode",
                              "mode: window buffers stores in device DRAM until eviction or flush; "
                              "write-through needs the explicit mode")
        try:
            policy = firmware_policies.get(cfg.firmware.policy)
        except firmware_policies.UnknownPolicy as exc:
            raise ConfigError(cfg.source_of("firmware.policy"), "firmware.policy", str(exc)) from None
        if policy.needs_future:
            raise ConfigError(cfg.source_of("firmware.policy"), "firmware.policy",
                              f"{policy.name} is offline (needs the trace's future); it cannot drive a window")
        try:
            policy.resolve_params(cfg.firmware.params)
        except firmware_policies.PolicyParamError as exc:
            raise ConfigError(cfg.source_of("firmware.params"), "firmware.params", str(exc)) from None

    def _open_native(self):
        ffi, lib, o = self._ffi, self._lib, self.options
        p = self._params = ffi.new("struct cxlhm_window_params *")
        p.capacity, p.block_size, p.granule = self.capacity, self.block_size, self.granule
        p.n_slots, p.n_staging = self.n_slots, self.n_staging
        p.staging = ffi.cast("void *", self.staging.base_address)
        p.ssd_fd, p.queue_depth = self.ssd.fd, min(4096, max(self.cfg.backend.queue_depth, 2 * self.n_staging))
        p.firmware = ffi.cast("void *", self.firmware.address)
        p.firmware_ctx = ffi.cast("int64_t *", self.firmware.ctx.ctypes.data)
        p.bt_flags = ffi.cast("uint8_t *", self.bt.flags.ctypes.data)
        p.bt_scalars = ffi.cast("int64_t *", self.bt.scalars.ctypes.data)
        p.now_index = btm.NOW_NS
        p.has_background = int(self.firmware.has_background)
        p.jobs, p.jobs_cap = ffi.cast("int64_t *", self._jobs.ctypes.data), self._jobs.shape[0]
        p.job_prefetch, p.job_flush = JOB_PREFETCH, JOB_FLUSH
        p.flag_busy, p.flag_pinned, p.flag_prefetched = int(btm.BUSY), int(btm.PINNED), int(btm.PREFETCHED)
        p.sample_interval_ns = int(o.sample_interval_ms * MS)
        p.sample_blocks = o.sample_blocks_for(self.n_slots)
        p.sample_bytes = self.sample_bytes
        p.sample_min_age_ns = int(o.sample_min_age_ms * MS)
        p.prefetch_grace_ns = int(o.prefetch_grace_ms * MS)
        p.huge_pages = int(o.huge_pages)
        self.persistence.fill_params(ffi, p)
        stage, err_no, message = ffi.new("int *"), ffi.new("int *"), ffi.new("char[256]")
        w = lib.cxlhm_window_open(p, stage, err_no, message, 256)
        if w == ffi.NULL:
            detail = ffi.string(message).decode()
            if stage[0] == STAGE_OTHER:
                raise OSError(err_no[0], f"cannot set up the load/store window: {detail}")
            raise WindowUnavailable(explain(stage[0], err_no[0], detail), err_no[0])
        return w

    # ------------------------------------------------------------ memory
    def check_extent(self, hpa: int, n: int) -> None:
        if hpa < 0 or n < 0 or hpa > self.capacity - n:
            raise AccessOutOfRange(f"[{hpa:#x}, +{n}) is outside the HDM window [0, {self.capacity:#x})")

    def ndarray(self, hpa: int, shape, dtype=np.uint8) -> np.ndarray:
        """A numpy array over the window at `hpa` (no copy): plain loads and stores."""
        self._open()
        dtype = np.dtype(dtype)
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.check_extent(int(hpa), nbytes)
        anchor = _WindowMemory(self, self.base_address + int(hpa), shape, dtype)
        self._views.add(anchor)
        return np.asarray(anchor)

    def memoryview(self, hpa: int, n: int) -> memoryview:
        """A writable memoryview of n bytes at `hpa` (torch.frombuffer takes it)."""
        return memoryview(self.ndarray(hpa, (n,), np.uint8))

    def address(self, hpa: int) -> int:
        """The virtual address of `hpa`, for native code (keep a view alive meanwhile)."""
        self.check_extent(int(hpa), 0)
        return self.base_address + int(hpa)

    # ------------------------------------------------------------ device operations
    def prefetch(self, hpa: int, n: int, *, wait: bool = True, session: int = 0) -> int:
        """Install the blocks of [hpa, hpa+n) ahead of use (UFFDIO_COPY: reading them
        later takes no fault). Returns the number of blocks requested. With
        WindowOptions.huge_pages, the 2 MiB-aligned regions it completes are then
        collapsed into huge pages by the service thread (wait_idle() waits for that)."""
        self.check_extent(int(hpa), int(n))
        if n == 0:
            return 0
        first, last = hpa // self.block_size, (hpa + n - 1) // self.block_size
        return self.prefetch_blocks(np.arange(first, last + 1, dtype=np.int64), session=session, wait=wait)

    def prefetch_blocks(self, blocks, owners=None, *, session: int = 0, wait: bool = True) -> int:
        self._open()
        blocks = np.ascontiguousarray(blocks, np.int64)
        if blocks.size and (blocks.min() < 0 or blocks.max() >= self.capacity // self.block_size):
            raise AccessOutOfRange("prefetch of a block outside the HDM window")
        owners = (np.full_like(blocks, session) if owners is None else np.ascontiguousarray(owners, np.int64))
        r = self._lib.cxlhm_window_prefetch(self._w, self._ffi.cast("int64_t *", blocks.ctypes.data),
                                            self._ffi.cast("int64_t *", owners.ctypes.data), blocks.shape[0],
                                            int(wait))
        if r < 0:
            raise OSError(-r, f"prefetch failed: {os.strerror(-r)}")
        return int(r)

    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0) -> bool:
        """A request-lifecycle hint (cxlhm.mailbox.hints) for the policy; PIN/UNPIN are
        carried out here. Advisory: returns False when one was not followed."""
        self._open()
        if first_block < 0 or n_blocks < 0 or first_block + n_blocks > self.capacity // self.block_size:
            raise AccessOutOfRange(f"hint range [{first_block}, +{n_blocks}) is outside the window's blocks")
        if kind in (HintKind.PIN, HintKind.UNPIN):
            return self._pin(first_block, n_blocks, kind == HintKind.PIN)
        self._firmware(fc.OPS['HINT'], kind, session, first_block, n_blocks, arg)
        return True

    def _pin(self, first_block: int, n_blocks: int, pin: bool) -> bool:
        if not pin:
            self._firmware(fc.OPS['PIN'], first_block, n_blocks, 0)
            return True
        if int(self.bt.scalars[btm.N_PINNED]) + n_blocks > self.n_slots - 1:
            return False  # leave a slot for faults, or every miss would block forever
        for _ in range(4):  # a concurrent fault may evict a block between prefetch and pin
            if self._firmware(fc.OPS['PIN'], first_block, n_blocks, 1) == 0:
                return True
            self.prefetch_blocks(np.arange(first_block, first_block + n_blocks, dtype=np.int64))
        return self._firmware(fc.OPS['PIN'], first_block, n_blocks, 1) == 0

    def _firmware(self, op: int, *args: int) -> int:
        """Call the firmware through C, which takes the window's mutex itself: Python
        never holds that mutex, so it can never hold it while waiting for the GIL."""
        with self._call_lock:
            self._args[:] = 0
            self._args[:len(args)] = args
            return int(self._lib.cxlhm_window_firmware(self._w, op, self._ffi.cast("int64_t *", self._args.ctypes.data),
                                                       self._ffi.cast("int64_t *", self._out.ctypes.data)))

    def flush(self) -> int:
        """Write every written granule back to the SSD; blocks stay resident. Returns blocks written."""
        self._open()
        r = self._lib.cxlhm_window_flush(self._w)
        if r < 0:
            raise MediaError(-r, f"window flush failed: {self.last_error() or os.strerror(-r)}")
        self.ssd.sync()
        return int(r)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until queued prefetches (and their huge-page collapses), flushes and the
        policy's background work are done."""
        self._open()
        return bool(self._lib.cxlhm_window_wait_idle(self._w, int((timeout or 0) * 1e9)))

    def resident_bytes(self) -> int:
        """Device DRAM in use: present pages of the window and of the sampler's side area."""
        self._open()
        return int(self._lib.cxlhm_window_resident_bytes(self._w))

    def huge_page_bytes(self, hpa: int, n: int) -> int:
        """Bytes of [hpa, hpa+n) mapped by 2 MiB pages right now (the kernel's page
        tables, as /proc/self/smaps' AnonHugePages counts them)."""
        self._open()
        self.check_extent(int(hpa), int(n))
        r = int(self._lib.cxlhm_window_huge_bytes(self._w, int(hpa), int(n)))
        if r < 0:
            raise OSError(-r, f"reading the window's page tables: {os.strerror(-r)}")
        return r

    def huge_pages_unavailable(self) -> str | None:
        """None when prefetched regions become huge pages, else why they do not."""
        self._open()
        state = int(self._lib.cxlhm_window_huge_pages(self._w))
        if state > 0:
            return None
        if state == 0:
            return "switched off (WindowOptions(huge_pages=False))"
        return self.last_error() or f"the kernel refused: {os.strerror(-state)}"

    def last_error(self) -> str:
        if self._w is None:
            return ""
        buf = self._ffi.new("char[256]")
        self._lib.cxlhm_window_error(self._w, buf, 256)
        return self._ffi.string(buf).decode()

    def window_counters(self) -> dict[str, int]:
        """The fault service's own counters (faults, UFFDIO_COPY calls, ...); after
        close(), their final values."""
        if self._final_counters is not None:
            return dict(self._final_counters)
        n = self._lib.cxlhm_window_stat_count()
        out = self._ffi.new("int64_t[]", n)
        self._lib.cxlhm_window_stats(self._w, out, n)
        return self._named_counters(out, n)

    def _named_counters(self, values, n: int) -> dict[str, int]:
        return {self._ffi.string(self._lib.cxlhm_window_stat_name(i)).decode(): int(values[i]) for i in range(n)}

    def stats(self) -> dict:
        """Firmware counters (hits are accesses the device saw: first stores and sampled
        accesses) overlaid with the fault service's physical counters. Works after
        close() too (final values)."""
        out = C.as_dict(self.counters)
        window = self.window_counters()
        out.update(window)
        out["ssd_reads"] = window["fills"] + window["prefetch_installed"]
        out["ssd_read_bytes"] = out["ssd_reads"] * self.block_size
        out["ssd_writes"] = window["writebacks"]
        out["ssd_write_bytes"] = window["writeback_bytes"]
        out["resident_blocks"] = int(self.n_slots - self.bt.scalars[btm.N_FREE])
        out["dirty_blocks"] = int(np.count_nonzero(self.bt.flags & btm.DIRTY))
        out["resident_bytes"] = 0 if self.closed else self.resident_bytes()
        out["user_mode_only"] = self.user_mode_only
        return out

    # ------------------------------------------------------------ lifecycle
    def _open(self) -> None:
        if self.closed:
            raise DeviceClosed("the window is closed")

    def close(self) -> None:
        """Flush written bytes (like a CXL Global Persistent Flush), stop the fault
        service and give the range back. Arrays still alive over the window make the
        range PROT_NONE instead (a later access crashes rather than read wrong bytes)."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
            _OPEN.discard(self)
            if self._views:
                gc.collect()  # arrays in reference cycles
            keep = len(self._views) > 0
            n = self._lib.cxlhm_window_stat_count()
            final = self._ffi.new("int64_t[]", n)
            rc = self._lib.cxlhm_window_close(self._w, int(keep), final, n)
            self._final_counters = self._named_counters(final, n)
            self._w = None
            try:
                self.ssd.sync()
                self.persistence.close(clean=rc == 0)
            finally:
                self.ssd.close()
                self.staging.close()
            if keep:
                warnings.warn(f"{len(self._views)} array(s) over the closed window are still alive; its range is "
                              "now PROT_NONE and touching them crashes", ResourceWarning, stacklevel=2)
            if rc < 0:
                raise MediaError(-rc, f"bytes written through the window could not be persisted: {os.strerror(-rc)}")

    def __enter__(self) -> "Window":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@atexit.register
def _close_open_windows() -> None:
    """Written bytes reach the SSD even when a program forgets close()."""
    for window in list(_OPEN):
        try:
            window.close()
        except Exception:  # noqa: BLE001 - at exit, report and go on
            warnings.warn(f"closing a window at exit failed", RuntimeWarning)


def open_window(spec=None, options: WindowOptions | None = None, **overrides) -> Window:
    """A window from a DeviceConfig, a profile name, a YAML path or a dict of overrides
    (like host_runtime.driver.open_device); `mode` may be either value."""
    from cxlhm.config import load_config
    cfg = spec if isinstance(spec, DeviceConfig) else load_config(spec, overrides or None)
    return Window(cfg, options)
