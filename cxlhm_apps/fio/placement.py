"""Where and how a job's thread runs: fio's cpus_allowed, cpumask, cpus_allowed_policy and
nice. They apply to the job's own thread (its side thread, an engine's helper threads and
the device's threads run as they are)."""
from __future__ import annotations

import os
import threading


def parse_cpu_list(text: str, kb_base: int) -> frozenset[int]:
    """fio's cpus_allowed: CPU numbers and ranges (0-3,6), each on this machine."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"expected CPU numbers and ranges such as 0-3,6; got {text!r}")
        cpus.update(range(int(low), int(high or low) + 1))
    return _on_this_machine(cpus, text)


def parse_cpu_mask(text: str, kb_base: int) -> frozenset[int]:
    """fio's cpumask: a bit per CPU (0x3: CPUs 0 and 1)."""
    try:
        mask = int(text.strip(), 0)
    except ValueError:
        raise ValueError(f"expected a bit mask such as 0x3; got {text!r}") from None
    return _on_this_machine({bit for bit in range(mask.bit_length()) if mask >> bit & 1}, text)


def _on_this_machine(cpus: set[int], text: str) -> frozenset[int]:
    have = os.cpu_count() or 1
    if not cpus or max(cpus) >= have:
        raise ValueError(f"{text!r} names CPUs this machine does not have (it has 0-{have - 1})")
    return frozenset(cpus)


def pin(job, thread_number: int) -> None:
    """The calling thread on the job's CPUs (split: on one of them, by fio's thread number,
    counted from 1 over every job and clone of the run), at the job's nice value."""
    if job["nice"]:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), job["nice"])
    cpus = job["cpus_allowed"] or job["cpumask"]
    if cpus:
        if job["cpus_allowed_policy"] == "split":
            cpus = {sorted(cpus)[(thread_number - 1) % len(cpus)]}
        os.sched_setaffinity(0, cpus)
