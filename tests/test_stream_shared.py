"""Streams sharing a device (cxlhm/device/stream/): while several run, a slice leaves the
I/Os it prepares off the ring until its thread waits for completions without the device
lock (state.py's submit, loop.py's reap_unlocked) - and every one of them still goes on
the ring: none is left pending when the slice returns for anything else, on an error
either, and every byte reads back as written. Their victims are seen through the shared
victim table (victims.py)."""
import mmap
import threading

import numpy as np
import pytest

from cxlhm.device.stream import state as ss
from cxlhm.device.stream.driver import Streams
from cxlhm.device.stream.registry import StreamRegistry
from device_parts import open_parts
from threads import run_all

BLOCK = 4096
PER, THREADS = 96, 4


def _device(tmp_path):
    cfg = {"capacity": PER * THREADS * BLOCK, "block_size": BLOCK, "dram_bytes": 24 * BLOCK,
           "backend": {"path": str(tmp_path / "s.img")}}
    return open_parts(cfg)


def _buffers(n: int):
    area = mmap.mmap(-1, BLOCK * n)
    flat = np.frombuffer(area, np.uint8)
    return flat, flat.ctypes.data + np.arange(n, dtype=np.int64) * BLOCK


def _write_then_read_each_others(device, errors: list) -> None:
    """THREADS threads stream writes of their own blocks, then reads of anyone's, at once;
    a block that reads back wrong goes to `errors`."""
    barrier = threading.Barrier(THREADS)

    def worker(k):
        rng = np.random.default_rng(k)
        mine = rng.permutation(np.arange(k * PER, (k + 1) * PER)) * BLOCK
        flat, addrs = _buffers(PER)
        for i, off in enumerate(mine.tolist()):
            flat[i * BLOCK:(i + 1) * BLOCK] = (off // BLOCK) % 251
        barrier.wait()
        device.stream_io(mine, np.full(PER, BLOCK), addrs, 8, writes=np.ones(PER, np.uint8))
        barrier.wait()
        theirs = rng.permutation(np.arange(PER * THREADS))[:PER] * BLOCK
        flat, addrs = _buffers(PER)
        ran = device.stream_io(theirs, np.full(PER, BLOCK), addrs, 8)
        assert ran.count == PER
        for i, off in enumerate(theirs.tolist()):
            if not (flat[i * BLOCK:(i + 1) * BLOCK] == (off // BLOCK) % 251).all():
                errors.append(off)

    def guarded(k):
        try:
            worker(k)
        except Exception as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(repr(exc))
            barrier.abort()

    run_all([threading.Thread(target=guarded, args=(k,)) for k in range(THREADS)])


def test_shared_slices_leave_their_io_pending_only_for_the_unlocked_wait(tmp_path, monkeypatch):
    """Four streams on one device: slices leave I/O pending, it is on the ring before
    each unlocked wait and after every other slice's end, and every byte arrives."""
    real_settle, real_reap = Streams._settle, Streams._reap_unlocked
    pending_at_reap, misplaced = [], []

    def settle(self, job, status):
        if job.state.st[ss.N_PEND] and status not in (ss.REAP_UNLOCKED, ss.SLICE):
            misplaced.append(status)
        return real_settle(self, job, status)

    def reap(self, job):
        pending_at_reap.append(int(job.state.st[ss.N_PEND]))
        real_reap(self, job)
        assert job.state.st[ss.N_PEND] == 0  # on the ring before the wait

    monkeypatch.setattr(Streams, "_settle", settle)
    monkeypatch.setattr(Streams, "_reap_unlocked", reap)
    errors = []
    with _device(tmp_path) as (dev, device):
        _write_then_read_each_others(device, errors)
        assert errors == []
        assert misplaced == []
        assert any(pending_at_reap), "no slice deferred its I/O: the case did not happen"
        assert (device.state.inflight, device.state.inflight_slots) == (0, 0)
        for off in range(0, PER * THREADS * BLOCK, 5 * BLOCK):  # the plain path agrees
            assert dev.load(off, BLOCK) == bytes([(off // BLOCK) % 251]) * BLOCK


def test_an_error_with_io_pending_puts_it_on_the_ring_and_leaves_nothing_in_flight(tmp_path, monkeypatch):
    """A slice that errs after leaving I/Os pending: the drain puts them on the ring and
    collects them, the error is raised, nothing stays counted in flight, and the other
    streams finish."""
    real_settle = Streams._settle
    raised = []

    def settle(self, job, status):
        if raised and raised[0] is job.state or (not raised and job.state.st[ss.N_PEND] and
                                                 status == ss.REAP_UNLOCKED):
            if not raised:
                raised.append(job.state)
            raise OSError("injected: a short write of the integrity log")
        return real_settle(self, job, status)

    monkeypatch.setattr(Streams, "_settle", settle)
    errors = []
    with _device(tmp_path) as (dev, device):
        _write_then_read_each_others(device, errors)
        assert raised, "no slice erred with I/O pending: the case did not happen"
        assert [e for e in errors if "injected" in e] != []
        assert (device.state.inflight, device.state.inflight_slots) == (0, 0)
        assert raised[0].st[ss.N_PEND] == 0 and raised[0].st[ss.IN_FLIGHT] == 0


def test_the_victim_table_grows_and_gives_back_rows_of_replaced_and_gone_states():
    class Geometry:
        block_size = BLOCK

    registry = StreamRegistry(Geometry())

    def with_victims(blocks, depth=4):
        stream = ss.StreamState(depth, 1)
        stream.wb_rows[:len(blocks), 2] = np.asarray(blocks, np.int64) * BLOCK
        stream.wb_state[:len(blocks)] = ss.WB_RING
        stream.st[ss.WB_USED] = len(blocks)
        stream.note_victims(BLOCK)
        return stream

    first = with_victims([8, 2])
    registry.register(first)
    assert registry.victim_blocks().tolist() == [2, 8]
    wider = with_victims(list(range(40, 100)), depth=16)  # more rows than the table's width
    registry.register(wider)  # (the same thread: it replaces `first`)
    assert registry.victim_blocks().tolist() == list(range(40, 100))
    first.note_victims(BLOCK)  # a replaced state's row is its own again: no one else sees it
    assert registry.victim_blocks().tolist() == list(range(40, 100))

    other = []

    def register_another():
        other.append(with_victims([5]))
        registry.register(other[0])
    thread = threading.Thread(target=register_another)
    thread.start()
    thread.join()
    assert registry.victim_blocks().tolist() == [5, *range(40, 100)]
    assert registry.victim_blocks(but=other[0]).tolist() == list(range(40, 100))
    matrix, counts, slot = wider.victim_row.arrays
    assert matrix is registry.table.matrix and counts[slot] == 60
    other.clear()  # the thread's state is gone: its blocks with it
    assert registry.victim_blocks().tolist() == list(range(40, 100))
    replacement = with_victims([7])
    registry.register(replacement)  # (gives the gone state's slot back, and `wider`'s)
    assert registry.victim_blocks().tolist() == [7]
    assert len(registry.table.blocks()) == 1


@pytest.mark.parametrize("blocks, io, touches", [
    ([3, 9], (2, 1), False), ([3, 9], (3, 1), True), ([3, 9], (4, 5), False), ([3, 9], (8, 2), True),
    ([], (0, 100), False)])
def test_a_stream_sees_the_other_streams_victims_not_its_own(blocks, io, touches):
    from cxlhm.device.stream.victims import VictimRow, VictimTable, touches_others
    table = VictimTable()
    rows = [VictimRow(8), VictimRow(8)]
    for row in rows:
        table.take(row, 8)
    theirs, mine = rows
    wb_rows = np.zeros((8, 4), np.int64)
    wb_state = np.zeros(8, np.uint8)
    wb_rows[:len(blocks), 2] = np.asarray(blocks, np.int64) * BLOCK
    wb_state[:len(blocks)] = ss.WB_STAGE
    theirs.note(wb_rows, wb_state, BLOCK, bool(blocks))
    mine.note(wb_rows, wb_state, BLOCK, bool(blocks))  # its own: never in its way
    first, n = io
    assert touches_others(mine.arrays, first * BLOCK, n * BLOCK, BLOCK) is touches
    assert touches_others(theirs.arrays, first * BLOCK, n * BLOCK, BLOCK) is touches
    table.give_back(theirs)
    assert touches_others(mine.arrays, first * BLOCK, n * BLOCK, BLOCK) is False
