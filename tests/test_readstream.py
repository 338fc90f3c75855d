"""Streamed reads (Device.stream_io, cxlhm/device/stream/loop.py): the compiled loop that keeps
many reads in flight must return exactly the bytes the device's other paths return,
keep dirty victims, verify checksums, stop before poison, and share the device with
other threads."""
import mmap
import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm import counters as C
from cxlhm.device import STREAM_PASSES
from cxlhm.integrity import PoisonError
from cxlhm.mailbox.hints import HintKind
from device_parts import open_parts
from host_runtime.driver import open_device
from threads import run_all

BLOCK = 4096


def _device(tmp_path, name="s.img", *, blocks=64, dram_blocks=8, block=BLOCK, **extra):
    """(handle, device): these tests read the device's stream state itself."""
    cfg = {"capacity": blocks * block, "block_size": block, "dram_bytes": dram_blocks * block,
           "backend": {"path": str(tmp_path / name)}, **extra}
    return open_parts(cfg)


def _buffers(n: int, size: int):
    """n page-aligned host buffers of `size` bytes (one mmap), and their addresses."""
    step = -(-size // 4096) * 4096
    area = mmap.mmap(-1, max(step * n, 4096))
    flat = np.frombuffer(area, np.uint8)
    return flat, flat.ctypes.data + np.arange(n, dtype=np.int64) * step, step


def _stream(dev, offsets, sizes, depth, **kw):
    flat, addrs, step = _buffers(len(offsets), max(sizes) if len(sizes) else 1)
    result = dev.stream_io(np.asarray(offsets, np.int64), np.asarray(sizes, np.int64), addrs, depth, **kw)
    views = [flat[i * step:i * step + size] for i, size in enumerate(sizes)]
    return result, views


def test_streamed_reads_return_the_written_bytes_through_hits_misses_and_evictions(tmp_path):
    rng = np.random.default_rng(1)
    with _device(tmp_path) as (dev, device):
        image = rng.integers(0, 256, 64 * BLOCK, dtype=np.uint8)
        dev.write_from(0, image)
        dev.flush()
        offsets = rng.integers(0, 64 * BLOCK - 3 * BLOCK, 300)  # unaligned, up to 3 blocks each
        sizes = rng.integers(1, 2 * BLOCK, 300)
        result, views = _stream(dev, offsets, sizes, 6)
        assert result.count == 300
        for off, size, got in zip(offsets.tolist(), sizes.tolist(), views):
            assert (got == image[off:off + size]).all()
        stats = dev.stats()
        assert result.hits + result.misses == stats["hits"] + stats["misses"] - 64  # the writes' blocks
        assert stats["resident_blocks"] <= 8
        assert device.state.inflight == 0 and device.state.inflight_slots == 0


def test_the_same_block_twice_in_flight_waits_for_its_fill(tmp_path):
    with _device(tmp_path) as (dev, device):
        dev.write_from(0, np.arange(4 * BLOCK, dtype=np.uint32).view(np.uint8)[:4 * BLOCK])
        dev.flush()
    with _device(tmp_path) as (dev, device):  # reopened: nothing in DRAM, every first read misses
        expected = np.arange(4 * BLOCK, dtype=np.uint32).view(np.uint8)[:4 * BLOCK]
        offsets = [0, 10, BLOCK, 5, 2 * BLOCK + 7, 0]
        sizes = [100, 200, BLOCK, 50, 300, BLOCK]
        result, views = _stream(dev, offsets, sizes, 8)
        assert result.count == 6
        for off, size, got in zip(offsets, sizes, views):
            assert (got == expected[off:off + size]).all()
        assert result.misses == 3  # blocks 0, 1, 2 once each; the rest hit (after waiting for the fill)


def test_dirty_victims_are_written_back_before_their_blocks_are_read_again(tmp_path):
    rng = np.random.default_rng(2)
    with _device(tmp_path) as (dev, device):
        data = rng.integers(0, 256, 8 * BLOCK, dtype=np.uint8)
        dev.write_from(0, data)  # 8 dirty blocks fill the DRAM
        far = np.arange(8, 40) * BLOCK
        result, _ = _stream(dev, far, [BLOCK] * 32, 4)  # evicts every dirty block
        assert result.count == 32
        assert dev.stats()["writebacks"] >= 8
        result, views = _stream(dev, np.arange(8) * BLOCK, [BLOCK] * 8, 4)
        assert result.count == 8
        assert (np.concatenate(views) == data).all()


def test_a_block_whose_ssd_bytes_do_not_match_its_checksum_is_poison_not_data(tmp_path):
    with _device(tmp_path, dram_blocks=4) as (dev, device):
        dev.write_from(0, np.full(16 * BLOCK, 7, np.uint8))
        dev.flush()
        _stream(dev, np.arange(8, 16) * BLOCK, [BLOCK] * 8, 4)  # block 3 leaves DRAM
        with open(tmp_path / "s.img", "r+b") as f:  # the SSD's copy rots behind the device's back
            f.seek(3 * BLOCK + 100)
            f.write(b"\x00" * 8)
            f.flush()
            os.fsync(f.fileno())
        with pytest.raises(PoisonError):
            _stream(dev, np.arange(0, 6) * BLOCK, [BLOCK] * 6, 4)
        assert device.counters[C.CHECKSUM_MISMATCHES] == 1
        assert 3 in device.poison.blocks
        result, views = _stream(dev, [0, BLOCK], [BLOCK, BLOCK], 2)  # the device keeps working
        assert result.count == 2 and all((v == 7).all() for v in views)


def test_a_stream_stops_before_a_poisoned_block(tmp_path):
    with _device(tmp_path) as (dev, device):
        dev.write_from(0, np.full(16 * BLOCK, 3, np.uint8))
        device._poison(5, "test")
        result, views = _stream(dev, np.arange(10) * BLOCK, [BLOCK] * 10, 4)
        assert result.count == 5
        assert all((v == 3).all() for v in views[:5])


def test_a_deadline_stops_issuing_and_leaves_nothing_in_flight(tmp_path):
    import time
    with _device(tmp_path, blocks=512, dram_blocks=8) as (dev, device):
        offsets = np.arange(512) * BLOCK
        result, _ = _stream(dev, offsets, [BLOCK] * 512, 8, deadline_ns=time.monotonic_ns() - 1)
        assert result.count == 0
        assert device.state.inflight == 0 and device.ssd.queued() == 0


def test_a_read_wider_than_the_unpinned_slots_is_split_not_refused(tmp_path):
    with _device(tmp_path, dram_blocks=3) as (dev, device):
        data = np.arange(8 * BLOCK, dtype=np.uint8)
        dev.write_from(0, data)
        assert dev.hint(HintKind.PIN, 0, 0, 2)  # one slot left for everything else
        result, views = _stream(dev, [4 * BLOCK + 5, 2 * BLOCK], [2 * BLOCK, BLOCK], 4)
        assert result.count == 2
        assert (views[0] == data[4 * BLOCK + 5:6 * BLOCK + 5]).all() and (views[1] == data[2 * BLOCK:3 * BLOCK]).all()
        assert device.state.inflight == 0


def test_streams_and_writers_on_other_threads_lose_no_update(tmp_path):
    rng = np.random.default_rng(3)
    errors = []
    with _device(tmp_path, blocks=128, dram_blocks=12) as (dev, device):
        base = rng.integers(0, 256, 64 * BLOCK, dtype=np.uint8)
        dev.write_from(0, base)  # blocks 0-63: read-only, streamed by two threads

        def reader(seed):
            r = np.random.default_rng(seed)
            try:
                for _ in range(15):
                    offsets = r.integers(0, 63 * BLOCK, 40)
                    result, views = _stream(dev, offsets, [BLOCK] * 40, 8)
                    if result.count != 40 or any(not (v == base[o:o + BLOCK]).all()
                                                 for o, v in zip(offsets.tolist(), views)):
                        errors.append(("reader", seed))
            except Exception as exc:  # surfaced below
                errors.append(exc)

        def writer():
            try:
                for r in range(60):
                    dev.write_from((64 + r % 64) * BLOCK, np.full(BLOCK, r % 256, np.uint8))
            except Exception as exc:
                errors.append(exc)

        run_all([threading.Thread(target=reader, args=(s,)) for s in (1, 2)] + [threading.Thread(target=writer)])
        assert errors == []
        for r in range(60):  # each write survived every eviction
            assert dev.load((64 + r) * BLOCK, BLOCK) == bytes([r]) * BLOCK


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 20 * BLOCK - 1), st.integers(0, 3 * BLOCK)),
                    min_size=1, max_size=25),
       depth=st.integers(1, 6))
def test_streamed_reads_agree_with_a_bytearray_model(tmp_path_factory, ops, depth):
    path = tmp_path_factory.mktemp("rs")
    model = bytearray(24 * BLOCK)
    with _device(path, blocks=24, dram_blocks=3) as (dev, device):
        for i, (write, off, size) in enumerate(ops):
            size = min(size, 24 * BLOCK - off)
            if write:
                value = np.full(size, i % 251 + 1, np.uint8)
                dev.write_from(off, value)
                model[off:off + size] = value.tobytes()
            else:
                result, views = _stream(dev, [off, off // 2], [size, BLOCK], depth)
                assert result.count == 2
                assert views[0].tobytes() == bytes(model[off:off + size])
                assert views[1].tobytes() == bytes(model[off // 2:off // 2 + BLOCK])


def _on_the_ssd(path, blocks, dram_blocks, block, seed):
    """A device config (an SSD queue of 16) whose image holds random bytes, written and
    flushed by a device that is closed again: a device opened on it has nothing in DRAM."""
    cfg = {"capacity": blocks * block, "block_size": block, "dram_bytes": dram_blocks * block,
           "backend": {"path": str(path), "queue_depth": 16}}
    data = np.random.default_rng(seed).integers(0, 256, blocks * block, dtype=np.uint8)
    with open_device(cfg) as dev:
        dev.write_from(0, data)
        dev.flush()
    return cfg, data


def test_a_multi_block_read_into_is_one_streamed_pass_and_one_host_read(tmp_path):
    cfg, data = _on_the_ssd(tmp_path / "m.img", 512, 300, BLOCK, 4)
    with open_parts(cfg) as (dev, device):
        calls = []
        real = device.streams.stream_io
        device.streams.stream_io = lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k)
        out = np.empty(100 * BLOCK - 10, np.uint8)  # 100 blocks, cut in passes of 16 // STREAM_PASSES
        dev.read_into(5, out)
        assert (out == data[5:5 + out.shape[0]]).all()
        assert calls == [-(-100 // (16 // STREAM_PASSES))] and dev.stats()["host_reads"] == 1 and dev.stats()["misses"] == 100


def test_a_wide_read_sends_its_next_pass_before_copying_out_a_landed_one(tmp_path):
    # blocks of >= 32 KiB (stream state's WIDE_BLOCK): the ring's room holds STREAM_PASSES
    # passes; the stream plans the next as soon as a reap frees room, before the landed
    # pass is copied out and completed, so one more than that is in flight at the peak
    block = 32 << 10
    cfg, data = _on_the_ssd(tmp_path / "w.img", 64, 48, block, 9)
    with open_parts(cfg) as (dev, device):
        results = []
        real = device.streams.stream_io
        device.streams.stream_io = lambda *a, **k: results.append(real(*a, **k)) or results[-1]
        out = np.empty(40 * block, np.uint8)  # 20 passes of 16 // STREAM_PASSES = 2 blocks
        dev.read_into(3 * block, out)
        assert (out == data[3 * block:43 * block]).all()
        assert results[0].count == 40 // (16 // STREAM_PASSES)
        assert results[0].peak_in_flight > STREAM_PASSES
        assert device.state.inflight == 0 and device.state.inflight_slots == 0


@pytest.mark.parametrize("hpa,n,skew", [
    (0, 8 * 16384, 0),                  # whole blocks into an aligned buffer
    (100, 5 * 16384, 0),                # partial first and last blocks
    (16384, 4 * 16384, 512),            # whole blocks into a buffer that is not page-aligned
    (3 * 16384 - 7, 2 * 16384 + 14, 0),
])
def test_streamed_fills_leave_the_same_bytes_in_the_host_and_in_device_dram(tmp_path, hpa, n, skew):
    block = 16384
    cfg = {"capacity": 64 * block, "block_size": block, "dram_bytes": 16 * block,
           "backend": {"path": str(tmp_path / "c.img")}}
    data = np.random.default_rng(hpa + skew).integers(0, 256, 64 * block, dtype=np.uint8)
    with open_device(cfg) as dev:
        dev.write_from(0, data)
    with open_parts(cfg) as (dev, device):  # reopened: every read misses, and every block has a checksum
        area, addrs, _ = _buffers(1, n + skew)
        result = dev.stream_io(np.array([hpa], np.int64), np.array([n], np.int64), addrs + skew, 1)
        assert result.count == 1 and result.misses == (hpa + n - 1) // block - hpa // block + 1
        assert (area[skew:skew + n] == data[hpa:hpa + n]).all()
        area[:] = 0  # the host reuses its buffer: device DRAM must hold its own copy
        again = np.zeros(n, np.uint8)
        hits0 = dev.stats()["hits"]
        dev.read_into(hpa, again)
        assert dev.stats()["hits"] > hits0 and (again == data[hpa:hpa + n]).all()
        dev.flush()
        assert device.counters[C.CHECKSUM_MISMATCHES] == 0


# ---------------------------------------------------------------- streams of reads and writes
# (Device.stream_io with `writes`): every I/O keeps its issue order against earlier ones
# that share a block, so the result is exactly that of running them one by one - checked
# against a plain byte array - through hits, misses, partial-block writes (filled first),
# dirty evictions, and a close and reopen (the write-backs' checksums and the integrity
# log stay true).
RW_BLOCKS = 48


def _rw_device(path, dram_blocks=6, block=BLOCK):
    """(handle, device), as _device."""
    return open_parts({"capacity": RW_BLOCKS * block, "block_size": block, "dram_bytes": dram_blocks * block,
                       "backend": {"path": str(path)}})


ops = st.lists(st.tuples(st.booleans(), st.integers(0, RW_BLOCKS * BLOCK - 1), st.integers(1, 3 * BLOCK)),
               min_size=1, max_size=60)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, depth=st.integers(1, 8), seed=st.integers(0, 2**31), scale=st.sampled_from([1, 8]))
def test_a_stream_of_reads_and_writes_is_its_issue_order(tmp_path_factory, ops, depth, seed, scale):
    # scale 8: 32 KiB blocks, where the loop plans its next I/Os before it copies out a reap
    block = BLOCK * scale
    path = tmp_path_factory.mktemp("s") / "s.img"
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, RW_BLOCKS * block, dtype=np.uint8)
    offsets = np.array([min(o * scale, RW_BLOCKS * block - n * scale) for _, o, n in ops], np.int64)
    sizes = np.array([n * scale for _, _, n in ops], np.int64)
    writes = np.array([w for w, _, _ in ops], np.uint8)
    step = 3 * block
    area = mmap.mmap(-1, step * len(ops))
    flat = np.frombuffer(area, np.uint8)
    flat[:] = rng.integers(0, 256, flat.shape[0], dtype=np.uint8)
    payload = flat.copy()
    addrs = flat.ctypes.data + np.arange(len(ops), dtype=np.int64) * step
    with _rw_device(path, block=block) as (dev, device):
        dev.write_from(0, image)
        dev.flush()
        result = dev.stream_io(offsets, sizes, addrs, depth, writes=writes)
        assert result.count == len(ops)
        expected = image.copy()
        for i, (w, off, n) in enumerate(zip(writes.tolist(), offsets.tolist(), sizes.tolist())):
            buf = flat[i * step:i * step + n]
            if w:
                expected[off:off + n] = payload[i * step:i * step + n]
            else:
                assert (buf == expected[off:off + n]).all(), f"read {i} at {off}+{n}"
        assert result.write_hits + result.write_misses <= result.hits + result.misses
        back = np.zeros(RW_BLOCKS * block, np.uint8)
        dev.read_into(0, back)
        assert (back == expected).all()
        assert device.state.inflight == 0 and device.state.inflight_slots == 0
    with _rw_device(path, dram_blocks=4, block=block) as (dev, device):  # from the SSD, every block checked against its sum
        back = np.zeros(RW_BLOCKS * block, np.uint8)
        dev.read_into(0, back)
        assert (back == expected).all()
        assert dev.stats()["checksum_mismatches"] == 0


def test_a_write_stream_writes_its_dirty_victims_back_on_its_ring_and_loses_nothing(tmp_path, monkeypatch):
    """Every write evicts a dirty block: the victims go to the SSD on the stream's ring
    (never the synchronous path), and every byte, and every checksum, is right after."""
    from cxlhm.device.media import MediaPath
    sync_calls = []
    real = MediaPath.write_rows
    monkeypatch.setattr(MediaPath, "write_rows", lambda self, rows, **kw: sync_calls.append(len(rows))
                        or real(self, rows, **kw))
    path = tmp_path / "w.img"
    rng = np.random.default_rng(3)
    with _rw_device(path, dram_blocks=8) as (dev, device):
        first = rng.integers(0, 256, 8 * BLOCK, dtype=np.uint8)
        result = dev.stream_io(np.arange(8, dtype=np.int64) * BLOCK, np.full(8, BLOCK, np.int64),
                               first.ctypes.data + np.arange(8, dtype=np.int64) * BLOCK, 4,
                               writes=np.ones(8, np.uint8))
        assert result.count == 8  # DRAM now full of dirty blocks
        data = rng.integers(0, 256, 32 * BLOCK, dtype=np.uint8)
        offsets = (8 + np.arange(32, dtype=np.int64)) * BLOCK
        result = dev.stream_io(offsets, np.full(32, BLOCK, np.int64),
                               data.ctypes.data + np.arange(32, dtype=np.int64) * BLOCK, 8,
                               writes=np.ones(32, np.uint8))
        assert result.count == 32 and sync_calls == []
        assert dev.stats()["writebacks"] >= 24
        back = np.zeros(40 * BLOCK, np.uint8)
        dev.read_into(0, back)
        assert (back[:8 * BLOCK] == first).all() and (back[8 * BLOCK:] == data).all()
    with _rw_device(path, dram_blocks=4) as (dev, device):  # from the SSD, each block checked against its recorded sum
        back = np.zeros(40 * BLOCK, np.uint8)
        dev.read_into(0, back)
        assert (back[8 * BLOCK:] == data).all() and dev.stats()["checksum_mismatches"] == 0


def test_a_stream_that_wrote_victims_back_leaves_its_rows_as_a_reset_would(tmp_path):
    """StreamState.reset() leaves the write-back rows alone when none is in use: that holds
    only if every row a stream used went back FREE, without an owner, on the free stack.
    Streams of writes that evict dirty blocks, one after another on one thread."""
    from cxlhm.device.stream import state as ss
    rng = np.random.default_rng(5)
    with _rw_device(tmp_path / "r.img", dram_blocks=8) as (dev, device):
        expected = np.zeros(RW_BLOCKS * BLOCK, np.uint8)
        for round_ in range(4):
            blocks = rng.permutation(RW_BLOCKS)[:24].astype(np.int64)
            data = rng.integers(0, 256, 24 * BLOCK, dtype=np.uint8)
            result = dev.stream_io(blocks * BLOCK, np.full(24, BLOCK, np.int64),
                                   data.ctypes.data + np.arange(24, dtype=np.int64) * BLOCK, 6,
                                   writes=np.ones(24, np.uint8))
            assert result.count == 24
            for i, b in enumerate(blocks.tolist()):
                expected[b * BLOCK:(b + 1) * BLOCK] = data[i * BLOCK:(i + 1) * BLOCK]
            state = device.state.threads.stream
            assert state.st[ss.WB_USED] == 0
            assert (state.wb_state == ss.WB_FREE).all() and (state.wb_owner == -1).all()
            assert sorted(state.wb_free.tolist()) == list(range(state.wb_free.shape[0]))
        assert dev.stats()["writebacks"] > 0
        back = np.zeros(RW_BLOCKS * BLOCK, np.uint8)
        dev.read_into(0, back)
        assert (back == expected).all()


@pytest.mark.parametrize("block", [BLOCK, 64 << 10])
def test_rot_under_a_wide_streamed_read_is_poison_and_the_rest_arrives(tmp_path, block):
    """A wide read's blocks land together and are copied and checksummed as one run by the
    copy engine (large blocks: shared with its helper thread): one rotten block among them
    fails the read with poison naming it, never its bytes; the blocks around it read back."""
    n_blocks = 24
    with _device(tmp_path, blocks=2 * n_blocks, dram_blocks=n_blocks + 8, block=block) as (dev, device):
        data = np.random.default_rng(block).integers(0, 256, n_blocks * block, dtype=np.uint8)
        dev.write_from(0, data)
        dev.flush()
        dev.store(n_blocks * block, bytes(n_blocks * block))  # evicts the written blocks: all on the SSD
        dev.read_into(n_blocks * block, np.empty(n_blocks * block, np.uint8))
        rotten = 13
        with open(tmp_path / "s.img", "r+b") as f:
            f.seek(rotten * block + 7)
            f.write(b"rot")
        out = np.zeros(n_blocks * block, np.uint8)
        with pytest.raises(PoisonError, match=f"block {rotten}"):
            dev.read_into(0, out)
        assert dev.stats()["checksum_mismatches"] == 1
        assert dev.load(0, rotten * block) == data[:rotten * block].tobytes()
        assert dev.load((rotten + 1) * block, (n_blocks - rotten - 1) * block) == data[(rotten + 1) * block:].tobytes()


@pytest.mark.parametrize("room", [True, False])
def test_a_write_stream_leaves_the_checksums_and_dirty_set_its_log_replays_to(tmp_path, monkeypatch, room):
    """The stream's loop records its landed write-backs' checksums and its dirty blocks
    in the driver's tables itself; whatever it recorded, replaying the integrity log it
    wrote (as after a crash) gives the same checksums, and poisons exactly the blocks
    the dirty set holds. Without room in the sum table (room=False: a tiny table that
    is never grown for the loop) the landings go to the driver, with the same result."""
    from cxlhm.device.stream import state as ss
    from cxlhm.device.stream.driver import Streams
    from cxlhm.integrity import BlockChecksums, PoisonTable
    from cxlhm.sumtable import SumTable
    handed = []
    real = Streams._writebacks
    monkeypatch.setattr(Streams, "_writebacks",
                        lambda self, state: (handed.append(int(state.st[ss.WB_LANDED])), real(self, state))[1])
    path = tmp_path / "r.img"
    rng = np.random.default_rng(5)
    with _rw_device(path, dram_blocks=8) as (dev, device):
        if not room:
            device.checksums.sums.table = SumTable(capacity=4)
            monkeypatch.setattr(SumTable, "reserve", lambda self, more: None)
        n = 40
        offsets = rng.permutation(RW_BLOCKS)[:n].astype(np.int64) * BLOCK
        data = rng.integers(0, 256, n * BLOCK, dtype=np.uint8)
        result = dev.stream_io(offsets, np.full(n, BLOCK, np.int64),
                               data.ctypes.data + np.arange(n, dtype=np.int64) * BLOCK, 8,
                               writes=np.ones(n, np.uint8))
        assert result.count == n and dev.stats()["writebacks"] >= n - 8
        landed_by_driver = sum(handed)
        assert (landed_by_driver == 0) == room
        checksums = device.checksums
        sums, dirty = dict(checksums.sums.items()), set(checksums.dirty)
        assert len(sums) >= n - 8 and dirty
        replayed = BlockChecksums(None, BLOCK)
        poison = PoisonTable()
        replayed.attach_log(tmp_path / "copy.ilog", poison, unclean=False)
        replayed.close()
        (tmp_path / "copy.ilog").write_bytes(checksums.log.path.read_bytes())
        replayed.attach_log(tmp_path / "copy.ilog", poison, unclean=True)
        replayed.close()
        assert dict(replayed.sums.items()) == {b: s for b, s in sums.items() if b not in dirty}
        assert set(poison.blocks) == dirty


def test_a_thread_waiting_for_the_device_gets_it_while_a_long_stream_runs(tmp_path):
    """A stream's slice goes on past its time while nobody waits for the device lock, but
    not for ever: a thread that waits gets the lock while the stream still runs."""
    import time
    with _device(tmp_path, blocks=4096, dram_blocks=64) as (dev, device):
        n = 1 << 18  # (a stream of a second or so: reads of a fresh, sparse image are quick)
        offsets = (np.arange(n, dtype=np.int64) * 7919 % 4096) * BLOCK
        flat, addrs, _ = _buffers(64, BLOCK)
        addrs = addrs[np.arange(n) % 64]
        times = {}
        dev.stream_io(offsets[:64], np.full(64, BLOCK, np.int64), addrs[:64], 16)  # compiled first

        def stream():
            deadline = time.monotonic_ns() + 1_500_000_000
            times["count"] = dev.stream_io(offsets, np.full(n, BLOCK, np.int64), addrs, 16,
                                           deadline_ns=deadline).count
            times["stream_end"] = time.monotonic()

        def other():
            start = time.monotonic()
            while not device.state.lock.locked():  # the stream has the lock
                if time.monotonic() - start > 30:
                    return
            with device.state.lock:
                times["other"] = time.monotonic()

        run_all([threading.Thread(target=stream), threading.Thread(target=other)])
        assert times["count"] > 0 and times["other"] < times["stream_end"]
        assert device.state.lock.waiting[0] == 0


@pytest.mark.parametrize("wide", [False, True], ids=["4 KiB reads", "wide reads"])
@pytest.mark.parametrize("when", ["last slice", "slices with reads in flight"])
def test_an_error_in_a_slice_leaves_the_device_nothing_in_flight(tmp_path, monkeypatch, when, wide):
    """An error of the driver's part of a slice (here a short write of the integrity log)
    raises from the stream, and what the stream held is given back all the same - on its
    last slice, or while reads are in flight (they land first, erring again): nothing is
    left counted in flight, so other threads are not kept waiting and close() returns."""
    from cxlhm.device.stream import state as ss
    from cxlhm.device.stream.driver import Streams
    real_account, real_settle = Streams._account, Streams._settle
    held = []  # slots the stream held after each slice

    def account(self, st, counted, was_held):
        out = real_account(self, st, counted, was_held)
        held.append(out[1])
        return out

    raised = []

    def settle(self, job, status):
        in_flight = int(job.state.st[ss.IN_FLIGHT])
        # the last slice errs whether or not it still holds slots (how many it holds when it
        # finishes depends on when the reads landed); the other case errs while slots are held
        # and reads are out
        hit = status == ss.FINISHED if when == "last slice" else bool(held and held[-1] and in_flight)
        if raised or hit:
            raised.append(in_flight)  # (and at every slice after: the drain's too)
            raise OSError("injected: a short write of the integrity log")
        return real_settle(self, job, status)

    monkeypatch.setattr(Streams, "_account", account)
    monkeypatch.setattr(Streams, "_settle", settle)
    # wide: reads of two 32 KiB blocks, where the loop issues the next reads before it
    # completes a reap
    block, per_read, n = (32 << 10, 2, 512) if wide else (BLOCK, 1, 4096)
    dev, device = _device(tmp_path, blocks=n, dram_blocks=64, block=block)  # (not `with`: close() would wait for ever on a leak)
    dev.store(0, np.random.default_rng(5).integers(0, 256, n * block, dtype=np.uint8))
    lock = device.state.lock
    lock.waiting[0] = 1  # as while a thread waits for the device: each slice ends after a short time
    reads = n // per_read
    try:
        with pytest.raises(OSError, match="injected"):
            _stream(dev, (np.arange(reads) * 7919 % reads) * block * per_read, [block * per_read] * reads, 16)
    finally:
        lock.waiting[0] = 0
    left = (device.state.inflight, device.state.inflight_slots)
    if left == (0, 0):
        monkeypatch.undo()
        assert dev.load(0, BLOCK) == dev.load(0, BLOCK)  # the device still serves
        dev.close()
    assert raised, "no slice ended holding slots: the case did not happen"
    if when != "last slice":
        assert raised[0] > 0 and len(raised) > 1  # raised with reads out, and again as they landed
    assert left == (0, 0), "an access is left counted in flight: close() would wait for it for ever"


@pytest.mark.parametrize("threshold, streams", [(1 << 40, 0), (4 * 65536, 1)])
def test_a_stream_too_large_for_the_caches_streams_its_copies_out(tmp_path, monkeypatch, threshold, streams):
    """Whether a stream's copies out bypass the CPU's caches follows its reads' total
    (copyengine.bypasses_caches): a transfer that fits the caches is copied into them,
    a larger one streams its copies of 64 KiB blocks past them; the bytes are the same."""
    from cxlhm.device.stream import copyengine
    from cxlhm.device.stream import state as ss
    monkeypatch.setattr(copyengine, "STREAM_MIN_TOTAL", threshold)
    block = 65536
    rng = np.random.default_rng(3)
    with _device(tmp_path, blocks=16, dram_blocks=4, block=block) as (dev, device):
        image = rng.integers(0, 256, 16 * block, dtype=np.uint8)
        dev.write_from(0, image)
        dev.flush()
        offsets = [b * block for b in (3, 9, 0, 14, 7, 3)]
        result, views = _stream(dev, offsets, [block] * 6, 4)
        assert result.count == 6
        for off, got in zip(offsets, views):
            assert (got == image[off:off + block]).all()
        assert device.state.threads.stream.st[ss.BYPASS_CACHES] == streams


def test_the_last_level_cache_is_read_from_the_kernels_listing(tmp_path):
    """copyengine.last_level_cache_bytes: the highest data or unified cache level's size
    (instruction caches ignored), None where the kernel lists none or garbage."""
    from cxlhm.device.stream.copyengine import last_level_cache_bytes

    def index(name, level, kind, size):
        folder = tmp_path / "cache" / name
        folder.mkdir(parents=True)
        for field, value in (("level", level), ("type", kind), ("size", size)):
            (folder / field).write_text(f"{value}\n")

    assert last_level_cache_bytes(tmp_path / "cache") is None
    index("index0", 1, "Data", "32K")
    index("index1", 1, "Instruction", "64K")
    assert last_level_cache_bytes(tmp_path / "cache") == 32 << 10
    index("index2", 2, "Unified", "512K")
    index("index3", 3, "Unified", "32768K")
    assert last_level_cache_bytes(tmp_path / "cache") == 32 << 20
    index("index4", 4, "Unified", "lots")
    assert last_level_cache_bytes(tmp_path / "cache") is None


def test_streams_of_several_threads_on_one_device_keep_every_byte(tmp_path):
    """Four threads stream writes, then reads of each other's blocks, on one device at
    once (DRAM far smaller than what they touch: misses, dirty victims written back on
    each stream's ring): while streams share the device none waits at the SSD holding
    its lock, and every block reads back as its writer wrote it."""
    per, threads_n = 96, 4
    with _device(tmp_path, blocks=per * threads_n, dram_blocks=24) as (dev, device):
        barrier = threading.Barrier(threads_n)
        errors = []

        def worker(k):
            rng = np.random.default_rng(k)
            mine = rng.permutation(np.arange(k * per, (k + 1) * per)) * BLOCK
            flat, addrs, step = _buffers(per, BLOCK)
            for i, off in enumerate(mine.tolist()):
                flat[i * step:i * step + BLOCK] = (off // BLOCK) % 251
            barrier.wait()
            ran = device.stream_io(mine, np.full(per, BLOCK), addrs, 8, writes=np.ones(per, np.uint8))
            assert ran.count == per
            barrier.wait()  # every block written: now each thread reads the others' too
            theirs = rng.permutation(np.arange(per * threads_n))[:per] * BLOCK
            result, views = _stream(dev, theirs.tolist(), [BLOCK] * per, 8)
            assert result.count == per
            for off, view in zip(theirs.tolist(), views):
                if not (view == (off // BLOCK) % 251).all():
                    errors.append(off)

        def guarded(k):
            try:
                worker(k)
            except Exception as exc:  # noqa: BLE001 - reported by the test's thread
                errors.append(repr(exc))
                barrier.abort()

        run_all([threading.Thread(target=guarded, args=(k,)) for k in range(threads_n)])
        assert errors == []
        assert device.stream_registry.running[0] == 0  # every stream left the count as it found it
        for off in range(0, per * threads_n * BLOCK, 7 * BLOCK):  # and the plain path agrees
            assert dev.load(off, BLOCK) == bytes([(off // BLOCK) % 251]) * BLOCK
