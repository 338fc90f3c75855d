"""The device lock (cxlhm/device/lock.py): threading.Lock's behaviour, and its count of
the threads waiting for the device - blocked on it, or waiting on its condition - which
a stream's compiled loop reads to decide whether its time slice may go on."""
import threading
import time

import pytest

from cxlhm.device.lock import DeviceLock


def _until(predicate, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.001)


def test_it_behaves_as_a_lock():
    lock = DeviceLock()
    assert not lock.locked()
    with lock:
        assert lock.locked()
        assert not lock.acquire(False)  # not reentrant, as threading.Lock
        assert not lock.acquire(True, 0.01)
    assert not lock.locked() and lock.waiting[0] == 0
    assert lock.acquire()
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()


def test_a_thread_blocked_on_it_is_counted_until_it_gets_it():
    lock = DeviceLock()
    got = threading.Event()
    lock.acquire()

    def waiter():
        with lock:
            got.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    _until(lambda: lock.waiting[0] == 1)
    assert not got.is_set()
    lock.release()
    thread.join(30)
    assert got.is_set() and lock.waiting[0] == 0


def test_a_timed_out_wait_leaves_the_count_as_it_was():
    lock = DeviceLock()
    lock.acquire()
    results = []
    thread = threading.Thread(target=lambda: results.append(lock.acquire(True, 0.05)))
    thread.start()
    thread.join(30)
    assert results == [False] and lock.waiting[0] == 0
    lock.release()


def test_a_wait_on_its_condition_is_counted_and_notified():
    lock = DeviceLock()
    state = {"ready": False, "woke": False}

    def waiter():
        with lock:
            while not state["ready"]:
                lock.wait_idle()
            state["woke"] = True

    thread = threading.Thread(target=waiter)
    thread.start()
    _until(lambda: lock.waiting[0] == 1)
    with lock:
        state["ready"] = True
        lock.idle.notify_all()
    thread.join(30)
    assert state["woke"] and lock.waiting[0] == 0


def test_many_threads_leave_the_count_at_zero():
    lock = DeviceLock()
    total = [0]

    def worker():
        for _ in range(2000):
            with lock:
                total[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert total[0] == 12000 and lock.waiting[0] == 0


def test_let_one_in_returns_once_a_blocked_thread_has_had_the_lock():
    lock = DeviceLock()
    lock.acquire()
    had = threading.Event()

    def waiter():
        with lock:
            had.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    _until(lambda: lock.waiting[1] == 1)
    handed = lock.waiting[2]
    lock.release()
    lock.let_one_in(seconds=30)  # (bounded: a lost wake-up would fail the assertion, not hang)
    assert had.is_set() or lock.locked() or lock.waiting[2] == handed + 1
    thread.join(30)
    assert lock.waiting[2] == handed + 1 and lock.waiting[1] == 0


def test_a_timed_out_wait_is_not_counted_as_handed_over():
    lock = DeviceLock()
    lock.acquire()
    thread = threading.Thread(target=lambda: lock.acquire(True, 0.05))
    thread.start()
    thread.join(30)
    assert lock.waiting[2] == 0
    lock.release()
