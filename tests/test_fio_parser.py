"""cxlhm-fio job-file parsing: options, units, inheritance, arithmetic, errors."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio import options as O
from cxlhm_apps.fio.distributions import DistSpec
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, load_jobs, read_sections
from cxlhm_apps.fio.steadystate import SteadySpec
from cxlhm_apps.fio.values import Percent, parse_size, parse_time_ns, split_directions


def jobs_of(text: str, path: str = "job.fio"):
    return build_jobs([read_sections(text, path)])[0]


def one(text: str):
    return jobs_of(text)[0]


def error_of(text: str, path: str = "bad.fio") -> JobFileError:
    with pytest.raises(JobFileError) as info:
        jobs_of(text, path)
    return info.value


# ---------------------------------------------------------------- units

@pytest.mark.parametrize("text,kb_base,expected", [
    ("4096", 1024, 4096), ("4k", 1024, 4096), ("4K", 1024, 4096), ("4kb", 1024, 4096), ("4KiB", 1024, 4000),
    ("1m", 1024, 1 << 20), ("1g", 1024, 1 << 30), ("2t", 1024, 2 << 40), ("1p", 1024, 1 << 50),
    ("4k", 1000, 4000), ("4ki", 1000, 4096), ("1mi", 1000, 1 << 20), ("1m", 1000, 10**6),
    ("0x1000", 1024, 4096), ("1.5k", 1024, 1536), ("512b", 1024, 512),
])
def test_sizes_follow_fio_and_kb_base(text, kb_base, expected):
    assert parse_size(text, kb_base=kb_base) == expected


@pytest.mark.parametrize("text,ns", [
    ("10", 10 * 10**9), ("10s", 10 * 10**9), ("500ms", 5 * 10**8), ("500msec", 5 * 10**8), ("250us", 250_000),
    ("2m", 120 * 10**9), ("1h", 3600 * 10**9), ("1d", 86400 * 10**9), ("1.5s", 1_500_000_000),
])
def test_times_default_to_seconds(text, ns):
    assert parse_time_ns(text) == ns


def test_per_direction_values_follow_fio_comma_rules():
    assert split_directions("8k") == ["8k", "8k", "8k"]
    assert split_directions("8k,32k") == ["8k", "32k", "32k"]
    assert split_directions("8k,32k,") == ["8k", "32k", None]
    assert split_directions(",8k") == [None, "8k", "8k"]


# ---------------------------------------------------------------- every option

EXAMPLES = {
    "name": ("renamed", "renamed"), "description": ("hello there", "hello there"),
    "ioengine": ("io_uring", "io_uring"), "filename": ("/tmp/x.img", "/tmp/x.img"), "direct": ("1", True),
    "rw": ("randrw:8", O.RwMode("randrw", True, True, True, 8)), "rw_sequencer": ("identical", "identical"),
    "rwmixread": ("70", 70), "rwmixwrite": ("30", 30), "bs": ("8k,32k", (8192, 32768)),
    "bsrange": ("4k-16k", ((4096, 16384), (4096, 16384))),
    "bssplit": ("4k/10:64k/90", (((4096, 10.0), (65536, 90.0)),) * 2),
    "size": ("64m", 64 << 20), "offset": ("10%", Percent(10.0)), "io_size": ("1g", 1 << 30),
    "number_ios": ("100", 100), "random_distribution": ("zipf:1.2", DistSpec("zipf", 1.2)),
    "randseed": ("42", 42), "randrepeat": ("0", False), "norandommap": ("1", True), "kb_base": ("1000", 1000),
    "iodepth": ("32", 32), "iodepth_batch_submit": ("8", 8), "iodepth_batch_complete_min": ("4", 4),
    "iodepth_batch_complete_max": ("16", 16), "serialize_overlap": ("1", True), "numjobs": ("4", 4), "runtime": ("10s", 10**10), "time_based": ("1", True),
    "latency_target": ("500", 500_000), "latency_window": ("5s", 5 * 10**9), "latency_percentile": ("99.9", 99.9),
    "latency_run": ("1", True),
    "ramp_time": ("2", 2 * 10**9), "startdelay": ("1-3", (10**9, 3 * 10**9)),
    "percentage_random": ("30,70", (30, 70)), "mem": ("mmap:/tmp/buf", "mmap:/tmp/buf"),
    "bwavgtime": ("250", 250), "iopsavgtime": ("1000", 1000), "significant_figures": ("6", 6),
    "unit_base": ("1", "1"), "allow_file_create": ("0", False), "fadvise_hint": ("random", "random"),
    "pre_read": ("1", True), "nrfiles": ("1", 1), "create_fsync": ("0", False), "create_only": ("1", True),
    "file_append": ("1", True), "clocksource": ("cpu", "cpu"), "gtod_cpu": ("1", 1), "lockmem": ("0", "0"),
    "exitall_on_error": ("1", True), "iodepth_low": ("4", 4), "continue_on_error": ("none", "none"),
    "verify_async": ("0", "0"), "trim_percentage": ("0", "0"), "stats": ("0", False), "disk_util": ("0", False),
    "unified_rw_reporting": ("none", "none"), "log_compression": ("1m", 1 << 20),
    "log_store_compressed": ("0", "0"), "write_hist_log": ("h", "h"), "log_hist_msec": ("100", 100),
    "log_hist_coarseness": ("2", 2), "openfiles": ("2", 2), "file_service_type": ("zipf:1.2", "zipf:1.2"), "group_reporting": ("1", True), "stonewall": ("1", True), "new_group": ("1", True),
    "verify": ("md5", "md5"), "do_verify": ("0", False), "verify_fatal": ("1", True), "experimental_verify": ("1", True), "verify_backlog": ("64", 64),
    "verify_pattern": ("0xaa555aa5", "0xaa555aa5"), "verify_interval": ("512", 512),
    "fill_device": ("1", True), "create_serialize": ("0", False),
    "clat_percentiles": ("0", False), "lat_percentiles": ("1", True), "slat_percentiles": ("1", True),
    "percentile_list": ("99.9:50", (50.0, 99.9)), "cxlhm_profile": ("cmm-h", "cmm-h"), "cxlhm_policy": ("lru", "lru"),
    "cxlhm_dram": ("64m", 64 << 20), "cxlhm_block_size": ("4k", 4096), "cxlhm_clock": ("wall", "wall"),
    "directory": ("/tmp", "/tmp"), "filename_format": ("f.$jobnum", "f.$jobnum"), "filesize": ("8m", 8 << 20),
    "buffered": ("0", False), "invalidate": ("0", False), "fsync": ("8", 8), "fdatasync": ("2", 2), "end_fsync": ("1", True),
    "sync": ("1", True), "unlink": ("1", True), "cpus_allowed": ("0", frozenset({0})), "cpumask": ("0x1", frozenset({0})),
    "cpus_allowed_policy": ("split", "split"), "nice": ("5", 5), "exec_prerun": ("true", "true"),
    "exec_postrun": ("true", "true"), "max_latency": ("250us,1ms", (250000, 1000000)),
    "fsync_on_close": ("1", True), "fallocate": ("keep", "keep"), "overwrite": ("1", True),
    "create_on_open": ("1", True), "log_prio": ("1", True), "gtod_reduce": ("1", True), "disable_lat": ("1", True),
    "disable_clat": ("1", True), "disable_slat": ("1", True), "disable_bw_measurement": ("1", True),
    "random_generator": ("lfsr", "lfsr"), "io_submit_mode": ("offload", "offload"), "thread": ("1", True), "offset_increment": ("1m", 1 << 20),
    "blockalign": ("8k", (8192, 8192)), "loops": ("3", 3), "numa_cpu_nodes": ("0", "0"),
    "numa_mem_policy": ("local", "local"), "wait_for": ("w", "w"), "exitall": ("1", True),
    "exit_what": ("stonewall", "stonewall"), "write_lat_log": ("lat", "lat"), "write_bw_log": ("bw", "bw"),
    "write_iops_log": ("io", "io"), "log_avg_msec": ("500", 500), "per_job_logs": ("0", False), "write_iolog": ("io.log", "io.log"),
    "verify_dump": ("1", True), "verify_only": ("1", True), "read_iolog": ("io.log", "io.log"), "read_iolog_chunked": ("1", True), "replay_no_stall": ("1", True),
    "replay_time_scale": ("200", 200), "replay_redirect": ("/tmp/f", "/tmp/f"), "replay_scale": ("2", 2),
    "replay_align": ("4k", 4096), "replay_skip": ("write,sync", frozenset({"write", "sync"})),
    "flow": ("-8", -8), "flow_id": ("2", 2),
    "flow_sleep": ("1000", 1000), "thinktime": ("2000", 2 * 10**6), "thinktime_spin": ("1ms", 10**6),
    "thinktime_blocks": ("8", 8), "thinktime_blocks_type": ("issue", "issue"), "thinktime_iotime": ("2", 2 * 10**9),
    "rate": ("1m,500k", (1 << 20, 500 << 10)), "rate_iops": ("100,", (100, None)),
    "rate_process": ("poisson", "poisson"), "rate_min": ("1m,", (1 << 20, None)),
    "rate_iops_min": (",50", (None, 50)), "rate_cycle": ("250", 250),
    "steadystate": ("bw_slope:1%", SteadySpec(False, True, 1.0, True)), "steadystate_duration": ("30", 30 * 10**9),
    "steadystate_ramp_time": ("5s", 5 * 10**9), "steadystate_check_interval": ("1000ms", 10**9),
    "sprandom": ("1", True), "spr_op": ("0.21", 0.21), "spr_num_regions": ("400", 400), "spr_cs": ("1m", 1 << 20),
    "dedupe_percentage": ("30", 30),
    "dedupe_mode": ("working_set", "working_set"), "dedupe_working_set_percentage": ("20", 20),
    "dedupe_global": ("1", True), "buffer_compress_percentage": ("50", 50), "buffer_compress_chunk": ("4k", 4096),
    "scramble_buffers": ("0", False), "refill_buffers": ("1", True), "zero_buffers": ("1", True),
    "buffer_pattern": ('"ab"0x01', b"ab\x01"),
    "zonemode": ("none", "none"), "zonesize": ("256m", 256 << 20), "zonerange": ("512m", 512 << 20),
    "zoneskip": ("2g", 2 << 30), "log_offset": ("1", True),
}
NEEDS = {"time_based": "runtime=1\n", "verify_backlog": "verify=crc32c\n",
         "steadystate_duration": "new_group\n", "sprandom": "rw=randwrite\n"}  # (fio: one reporting group, the same steady-state options)


def test_examples_cover_every_option():
    from cxlhm_apps.fio.engines import DEVICE_OPTIONS  # (the device engine's own options)
    assert set(EXAMPLES) == {o.name for o in O.OPTIONS + DEVICE_OPTIONS}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_option_parses(name):
    text, expected = EXAMPLES[name]
    engine = "ioengine=cxlhm\n" if name.startswith("cxlhm_") else ""
    job = jobs_of(f"[w]\n[j]\n{NEEDS.get(name, '')}{engine}{name}={text}\n")[-1]  # ([w]: for wait_for)
    assert job[name] == expected


def test_aliases_and_bare_flags():
    job = one("[j]\nreadwrite=randread\nblocksize=16k\ntime_based\nruntime=1\nnorandommap\ngroup_reporting\n")
    assert job["rw"].name == "randread" and job["bs"] == (16384, 16384)
    assert job["time_based"] and job["norandommap"] and job["group_reporting"]


def test_defaults_when_not_given():
    job = one("[j]\nsize=1m\n")
    assert job["rw"].name == "read" and job["bs"] == (4096, 4096) and job["iodepth"] == 1
    assert job["numjobs"] == 1 and job["rwmixread"] == 50
    assert job["ioengine"] == "psync" and not job["direct"]  # fio's defaults: psync, buffered


def test_kb_base_applies_to_the_job_sizes():
    job = one("[global]\nkb_base=1000\n[j]\nsize=1m\nbs=4ki\n")
    assert job["size"] == 10**6 and job["bs"] == (4096, 4096)


def test_rw_suffix_is_io_count_for_random_and_hole_for_sequential():
    assert one("[j]\nrw=randread:8\n")["rw"].modifier == 8
    assert one("[j]\nrw=write:4k\n")["rw"].modifier == 4096


# ---------------------------------------------------------------- inheritance

def test_globals_apply_to_jobs_below_only():
    jobs = jobs_of("[global]\nbs=8k\niodepth=4\n[a]\n[global]\nbs=16k\n[b]\niodepth=2\n")
    a, b = jobs
    assert a["bs"] == (8192, 8192) and a["iodepth"] == 4
    assert b["bs"] == (16384, 16384) and b["iodepth"] == 2


def test_job_overrides_global_and_job_options_list_only_its_own():
    job = one("[global]\nrw=randread\nsize=8m\n[j]\nrw=randwrite\n")
    assert job["rw"].name == "randwrite" and job["size"] == 8 << 20
    assert [r.key for r in job.job_options] == ["rw"]


def test_globals_do_not_leak_between_files():
    first = read_sections("[global]\niodepth=8\n[a]\n", "one.fio")
    second = read_sections("[b]\n", "two.fio")
    a, b = build_jobs([first, second])[0]
    assert a["iodepth"] == 8 and b["iodepth"] == 1


def test_include_and_environment(tmp_path, monkeypatch):
    (tmp_path / "common.fio").write_text("iodepth=16\n; a comment\nbs=${BS}\n")
    monkeypatch.setenv("BS", "64k")
    monkeypatch.setenv("SIZE", "32m")
    path = tmp_path / "main.fio"
    path.write_text("[global]\ninclude common.fio\nsize=${SIZE}  ; trailing comment\n[j]\nname=${UNSET_VAR}x\n")
    job = build_jobs([read_sections(path.read_text(), str(path))])[0][0]
    assert job["iodepth"] == 16 and job["bs"] == (65536, 65536) and job["size"] == 32 << 20
    assert job.name == "x"


# ---------------------------------------------------------------- arithmetic

def test_bssplit_blanks_share_the_rest():
    split = one("[j]\nbssplit=4k/50:1k/:32k/\n")["bssplit"][0]
    assert split == ((4096, 50.0), (1024, 25.0), (32768, 25.0))


def test_bssplit_per_direction():
    read, write = one("[j]\nbssplit=2k/50:4k/50,4k/90:8k/10\n")["bssplit"]
    assert read == ((2048, 50.0), (4096, 50.0)) and write == ((4096, 90.0), (8192, 10.0))


def test_rwmixwrite_sets_rwmixread():
    job = one("[j]\nrw=randrw\nrwmixwrite=30\n")
    assert job["rwmixread"] == 70 and job["rwmixwrite"] == 30


# ---------------------------------------------------------------- errors name file, line and option

@pytest.mark.parametrize("text,line,option,words", [
    ("[j]\nsize=1m\nbogus_option=3\n", 3, "bogus_option", "unknown"),
    ("[j]\nsize=12 parsecs\n", 2, "size", "size"),
    ("[j]\n\nsize=-4k\n", 3, "size", "negative"),
    ("[j]\nbssplit=4k/60:8k/50\n", 2, "bssplit", "more than 100"),
    ("[j]\nbssplit=4k/60:8k/30\n", 2, "bssplit", "not 100"),
    ("[j]\nrw=sideways\n", 2, "rw", "unknown I/O pattern"),
    ("[j]\nrw=trim\n", 2, "rw", "trim"),
    ("[j]\niodepth=0\n", 2, "iodepth", "integer"),
    ("[j]\nrwmixread=70\nrwmixwrite=40\n", 3, "rwmixwrite", "add up to 100"),
    ("[j]\ntime_based\n", 2, "time_based", "runtime"),
    ("[j]\nsize\n", 2, "size", "needs a value"),
    ("[j]\nrandom_distribution=zipf:0\n", 2, "random_distribution", "positive"),
    ("[j]\nrandom_distribution=zoned:50/10:40/90\n", 2, "random_distribution", "not 100"),
    ("[j]\nverify=sha1\n", 2, "verify", "one of"),
    ("[j]\nioengine=io_uring\ncxlhm_dram=64m\n", 3, "cxlhm_dram", "ioengine=cxlhm only"),
    ("[j]\ncxlhm_clock=sundial\n", 2, "cxlhm_clock", "one of"),
    ("[j]\nioengine=psync\nhipri=1\n", 3, "hipri", "ioengine=pvsync2 only"),
    ("[j]\nzonemode=zbd\n", 2, "zonemode", "not modelled"),
    ("[j]\nkb_base=999\n", 2, "kb_base", "1000 or 1024"),
])
def test_bad_options_report_file_line_and_option(text, line, option, words):
    err = error_of(text)
    assert (err.path, err.line, err.option) == ("bad.fio", line, option)
    assert words in str(err)
    assert str(err).startswith(f"bad.fio:{line}: option {option!r}:")


@pytest.mark.parametrize("text,line,words", [
    ("size=1m\n[j]\n", 1, "outside of a section"),
    ("[j\nsize=1m\n", 1, "malformed section"),
    ("[j]\n=3\n", 2, "cannot parse"),
    ("[j]\ninclude nowhere.fio\n", 2, "no such file"),
    ("; only a comment\n", 0, "no jobs"),
])
def test_bad_structure_reports_file_and_line(text, line, words):
    err = error_of(text)
    assert err.line == line and words in str(err)


def test_every_refused_option_of_a_file_is_listed_in_one_error(tmp_path):
    inc = tmp_path / "inc.fio"
    inc.write_text("max_open_zones=4\n")
    path = tmp_path / "many.fio"
    path.write_text("[global]\nrate_ignore_thinktime=1\nbs=12 parsecs\n[a]\ninclude inc.fio\nbogus=1\n[b]\nrw=sideways\n"
                    "iodepth=0\n[c]\ntime_based\n")
    with pytest.raises(JobFileError) as info:
        load_jobs([str(path)])
    err = info.value
    found = [(os.path.basename(e.path), e.line, e.option) for e in err.errors]
    assert found == [("many.fio", 2, "rate_ignore_thinktime"), ("inc.fio", 1, "max_open_zones"), ("many.fio", 6, "bogus"),
                     ("many.fio", 3, "bs"), ("many.fio", 8, "rw"), ("many.fio", 9, "iodepth"),
                     ("many.fio", 11, "time_based")]
    text = str(err)
    assert text.startswith(f"{path}:2: option 'rate_ignore_thinktime'") and "7 problems" in text
    assert text.count("bs=") == 0 and text.count("option 'bs'") == 1  # a bad global is said once, not per job


def test_name_in_global_names_no_job():
    jobs, _ = build_jobs([read_sections("[global]\nname=foo\n[a]\n[b]\nname=bar\n")])
    assert [j.name for j in jobs] == ["a", "bar"]  # as fio 3.33 names them


def test_unknown_option_suggests_a_close_name():
    assert "did you mean 'iodepth'" in str(error_of("[j]\niodepht=4\n"))


def test_include_may_not_hold_sections(tmp_path):
    (tmp_path / "inc.fio").write_text("[sneaky]\n")
    path = tmp_path / "main.fio"
    path.write_text("[j]\ninclude inc.fio\n")
    with pytest.raises(JobFileError, match="inc.fio:1: an included file may not contain"):
        read_sections(path.read_text(), str(path))


def test_cmdhelp_lists_every_option():
    text = O.cmdhelp()
    for opt in O.OPTIONS:
        assert opt.name in text
    assert "type: int" in O.cmdhelp("iodepth")


# ---------------------------------------------------------------- fuzzing: never crash

_TOKENS = st.sampled_from([
    "[global]", "[job]", "[", "]", "=", "\n", " ", ";", "#", "${HOME}", "${X", "include ", "rw", "randread", "bs",
    "4k", "-", ":", "/", ",", "bssplit", "size", "%", "1e999", "99999999999999999999999", "0x", "iodepth",
    "random_distribution", "zipf", "zoned", "time_based", "runtime", "kb_base", "1000", "verify", "crc32c", "\x00",
    "é", "cxlhm_clock", "model", "offset", "rwmixread", "110", "percentile_list", "numjobs",
])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_TOKENS | st.text(max_size=6), max_size=40).map("".join))
def test_random_job_files_never_crash(text):
    try:
        jobs_of(text, "fuzz.fio")
    except JobFileError as exc:
        assert str(exc).startswith("fuzz.fio")


def test_an_engine_added_to_the_registry_can_be_named_in_a_job_file():
    from cxlhm_apps.fio.ioengine import ENGINES, IOENGINE_VERSION, IOEngineOps
    with pytest.raises(JobFileError, match="ioengine.*must be one of cxlhm, ftruncate, io_uring"):
        one("[j]\nioengine=nullio\n")
    ENGINES.add("nullio", IOEngineOps("nullio", IOENGINE_VERSION, open=lambda job: None))
    try:
        assert one("[j]\nioengine=nullio\n")["ioengine"] == "nullio"
    finally:
        ENGINES.unregister("nullio")
