"""fio options this tool knows by name but does not model, with the reason: a job file
that uses one is refused with that reason (never run with the option dropped).

Only options met in real job files are listed (fio's examples among them); any other
unknown name gets the generic "unknown or unsupported option" with a close match.
"""
from __future__ import annotations

_HARDWARE = "needs hardware or a kernel interface absent from a plain file"
_ENGINE = "belongs to an ioengine that is not modelled (fio's file engines and cxlhm are)"

NOT_MODELLED_WHY: dict[str, str] = {
    # zoned block devices, NVMe commands, protection information
    **{name: "zoned block devices (zonemode=zbd) are not modelled; zonemode=strided is" for name in (
        "max_open_zones", "zone_reset_threshold", "zone_reset_frequency", "read_beyond_wp")},
    **{name: f"NVMe passthrough / protection information: {_HARDWARE}" for name in (
        "cmd_type", "pi_chk", "pi_act", "apptag", "apptag_mask", "md_per_io_size", "fdp", "fdp_pli",
        "write_mode", "num_range", "readfua", "writefua", "atomic")},
    # (cmdprio*, prioclass, prio: options of ioengine=libaio and io_uring, cmdprio.py)
    # engines that are not modelled
    **{name: _ENGINE for name in (
        "sg_write_mode", "hostname", "port", "protocol", "listen", "pingpong", "https", "http_verbose",
        "http_mode", "http_host", "http_s3_region", "http_s3_keyid", "http_s3_key", "http_swift_auth_token",
        "http_s3_storage_class", "http_s3_sse_customer_key", "http_s3_sse_customer_algorithm", "cpuload",
        "cpumode", "program", "arguments", "pool", "rbdname", "clientname", "gpu_dev_ids", "gpu_dev_id",
        "cuda_io", "rocm_io", "libblkio_path", "libblkio_driver", "nfs_url", "volume", "brick", "conf",
        "donorname", "inplace", "std_redirect", "uri", "busy_poll", "verb")},
    # (the options of modelled engines that are refused - io_uring's sqthread_poll, libaio's
    # userspace_reap, ... - are refused by their engine's declaration: IOEngineOps.refused)
    # workload features not modelled
    "rate_ignore_thinktime": "rate_ignore_thinktime is not modelled (think time counts against the rate)",
    "thinkcycles": "thinkcycles is not modelled (thinktime is)",
    "verify_state_save": "verify state saved for a later run is not modelled",
    "verify_state_load": "verify state saved by an earlier run is not modelled",
    "verify_write_sequence": "verify_write_sequence is not modelled",
    "sync_file_range": "sync_file_range is not modelled (fsync and fdatasync are)",
    "write_barrier": "write_barrier is not modelled (fsync and fdatasync are)",
    "ignore_error": "ignore_error is not modelled (a failed I/O ends the job)",
    "log_max_value": "a window's largest value in the logs is not modelled (log_avg_msec logs the mean)",
    "ioscheduler": "choosing a block device's I/O scheduler needs the device's sysfs queue (a plain file has none)",
    "cgroup": "cgroup placement is not modelled", "cgroup_weight": "cgroup placement is not modelled",
    "cgroup_nodelete": "cgroup placement is not modelled",
    "uid": "running a job as another user is not modelled", "gid": "running a job as another group is not modelled",
    "error_dump": "error_dump is not modelled",
    "random_sequence_stride": "random_sequence_stride is not modelled",
    "block_error_percentiles": "block error percentiles need trim/error counters not modelled",
    "grace_time": _ENGINE, "ttl": _ENGINE, "skip_bad": "MTD devices are not modelled",
    "cont": _ENGINE,
    **{name: "merging blktrace files is not modelled (read_iolog replays fio's own trace formats)" for name in (
        "merge_blktrace_file", "merge_blktrace_scalars", "merge_blktrace_iters")},
}
