"""Every registered back end and the device on each of them, through the conformance
suites shipped in cxlhm.testing (as an outside back end would run them)."""
from cxlhm.media.registry import backend_kinds
from cxlhm.testing.backends import BackendTests
from cxlhm.testing.device import DeviceTests


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


def test_every_registered_backend_runs_both_suites():
    backends = {cls.kind for cls in BackendTests.__subclasses__()}
    devices = {cls.overrides["backend"]["kind"] for cls in DeviceTests.__subclasses__()}
    assert set(backend_kinds()) <= backends and set(backend_kinds()) <= devices
