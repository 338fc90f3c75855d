"""A device with a DRAM of a few blocks (so nearly every access evicts), driven by random
loads, stores, vectored I/O, flushes and close/reopen cycles, checked byte for byte
against a bytearray."""
import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from host_runtime.driver import open_device

BLOCK = 4096
CAPACITY = 64 * BLOCK


class DeviceVsBytearray(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="cxlhm-sm-")
        self.config = {"capacity": CAPACITY, "block_size": BLOCK, "dram_bytes": 3 * BLOCK,
                       "backend": {"path": str(Path(self.folder) / "ssd.img")}}
        self.dev = open_device(self.config)
        self.model = bytearray(CAPACITY)

    extent = st.integers(0, CAPACITY - 1).flatmap(
        lambda off: st.tuples(st.just(off), st.integers(0, min(CAPACITY - off, 5 * BLOCK))))

    @rule(ext=extent, seed=st.integers(0, 2**32 - 1))
    def store(self, ext, seed):
        off, n = ext
        data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
        self.dev.store(off, data)
        self.model[off:off + n] = data

    @rule(ext=extent)
    def load(self, ext):
        off, n = ext
        assert self.dev.load(off, n) == bytes(self.model[off:off + n])

    @rule(offsets=st.lists(st.integers(0, CAPACITY // 512 - 2), min_size=1, max_size=6), seed=st.integers(0, 255))
    def writev(self, offsets, seed):
        length = 700  # crosses 512-byte grid points and sometimes block boundaries
        hpas = [o * 512 for o in offsets if o * 512 + length <= CAPACITY]
        if not hpas:
            return
        data = np.random.default_rng(seed).integers(0, 256, len(hpas) * length, dtype=np.uint8)
        self.dev.writev(hpas, length, data)
        for i, h in enumerate(hpas):  # later extents win where they overlap, as on the device
            self.model[h:h + length] = data[i * length:(i + 1) * length].tobytes()

    @rule(offsets=st.lists(st.integers(0, CAPACITY // 512 - 2), min_size=1, max_size=6))
    def readv(self, offsets):
        length = 700
        hpas = [o * 512 for o in offsets if o * 512 + length <= CAPACITY]
        if not hpas:
            return
        out = np.empty(len(hpas) * length, np.uint8)
        self.dev.readv(hpas, length, out)
        expected = b"".join(bytes(self.model[h:h + length]) for h in hpas)
        assert out.tobytes() == expected

    @rule()
    def flush(self):
        self.dev.flush()
        assert self.dev.stats()["dirty_blocks"] == 0

    @rule()
    def close_and_reopen(self):
        self.dev.close()
        self.dev = open_device(self.config)

    @invariant()
    def dram_never_overflows(self):
        stats = self.dev.stats()
        assert stats["resident_blocks"] <= 3

    def teardown(self):
        self.dev.close()
        shutil.rmtree(self.folder, ignore_errors=True)


DeviceVsBytearray.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestDeviceVsBytearray = DeviceVsBytearray.TestCase
