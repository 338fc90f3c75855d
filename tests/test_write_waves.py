"""Writes that evict dirty victims write them back in waves (WriteWaves.plan,
MediaPath.write_back_in_waves): one wave on the SSD while the previous wave's slots
take the new bytes. Checked against a byte model of the device's address space, across
a reopen, and with write-backs that fail once (retried) or for good (the victim is
poisoned, the new bytes are not harmed)."""
from __future__ import annotations

import errno

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm.device import waves as device_waves
from cxlhm.device.media import MediaPath
from cxlhm.integrity import PoisonError
from device_parts import open_parts
from host_runtime.driver import open_device

BLOCK = 4096
SLOTS = 16


def config(path):
    return {"capacity": 256 * BLOCK, "block_size": BLOCK, "dram_bytes": SLOTS * BLOCK,
            "backend": {"path": str(path)}}


@pytest.fixture
def waves_seen(monkeypatch):
    """Waves as small as a block, and a record of each call's wave sizes."""
    monkeypatch.setattr(device_waves, "WAVE_BYTES", BLOCK)
    seen: list[list[int]] = []
    real = MediaPath.write_back_in_waves

    def spy(self, waves, after_wave):
        seen.append([w.shape[0] for w in waves])
        return real(self, waves, after_wave)

    monkeypatch.setattr(MediaPath, "write_back_in_waves", spy)
    return seen


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=st.lists(st.tuples(st.integers(0, 200), st.integers(1, SLOTS), st.integers(0, 255)),
                       min_size=3, max_size=10))
def test_writes_in_waves_read_back_as_the_byte_model_says(tmp_path_factory, waves_seen, writes):
    path = tmp_path_factory.mktemp("waves") / "w.img"
    model = np.zeros(256 * BLOCK, np.uint8)
    with open_device(config(path)) as dev:
        for first, n, fill in writes:
            data = np.full(n * BLOCK, fill, np.uint8)
            data[::BLOCK] = np.arange(n, dtype=np.uint8)  # each block differs
            dev.store(first * BLOCK, data)
            model[first * BLOCK:(first + n) * BLOCK] = data
            assert dev.load(first * BLOCK, n * BLOCK) == data.tobytes()
        assert dev.load(0, model.size) == model.tobytes()  # victims come back from the SSD, verified
        assert dev.stats()["poisoned_blocks"] == 0
    with open_device(config(path)) as dev:  # their checksum records were logged right
        assert dev.load(0, model.size) == model.tobytes()


def test_a_full_dram_of_dirty_blocks_is_written_back_in_waves(tmp_path, waves_seen):
    with open_device(config(tmp_path / "f.img")) as dev:
        old = np.random.default_rng(1).integers(0, 256, SLOTS * BLOCK, dtype=np.uint8)
        new = np.random.default_rng(2).integers(0, 256, SLOTS * BLOCK, dtype=np.uint8)
        dev.store(0, old)
        assert not waves_seen  # nothing dirty was evicted yet
        dev.store(64 * BLOCK, new)
        assert waves_seen == [[SLOTS // device_waves.MAX_WAVES] * device_waves.MAX_WAVES]
        assert dev.load(64 * BLOCK, new.size) == new.tobytes()
        assert dev.load(0, old.size) == old.tobytes()


def _fail_on_reap(monkeypatch, device, failures: int):
    """The first `failures` write completions the waves reap report EIO."""
    ssd = device.ssd
    real = ssd.reap
    left = [failures]

    def reap(min_complete=1, max_complete=0):
        tags, res = real(min_complete, max_complete)
        res = res.copy()
        take = min(left[0], res.shape[0])
        res[:take] = -errno.EIO
        left[0] -= take
        return tags, res

    monkeypatch.setattr(ssd, "reap", reap)


def test_a_write_back_that_fails_once_is_retried(tmp_path, waves_seen, monkeypatch):
    with open_parts(config(tmp_path / "r.img")) as (dev, device):
        old = np.full(SLOTS * BLOCK, 7, np.uint8)
        dev.store(0, old)
        _fail_on_reap(monkeypatch, device, 3)
        dev.store(64 * BLOCK, np.full(SLOTS * BLOCK, 9, np.uint8))
        assert waves_seen
        stats = dev.stats()
        assert stats["media_retries"] >= 3 and stats["poisoned_blocks"] == 0
        assert dev.load(0, old.size) == old.tobytes()


def test_a_write_back_that_keeps_failing_poisons_its_victim_only(tmp_path, waves_seen, monkeypatch):
    with open_parts(config(tmp_path / "p.img")) as (dev, device):
        dev.store(0, np.full(SLOTS * BLOCK, 7, np.uint8))
        _fail_on_reap(monkeypatch, device, 1)
        real_submit = device.ssd.submit

        def failing_submit(ops):  # the retries of that one write-back fail too
            res = real_submit(ops).copy()
            res[ops[:, 3] == 1] = -errno.EIO
            return res

        monkeypatch.setattr(device.ssd, "submit", failing_submit)
        new = np.full(SLOTS * BLOCK, 9, np.uint8)
        dev.store(64 * BLOCK, new)
        monkeypatch.setattr(device.ssd, "submit", real_submit)
        assert dev.stats()["poisoned_blocks"] == 1
        assert dev.load(64 * BLOCK, new.size) == new.tobytes()
        readable = 0
        for b in range(SLOTS):
            try:
                assert dev.load(b * BLOCK, BLOCK) == bytes([7]) * BLOCK
                readable += 1
            except PoisonError:
                pass
        assert readable == SLOTS - 1
