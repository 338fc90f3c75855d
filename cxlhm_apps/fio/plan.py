"""Planning a run: each job's clones, their files, regions and phases (fio's own layout
rules: offset, offset_increment, size against filesize, stonewall phases), and what
each clone's generator needs from its plan (random seed, block alignment, where a
`loops` pass ends, where strided zones wrap)."""
from __future__ import annotations

import dataclasses
import os

from cxlhm_apps.fio import files
from cxlhm_apps.fio.devices import check_images_stay_the_devices
from cxlhm_apps.fio.engines import engine_of
from cxlhm_apps.fio.iolog_replay import ReplayLog, apply_to_job
from cxlhm_apps.fio.jobfile import JobSpec
from cxlhm_apps.fio.options import READ, WRITE
from cxlhm_apps.fio.pattern import size_choices
from cxlhm_apps.fio.values import Percent


@dataclasses.dataclass
class ClonePlan:
    job: JobSpec
    clone: int
    groupid: int
    phase: int
    filename: str
    region_start: int
    region_len: int
    file_end: int  # bytes of the file this clone touches (offset + size)
    replay: ReplayLog | None = None  # read_iolog's log, whose I/O the clone replays


def resolve_share(value, total: int | None, job: JobSpec, name: str, align: int = 1) -> int:
    if isinstance(value, Percent):
        if not total:
            raise job.error(name, f"{value} needs an existing file to take a share of")
        return value.of(total, align)
    return int(value)


def plan_clones(jobs: list[JobSpec]) -> list[ClonePlan]:
    plans: list[ClonePlan] = []
    groupid, phase = 0, 0
    for k, job in enumerate(jobs):
        if k and (job["stonewall"] or job["new_group"]):
            groupid += 1
        if k and job["stonewall"]:
            phase += 1
        replay = apply_to_job(job) if job["read_iolog"] else None  # (the job takes the log's shape)
        sizes = size_choices(job.values)
        active = [sizes[d] for d in (READ, WRITE) if (job["rw"].reads, job["rw"].writes)[d]]
        min_bs, max_bs = min(c.min for c in active), max(c.max for c in active)
        if engine_of(job).uses_device:
            files.check_profile(job)
        diskless = engine_of(job).diskless
        for clone in range(job["numjobs"]):
            filename = files.job_filename(job, clone)
            existing = 0
            if not diskless:
                files.check_target(job, filename)
                existing = os.path.getsize(filename) if os.path.isfile(filename) else 0
            known = job["filesize"] or existing  # fio: filesize is the file's size, size the I/O's
            offset = resolve_share(job["offset"], known, job, "offset", min_bs)
            offset += clone * resolve_share(job["offset_increment"], known, job, "offset_increment", min_bs)
            if job["file_append"]:  # (fio: as offset= the file's size)
                offset += existing
            if job["size"] is None:
                if known <= offset:
                    raise job.error("size", f"size= is needed: ioengine={job['ioengine']} has no file to take it "
                                            "from" if diskless else
                                    f"size= is needed: {filename} does not exist or is empty")
                size = known - offset
            else:
                size = resolve_share(job["size"], known, job, "size", min_bs)
                if job["filesize"]:  # the I/O stays inside the file
                    size = min(size, max(job["filesize"] - offset, 0))
            if size < max_bs:
                raise job.error("size", f"the region ({size} bytes) is smaller than the block size ({max_bs} bytes)")
            end = max(offset + size, job["filesize"] or 0)
            plans.append(ClonePlan(job, clone, groupid, phase, filename, offset, size, end, replay))
    check_images_stay_the_devices(plans)
    return plans


def zone_file_size(job: JobSpec, plan: ClonePlan) -> int:
    """Where strided zones wrap: the file's size, as fio's real_file_size (an existing file
    larger than the job's region included; a device's image is the region's)."""
    size = plan.file_end
    if engine_of(job).plain_file and os.path.isfile(plan.filename):
        size = max(size, os.path.getsize(plan.filename))
    return size


def loop_pass_bytes(job: JobSpec, plan: ClonePlan) -> int | None:
    """The bytes after which fio starts its next `loops` pass (its do_io returns), or None
    when the whole job is one pass. fio ends a pass once the bytes it counts as issued
    reach `size` (`io_size` if larger, for random writes without the random map) - and
    counts only I/Os an engine queues: a synchronous engine's completed I/Os are never
    counted, so under psync, sync, pvsync, pvsync2 or mmap a pass ends only where the
    next I/O cannot be placed: a random job's map is full or a sequential job is at the
    file's end (taken as the region's), a region's bytes on. Without the map that never
    happens: all loops are one pass, as they are here for a sequential job of both
    directions (fio's pass ends where either direction reaches the file's end)."""
    from cxlhm_apps.fio.raw_engines import ENGINE_OPS
    ops = ENGINE_OPS.get(job["ioengine"])
    if job["time_based"]:
        # with verify, fio ends a time_based job's do_io once `size` bytes are issued, verifies
        # them and starts again, until the run time ends one (that last one is not verified);
        # a synchronous engine's I/Os are never counted as issued, so it never ends one
        from cxlhm_apps.fio.verify import verifies_each_pass
        return plan.region_len if verifies_each_pass(job) and not (ops is not None and ops.sync) else None
    if job["loops"] <= 1:
        return None
    rw = job["rw"]
    if ops is not None and ops.sync:
        dist = job["random_distribution"]
        random_map = not job["norandommap"] and (dist is None or dist.kind == "random")
        active = [pct for d, pct in enumerate(job["percentage_random"]) if (rw.reads, rw.writes)[d]]
        if rw.modifier > 1 or min(active) < 100:  # sequential I/Os leave their cells unmarked: the map fills
            random_map = False                    # later than a region's bytes on
        return plan.region_len if (random_map if rw.random else not rw.mixed) else None
    if rw.writes and rw.random and job["norandommap"] and job["io_size"]:
        return max(plan.region_len, job["io_size"])
    return plan.region_len


def loop_budget(job: JobSpec, plan: ClonePlan) -> int | None:
    """The bytes a job issues over all its `loops` (None: time_based). fio's do_io stops
    at `io_size` (else `size`) times loops in all; keep_running gives it `loops` passes,
    then more while the bytes done fall short of one `io_size` by a block or more."""
    if job["time_based"]:
        return None
    limit = job["io_size"] or plan.region_len
    budget = limit * job["loops"]
    per_pass = loop_pass_bytes(job, plan)
    if per_pass:
        passes = job["loops"]
        largest = max(choice.max for choice in size_choices(job.values))
        if limit - passes * per_pass >= largest:
            passes = -(-(limit - largest + 1) // per_pass)
        budget = min(budget, passes * per_pass)
    return budget


def blockalign(job: JobSpec) -> int | None:
    """The alignment of random offsets blockalign gives for the job's directions."""
    given = [job["blockalign"][d] for d in (READ, WRITE) if (job["rw"].reads, job["rw"].writes)[d]]
    given = [a for a in given if a]
    return min(given) if given else None



def seed_for(job: JobSpec, clone: int) -> int:
    base = job["randseed"] if job["randrepeat"] or "randseed" in job.given else int.from_bytes(os.urandom(4), "little")
    return (base * 1_000_003 + job.index * 1_009 + clone) & 0x7FFFFFFF
