"""The compiled kernels a run's jobs will use, loaded before any job's clock starts:
each takes 5-10 ms from numba's cache (seconds, cold), against the ~1 ms a small job runs."""
from __future__ import annotations

from cxlhm_apps.fio import buffers, fiorand
from cxlhm_apps.fio import verify as VF


def warm_up(plans) -> None:
    for kind in {VF.TYPES.get(plan.job["verify"], 0) for plan in plans}:
        VF.warm_up(kind)
    if any(plan.job["rw"].mixed or plan.job["rw"].random for plan in plans):
        fiorand.warm_up()  # (fio's direction, offset and size draws)
    if any(plan.job["rw"].writes for plan in plans):
        buffers.warm_up()  # (scramble_buffers, refill_buffers)
