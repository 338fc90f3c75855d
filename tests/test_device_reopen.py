"""What a reopen trusts: sidecar files (checksummed, never silently dropped), one owner
per image, the geometry an image was made with, failed flushes, and poison that a
write clears for the bytes it covers."""
import os

import numpy as np
import pytest

from cxlhm.config import ConfigError
from cxlhm.device import MediaError, PoisonError, SidecarError, metadata_path
from device_parts import open_parts
from host_runtime.driver import open_device

BLOCK = 4096


def config(path, **over):
    cfg = {"capacity": 1 << 20, "block_size": BLOCK, "dram_bytes": 4 * BLOCK, "backend": {"path": str(path)},
           "firmware": {"background": "manual"}}
    for key, value in over.items():
        if isinstance(value, dict):
            cfg[key] = {**cfg.get(key, {}), **value}
        else:
            cfg[key] = value
    return cfg


def written_image(path, blocks=20):
    """An image whose first `blocks` blocks were written back and checksummed, cleanly closed."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, blocks * BLOCK, dtype=np.uint8).tobytes()
    with open_device(config(path)) as dev:
        dev.store(0, data)
    return data


def flip_bytes_of_every_block(path, blocks):
    with open(path, "r+b") as f:
        for b in range(blocks):
            f.seek(b * BLOCK + 100)
            byte = f.read(1)
            f.seek(b * BLOCK + 100)
            f.write(bytes([byte[0] ^ 0xFF]))


# ---------------------------------------------------------------- sidecars
def test_a_deleted_checksum_file_refuses_the_open_instead_of_verifying_nothing(tmp_path):
    image = tmp_path / "d.img"
    written_image(image)
    os.unlink(str(image) + ".cxlhm.sums")
    flip_bytes_of_every_block(image, 20)
    with pytest.raises(SidecarError, match=r"\.cxlhm\.sums is missing.*backend\.lost_sidecar") as err:
        open_device(config(image))
    assert err.value.key == "backend.path"


def test_lost_sidecar_poison_turns_every_unverifiable_block_into_poison(tmp_path):
    image = tmp_path / "p.img"
    written_image(image)
    os.unlink(str(image) + ".cxlhm.sums")
    flip_bytes_of_every_block(image, 20)
    with open_device(config(image, backend={"lost_sidecar": "poison"})) as dev:
        for b in range(20):  # all 20 flipped blocks: an error, never the flipped bytes
            with pytest.raises(PoisonError):
                dev.load(b * BLOCK, BLOCK)
        assert dev.load(20 * BLOCK, BLOCK) == bytes(BLOCK)  # never written: a hole, not poison
        assert dev.integrity_report()["rebuilt_sidecars"].startswith("poison")
        dev.store(0, b"new" * 10)  # a write brings the bytes it covers back
        assert dev.load(0, 30) == b"new" * 10


def test_lost_sidecar_trust_checksums_the_image_as_it_stands(tmp_path):
    image = tmp_path / "t.img"
    data = written_image(image)
    os.unlink(str(image) + ".cxlhm.sums")
    with open_device(config(image, backend={"lost_sidecar": "trust"})) as dev:
        assert dev.load(0, len(data)) == data
    with open_device(config(image)) as dev:  # the rebuilt sums were saved: no complaint any more
        assert dev.load(0, len(data)) == data
        assert dev.integrity_report()["rebuilt_sidecars"] == ""


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_checksum_file_is_a_clear_error_not_a_zip_error(tmp_path, damage):
    image = tmp_path / "z.img"
    written_image(image)
    sums = str(image) + ".cxlhm.sums"
    raw = bytearray(open(sums, "rb").read())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
    elif damage == "truncate":
        raw = raw[:len(raw) - 7]
    else:
        raw = bytearray()
    open(sums, "wb").write(raw)
    with pytest.raises(SidecarError, match=r"\.cxlhm\.sums"):
        open_device(config(image))


def test_damaged_or_missing_metadata_is_a_clear_error(tmp_path):
    image = tmp_path / "m.img"
    written_image(image)
    meta = metadata_path(str(image))
    text = meta.read_text()
    meta.write_text(text.replace('"clean": true', '"clean": false'))  # valid JSON, wrong checksum
    with pytest.raises(SidecarError, match="checksum does not match"):
        open_device(config(image))
    meta.unlink()
    with pytest.raises(SidecarError, match=r"\.cxlhm\.json is missing"):
        open_device(config(image))


def test_a_missing_integrity_log_after_a_crash_is_a_clear_error(tmp_path):
    image = tmp_path / "l.img"
    dev, device = open_parts(config(image))
    dev.store(0, b"x" * BLOCK)
    device.simulate_power_loss()
    os.unlink(str(image) + ".cxlhm.ilog")
    with pytest.raises(SidecarError, match=r"\.cxlhm\.ilog is missing after an unclean shutdown"):
        open_device(config(image))


# ---------------------------------------------------------------- one owner per image
@pytest.mark.parametrize("kind", ["ssd", "memory"])
def test_a_second_device_on_the_same_image_is_refused(tmp_path, kind):
    image = tmp_path / "o.img"
    with open_device(config(image, backend={"kind": kind})) as first:
        first.store(0, b"mine")
        with pytest.raises(ConfigError, match="already open by another device") as err:
            open_device(config(image, backend={"kind": kind}))
        assert err.value.key == "backend.path"
        first.store(0, b"MINE")
    with open_device(config(image, backend={"kind": kind})) as second:  # free again after close
        assert second.load(0, 4) == b"MINE"


@pytest.mark.parametrize("kind", ["ssd", "memory"])
def test_closing_frees_the_image_while_another_reference_to_it_lingers(tmp_path, kind):
    """A reference to the open image that outlives the device (a child forked meanwhile,
    an io_uring ring torn down in the background) must not keep the image locked."""
    image = tmp_path / "l.img"
    first, device = open_parts(config(image, backend={"kind": kind}))
    first.store(0, b"mine")
    lingering = os.dup(device.ssd.fd)
    try:
        first.close()
        with open_device(config(image, backend={"kind": kind})) as second:
            assert second.load(0, 4) == b"mine"
    finally:
        os.close(lingering)


# ---------------------------------------------------------------- geometry
def test_another_capacity_is_refused_at_reopen(tmp_path):
    image = tmp_path / "c.img"
    written_image(image, 2)
    with pytest.raises(ConfigError, match="made with capacity") as err:
        open_device(config(image, capacity=2 << 20))
    assert err.value.key == "capacity"


def test_another_block_size_keeps_poison_on_the_lost_bytes_only(tmp_path):
    image = tmp_path / "b.img"
    data = written_image(image, 8)
    with open_parts(config(image)) as (dev, device):
        device._poison(3, "test: lost")  # old block 3 = bytes [12K, 16K)
    with open_device(config(image, block_size=2 * BLOCK, dram_bytes=4 * 2 * BLOCK)) as dev:
        assert dev.load(0, 3 * BLOCK) == data[:3 * BLOCK]  # new block 1 = old blocks 2 and 3: 2 still reads
        with pytest.raises(PoisonError):
            dev.load(3 * BLOCK, 10)
        assert dev.load(4 * BLOCK, 4 * BLOCK) == data[4 * BLOCK:8 * BLOCK]


def test_another_block_size_after_a_crash_is_refused(tmp_path):
    image = tmp_path / "u.img"
    dev, device = open_parts(config(image))
    dev.store(0, b"x")
    device.simulate_power_loss()
    with pytest.raises(ConfigError, match="not closed cleanly") as err:
        open_device(config(image, block_size=2 * BLOCK, dram_bytes=8 * BLOCK))
    assert err.value.key == "block_size"


def test_flush_raises_when_a_write_back_fails(tmp_path):
    cfg = config(tmp_path / "f.img", backend={"retries": 0, "faults": {"write_error_rate": 1.0}})
    dev, device = open_parts(cfg)
    dev.store(0, b"dirty" * 100)
    with pytest.raises(MediaError, match="write-back of 1 dirty block"):
        dev.flush()
    assert dev.stats()["dirty_blocks"] == 1  # still in device DRAM
    device.simulate_power_loss()


# ---------------------------------------------------------------- writes clear poison
def crashed_with_an_unflushed_block(image):
    dev, device = open_parts(config(image))
    dev.store(0, bytes(range(256)) * 16)
    dev.flush()
    dev.store(BLOCK, b"\xAA" * BLOCK)  # never flushed
    device.simulate_power_loss()


def test_sub_block_writes_into_a_block_lost_at_a_crash_succeed_and_read_back(tmp_path):
    image = tmp_path / "w.img"
    crashed_with_an_unflushed_block(image)
    with open_device(config(image)) as dev:
        with pytest.raises(PoisonError):
            dev.load(BLOCK, 16)
        dev.store(BLOCK + 100, b"chunk-a" * 20)  # a KV put smaller than a block
        assert dev.load(BLOCK + 100, 140) == b"chunk-a" * 20
        with pytest.raises(PoisonError, match="rewritten since"):  # the rest of the block is still lost
            dev.load(BLOCK, 200)
        assert dev.load(0, 256) == bytes(range(256))
    with open_device(config(image)) as dev:  # the rewritten range survives a clean close
        assert dev.load(BLOCK + 100, 140) == b"chunk-a" * 20
        with pytest.raises(PoisonError):
            dev.load(BLOCK, 200)
        dev.store(BLOCK, b"\x01" * 100)
        dev.store(BLOCK + 240, b"\x02" * (BLOCK - 240))  # now every byte was rewritten: whole again
        assert dev.load(BLOCK, BLOCK) == b"\x01" * 100 + b"chunk-a" * 20 + b"\x02" * (BLOCK - 240)
        assert dev.integrity_report()["poisoned_blocks"] == 0


def test_a_rewritten_range_survives_a_second_crash_after_flush(tmp_path):
    image = tmp_path / "x.img"
    crashed_with_an_unflushed_block(image)
    dev, device = open_parts(config(image))
    dev.store(BLOCK + 8, b"kept")
    dev.flush()
    dev.store(BLOCK + 2000, b"lost again")  # after the flush: lost at the next crash
    device.simulate_power_loss()
    with open_device(config(image)) as dev:
        with pytest.raises(PoisonError):  # the unflushed write made the whole block lost again
            dev.load(BLOCK + 8, 4)
        dev.store(BLOCK + 8, b"back")
        assert dev.load(BLOCK + 8, 4) == b"back"
