"""The device conformance suite: what a host may rely on from any device
(cxlhm.device.interface.HostDevice). Subclass `DeviceTests`, give `overrides` (config
keys on top of a small default device) or override `open_device`, and pytest runs
the checks below - byte-granular round trips across blocks, range checks, flush and
reopen (if `caps.persistent`), and a hypothesis state machine against a bytearray.

    from cxlhm.testing.device import DeviceTests

    class TestDeviceOnMyBackend(DeviceTests):
        overrides = {"backend": {"kind": "my-backend"}}
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from cxlhm.config import load_config
from cxlhm.device import AccessOutOfRange, Device, DeviceCaps, HostDevice, IntegrityDevice
from cxlhm.mailbox.hints import HintKind

BLOCK = 4096
CAPACITY = 64 * BLOCK


def store_bytes(dev: HostDevice, hpa: int, data) -> None:
    """Write `data` (bytes or any buffer) at `hpa` through the device's own access path."""
    buf = np.frombuffer(bytearray(data), np.uint8)
    dev.access_one(hpa, buf.shape[0], buf.ctypes.data, True)


def load_bytes(dev: HostDevice, hpa: int, n: int) -> bytes:
    buf = np.zeros(n, np.uint8)
    dev.access_one(hpa, n, buf.ctypes.data, False)
    return buf.tobytes()


class DeviceTests:
    overrides: dict = {}

    def config(self, path: str | None, **extra):
        """The suite's small device (64 blocks, 4 in DRAM) with `overrides` and `extra` on top."""
        cfg = {"capacity": CAPACITY, "block_size": BLOCK, "dram_bytes": 4 * BLOCK,
               "backend": {"path": path}, "firmware": {"background": "manual"}}
        for layer in (self.overrides, extra):
            for key, value in layer.items():
                cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
        return load_config(cfg)

    def open_device(self, path: str | None, **extra) -> HostDevice:
        return Device(self.config(path, **extra))

    @pytest.fixture
    def device(self, tmp_path):
        dev = self.open_device(str(tmp_path / "device.img"))
        yield dev
        dev.close()

    store = staticmethod(store_bytes)
    load = staticmethod(load_bytes)

    def test_is_a_host_device_with_declared_caps(self, device):
        assert isinstance(device, HostDevice) and isinstance(device.caps, DeviceCaps)
        assert device.capacity == CAPACITY and device.block_size == BLOCK and not device.closed
        assert not device.unclean_shutdown_detected
        if device.caps.integrity:
            assert isinstance(device, IntegrityDevice)

    def test_mailbox_side(self, device):
        """What the mailbox asks: warm-up, a batch of hints (advisory: some may be
        declined, never more than were sent), and an empty poison list on a fresh image."""
        device.warm_up()
        sessions = np.arange(1, 4, dtype=np.int64)
        declined = device.hint_batch(HintKind.SESSION_RESUME, sessions, np.arange(3, dtype=np.int64),
                                     np.ones(3, np.int64), np.zeros(3, np.int64))
        assert 0 <= declined <= 3
        assert device.poison_records(0, CAPACITY, 16).records == ()
        self.store(device, 0, b"after hints")
        assert self.load(device, 0, 11) == b"after hints"

    @pytest.mark.parametrize("hpa,n", [(0, 1), (BLOCK - 3, 7), (5, 9 * BLOCK + 1), (CAPACITY - 10, 10)])
    def test_round_trip_at_any_offset(self, device, hpa, n):
        data = np.random.default_rng(hpa).integers(0, 256, n, dtype=np.uint8).tobytes()
        self.store(device, hpa, data)
        assert self.load(device, hpa, n) == data
        if hpa:
            assert self.load(device, hpa - 1, 1) == b"\0"

    def test_extents_in_one_call(self, device):
        buf = np.arange(3 * 100, dtype=np.uint8)
        hpas, lens = np.array([10, 5 * BLOCK - 50, 20 * BLOCK]), np.full(3, 100)
        device.access(hpas, lens, buf.ctypes.data, True)
        for i, hpa in enumerate(hpas.tolist()):
            assert self.load(device, hpa, 100) == buf[i * 100:(i + 1) * 100].tobytes()

    @pytest.mark.parametrize("hpa,n", [(-1, 1), (CAPACITY, 1), (CAPACITY - 1, 2)])
    def test_out_of_range_is_refused(self, device, hpa, n):
        with pytest.raises(AccessOutOfRange):
            device.check_extent(hpa, n)
        buf = np.zeros(max(n, 1), np.uint8)
        with pytest.raises(AccessOutOfRange):
            device.access_one(hpa, n, buf.ctypes.data, False)

    def test_close_flushes_and_a_reopen_sees_every_byte(self, tmp_path):
        path = str(tmp_path / "reopen.img")
        dev = self.open_device(path)
        if not dev.caps.persistent:
            dev.close()
            pytest.skip("not persistent")
        self.store(dev, 7, b"persist" * 3000)
        dev.close()
        assert dev.closed
        dev = self.open_device(path)
        try:
            assert self.load(dev, 7, 21000) == b"persist" * 3000
        finally:
            dev.close()

    def test_matches_a_bytearray_model(self, tmp_path):
        """Random writes, reads, flushes and clean reopens, byte-granular, against a bytearray."""
        suite = self

        class Machine(RuleBasedStateMachine):
            def __init__(self):
                super().__init__()
                self.path = str(Path(tempfile.mkdtemp(dir=tmp_path)) / "m.img")
                self.dev = suite.open_device(self.path)
                self.model = bytearray(CAPACITY)

            extents = st.integers(0, CAPACITY - 1).flatmap(
                lambda hpa: st.tuples(st.just(hpa), st.integers(0, min(3 * BLOCK, CAPACITY - hpa))))

            @rule(extent=extents, seed=st.integers(0, 255))
            def write(self, extent, seed):
                hpa, n = extent
                data = bytes((seed + i) % 256 for i in range(n))
                suite.store(self.dev, hpa, data)
                self.model[hpa:hpa + n] = data

            @rule(extent=extents)
            def read(self, extent):
                hpa, n = extent
                assert suite.load(self.dev, hpa, n) == bytes(self.model[hpa:hpa + n])

            @rule()
            def flush(self):
                self.dev.flush()

            @rule()
            def reopen(self):
                if self.dev.caps.persistent:
                    self.dev.close()
                    self.dev = suite.open_device(self.path)

            def teardown(self):
                self.dev.close()

        run_state_machine_as_test(Machine, settings=settings(max_examples=10, stateful_step_count=25, deadline=None))
