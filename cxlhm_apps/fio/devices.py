"""The devices of a run's `ioengine=cxlhm` jobs: one device per backing file, shared by
every clone that names it, sized for all of them, opened before the first phase; and the
rule that keeps a device's image the device's alone (a job of fio's own engines on the
same file would change it behind the device's back)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from cxlhm.config import ConfigError, load_config
from cxlhm_apps.fio import clocks, files
from cxlhm_apps.fio.engines import DeviceShare, engine_of, warm_stream
from cxlhm_apps.fio.jobfile import JobSpec
from firmware_policies.base import PolicyParamError

if TYPE_CHECKING:
    from cxlhm_apps.fio.plan import ClonePlan


def check_images_stay_the_devices(plans: list[ClonePlan]) -> None:
    """A file that a job uses as a device's image is the device's alone: a job of fio's
    own engines writing it (or reading it half-written) would go behind the device's back."""
    images = {os.path.realpath(p.filename): p.job for p in plans if engine_of(p.job).uses_device}
    for plan in plans:
        device_job = images.get(os.path.realpath(plan.filename))
        if device_job is not None and not engine_of(plan.job).uses_device:
            raise plan.job.error("filename", f"{plan.filename} is the image of the device job {device_job.name!r} "
                                             f"uses; ioengine={plan.job['ioengine']} would change it behind the "
                                             "device's back (give this job a file of its own, or ioengine=cxlhm)")


_DEVICE_OPTION_FOR_KEY = {"dram_bytes": "cxlhm_dram", "block_size": "cxlhm_block_size",
                          "firmware.policy": "cxlhm_policy", "firmware.params": "cxlhm_policy", "clock": "cxlhm_clock"}


def _option_for_key(job: JobSpec, key: str) -> str | None:
    """The job option a device configuration error is about (None: the device's
    configuration as a whole, when no option of the job set it)."""
    if key in _DEVICE_OPTION_FOR_KEY:
        return _DEVICE_OPTION_FOR_KEY[key]
    if key.startswith("backend."):
        return "filename"
    if key == "capacity":
        return "size"
    return "cxlhm_profile" if job["cxlhm_profile"] else None


def _device_settings(job: JobSpec) -> tuple:
    return tuple(job[name] for name in ("cxlhm_profile", "cxlhm_policy", "cxlhm_dram", "cxlhm_block_size", "cxlhm_clock"))


def open_devices(plans: list[ClonePlan], log=None) -> dict[str, DeviceShare]:
    """One device per backing file, sized for every clone that uses it. `log` hears of
    each image the device had to grow past what the jobs use."""
    from host_runtime.driver import open_device

    by_path: dict[str, list[ClonePlan]] = {}
    for plan in plans:
        if engine_of(plan.job).uses_device:
            by_path.setdefault(os.path.realpath(plan.filename), []).append(plan)
    shares: dict[str, DeviceShare] = {}
    try:
        for path, users in by_path.items():
            first = users[0].job
            for other in users[1:]:
                if _device_settings(other.job) != _device_settings(first):
                    raise other.job.error("cxlhm_profile", f"uses the same device ({path}) as job {first.name!r} "
                                          "with different cxlhm_* settings")
            shares[path] = _open_device(first, path, max(p.file_end for p in users), open_device, log)
    except BaseException:
        for share in shares.values():
            share.handle.close()
        raise
    return shares


def _open_device(job: JobSpec, path: str, needed: int, open_device, log=None) -> DeviceShare:
    overrides: dict = {"backend": {"path": path}}
    if job["cxlhm_policy"]:
        overrides["firmware"] = {"policy": job["cxlhm_policy"]}
    if job["cxlhm_dram"]:
        overrides["dram_bytes"] = job["cxlhm_dram"]
    if job["cxlhm_block_size"]:
        overrides["block_size"] = job["cxlhm_block_size"]
    try:
        cfg = load_config(job["cxlhm_profile"], overrides)
        clock_name = job["cxlhm_clock"] or cfg.clock
        if clock_name == "model" and clocks.model_clock_unavailable():
            raise job.error("cxlhm_clock" if job["cxlhm_clock"] else "cxlhm_profile", clocks.model_clock_unavailable())
        # The device is sized to the jobs' region (at least its DRAM), plus two scratch
        # blocks past it that warm up the compiled access paths before any job starts.
        block = cfg.block_size
        capacity = -(-max(needed, cfg.dram_bytes) // block) * block + 2 * block
        cfg = load_config(job["cxlhm_profile"], {**overrides, "capacity": capacity, "clock": clock_name})
        before = os.path.getsize(path) if os.path.isfile(path) else 0
        handle = open_device(cfg)
    except ConfigError as exc:
        raise job.error(_option_for_key(job, exc.key), str(exc)) from None
    except PolicyParamError as exc:
        raise job.error("cxlhm_policy", str(exc)) from None
    except OSError as exc:
        raise files.setup_error(job, path, exc, "cannot open the device's image") from None
    scratch = np.zeros(block, np.uint8)
    first = capacity - 2 * block
    if clock_name == "wall":  # a dirty block would cost the model clock a write-back later in the job
        handle.writev(np.array([first]), block, scratch)  # compile the write and read paths now
    handle.readv(np.array([first]), block, scratch)
    warm_stream(handle, capacity - block, scratch)
    after = os.path.getsize(path) if os.path.isfile(path) else 0
    if log is not None and after > max(before, needed):
        log(_grown_notice(path, before, after, needed, cfg.dram_bytes, block))
    return DeviceShare(handle, clocks.clock_for(clock_name, handle))


def _grown_notice(path: str, before: int, after: int, needed: int, dram: int, block: int) -> str:
    """What a user whose file the device grew past the jobs' region is told, and why."""
    def size(n: int) -> str:
        return f"{n} bytes ({n / 2**20:.1f} MiB)" if n >= 2**20 else f"{n} bytes"
    why = [f"the jobs use {size(needed)}"]
    if dram > needed:
        why.append(f"a device's capacity is at least its DRAM, {size(dram)} (cxlhm_dram sets it)")
    why.append(f"2 blocks of {block} bytes past them warm up the device's I/O paths")
    return (f"cxlhm fio: {path}: the device grew its image from {size(before)} to {size(after)}: "
            + "; ".join(why))


def describe_device(share: DeviceShare) -> dict:
    cfg = share.handle.config
    return {"backing_file": cfg.backend.path, "profile": cfg.name, "policy": cfg.firmware.policy,
            "dram_bytes": cfg.dram_bytes, "block_size": cfg.block_size, "capacity": cfg.capacity,
            "clock": share.clock.name}
