"""When each job clone of a phase starts and stops, beyond "all at once": `wait_for`
(a job starts once every clone of the named, earlier job has finished) and `exitall`
with `exit_what` (a job that finishes ends the others: those of its reporting group,
every running one (`stonewall`, the next phase still runs), or every one (`all`, no
later phase runs)), as fio does. The phase's flow jobs join their flow groups before
any of them starts (flow.join_phase).
"""
from __future__ import annotations

import threading

from cxlhm_apps.fio import flow


def run_phase(workers: list) -> bool:
    """Run one phase's workers in threads until every one has finished. True when a job
    with exit_what=all ended the whole run."""
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
            waitee = w.job["wait_for"]
            if waitee and waitee in finished and waitee != w.job.name:
                finished[waitee].wait()  # (a waitee of an earlier phase has finished already)
            if w.stopped:
                w.state = "D"  # ended by another job's exitall before it began: no I/O, as in fio
            else:
                w.run()
        finally:
            if w.flow is not None:  # (one ended before it began holds its flow group back no longer)
                w.flow.leave()
            with lock:
                left[w.job.name] -= 1
                if left[w.job.name] == 0:
                    finished[w.job.name].set()
                if w.job["exitall"]:
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
