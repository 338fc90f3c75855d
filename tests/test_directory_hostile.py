"""The embedded directory against processes that misbehave around it: a writer stopped
or killed holding the lock, a file truncated or replaced under its readers."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

from host_runtime.directory import sigbus_guard
from host_runtime.directory import DirectoryUnavailable, SharedMemoryDirectory
from host_runtime.directory import shm_table as T
from host_runtime.directory.location import key_array
from host_runtime.directory.shm import DirectoryBusy, DirectoryFileError
from host_runtime.testing.directory import fp, loc

CTX = mp.get_context("spawn")


def _stopped_writer(path: str, ready) -> None:
    d = SharedMemoryDirectory.attach(path)
    with d._writer():
        ready.set()
        signal.pause()


def test_a_stopped_writer_delays_publishes_by_the_deadline_only(tmp_path):
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=1000)
    ready = CTX.Event()
    p = CTX.Process(target=_stopped_writer, args=(d.path, ready))
    p.start()
    try:
        assert ready.wait(120)
        d.lock_timeout_s = 0.3
        started = time.monotonic()
        assert not d.publish(fp(1), loc(1))  # dropped, counted, not hung
        assert d.remove(fp(1)) is False
        assert time.monotonic() - started < 5 and d.lock_timeouts == 2
        with pytest.raises(DirectoryBusy, match="held the writer lock"):
            d.clear()
        assert d.lookup(fp(1)) is None  # readers never wait
    finally:
        p.kill()
        p.join(30)
    assert d.publish(fp(1), loc(1)) and d.lookup(fp(1)) == loc(1)
    d.close()


def _truncate_under_readers(path: str, q) -> None:
    d = SharedMemoryDirectory.attach(path)
    keys = [fp(i) for i in range(100)]
    before = d.lookup_sparse(keys).n_hits
    os.truncate(path, 4096)  # what a careless or hostile process of the same user can do
    after = d.lookup_sparse(keys).n_hits
    try:
        d.publish(fp(1000), loc(1))
        published = "no error"
    except DirectoryUnavailable as exc:
        published = str(exc)
    q.put((before, after, d.truncated_batches, published))


def test_a_truncated_table_reads_as_misses_not_sigbus(tmp_path):
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=1000)
    d.publish_many([fp(i) for i in range(100)], [loc(i) for i in range(100)])
    q = CTX.Queue()
    p = CTX.Process(target=_truncate_under_readers, args=(d.path, q))  # a child: SIGBUS would kill only it
    p.start()
    p.join(120)
    assert p.exitcode == 0, f"the reader died (exit {p.exitcode}; -7 is SIGBUS)"
    before, after, truncated, published = q.get(timeout=5)
    assert (before, after, truncated) == (100, 0, 1) and "was truncated" in published
    assert d.lookup_sparse([fp(i) for i in range(100)]).n_hits == 0  # this process too
    d.close()


def _look_up_while_truncated(path: str, q, ready) -> None:
    d = SharedMemoryDirectory.attach(path)
    keys = [fp(i) for i in range(2000)]
    assert d.lookup_sparse(keys).n_hits == 2000
    ready.set()
    batches = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not sigbus_guard.faulted(d._guard):
        d.lookup_sparse(keys)  # each batch's size check passes while the file is whole...
        batches += 1
    q.put((batches, sigbus_guard.faulted(d._guard), d.lookup_sparse(keys).n_hits))


def test_a_truncation_racing_a_lookup_is_misses_not_sigbus(tmp_path):
    """The size check before a batch cannot see a truncation that lands during the
    batch: the file is cut and grown back in a loop, so checks pass and accesses fault.
    The reader must live (its table reads as zeros from then on) and say so."""
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=50_000)
    d.publish_many([fp(i) for i in range(2000)], [loc(i) for i in range(2000)])
    q, ready = CTX.Queue(), CTX.Event()
    p = CTX.Process(target=_look_up_while_truncated, args=(d.path, q, ready))  # a child: SIGBUS kills only it
    p.start()
    assert ready.wait(120)
    size = d.size
    deadline = time.monotonic() + 60
    while p.is_alive() and time.monotonic() < deadline:
        os.truncate(d.path, 0)
        time.sleep(0.0005)
        os.truncate(d.path, size)  # ...and the pages it then touches are gone
        time.sleep(0.002)
    p.join(60)
    assert p.exitcode == 0, f"the reader died (exit {p.exitcode}; -7 is SIGBUS)"
    batches, faulted, hits_after = q.get(timeout=5)
    assert faulted and hits_after == 0, (batches, faulted, hits_after)
    d.close()


def test_create_refuses_a_live_table_and_replaces_a_stale_one(tmp_path):
    path = tmp_path / "dir.shm"
    d = SharedMemoryDirectory.create(path, entries=1000)
    d.publish(fp(1), loc(1))
    reader = SharedMemoryDirectory.attach(path)
    with pytest.raises(DirectoryFileError, match="in use by a live process"):
        SharedMemoryDirectory.create(path, entries=1000)
    assert reader.lookup(fp(1)) == loc(1) and d.lookup(fp(1)) == loc(1)  # wiped nothing
    d.close()
    with pytest.raises(DirectoryFileError, match="in use"):
        SharedMemoryDirectory.create(path, entries=1000)  # the reader still has it
    reader.close()
    fresh = SharedMemoryDirectory.create(path, entries=1000)  # nobody has it: a stale file, replaced
    assert fresh.lookup(fp(1)) is None and fresh.live == 0
    fresh.close()


def _slot_of(d: SharedMemoryDirectory, key) -> int:
    k = key_array([key])[0]
    rows = np.flatnonzero((d._table[:, T.K0] == k[0]) & (d._table[:, T.K1] == k[1]))
    return int(rows[0])


def _home(d: SharedMemoryDirectory, key) -> int:
    k = key_array([key])[0]
    return int(T._mix(np.uint64(k[0]), np.uint64(k[1])) & np.uint64(d.slots - 1))


def _killed_mid_write(path: str, slot: int, ready) -> None:
    d = SharedMemoryDirectory.attach(path)
    with d._writer():  # marks the table as being written
        d._table[slot, T.SEQ] += np.uint64(1)  # a slot begun and never finished
        d._table[slot, T.W1] = np.uint64(12345)
        ready.set()
        signal.pause()


def test_a_slot_a_killed_writer_left_half_written_is_repaired(tmp_path):
    d = SharedMemoryDirectory.create(tmp_path / "dir.shm", entries=64, max_probe=64)  # 128 slots: clusters
    keys = [fp(i, b"kill") for i in range(80)]
    d.publish_many(keys, [loc(i) for i in range(80)])
    # a key stored past its home slot, and the key in the first slot of its probe path
    behind = next(k for k in keys if _slot_of(d, k) != _home(d, k))
    torn = _home(d, behind)
    victim = next(k for k in keys if _slot_of(d, k) == torn)
    ready = CTX.Event()
    p = CTX.Process(target=_killed_mid_write, args=(d.path, torn, ready))
    p.start()
    assert ready.wait(120)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert d.lookup(behind) is None  # the torn slot stops its probe: a miss, never wrong bytes
    assert d.publish(fp(999, b"next"), loc(3))  # the next writer repairs
    assert d.repairs == 1
    assert d.lookup(behind) == loc(keys.index(behind))
    assert d.lookup(victim) is None  # the half-written entry itself is dropped
    hits = d.lookup_sparse(keys)
    assert hits.n_hits == 79 and d.live == 80  # 79 of the first 80, and the new one
    d.close()
