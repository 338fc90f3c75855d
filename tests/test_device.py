"""Device core: byte-granular access, buffers, errors, persistence, O_DIRECT back end, counters."""
import fcntl
import json
import mmap
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm.device.stream import copyengine as ce
from cxlhm.config import ConfigError
from cxlhm.device import AccessOutOfRange, metadata_path
from host_runtime.driver import open_device

KIB = 1024
BLOCK = 4 * KIB


def pattern(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("offset,length", [
    (0, 1), (1, 4095), (4095, 2), (4094, 3 * BLOCK + 17), (BLOCK, BLOCK), (100, 7 * BLOCK), (3 * BLOCK - 1, 1),
])
def test_unaligned_and_block_crossing_round_trip(make_device, offset, length):
    dev = make_device()
    data = pattern(length, offset)
    dev.store(offset, data)
    assert dev.load(offset, length) == data.tobytes()
    # the bytes around the write are untouched zeros
    assert dev.load(max(0, offset - 5), min(5, offset)) == bytes(min(5, offset))
    assert dev.load(offset + length, 5) == bytes(5)


def test_access_larger_than_dram_is_split_and_correct(make_device):
    dev = make_device(dram_bytes=2 * BLOCK)  # the access spans 40 blocks, DRAM holds 2
    data = pattern(40 * BLOCK + 123, 1)
    dev.store(77, data)
    assert dev.load(77, data.size) == data.tobytes()
    assert dev.stats()["resident_blocks"] <= 2


def test_zero_length_access_is_a_no_op(make_device):
    dev = make_device()
    assert dev.load(0, 0) == b""
    assert dev.load(dev.capacity, 0) == b""  # the end of the window is a valid empty extent
    dev.store(5, b"")
    assert dev.stats()["hits"] + dev.stats()["misses"] == 0


@pytest.mark.parametrize("hpa,n", [(-1, 1), (1 << 20, 1), ((1 << 20) - 1, 2), (2**62, 2**62), (0, (1 << 20) + 1)])
def test_out_of_range_access_raises_and_changes_nothing(make_device, hpa, n):
    dev = make_device()
    dev.store(0, b"keep")
    with pytest.raises((AccessOutOfRange, ValueError)):
        dev.load(hpa, n)
    if n < 1 << 30:
        with pytest.raises((AccessOutOfRange, ValueError)):
            dev.store(hpa, bytes(n))
    assert dev.load(0, 4) == b"keep"


def test_buffer_types(make_device):
    dev = make_device()
    values = np.arange(1000, dtype=np.float32)
    dev.write_from(10, values)
    out = np.empty_like(values)
    dev.read_into(10, out)
    np.testing.assert_array_equal(out, values)
    ba = bytearray(4000)
    dev.read_into(10, ba)
    assert bytes(ba) == values.tobytes()
    dev.write_from(20_000, memoryview(b"memoryview bytes"))
    mm = mmap.mmap(-1, 16)
    dev.read_into(20_000, mm)
    assert mm[:] == b"memoryview bytes"


def test_bad_buffers_are_rejected(make_device):
    dev = make_device()
    with pytest.raises(ValueError, match="read-only"):
        dev.read_into(0, b"immutable")
    with pytest.raises(ValueError, match="contiguous"):
        dev.read_into(0, np.zeros((10, 10), np.uint8)[:, 0])
    with pytest.raises(TypeError):
        dev.write_from(0, 12345)
    with pytest.raises(ValueError):
        dev.readv([0, 4096], 100, np.zeros(150, np.uint8))


def test_lru_counters_for_a_known_sequence(make_device):
    dev = make_device(dram_bytes=2 * BLOCK)
    block = lambda b: b * BLOCK
    dev.load(block(0), 1)   # miss (fill)
    dev.load(block(1), 1)   # miss (fill)
    dev.load(block(0), 1)   # hit
    dev.store(block(2), bytes(BLOCK))  # miss, full-block write: no fill; evicts block 1 (LRU)
    dev.load(block(1), 1)   # miss, evicts block 0; block 2 is dirty
    dev.load(block(3), 1)   # miss, evicts dirty block 2 -> one write-back
    s = dev.stats()
    assert (s["hits"], s["misses"], s["fill_reads"], s["evictions"], s["writebacks"]) == (1, 5, 4, 3, 1)
    assert s["ssd_read_bytes"] == 4 * BLOCK and s["ssd_write_bytes"] == BLOCK
    assert (s["host_reads"], s["host_writes"], s["host_write_bytes"]) == (5, 1, BLOCK)


def test_back_end_is_o_direct_and_bytes_land_only_after_write_back(make_device_parts, image):
    dev, device = make_device_parts()
    assert fcntl.fcntl(device.ssd.fd, fcntl.F_GETFL) & os.O_DIRECT
    dev.store(3 * BLOCK + 10, b"payload")
    with open(image, "rb") as f:
        f.seek(3 * BLOCK + 10)
        assert f.read(7) == bytes(7)  # still only in device DRAM (write-back)
    assert dev.flush() == 1
    with open(image, "rb") as f:
        f.seek(3 * BLOCK + 10)
        assert f.read(7) == b"payload"


def test_write_through_reaches_the_ssd_immediately(make_device, image):
    dev = make_device(firmware={"policy": "lru", "write_mode": "write-through"})
    dev.store(BLOCK + 1, b"through")
    with open(image, "rb") as f:
        f.seek(BLOCK + 1)
        assert f.read(7) == b"through"
    assert dev.stats()["dirty_blocks"] == 0


def test_one_tib_window_is_sparse(tmp_path):
    path = str(tmp_path / "big.img")
    with open_device({"capacity": "1TiB", "block_size": "64KiB", "dram_bytes": "1MiB", "backend": {"path": path}}) as dev:
        dev.store((1 << 40) - 5, b"edge!")
        assert dev.load((1 << 40) - 5, 5) == b"edge!"
    st = os.stat(path)
    assert st.st_size == 1 << 40
    assert st.st_blocks * 512 <= 1 << 20  # only the written block is allocated
    with open_device({"capacity": "1TiB", "block_size": "64KiB", "dram_bytes": "1MiB", "backend": {"path": path}}) as dev:
        assert dev.load((1 << 40) - 5, 5) == b"edge!"


def test_close_flushes_and_reopen_sees_every_byte(make_device, image):
    dev = make_device(dram_bytes=4 * BLOCK)
    data = pattern(10 * BLOCK, 7)
    dev.store(123, data)
    assert json.loads(metadata_path(image).read_text())["clean"] is False
    dev.close()
    assert json.loads(metadata_path(image).read_text())["clean"] is True
    again = make_device(dram_bytes=8 * BLOCK, block_size=8 * KIB)  # a different block size reads the same image
    assert again.load(123, data.size) == data.tobytes()
    assert not again.unclean_shutdown_detected


def test_unclean_shutdown_is_detected(make_device, make_device_parts, image):
    dev, device = make_device_parts()
    dev.store(0, b"x")
    device.ssd.close()  # the process "dies": no flush, no clean mark
    device.state.closed = True
    assert make_device().unclean_shutdown_detected


def test_closed_device_refuses_access(make_device):
    dev = make_device()
    dev.close()
    dev.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        dev.load(0, 1)


def test_timing_only_device_follows_the_same_firmware_path(make_device):
    """data: none moves no bytes and opens no file, but its counters match a real device."""
    def workload(dev):
        rng = np.random.default_rng(3)
        for _ in range(200):
            off = int(rng.integers(0, (1 << 20) - 3 * BLOCK))
            if rng.random() < 0.4:
                dev.store(off, bytes(int(rng.integers(1, 3 * BLOCK))))
            else:
                dev.load(off, int(rng.integers(1, 3 * BLOCK)))
        return dev.stats()

    real = workload(make_device())
    none = workload(make_device(data="none", backend={"path": "/nonexistent/never-opened.img"}))
    for key in ("hits", "misses", "fill_reads", "evictions", "writebacks", "ssd_read_bytes"):
        assert real[key] == none[key], key


@pytest.mark.parametrize("overrides,key", [
    ({"capacity": "lots"}, "capacity"),
    ({"block_size": 3000}, "block_size"),
    ({"block_size": "4MiB"}, "block_size"),
    ({"dram_bytes": "2MiB"}, "dram_bytes"),  # larger than the 1 MiB capacity
    ({"dram_bytes": 4096}, "dram_bytes"),  # fewer than 2 blocks
    ({"colour": "blue"}, "colour"),
    ({"backend": {"path": "/nonexistent-dir/ssd.img"}}, "backend.path"),
    ({"backend": {"depth": 4}}, "backend.depth"),
    ({"firmware": {"policy": "nosuch"}}, "firmware.policy"),
    ({"firmware": {"params": {"nosuch": 1}}}, "firmware.params"),
    ({"firmware": {"write_mode": "sometimes"}}, "firmware.write_mode"),
])
def test_bad_configs_name_the_key(make_device, overrides, key):
    with pytest.raises(ConfigError) as info:
        make_device(**overrides)
    assert info.value.key == key
    assert info.value.source  # the file or "overrides"
    assert key in str(info.value)


def test_bad_yaml_file_names_file_and_key(tmp_path):
    cfg = tmp_path / "dev.yaml"
    cfg.write_text("profile: cmm-h\ndram_bytes: 64MiB\nbackend:\n  queue_depth: -3\n")
    with pytest.raises(ConfigError) as info:
        open_device(str(cfg))
    assert info.value.source == str(cfg) and info.value.key == "backend.queue_depth"
    cfg.write_text("dram_bytes: [1, 2\n")
    with pytest.raises(ConfigError, match="line"):
        open_device(str(cfg))


def test_directory_as_backend_is_refused(tmp_path):
    with pytest.raises(ConfigError) as info:
        open_device({"capacity": "1MiB", "block_size": "4KiB", "dram_bytes": "16KiB", "backend": {"path": str(tmp_path)}})
    assert info.value.key == "backend.path"


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 20), st.integers(0, 640 * KIB)),
                min_size=1, max_size=12))
def test_long_dram_hits_copied_on_the_copy_engine_match_a_byte_model(ops):
    """A DRAM hit longer than the copy engine's helper threshold is planned and finished
    in one kernel call and copied afterwards on the engine (still under the device
    lock); reads and writes of any offset and length read back what a bytearray says."""
    engine_copies = []
    real = ce.copy_extents

    def spy(*args, **kwargs):
        engine_copies.append(int(args[4].sum()))
        return real(*args, **kwargs)

    model = bytearray(2 << 20)
    with open_device({"capacity": 2 << 20, "block_size": BLOCK, "dram_bytes": 2 << 20,
                      "backend": {"kind": "memory"}}) as dev, pytest.MonkeyPatch.context() as mp:
        mp.setattr(ce, "copy_extents", spy)
        dev.store(0, np.zeros(2 << 20, np.uint8))  # every block resident: each access below is a hit
        for i, (is_write, hpa, n) in enumerate(ops):
            n = min(n, (2 << 20) - hpa)
            if is_write:
                data = pattern(n, i)
                dev.store(hpa, data)
                model[hpa:hpa + n] = data.tobytes()
            else:
                assert dev.load(hpa, n) == bytes(model[hpa:hpa + n])
        assert dev.load(0, 2 << 20) == bytes(model)
        assert dev.stats()["misses"] == 2 << 20 >> 12  # only the first store missed
    assert engine_copies and min(engine_copies) >= ce.HELPER_MIN_BYTES
