import pytest

from device_parts import open_parts
from host_runtime.driver import open_device

KIB = 1024


@pytest.fixture
def image(tmp_path):
    """Path of a (not yet created) SSD image in a disk-backed temp folder."""
    return str(tmp_path / "ssd.img")


def _test_config(image, overrides) -> dict:
    cfg = {"capacity": 1 << 20, "block_size": 4 * KIB, "dram_bytes": 4 * 4 * KIB, "backend": {"path": image}}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


@pytest.fixture
def make_device(image):
    """Open devices on the test's image; all closed at teardown."""
    opened = []

    def factory(**overrides):
        dev = open_device(_test_config(image, overrides))
        opened.append(dev)
        return dev

    yield factory
    for dev in opened:
        dev.close()


@pytest.fixture
def make_device_parts(image):
    """For white-box tests of the device: factory(**overrides) -> (handle, device), the
    device opened itself and a host handle over it (device_parts.open_parts); all
    closed at teardown."""
    opened = []

    def factory(**overrides):
        parts = open_parts(_test_config(image, overrides))
        opened.append(parts.handle)
        return parts

    yield factory
    for handle in opened:
        handle.close()
