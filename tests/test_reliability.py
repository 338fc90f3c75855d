"""Injected SSD faults, checksums and poison: the device retries, then returns an error
for what it cannot produce - never stale, zero or corrupt bytes."""
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm.config import ConfigError
from cxlhm.integrity import PoisonError
from host_runtime.driver import open_device

BLOCK = 4096
SLOTS = 4


def dev_config(path, **faults):
    return {"capacity": 256 * BLOCK, "block_size": BLOCK, "dram_bytes": SLOTS * BLOCK,
            "backend": {"path": str(path), "faults": faults, "retries": faults.pop("retries", 3)}}


def evict_all(dev):
    for i in range(SLOTS):
        dev.load((200 + i) * BLOCK, 1)


def test_transient_read_errors_are_retried_and_invisible(tmp_path):
    with open_device(dev_config(tmp_path / "a.img")) as dev:
        data = np.random.default_rng(0).integers(0, 256, 40 * BLOCK, dtype=np.uint8)
        dev.store(0, data)
    with open_device(dev_config(tmp_path / "a.img", read_error_rate=0.3, short_read_rate=0.2, retries=8)) as dev:
        assert dev.load(0, data.size) == data.tobytes()
        s = dev.stats()
        assert s["media_retries"] > 0 and s["poisoned_blocks"] == 0
        assert dev.device.ssd.injected["read_error"] > 0 and dev.device.ssd.injected["short_read"] > 0


def test_permanent_read_errors_poison_the_block_and_are_listed(tmp_path):
    path = tmp_path / "b.img"
    with open_device(dev_config(path)) as dev:
        dev.store(0, b"A" * (3 * BLOCK))
    with open_device(dev_config(path, read_error_rate=1.0)) as dev:
        with pytest.raises(PoisonError, match="block 1"):
            dev.load(BLOCK + 10, 5)
        listed = dev.device.poison_records(0, 256 * BLOCK, 16)
        assert [(r.dpa, r.length) for r in listed.records] == [(BLOCK, BLOCK)]
        with pytest.raises(PoisonError):  # still poisoned: no second chance for stale bytes
            dev.load(BLOCK, 1)
        with pytest.raises(PoisonError):  # a partial write cannot repair it
            dev.store(BLOCK, b"x")
        dev.store(BLOCK, b"B" * BLOCK)  # a whole-block write replaces the lost bytes
        assert dev.load(BLOCK, BLOCK) == b"B" * BLOCK
    with open_device(dev_config(path)) as dev:  # the repair was written back at close
        assert dev.load(BLOCK, BLOCK) == b"B" * BLOCK
        assert dev.load(0, BLOCK) == b"A" * BLOCK


def test_poison_survives_reopen(tmp_path):
    path = tmp_path / "c.img"
    with open_device(dev_config(path)) as dev:
        dev.store(0, b"C" * BLOCK)
    with open_device(dev_config(path, read_error_rate=1.0)) as dev:
        with pytest.raises(PoisonError):
            dev.load(0, 1)
    with open_device(dev_config(path)) as dev:  # healthy media now, but the device said the bytes were lost
        with pytest.raises(PoisonError):
            dev.load(0, 1)


def test_checksum_mismatch_is_poison_never_data(tmp_path):
    path = tmp_path / "d.img"
    with open_device(dev_config(path)) as dev:
        dev.store(5 * BLOCK, b"good" * (BLOCK // 4))
        dev.flush()
        evict_all(dev)
        with open(path, "r+b") as f:  # the media rots behind the device's back
            f.seek(5 * BLOCK + 100)
            f.write(b"rot")
        with pytest.raises(PoisonError, match="checksum"):
            dev.load(5 * BLOCK, 8)
        assert dev.stats()["checksum_mismatches"] == 1


def test_failed_write_backs_poison_the_victims(tmp_path):
    with open_device(dev_config(tmp_path / "e.img", write_error_rate=1.0)) as dev:
        dev.store(0, b"D" * (2 * BLOCK))
        evict_all(dev)  # the dirty blocks cannot reach the SSD: their bytes are gone
        with pytest.raises(PoisonError, match="write-back failed"):
            dev.load(0, 1)
        assert dev.stats()["poisoned_blocks"] == 2


def test_a_full_back_end_poisons_what_no_longer_fits(tmp_path):
    with open_device(dev_config(tmp_path / "f.img", capacity_bytes=3 * BLOCK)) as dev:
        for i in range(8):
            dev.store(i * BLOCK, bytes([i + 1]) * BLOCK)
        evict_all(dev)
        assert dev.device.ssd.injected["enospc"] > 0
        assert dev.load(0, BLOCK) == b"\x01" * BLOCK  # written before the back end filled up
        with pytest.raises(PoisonError, match="No space"):
            dev.load(7 * BLOCK, 1)


def test_bad_fault_config_names_the_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        open_device(dev_config(tmp_path / "g.img", read_error_rate=2.0))
    assert info.value.key == "backend.faults" and "read_error_rate" in str(info.value)
    with pytest.raises(ConfigError, match="unknown fault key"):
        open_device(dev_config(tmp_path / "g.img", gremlins=1))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), read_err=st.sampled_from([0.0, 0.2, 0.6]),
       write_err=st.sampled_from([0.0, 0.2, 0.6]), short=st.sampled_from([0.0, 0.3]),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 60 * BLOCK), st.integers(1, 2 * BLOCK)), max_size=40))
def test_under_any_faults_reads_are_exact_or_errors(tmp_path, seed, read_err, write_err, short, ops):
    # a fresh file per example: hypothesis reuses tmp_path and repeats seeds, and an
    # image left by an earlier example would hold bytes this example's model never saw
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / f"h{seed}.img"
    model = bytearray(64 * BLOCK)
    lost = set()  # blocks whose current bytes the device told us it lost
    cfg = dev_config(path, read_error_rate=read_err, write_error_rate=write_err,
                     short_read_rate=short, short_write_rate=short, retries=1)
    cfg["seed"] = seed
    rng = np.random.default_rng(seed)
    with open_device(cfg) as dev:
        for is_write, off, n in ops:
            blocks = set(range(off // BLOCK, (off + n - 1) // BLOCK + 1))
            if is_write:
                data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                try:
                    dev.store(off, data)
                except PoisonError:
                    continue  # refused before anything changed
                model[off:off + n] = data
                lost -= {b for b in blocks if b * BLOCK >= off and (b + 1) * BLOCK <= off + n}
            else:
                try:
                    got = dev.load(off, n)
                except PoisonError:
                    lost |= {b for b in blocks if b in dev.device.poison.blocks}
                    assert blocks & set(dev.device.poison.blocks), "an error must name a poisoned block"
                    continue
                assert not blocks & lost, "a block reported lost came back"
                assert got == bytes(model[off:off + n])
