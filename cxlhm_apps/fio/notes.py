"""What fio says about a run's jobs before it runs them: an iodepth a synchronous engine
caps at 1, and options accepted but not applied here (placement only, priorities the
device does not order by, completion batching)."""
from __future__ import annotations

from cxlhm_apps.fio.jobfile import JobSpec


def notes(jobs: list[JobSpec]) -> list[str]:
    """What fio would say about the jobs before running them, and options accepted but
    not applied here."""
    from cxlhm_apps.fio.cmdprio import device_note
    from cxlhm_apps.fio.options import NOT_MODELLED
    from cxlhm_apps.fio.ioengine import engine_ops
    out = []
    if any(j["iodepth"] > 1 and engine_ops(j["ioengine"]).sync for j in jobs):  # (fio's FIO_SYNCIO engines)
        out.append("note: both iodepth >= 1 and synchronous I/O engine are selected, queue depth will be capped at 1")
    for job in jobs:
        for name in NOT_MODELLED:
            if name in job.given:
                path, line = job.where(name)
                out.append(f"note: {path}:{line}: job {job.name!r}: {name} is accepted but not modelled "
                           "(placement only; the job runs where the OS puts it)")
        if engine_ops(job["ioengine"]).uses_device and (prio_note := device_note(job)):
            out.append(prio_note)
        for name in ("iodepth_batch_complete_min", "iodepth_batch_complete_max"):
            if name in job.given:
                path, line = job.where(name)
                out.append(f"note: {path}:{line}: job {job.name!r}: {name} is accepted, not applied: completions "
                           "are reaped as they come (the I/O is the same; iodepth_complete shows the batches taken)")
        if job["clocksource"] != "clock_gettime" or "gtod_cpu" in job.given:
            name = "gtod_cpu" if "gtod_cpu" in job.given else "clocksource"
            path, line = job.where(name)
            out.append(f"note: {path}:{line}: job {job.name!r}: {name} is accepted; every time here is "
                       "clock_gettime(CLOCK_MONOTONIC)'s")
        if job["io_submit_mode"] == "offload":
            path, line = job.where("io_submit_mode")
            out.append(f"note: {path}:{line}: job {job.name!r}: io_submit_mode=offload is accepted; the job "
                       "submits its I/O from its own thread (the same I/O, without offload's hand-over)")
        if "random_generator" in job.given and job["random_generator"] == "lfsr":
            path, line = job.where("random_generator")
            out.append(f"note: {path}:{line}: job {job.name!r}: random_generator={job['random_generator']} is "
                       "accepted; its offsets come from cxlhm's generator (each block once per pass, the "
                       "sequence not fio's)")
    return list(dict.fromkeys(out))
