import pytest

from host_runtime.driver import open_device

KIB = 1024


@pytest.fixture
def image(tmp_path):
    """Path of a (not yet created) SSD image in a disk-backed temp folder."""
    return str(tmp_path / "ssd.img")


@pytest.fixture
def make_device(image):
    """Open devices on the test's image; all closed at teardown."""
    opened = []

    def factory(**overrides):
        cfg = {"capacity": 1 << 20, "block_size": 4 * KIB, "dram_bytes": 4 * 4 * KIB, "backend": {"path": image}}
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(cfg.get(key), dict):
                cfg[key] = {**cfg[key], **value}
            else:
                cfg[key] = value
        dev = open_device(cfg)
        opened.append(dev)
        return dev

    yield factory
    for dev in opened:
        dev.close()
