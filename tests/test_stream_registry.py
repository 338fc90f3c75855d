"""The stream registry's view of the threads' stream states: every registered state is
seen by the others (also when threads register at once), a thread's new state replaces
its last one, and the victim list is the other streams' victims' blocks, sorted."""
from __future__ import annotations

import threading

import numpy as np

from cxlhm.device.stream import state as ss
from cxlhm.device.stream.registry import StreamRegistry


class _Geometry:
    block_size = 4096


def _with_victims(blocks) -> ss.StreamState:
    stream = ss.StreamState(4, 1)
    rows = np.asarray(blocks, np.int64)
    stream.wb_rows[:rows.shape[0], 2] = rows * _Geometry.block_size
    stream.wb_state[:rows.shape[0]] = ss.WB_RING
    stream.wb_state[rows.shape[0]:] = ss.WB_FREE
    stream.st[ss.WB_USED] = rows.shape[0]
    stream.note_victims(_Geometry.block_size)
    return stream


def _register_each_from_its_thread(registry: StreamRegistry, streams) -> None:
    """Each stream registered by a thread of its own, all alive until all are in (a
    thread's identity may be reused once it ends)."""
    registered = threading.Barrier(len(streams))

    def register(stream):
        registry.register(stream)
        registered.wait()
    threads = [threading.Thread(target=register, args=(stream,)) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_the_victim_list_is_the_other_streams_blocks_sorted():
    registry = StreamRegistry(_Geometry())
    streams = [_with_victims(blocks) for blocks in ([9, 3], [7], [])]
    _register_each_from_its_thread(registry, streams)
    assert registry.victim_blocks().tolist() == [3, 7, 9]
    assert registry.victim_blocks(but=streams[0]).tolist() == [7]
    assert registry.victim_blocks(but=streams[1]).tolist() == [3, 9]
    assert registry.victim_blocks(but=streams[2]).tolist() == [3, 7, 9]


def test_threads_registering_at_once_are_all_seen():
    registry = StreamRegistry(_Geometry())
    streams = [_with_victims([i]) for i in range(16)]  # (the registry holds them weakly)
    _register_each_from_its_thread(registry, streams)
    assert registry.victim_blocks().tolist() == list(range(16))


def test_a_threads_new_state_replaces_its_last():
    registry = StreamRegistry(_Geometry())
    first, second = _with_victims([5]), _with_victims([6])
    registry.register(first)
    registry.register(second)
    assert registry.victim_blocks().tolist() == [6]
    assert registry.others(None) == [second]
