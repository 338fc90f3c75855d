"""The back-end example of docs/extending.md (examples/extending/backend.py) through the
shipped back-end and device conformance suites, registered the way a test registers a
back end it does not install (cxlhm.media.registry.BACKENDS.register)."""
import numpy as np
import pytest

from cxlhm.config import ConfigError, load_config
from cxlhm.media.registry import BACKENDS
from cxlhm.testing.backends import BackendTests, Buffers, rows
from cxlhm.testing.device import DeviceTests
from example_loader import example

KIND = "pread-file"


@pytest.fixture(scope="module", autouse=True)
def pread_file_registered():
    example("backend")  # the checkout's root on sys.path, so the registry can import it by name
    BACKENDS.register(KIND, "examples.extending.backend:PreadFileBackend")
    yield
    BACKENDS.unregister(KIND)


class TestPreadFileBackend(BackendTests):
    kind = KIND


class TestDeviceOnPreadFile(DeviceTests):
    overrides = {"backend": {"kind": KIND}}


def test_a_config_selects_it_by_kind():
    assert load_config({"backend": {"kind": KIND}}).backend.kind == KIND
    BACKENDS.unregister(KIND)
    try:
        with pytest.raises(ConfigError, match="backend.kind"):
            load_config({"backend": {"kind": KIND}})
    finally:
        BACKENDS.register(KIND, "examples.extending.backend:PreadFileBackend")


def test_io_past_the_end_is_refused_and_the_rest_of_the_batch_runs(tmp_path):
    backend = BACKENDS.get(KIND)(str(tmp_path / "img"), 1 << 16, 8, source="test")
    bufs = Buffers(2)
    try:
        bufs.arrays[0] = 3
        ops = rows([(bufs.address(0), 16, True), (bufs.address(0), 1, True)])  # block 16 starts at the capacity
        assert backend.submit(ops).tolist() == [-22, 4096]
        backend.submit(rows([(bufs.address(1), 1, False)]))
        assert (bufs.arrays[1] == 3).all()
    finally:
        backend.close()
    assert np.fromfile(tmp_path / "img", np.uint8).size == 1 << 16  # the image was sized, never grown
