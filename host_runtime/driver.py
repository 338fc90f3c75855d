"""The userspace driver: opens an emulated CXL-HM device and moves bytes through its
HDM window with byte-granular load/store and zero-copy buffer variants.

    with open_device({"dram_bytes": "64MiB"}) as dev:
        dev.store(0x1000, b"hello")
        assert dev.load(0x1000, 5) == b"hello"
        arr = np.empty(1 << 20, np.uint8)
        dev.read_into(0, arr)

Buffers: anything exporting the buffer protocol (bytes, bytearray, memoryview, numpy
arrays, mmap) or the numpy array interface (CPU torch tensors work through
``tensor.numpy()``/``__array__``). They must be C-contiguous.

Request-lifecycle hints go where the caller says: ``dev.hint_sink("mailbox")`` (the CXL
mailbox, started then), ``"direct"`` (the device in process) or ``"none"``. A call the
device offers only by its caps (stream_io, now_ns, advance_to, the integrity calls)
raises DeviceCapabilityError where caps say no.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cxlhm.config import DeviceConfig, load_config
from cxlhm.device import Device, DeviceCaps, HostDevice
from host_runtime.buffers import byte_view
from host_runtime.hintsinks import DeviceHints, HintSink, NullHints
from host_runtime.mailbox import MailboxClient


class DeviceCapabilityError(ValueError):
    """A call the device's caps say it does not offer (a ValueError: a wrong request)."""


class DeviceHandle:
    """An open device as the host sees it. Use as a context manager, or call close().

    Besides the buffer-taking calls below it offers the declared device interface
    (cxlhm.device.interface: HostDevice, and StreamDevice, ModelClockDevice or
    IntegrityDevice where `caps` says so), so callers never reach for the device object:
    the device itself is private (`_device`); tests/test_layers.py fails on a module
    outside cxlhm/device/ that reads it."""

    def __init__(self, device: HostDevice):
        self._device = device
        self.cfg: DeviceConfig = device.cfg
        self.capacity = device.capacity
        self.block_size = device.block_size
        self.window = getattr(device, "window", None)  # cxlhm.window.Window in mode: window, else None

    # ---------------------------------------------------------------- bytes
    def load(self, hpa: int, n: int, *, session: int = 0) -> bytes:
        """Read `n` bytes at `hpa`. `session` (optional, here and below) tags the
        access with the serving session it belongs to, for hint-aware firmware."""
        self._device.check_extent(_integer(hpa, "hpa"), _integer(n, "n"))  # before allocating n bytes
        out = np.empty(n, np.uint8)
        self.read_into(hpa, out, session=session)
        return out.tobytes()

    def store(self, hpa: int, data: Any, *, session: int = 0) -> None:
        """Write `data` (any buffer) at `hpa`."""
        self.write_from(hpa, data, session=session)

    def read_into(self, hpa: int, buf: Any, *, session: int = 0) -> int:
        """Fill `buf` from the device at `hpa`; returns the byte count."""
        view = byte_view(buf, writable=True)
        self._access(hpa, view, False, session)
        return view.shape[0]

    def read_view(self, hpa: int, view: np.ndarray, session: int) -> None:
        """read_into() for a caller that already holds a flat, writable uint8 view and
        int arguments (the KV store): no conversion or checks of its own."""
        self._device.access_one(hpa, view.shape[0], view.ctypes.data, False, session)

    def write_from(self, hpa: int, buf: Any, *, session: int = 0) -> int:
        """Write the bytes of `buf` at `hpa`; returns the byte count."""
        view = byte_view(buf, writable=False)
        self._access(hpa, view, True, session)
        return view.shape[0]

    def readv(self, hpas: Any, length: int, out: Any, *, session: int = 0) -> None:
        """Read `len(hpas)` extents of `length` bytes, laid end to end in `out`, in one
        firmware pass and one SSD batch (the device sees them as concurrent: QD = len(hpas))."""
        hpas = np.asarray(hpas, np.int64).reshape(-1)
        view = byte_view(out, writable=True)
        if view.shape[0] != hpas.shape[0] * length:
            raise ValueError(f"out holds {view.shape[0]} bytes, expected {hpas.shape[0]} x {length}")
        self._device.access(hpas, np.full(hpas.shape[0], length, np.int64), view.ctypes.data, False, session)

    def writev(self, hpas: Any, length: int, data: Any, *, session: int = 0) -> None:
        """Write `len(hpas)` extents of `length` bytes taken end to end from `data`."""
        hpas = np.asarray(hpas, np.int64).reshape(-1)
        view = byte_view(data, writable=False)
        if view.shape[0] != hpas.shape[0] * length:
            raise ValueError(f"data holds {view.shape[0]} bytes, expected {hpas.shape[0]} x {length}")
        self._device.access(hpas, np.full(hpas.shape[0], length, np.int64), view.ctypes.data, True, session)

    def _access(self, hpa: int, view: np.ndarray, is_write: bool, session: int) -> None:
        self._device.access_one(_integer(hpa, "hpa"), view.shape[0], view.ctypes.data, is_write, _integer(session, "session"))

    # ---------------------------------------------------------------- mailbox
    @functools.cached_property
    def mailbox(self) -> MailboxClient:
        """The device's CXL mailbox (started on first use): identify(), health(), log(), poison()."""
        return MailboxClient(self._device.start_mailbox())

    def hint_sink(self, via: str = "mailbox") -> HintSink:
        """Where request-lifecycle hints for this device go, chosen by the caller (asking
        is the only thing that starts anything): "mailbox" - the CXL mailbox's hint client
        (starts the mailbox and its firmware thread, the real path); "direct" - the
        device's own hint() in process, no mailbox (benches, firmware tests); "none" -
        dropped."""
        if via == "mailbox":
            return self.mailbox.hints
        if via == "direct":
            return DeviceHints(self._device)
        if via == "none":
            return NullHints()
        raise ValueError(f"hint_sink: via must be 'mailbox', 'direct' or 'none', got {via!r}")

    @property
    def config(self) -> DeviceConfig:
        """The device's configuration (the same object as `cfg`, HostDevice's name for it)."""
        return self.cfg

    # ---------------------------------------------------------------- the device interface
    @property
    def caps(self) -> DeviceCaps:
        return self._device.caps

    @property
    def closed(self) -> bool:
        return self._device.closed

    @property
    def image_path(self) -> str | None:
        return self._device.image_path

    @property
    def unclean_shutdown_detected(self) -> bool:
        return self._device.unclean_shutdown_detected

    @property
    def write_mode(self) -> str:
        return self._device.write_mode

    def check_extent(self, hpa: int, n: int) -> None:
        self._device.check_extent(hpa, n)

    def access(self, ext_hpa: np.ndarray, ext_len: np.ndarray, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """Extents against a raw address (HostDevice.access); prefer readv/writev."""
        return self._device.access(ext_hpa, ext_len, user_addr, is_write, owner, issue_ns)

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None) -> float:
        return self._device.access_one(hpa, n, user_addr, is_write, owner, issue_ns)

    def stream_io(self, ext_hpa, ext_len, addrs, depth: int, **options):
        """StreamDevice.stream_io (only where caps.streams_io)."""
        self._require("streams_io", "stream_io", "use access()")
        return self._device.stream_io(ext_hpa, ext_len, addrs, depth, **options)

    def thread_hits_misses(self) -> tuple[int, int]:
        return self._device.thread_hits_misses()

    def now_ns(self) -> float:
        """ModelClockDevice.now_ns (only where caps.model_clock)."""
        self._require("model_clock", "now_ns", "its latencies are measured on the wall clock")
        return self._device.now_ns()

    def advance_to(self, t_ns: float) -> None:
        """ModelClockDevice.advance_to (only where caps.model_clock)."""
        self._require("model_clock", "advance_to", "its latencies are measured on the wall clock")
        self._device.advance_to(t_ns)

    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0, **options) -> bool:
        """One hint straight to the firmware (MailboxTarget.hint; hosts use hint_sink()).
        `options` go to the device as they are (Device.hint takes lock_timeout)."""
        return self._device.hint(kind, session, first_block, n_blocks, arg, **options)

    def hint_batch(self, kind: int, sessions: np.ndarray, first_blocks: np.ndarray, n_blocks: np.ndarray,
                   args: np.ndarray, **options) -> int:
        return self._device.hint_batch(kind, sessions, first_blocks, n_blocks, args, **options)

    def poison_records(self, dpa: int, length: int, max_records: int):
        return self._device.poison_records(dpa, length, max_records)

    def start_mailbox(self, **options):
        """The device's own mailbox (cxlhm.mailbox.Mailbox), started once; `mailbox` is a
        client of it."""
        return self._device.start_mailbox(**options)

    def prefetch(self, blocks, owners=None) -> int:
        return self._device.prefetch(blocks, owners)

    def run_background(self, budget: int = 32) -> int:
        return self._device.run_background(budget)

    def warm_up(self) -> None:
        self._device.warm_up()

    def block_checksums(self, first_block: int, n_blocks: int) -> list[int | None]:
        """IntegrityDevice.block_checksums (only where caps.integrity)."""
        self._require("integrity", "block_checksums", "it keeps no checksums")
        return self._device.block_checksums(first_block, n_blocks)

    def integrity_report(self) -> dict:
        """IntegrityDevice.integrity_report (only where caps.integrity)."""
        self._require("integrity", "integrity_report", "it keeps no integrity log")
        return self._device.integrity_report()

    def _require(self, cap: str, call: str, instead: str) -> None:
        if not getattr(self._device.caps, cap):
            raise DeviceCapabilityError(f"{call}: this device does not offer it (caps.{cap} is False: {instead})")

    # ---------------------------------------------------------------- control
    def flush(self) -> int:
        return self._device.flush()

    def stats(self) -> dict:
        return self._device.stats()

    def close(self) -> None:
        if "mailbox" in self.__dict__:
            self.mailbox.close()
        self._device.close()

    def __enter__(self) -> "DeviceHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    return int(value)


def open_device(spec: str | Path | Mapping | DeviceConfig | None = None, **overrides: Any) -> DeviceHandle:
    """Open a device from a profile name ("cmm-h"), a YAML path, a dict of overrides on
    the default profile, or a ready DeviceConfig; keyword overrides apply on top."""
    cfg = spec if isinstance(spec, DeviceConfig) else load_config(spec, overrides or None)
    return DeviceHandle(device_for(cfg))


def device_for(cfg: DeviceConfig) -> HostDevice:
    """The device object a config describes, opened: a cxlhm.device.Device, or in mode:
    window a cxlhm.window.WindowDevice. For tests and benches of the device itself (they
    keep it and wrap it in a DeviceHandle for the byte calls); hosts use open_device()."""
    if cfg.mode == "window":
        from cxlhm.window import WindowDevice  # userfaultfd: imported only when asked for
        return WindowDevice(cfg)
    return Device(cfg)
