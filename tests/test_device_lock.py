"""The device lock (cxlhm/device/lock.py): threading.Lock's behaviour, and its count of
the threads waiting for the device - blocked on it, or waiting on its condition - which
a stream's compiled loop reads to decide whether its time slice may go on."""
import queue
import threading
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

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


class _Worker:
    """A thread that runs the lock operations it is sent, one at a time, and reports each
    one's end on a shared queue (worker, what)."""

    def __init__(self, lock: DeviceLock, name: int, events: "queue.Queue"):
        self.lock, self.name, self.events = lock, name, events
        self.commands: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            command = self.commands.get()
            if command == "stop":
                return
            if command in ("release", "release+acquire"):
                self.lock.release()
                self.events.put((self.name, "released"))
            if command == "try":
                self.events.put((self.name, "got" if self.lock.acquire(False) else "refused"))
            if command in ("acquire", "release+acquire"):
                self.lock.acquire()
                self.events.put((self.name, "got"))


def _next_event(events):
    return events.get(timeout=30)  # (bounded: a lost hand-over fails, not hangs)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@example(threads=3, steps=[("ask", 0), ("ask", 1), ("again", 0), ("again", 1), ("release", 0)])
@example(threads=4, steps=[("ask", 0), ("ask", 1), ("ask", 2), ("ask", 3), ("release", 0), ("release", 0),
                           ("try", 0), ("again", 2), ("release", 0), ("release", 0)])
@given(threads=st.integers(2, 4), steps=st.lists(st.tuples(st.sampled_from(("ask", "release", "again", "try")),
                                                           st.integers(0, 3)), max_size=25))
def test_the_lock_goes_to_the_threads_blocked_on_it_in_the_order_they_asked(threads, steps):
    """A model of the hand-over: the holder, and the threads blocked on it in order. A
    release goes to the oldest blocked thread, a thread that asks again right after its
    release (a stream between two slices) queues behind those, and a free lock is taken
    at once. Each step waits for what the model says (a hand-over, or a count of blocked
    threads), so the order decides it, never a timing."""
    lock, events = DeviceLock(), queue.Queue()
    workers = [_Worker(lock, name, events) for name in range(threads)]
    holder, blocked = None, []
    try:
        for action, who in steps:
            who %= threads
            if action == "release" or action == "again":
                if holder is None:
                    continue
                releaser = holder
                workers[releaser].commands.put("release" if action == "release" else "release+acquire")
                holder = blocked.pop(0) if blocked else None
                if action == "again":
                    if holder is None:
                        holder = releaser  # nobody waited: it takes the free lock again
                    else:
                        blocked.append(releaser)  # behind those that waited
                wanted = {(releaser, "released")} | ({(holder, "got")} if holder is not None else set())
                assert {_next_event(events) for _ in wanted} == wanted
                _until(lambda: lock.waiting[1] == len(blocked))
            elif who == holder or who in blocked:
                continue
            elif action == "try":
                workers[who].commands.put("try")
                got = _next_event(events)
                assert got == (who, "got" if holder is None else "refused")
                if holder is None:
                    holder = who
            else:  # ask
                workers[who].commands.put("acquire")
                if holder is None:
                    assert _next_event(events) == (who, "got")
                    holder = who
                else:
                    blocked.append(who)
                    _until(lambda: lock.waiting[1] == len(blocked))
            assert lock.locked() == (holder is not None)
            assert lock.waiting[1] == len(blocked) and lock.waiting[0] == len(blocked)
    finally:  # let every worker go: the holder releases until nobody waits
        while holder is not None:
            workers[holder].commands.put("release")
            _next_event(events)
            holder = blocked.pop(0) if blocked else None
            if holder is not None:
                _next_event(events)
        for worker in workers:
            worker.commands.put("stop")
            worker.thread.join(30)
    assert not lock.locked() and lock.waiting[1] == 0


def test_a_timed_out_wait_is_not_counted_as_handed_over():
    lock = DeviceLock()
    lock.acquire()
    thread = threading.Thread(target=lambda: lock.acquire(True, 0.05))
    thread.start()
    thread.join(30)
    assert lock.waiting[2] == 0
    lock.release()
