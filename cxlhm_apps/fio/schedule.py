"""When each job clone of a phase starts and stops, beyond "all at once": `startdelay`
(a clone starts once that long has passed since the run began - fio's genesis, so a later
phase waits only for what is left of it; a range LO-HI gives each clone its own draw,
fio's: from the clone's start-delay generator, in microseconds), `wait_for`
(a job starts once every clone of the named, earlier job has finished) and `exitall`
(or `exitall_on_error`, for a job that failed)
with `exit_what` (a job that finishes ends the others: those of its reporting group,
every running one (`stonewall`, the next phase still runs), or every one (`all`, no
later phase runs)), as fio does. The phase's flow jobs join their flow groups before
any of them starts (flow.join_phase).
"""
from __future__ import annotations

import threading
import time

from cxlhm_apps.fio import fiorand, flow


def start_delay_ns(job, thread_number: int, seed: int) -> int:
    """The clone's startdelay: LO, or for a range a draw of fio's rand_between(LO, HI)
    in microseconds from the clone's generator (seeded as fio seeds its delay_state)."""
    low, high = job["startdelay"]
    if high == low:
        return low
    seeds = fiorand.FioSeeds.of_job(job, thread_number, seed)
    use64 = job["random_generator"] == "tausworthe64"
    state = fiorand.rand_state(fiorand.job_seed(seeds.randseed, thread_number, fiorand.RAND_START_DELAY_OFF), use64)
    return int(fiorand.rand_between(state, low // 1000, high // 1000, use64)) * 1000


def run_phase(workers: list, genesis_ns: int) -> bool:
    """Run one phase's workers in threads until every one has finished (each after its
    startdelay, counted from `genesis_ns` on the monotonic clock). True when a job with
    exit_what=all ended the whole run."""
    finished: dict[str, threading.Event] = {}
    left: dict[str, int] = {}
    for w in workers:
        finished.setdefault(w.job.name, threading.Event())
        left[w.job.name] = left.get(w.job.name, 0) + 1
    lock = threading.Lock()
    end_all = threading.Event()
    waiting = {id(w) for w in workers if w.job["wait_for"] in finished and w.job["wait_for"] != w.job.name}
    flow.join_phase(workers, waiting)

    def one(w) -> None:
        try:
            delay_left = genesis_ns + start_delay_ns(w.job, w.thread_number, w.seed) - time.monotonic_ns()
            if delay_left > 0:
                w.wait_stopped(delay_left / 1e9)  # (another job's exitall may end it meanwhile)
            waitee = w.job["wait_for"]
            if waitee and waitee in finished and waitee != w.job.name:
                finished[waitee].wait()  # (a waitee of an earlier phase has finished already)
            if w.stopped or w.job["create_only"]:
                w.state = "D"  # ended by another job's exitall before it began, or only its file set up: no I/O
            else:
                w.run()
        finally:
            if w.flow is not None:  # (one ended before it began holds its flow group back no longer)
                w.flow.leave()
            with lock:
                left[w.job.name] -= 1
                if left[w.job.name] == 0:
                    finished[w.job.name].set()
                if w.job["exitall"] or (w.job["exitall_on_error"] and w.stats.error):
                    what = w.job["exit_what"]
                    for other in workers:
                        if other is not w and (what != "group" or other.plan.groupid == w.plan.groupid):
                            other.stop()
                    if what == "all":
                        end_all.set()

    threads = [threading.Thread(target=one, args=(w,), name=f"cxlhm-fio-{w.job.name}.{w.plan.clone}")
               for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return end_all.is_set()
