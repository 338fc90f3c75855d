"""The integrity log's records as the device writes them: packed in batches (numpy)
byte for byte as one struct.pack each, SUM records written ahead by the streamed loop
itself (compiled: its frames replay like the driver's), and compaction, which must
replay to what the log it replaces replays to - also while write-backs whose SUMs the
loop logged are out."""
import mmap
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm import integrity
from cxlhm.device.stream import state as ss
from cxlhm.integrity import DIRTY, SUM, BlockChecksums, IntegrityLog, PoisonError, PoisonTable, pack_records
from device_parts import open_parts

BLOCK = 4096
REC = struct.Struct("<cQQ")  # the record as the log's format documents it

kinds = st.sampled_from([b"S", b"D", b"P", b"C", b"R", b"W"])
u64 = st.integers(0, 2**64 - 1)


@given(kind=kinds, pairs=st.lists(st.tuples(st.integers(0, 2**63 - 1), u64), max_size=40))
def test_packed_records_are_byte_for_byte_one_struct_pack_each(kind, pairs):
    blocks = np.array([b for b, _ in pairs], np.int64)
    values = np.array([v for _, v in pairs], np.uint64)
    assert pack_records(kind, blocks, values) == b"".join(REC.pack(kind, b, v) for b, v in pairs)
    assert pack_records(kind, [b for b, _ in pairs]) == b"".join(REC.pack(kind, b, 0) for b, _ in pairs)


def _records(path: Path) -> list[tuple[bytes, int, int]]:
    log = IntegrityLog(path)
    try:
        return log.replay()
    finally:
        log.close()


def test_intend_writes_the_sums_then_the_new_dirty_blocks_in_one_frame(tmp_path):
    sums = BlockChecksums(None)
    sums.attach_log(tmp_path / "a.ilog", PoisonTable(), unclean=False)
    sums.note_dirty([1, 2])
    size = (tmp_path / "a.ilog").stat().st_size
    # 1 and 2 are logged dirty already (no record); 2 and 5 are written back; 3 and 5 are new
    sums.intend(np.array([2, 5], np.int64), np.array([7, 2**64 - 1], np.uint64), np.array([1, 2, 3, 5], np.int64))
    frame = (tmp_path / "a.ilog").read_bytes()[size:]
    length, crc = struct.unpack_from("<II", frame)
    payload = frame[8:]
    assert len(payload) == length and zlib.crc32(payload) == crc  # one frame, whole
    # the writes came before the write-backs: a block both written and summed ends on its SUM
    assert payload == b"".join(REC.pack(k, b, v) for k, b, v in
                               [(DIRTY, 3, 0), (DIRTY, 5, 0), (SUM, 2, 7), (SUM, 5, 2**64 - 1)])
    assert set(sums.dirty) == {1, 3} and sums.sums.pending == {2: 7, 5: 2**64 - 1}
    sums.sums.set_many(np.array([5], np.int64), np.array([2**64 - 1], np.uint64))  # landed: recorded
    assert sums.sums.pending == {2: 7} and sums.sums[5] == 2**64 - 1
    sums.close()


def test_the_log_control_word_follows_the_descriptor(tmp_path):
    log = IntegrityLog(tmp_path / "c.ilog")
    assert log.ctl[0] == log.fd >= 0
    log.rewrite(pack_records(SUM, [1], [2]))
    assert log.ctl[0] == log.fd >= 0  # the compacted file's descriptor
    log.freeze()
    assert log.ctl[0] == -1  # the power is gone: compiled code writes nothing more
    log.close()
    assert log.ctl[0] == -1


# ------------------------------------------------- compaction replays like the history
blocks = st.integers(0, 11)
ops = st.lists(st.one_of(
    st.tuples(st.just("intend"), st.lists(blocks, max_size=4, unique=True), st.lists(blocks, max_size=4)),
    st.tuples(st.just("loop"), st.lists(blocks, min_size=1, max_size=4, unique=True)),
    st.tuples(st.just("land"), st.integers(0, 3)),
    st.tuples(st.just("fail"), st.integers(0, 3)),
    st.tuples(st.just("dirty"), st.lists(blocks, min_size=1, max_size=4)),
    st.tuples(st.just("poison"), blocks),
    st.tuples(st.just("rewrite"), blocks, st.integers(0, 3)),
    st.tuples(st.just("compact"))), max_size=40)


def _replayed(path: Path) -> tuple[dict, dict]:
    sums, poison = BlockChecksums(None), PoisonTable()
    sums.attach_log(path, poison, unclean=True)
    sums.close()
    return dict(sums.sums.items()), dict(poison.blocks), dict(poison.valid)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, seed=st.integers(0, 2**32))
def test_a_compaction_replays_to_what_the_history_replays_to(tmp_path_factory, ops, seed):
    """A device's log events in any order - SUMs written ahead by the driver (intend) or
    by the streamed loop straight to the descriptor (unrecorded until they land), landings,
    failed write-backs, host writes, poison and the bytes of poisoned blocks rewritten -
    with compactions anywhere: an unclean reopen of the
    compacted log restores exactly what one of the whole history restores."""
    folder = tmp_path_factory.mktemp("c")
    rng = np.random.default_rng(seed)
    history = bytearray()
    sums = BlockChecksums(None)
    sums.attach_log(folder / "a.ilog", PoisonTable(), unclean=False)
    real_append = sums.log.append

    def append(payload):
        history.extend(struct.pack("<II", len(payload), zlib.crc32(payload)) + payload)
        real_append(payload)
    sums.log.append = append
    out: list[tuple[int, int]] = []  # the loop's write-backs out: (block, sum), their SUMs logged
    sums.unrecorded = lambda: (np.array([b for b, _ in out], np.int64), np.array([s for _, s in out], np.uint64))
    busy = lambda: {b for b, _ in out} | set(sums.sums.pending)  # noqa: E731 - blocks with a write-back out
    for op, *args in ops:
        if op == "intend":
            summed = [b for b in args[0] if b not in busy()]
            sums.intend(np.array(summed, np.int64), rng.integers(0, 2**63, len(summed)).astype(np.uint64),
                        np.array([b for b in args[1] if b not in busy()], np.int64))
        elif op == "loop":  # as _log_staged writes them
            new = [(b, int(rng.integers(0, 2**63))) for b in args[0] if b not in busy()]
            if new:
                payload = pack_records(SUM, [b for b, _ in new], [s for _, s in new])
                frame = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
                assert os.write(int(sums.log.ctl[0]), frame) == len(frame)
                history.extend(frame)
                out.extend(new)
                sums.logged_elsewhere(len(new))
        elif op == "land":
            done = out[:args[0]] + list(sums.sums.pending.items())[:args[0]]
            del out[:args[0]]
            if done:
                landed = np.array([b for b, _ in done], np.int64)
                sums.sums.set_many(landed, np.array([s for _, s in done], np.uint64))
                sums.summed(landed)
        elif op == "fail" and out:
            block, _ = out.pop(min(args[0], len(out) - 1))
            sums.summed(np.array([block], np.int64))
            sums.sums.pop(block, None)
        elif op == "dirty":
            sums.note_dirty([b for b in args[0] if b not in busy()])
        elif op == "poison" and args[0] not in busy():  # as MediaPath.poison_block does
            sums.sums.forget(args[0], None)
            sums.poison.add(args[0], "lost")
        elif op == "rewrite":  # a host write of a quarter of the block (clears poison of those bytes)
            sums.poison.written(args[0] * 4096 + args[1] * 1024, 1024, 4096)
        elif op == "compact":
            sums._compact()
    sums.close()
    (folder / "history.ilog").write_bytes(bytes(history))
    assert _replayed(folder / "a.ilog") == _replayed(folder / "history.ilog")


# ------------------------------------------------- the streamed loop's own SUM records
def _device(path, *, blocks, dram_blocks):
    """(handle, device): these tests reach the device's integrity log."""
    return open_parts({"capacity": blocks * BLOCK, "block_size": BLOCK, "dram_bytes": dram_blocks * BLOCK,
                       "backend": {"path": str(path)}})


@pytest.mark.parametrize("where", ["loop", "driver"])
@pytest.mark.parametrize("compact", [False, True])
def test_a_write_stream_logs_its_victims_sums_ahead_and_a_power_loss_keeps_them(tmp_path, monkeypatch, where,
                                                                                compact):
    """Every write of the stream evicts a dirty victim. Its SUM record - written by the
    loop itself, or by the driver where the loop cannot (no compiled hash) - replays as
    the checksum of the bytes it wrote back; after a power loss, a block whose last
    record is that SUM reads back exact, one whose bytes were in device DRAM only is
    poison, and nothing is a checksum mismatch - also with the log compacted over and
    over while write-backs are out."""
    if where == "driver":
        monkeypatch.setattr(ss, "COMPILED_LOG", False)
    elif not ss.COMPILED_LOG:
        pytest.skip("this xxhash or zlib gives compiled code no hash or crc32: the driver logs")
    if compact:
        monkeypatch.setattr(integrity, "COMPACT_MIN_RECORDS", 8)
    n_blocks, dram, n_writes = 24, 6, 160
    path = tmp_path / "w.img"
    rng = np.random.default_rng(5)
    order = np.concatenate([rng.permutation(n_blocks) for _ in range(n_writes // n_blocks + 1)])[:n_writes]
    area = mmap.mmap(-1, n_writes * BLOCK)
    payload = np.frombuffer(area, np.uint8)
    payload[:] = rng.integers(0, 256, payload.shape[0], dtype=np.uint8)
    last = {int(b): i for i, b in enumerate(order.tolist())}  # block -> its last write
    with _device(path, blocks=n_blocks, dram_blocks=dram) as (dev, device):
        rewrites = []
        real_rewrite = device.checksums.log.rewrite
        monkeypatch.setattr(device.checksums.log, "rewrite", lambda p: rewrites.append(1) or real_rewrite(p))
        result = dev.stream_io(order.astype(np.int64) * BLOCK, np.full(n_writes, BLOCK, np.int64),
                               payload.ctypes.data + np.arange(n_writes, dtype=np.int64) * BLOCK, 8,
                               writes=np.ones(n_writes, np.uint8))
        assert result.count == n_writes and dev.stats()["writebacks"] >= result.misses - dram > n_writes // 2
        assert bool(rewrites) == compact
        device.simulate_power_loss()
    final = {}
    for kind, block, value in _records(Path(str(path) + ".cxlhm.ilog")):
        if kind in (SUM, DIRTY):  # (a compacted log starts with RESET)
            final[block] = (kind, value)
    lost = {b for b, (kind, _) in final.items() if kind == DIRTY}
    assert len(lost) <= dram  # only what device DRAM held
    for block, (kind, value) in final.items():
        if kind == SUM:
            written = payload[last[block] * BLOCK:(last[block] + 1) * BLOCK]
            assert value == xxhash.xxh3_64_intdigest(written), f"block {block}: its SUM is not its bytes' checksum"
    with _device(path, blocks=n_blocks, dram_blocks=dram) as (dev, _):
        for block in range(n_blocks):
            written = payload[last[block] * BLOCK:(last[block] + 1) * BLOCK]
            try:
                assert dev.load(block * BLOCK, BLOCK) == written.tobytes(), f"block {block} is not its last write"
            except PoisonError:
                assert block in lost, f"block {block} was written back, yet it is poison after the power loss"
        assert dev.stats()["checksum_mismatches"] == 0


def test_a_frozen_log_takes_no_record_from_the_loop_and_the_stream_goes_on(tmp_path):
    """Once the power is gone (the log frozen), the loop writes nothing to the log; its
    writes and their write-backs still complete."""
    path = tmp_path / "f.img"
    rng = np.random.default_rng(2)
    area = mmap.mmap(-1, 24 * BLOCK)
    payload = np.frombuffer(area, np.uint8)
    payload[:] = rng.integers(0, 256, payload.shape[0], dtype=np.uint8)
    addrs = payload.ctypes.data + np.arange(24, dtype=np.int64) * BLOCK
    with _device(path, blocks=24, dram_blocks=4) as (dev, device):
        dev.stream_io(np.arange(12, dtype=np.int64) * BLOCK, np.full(12, BLOCK, np.int64), addrs[:12], 4,
                      writes=np.ones(12, np.uint8))
        log = Path(str(path) + ".cxlhm.ilog")
        size = log.stat().st_size
        assert size > 0
        device.checksums.freeze()
        result = dev.stream_io(np.arange(12, 24, dtype=np.int64) * BLOCK, np.full(12, BLOCK, np.int64),
                               addrs[12:], 4, writes=np.ones(12, np.uint8))
        assert result.count == 12 and log.stat().st_size == size
        back = np.zeros(24 * BLOCK, np.uint8)
        dev.read_into(0, back)
        assert (back == payload).all()
