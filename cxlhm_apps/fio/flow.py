"""fio's token-based flow control between jobs: jobs with the same flow_id keep their
shares of the group's I/Os in the ratio of their `flow` weights.

The rule is fio's (flow.c), checked for every I/O: an I/O may go while the job's count
divided by the group's count is not above the job's weight divided by the group's total
weight. The group's count starts at one, and an I/O is counted when its check passes,
before it is issued, so the others see it at once. A job whose check fails sleeps
flow_sleep microseconds and looks again (here at least FLOOR_US, so a waiting job gives
the CPU to the others); with flow_sleep fio first completes what it has in flight
(io_u_quiesce).

Granularity: the runner runs batches, so a check here answers how many I/Os in a row
the rule lets the job issue from the counts as they stand (`allowance`), and counts
them all at once; what the batch did not issue (its deadline came) is given back. With
flow_sleep the batch runs from an empty queue, as after fio's quiesce, so the depths
come out as fio's: with weights 1 and 8 the light job issues 2 at a time and the heavy
one about 16, since the group's initial count of one leaves the heavy job a weight's
worth of slack. With flow_sleep=0 fio spins on the check without completing what is
in flight; here the job then runs batches of up to max(iodepth, runner.FLOW_BATCH)
I/Os, counted as they complete, and checks between them.

Membership: the jobs of a stonewall phase join their groups together before any of
them starts (a job waiting for another of its phase joins when it starts), and a job
leaves when it ends, taking its count with it, as fio's flow_exit_job does. fio adds
every job's weight when it parses the file, so there a flow job of a later phase holds
the earlier ones back and a job file like that never ends; here it counts from its
phase on.
"""
from __future__ import annotations

import threading
import time

from cxlhm_apps.fio.clocks import ModelTimeScheduler

FLOOR_US = 50


class FlowGroup:
    def __init__(self):
        self.total_weight = 0
        self.count = 1  # (fio's starts at one: a job's first check sees 0/1)
        self.lock = threading.Lock()


def allowance(mine: int, count: int, weight: int, total: int) -> int | None:
    """How many I/Os in a row fio's check lets a job issue from these counts: the j-th
    (from 0) goes while (mine + j) / (count + j) <= weight / total, each I/O counted
    as it goes. 0 when the job is ahead now; None when it never can be (it holds the
    group's whole weight)."""
    if weight >= total:
        return None
    slack = weight * count - total * mine
    if slack < 0:
        return 0
    # mine + j <= r (count + j)  <=>  j (total - weight) <= weight count - total mine
    return slack // (total - weight) + 1


class FlowTicket:
    """One job clone's place in its flow group."""

    def __init__(self, group: FlowGroup, weight: int, sleep_us: int, stop: threading.Event):
        self.group, self.weight, self.sleep_us, self.stop = group, weight, sleep_us, stop
        self.count = 0
        self.reserved: int | None = None  # I/Os counted ahead for the batch now running
        self.joined = self.left = False

    def join(self) -> None:
        """From now on the group's shares count this job's weight (once)."""
        if self.joined:
            return
        with self.group.lock:
            self.group.total_weight += self.weight
        self.joined = True

    def take(self, most: int | None = None) -> int | None:
        """One look at the rule: how many I/Os (at most `most`) the job may issue now,
        counted at once (0: it is ahead; None: any number, counted by `did` once done,
        the job being alone in its group or spinning with flow_sleep=0)."""
        group = self.group
        with group.lock:
            n = allowance(self.count, group.count, self.weight, group.total_weight)
            if n is None or n == 0:
                return n
            if not self.sleep_us:
                return None
            if most is not None:
                n = min(n, max(most, 1))
            group.count += n
        self.count += n
        self.reserved = n
        return n

    def wait_turn(self, deadline_ns: int, most: int | None = None, now=time.monotonic_ns) -> int | None:
        """`take`, sleeping flow_sleep between looks while the job is ahead, until it may
        issue, its deadline (on the clock `now`) has passed, or it is told to stop (then
        None: the engine's own deadline check ends the batch)."""
        while not self.stop.is_set() and now() < deadline_ns:
            n = self.take(most)
            if n != 0:
                return n
            time.sleep(max(self.sleep_us, FLOOR_US) / 1e6)
        return None

    def did(self, ios: int) -> None:
        """The batch has run `ios` I/Os: those `take` counted ahead and did not issue go
        back; without a count ahead, the batch's I/Os are counted now."""
        change = ios if self.reserved is None else ios - self.reserved
        self.reserved = None
        if change:
            with self.group.lock:
                self.group.count += change
            self.count += change

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
    """Tickets for the workers whose jobs set flow, by id(worker). A job on the model
    clock is refused (JobFileError): a job ahead there would wait, in wall time, for
    another whose next I/O waits for the first one's turn in model time."""
    groups: dict[int, FlowGroup] = {}
    out = {}
    for w in workers:
        weight = w.job["flow"]
        if not weight:
            continue
        if isinstance(getattr(w.engine, "clock", None), ModelTimeScheduler):
            raise w.job.error("flow", "flow control needs wall time (on the model clock a job ahead of its share "
                                      "never lets model time pass for the others); use cxlhm_clock=wall")
        group = groups.setdefault(w.job["flow_id"], FlowGroup())
        out[id(w)] = FlowTicket(group, abs(weight), w.job["flow_sleep"], w._stop)
    return out


def join_phase(workers: list, waiting: set[int]) -> None:
    """The flow jobs of a phase join their groups before any of them starts (fio counts
    every job's weight from the start, so none runs alone at first), except those in
    `waiting` (ids of workers that wait for another job of the phase: they join when
    they start)."""
    for w in workers:
        if w.flow is not None and id(w) not in waiting:
            w.flow.join()
