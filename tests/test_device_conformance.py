"""Every registered back end and the device on each of them, through the conformance
suites shipped in cxlhm.testing (as an outside back end would run them)."""
import pytest

from cxlhm.media.registry import backend_kinds
from cxlhm.testing.backends import BackendTests
from cxlhm.testing.device import DeviceTests
from cxlhm.window import WindowDevice, probe

WINDOW_UNAVAILABLE = probe()


class TestSsdBackend(BackendTests):
    kind = "ssd"


class TestMemoryBackend(BackendTests):
    kind = "memory"


class TestDeviceOnSsd(DeviceTests):
    overrides = {"backend": {"kind": "ssd"}}


class TestDeviceOnMemory(DeviceTests):
    overrides = {"backend": {"kind": "memory"}}


class TestDeviceWriteThroughOnMemory(DeviceTests):
    overrides = {"backend": {"kind": "memory"}, "firmware": {"write_mode": "write-through"}}


@pytest.mark.skipif(WINDOW_UNAVAILABLE is not None, reason=f"userfaultfd window unavailable: {WINDOW_UNAVAILABLE}")
class TestWindowDevice(DeviceTests):
    """The window's device face (what open_device(mode="window") hands out)."""

    def open_device(self, path, **extra):
        return WindowDevice(self.config(path, **extra))


def test_every_registered_backend_runs_both_suites():
    backends = {cls.kind for cls in BackendTests.__subclasses__()}
    devices = {cls.overrides["backend"]["kind"] for cls in DeviceTests.__subclasses__() if cls.overrides}
    assert set(backend_kinds()) <= backends and set(backend_kinds()) <= devices
