"""fio's token-based flow control between jobs: jobs with the same flow_id keep their
shares of the group's I/Os in the ratio of their `flow` weights. Before each batch a
job checks its share of the group's count against its weight's share of the group's
total weight; while ahead it sleeps flow_sleep microseconds (fio busy-retries with 0;
here at least FLOOR_US, so a waiting job gives the CPU to the others).

Granularity: fio looks before every I/O and, with flow_sleep, completes the I/O in
flight (io_u_quiesce) before it sleeps; here a job looks before each batch, and with
flow_sleep the batch is the I/Os it may issue before it is ahead again (run from an
empty queue, as after fio's quiesce: a job of weight 8 against one of weight 1 runs
about 8 at a time, the other 1). With flow_sleep=0 fio spins without completing what is
in flight, and a batch is at most max(iodepth, runner.FLOW_BATCH) I/Os.
"""
from __future__ import annotations

import threading
import time

FLOOR_US = 50


class FlowGroup:
    def __init__(self):
        self.total_weight = 0
        self.count = 0
        self.lock = threading.Lock()


class FlowTicket:
    """One job clone's place in its flow group."""

    def __init__(self, group: FlowGroup, weight: int, sleep_us: int, stop: threading.Event):
        self.group, self.weight, self.sleep_us, self.stop = group, weight, sleep_us, stop
        self.count = 0
        self.joined = self.left = False

    def join(self) -> None:
        """The job starts: from now on the group's shares count its weight (a job of a
        later stonewall phase holds no one back before it runs)."""
        with self.group.lock:
            self.group.total_weight += self.weight
        self.joined = True

    def wait_turn(self, deadline_ns: int) -> int | None:
        """Return once this job is not ahead of its share, its deadline (the job's
        run time) has passed, or it is told to stop: with flow_sleep, how many I/Os it may
        issue before it is ahead again (fio's check before each I/O, counted ahead);
        None when it may issue any number."""
        group = self.group
        while not self.stop.is_set() and time.monotonic_ns() < deadline_ns:
            with group.lock:
                count, total, weight = group.count, group.total_weight, self.weight
                ahead = count and self.count / count > weight / total
            if not ahead:
                return self.allowance(self.count, count, weight, total) if self.sleep_us else None
            time.sleep(max(self.sleep_us, FLOOR_US) / 1e6)
        return None

    @staticmethod
    def allowance(mine: int, count: int, weight: int, total: int) -> int | None:
        """I/Os in a row fio lets a job issue: the j-th (from 0) goes while
        (mine + j) / (count + j) <= weight / total (or while the group has counted none)."""
        if weight >= total:
            return None  # alone in its group: never ahead
        if count == 0:
            return 1  # (fio lets the first I/O of a group go; after it the job is at 1/1)
        # mine + j <= r (count + j)  <=>  j <= (r count - mine) / (1 - r), with r = weight / total
        return max(1, (weight * count - total * mine) // (total - weight) + 1)

    def did(self, ios: int) -> None:
        with self.group.lock:
            self.group.count += ios
        self.count += ios

    def leave(self) -> None:
        """The job has finished (or failed): the others no longer keep pace with it."""
        if self.left or not self.joined:
            return
        self.left = True
        with self.group.lock:
            self.group.total_weight -= self.weight
            self.group.count -= self.count
        self.count = 0


def tickets(workers: list) -> dict[int, FlowTicket]:
    """Tickets for the workers whose jobs set flow, by id(worker)."""
    groups: dict[int, FlowGroup] = {}
    out = {}
    for w in workers:
        weight = w.job["flow"]
        if not weight:
            continue
        group = groups.setdefault(w.job["flow_id"], FlowGroup())
        out[id(w)] = FlowTicket(group, abs(weight), w.job["flow_sleep"], w._stop)
    return out
