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
from host_runtime.mailbox import HintClient, MailboxClient


class DeviceHandle:
    """An open device as the host sees it. Use as a context manager, or call close().

    Besides the buffer-taking calls below it offers the declared device interface
    (cxlhm.device.interface: HostDevice, and StreamDevice, ModelClockDevice or
    IntegrityDevice where `caps` says so), so callers never reach for the device object."""

    def __init__(self, device: HostDevice):
        self.device = device
        self.config: DeviceConfig = device.cfg
        self.cfg = device.cfg
        self.capacity = device.capacity
        self.block_size = device.block_size
        self.window = getattr(device, "window", None)  # cxlhm.window.Window in mode: window, else None

    # ---------------------------------------------------------------- bytes
    def load(self, hpa: int, n: int, *, session: int = 0) -> bytes:
        """Read `n` bytes at `hpa`. `session` (optional, here and below) tags the
        access with the serving session it belongs to, for hint-aware firmware."""
        self.device.check_extent(_integer(hpa, "hpa"), _integer(n, "n"))  # before allocating n bytes
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
        self.device.access_one(hpa, view.shape[0], view.ctypes.data, False, session)

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
        self.device.access(hpas, np.full(hpas.shape[0], length, np.int64), view.ctypes.data, False, session)

    def writev(self, hpas: Any, length: int, data: Any, *, session: int = 0) -> None:
        """Write `len(hpas)` extents of `length` bytes taken end to end from `data`."""
        hpas = np.asarray(hpas, np.int64).reshape(-1)
        view = byte_view(data, writable=False)
        if view.shape[0] != hpas.shape[0] * length:
            raise ValueError(f"data holds {view.shape[0]} bytes, expected {hpas.shape[0]} x {length}")
        self.device.access(hpas, np.full(hpas.shape[0], length, np.int64), view.ctypes.data, True, session)

    def _access(self, hpa: int, view: np.ndarray, is_write: bool, session: int) -> None:
        self.device.access_one(_integer(hpa, "hpa"), view.shape[0], view.ctypes.data, is_write, _integer(session, "session"))

    # ---------------------------------------------------------------- mailbox
    @functools.cached_property
    def mailbox(self) -> MailboxClient:
        """The device's CXL mailbox (started on first use): identify(), health(), log(), poison()."""
        return MailboxClient(self.device.start_mailbox())

    @property
    def hints(self) -> HintClient:
        """Request-lifecycle hints through the mailbox: session_resume(), next_prefix(), ..."""
        return self.mailbox.hints

    # ---------------------------------------------------------------- the device interface
    @property
    def caps(self) -> DeviceCaps:
        return self.device.caps

    @property
    def closed(self) -> bool:
        return self.device.closed

    @property
    def image_path(self) -> str | None:
        return self.device.image_path

    @property
    def unclean_shutdown_detected(self) -> bool:
        return self.device.unclean_shutdown_detected

    @property
    def write_mode(self) -> str:
        return self.device.write_mode

    def check_extent(self, hpa: int, n: int) -> None:
        self.device.check_extent(hpa, n)

    def access(self, ext_hpa: np.ndarray, ext_len: np.ndarray, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """Extents against a raw address (HostDevice.access); prefer readv/writev."""
        return self.device.access(ext_hpa, ext_len, user_addr, is_write, owner, issue_ns)

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None) -> float:
        return self.device.access_one(hpa, n, user_addr, is_write, owner, issue_ns)

    def stream_io(self, ext_hpa, ext_len, addrs, depth: int, **options):
        """StreamDevice.stream_io (only where caps.streams_io)."""
        if not self.device.caps.streams_io:
            raise ValueError("this device does not stream (caps.streams_io is False): use access()")
        return self.device.stream_io(ext_hpa, ext_len, addrs, depth, **options)

    def thread_hits_misses(self) -> tuple[int, int]:
        return self.device.thread_hits_misses()

    def now_ns(self) -> float:
        """ModelClockDevice.now_ns (only where caps.model_clock)."""
        return self.device.now_ns()

    def advance_to(self, t_ns: float) -> None:
        """ModelClockDevice.advance_to (only where caps.model_clock)."""
        self.device.advance_to(t_ns)

    def prefetch(self, blocks, owners=None) -> int:
        return self.device.prefetch(blocks, owners)

    def run_background(self, budget: int = 32) -> int:
        return self.device.run_background(budget)

    def warm_up(self) -> None:
        self.device.warm_up()

    def block_checksums(self, first_block: int, n_blocks: int) -> list[int | None]:
        """IntegrityDevice.block_checksums (only where caps.integrity)."""
        return self.device.block_checksums(first_block, n_blocks)

    def integrity_report(self) -> dict:
        """IntegrityDevice.integrity_report (only where caps.integrity)."""
        return self.device.integrity_report()

    # ---------------------------------------------------------------- control
    def flush(self) -> int:
        return self.device.flush()

    def stats(self) -> dict:
        return self.device.stats()

    def close(self) -> None:
        if "mailbox" in self.__dict__:
            self.mailbox.close()
        self.device.close()

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
    if cfg.mode == "window":
        from cxlhm.window import WindowDevice  # userfaultfd: imported only when asked for
        return DeviceHandle(WindowDevice(cfg))
    return DeviceHandle(Device(cfg))
