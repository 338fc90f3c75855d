"""The fio I/O-engine conformance suite: what `cxlhm fio` relies on from any ioengine
(cxlhm_apps.fio.ioengine). Subclass `IOEngineConformance`, name the engine, and pytest
runs the checks below against it through `cxlhm fio` itself:

    from cxlhm_apps.fio.testing import IOEngineConformance

    class TestMyEngine(IOEngineConformance):
        engine = "myengine"                      # its name in ioengine.ENGINES
        option_values = {"my_option": "7"}       # a good value for each option it declares

- it speaks this protocol version and is registered under its own name;
- a job run as `cxlhm fio` runs it writes a region with verify=crc32c, then a second job reads
  the same region back and verifies every block (a block the engine did not write, or
  read back wrong, fails the run);
- fio's JSON comes out with fio's keys, byte counts and I/O counts, slat as its flags
  say and the queue depth fio would report (1 for a synchronous engine);
- each option it declares is in `--cmdhelp` and parses; an option of another engine,
  and each of fio's options it refuses, is refused with the job file's line.

The engine must be registered when the tests run (an entry point, or `ENGINES.add` in
the test module, as tests/test_example_fio_engine.py does).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cxlhm_apps.fio.ioengine import ENGINES, IOENGINE_VERSION, EngineFlags, IOEngineOps, engine_options, loaded_engines

# fio's keys (fio 3.33, --output-format=json) that tools read: a job's, and each direction's
FIO_JOB_KEYS = ("jobname", "groupid", "error", "eta", "elapsed", "job options", "read", "write", "trim", "sync",
                "job_runtime", "usr_cpu", "sys_cpu", "ctx", "majf", "minf", "iodepth_level", "iodepth_submit",
                "iodepth_complete", "latency_ns", "latency_us", "latency_ms", "latency_depth", "latency_target",
                "latency_percentile", "latency_window")
FIO_DIRECTION_KEYS = ("io_bytes", "io_kbytes", "bw_bytes", "bw", "iops", "runtime", "total_ios", "short_ios",
                      "drop_ios", "slat_ns", "clat_ns", "lat_ns", "bw_min", "bw_max", "bw_mean", "bw_dev",
                      "bw_samples", "iops_min", "iops_max", "iops_mean", "iops_stddev", "iops_samples")
FIO_TOP_KEYS = ("fio version", "timestamp", "timestamp_ms", "time", "global options", "jobs")


class IOEngineConformance:
    engine: str = ""  # the engine's name in ioengine.ENGINES
    job_lines: str = ""  # lines every job of the suite needs with this engine (e.g. the device's size)
    option_values: dict[str, str] = {}  # a good value per declared option (a flag defaults to 1)
    size_kib: int = 256  # the region the suite writes and reads back
    iodepth: int = 4

    # ------------------------------------------------------------------ helpers
    @property
    def ops(self) -> IOEngineOps:
        return ENGINES.get(self.engine)

    def skip_if_unavailable(self) -> None:
        why = self.ops.why_unavailable()
        if why:
            pytest.skip(f"ioengine={self.engine} cannot run here: {why}")

    def job_file(self, tmp: Path, body: str) -> Path:
        path = tmp / f"{self.engine}.fio"
        path.write_text(f"[global]\nioengine={self.engine}\nfilename={tmp / 'data.img'}\nsize={self.size_kib}k\n"
                        f"{self.job_lines}{body}")
        return path

    @staticmethod
    def fio(*paths: str) -> tuple[int, dict | None, str]:
        """What `cxlhm fio --output-format=json PATHS` does, in this process (so an engine
        added to the registry by the test is seen; the command's module is the CLI's):
        (exit status - 0 ok, 1 a job failed, 2 a bad job file -, fio's JSON, what was said)."""
        from cxlhm_apps.fio import report
        from cxlhm_apps.fio.jobfile import JobFileError, load_jobs
        from cxlhm_apps.fio.runner import run_jobs
        said: list[str] = []
        try:
            jobs, global_options = load_jobs(list(paths))
            result = run_jobs(jobs, log=said.append)
        except JobFileError as exc:
            return 2, None, f"cxlhm fio: error: {exc}\n"
        said += result.messages
        data = json.loads(report.format_json(result, global_options))
        return (1 if result.failed else 0), data, "".join(line + "\n" for line in said)

    def refused(self, tmp: Path, line: str) -> tuple[str, str]:
        """Runs a job with `line` added; asserts it is refused as a bad job file and
        returns (what was said, the FILE:LINE of `line`)."""
        path = self.job_file(tmp, f"[j]\nrw=read\n{line}\n")
        status, _data, err = self.fio(str(path))
        assert status == 2, f"ioengine={self.engine}: {line!r} was not refused (exit {status}): {err}"
        return err, f"{path}:{7 + self.job_lines.count(chr(10))}"

    # ------------------------------------------------------------------ one run, read by several checks
    @pytest.fixture(scope="class")
    @classmethod
    def round_trip(cls, tmp_path_factory):
        """A write job with verify=crc32c, then (stonewalled) a read job verifying the same
        region: (exit status, JSON report, stderr)."""
        self = cls()
        self.skip_if_unavailable()
        tmp = tmp_path_factory.mktemp(f"conformance-{self.engine}")
        body = (f"iodepth={self.iodepth}\nbs=4k\n"
                "[write]\nrw=randwrite\nverify=crc32c\ndo_verify=0\n"
                "[readback]\nstonewall\nrw=read\nverify=crc32c\n")
        return self.fio(str(self.job_file(tmp, body)))

    # ------------------------------------------------------------------ the checks
    def test_it_speaks_this_protocol_version(self):
        assert self.engine, "name the engine: engine = '...'"
        ops = self.ops
        assert isinstance(ops, IOEngineOps)
        assert ops.version == IOENGINE_VERSION
        assert ops.name == self.engine, f"registered as {self.engine!r} but names itself {ops.name!r}"
        assert isinstance(ops.flags, EngineFlags) and callable(ops.open)
        assert ops.help, "give the engine a one-line help"

    def test_an_engine_for_another_protocol_version_is_refused_naming_both(self, tmp_path):
        import dataclasses
        other = dataclasses.replace(self.ops, name=f"{self.engine}-v{IOENGINE_VERSION + 1}",
                                    version=IOENGINE_VERSION + 1)
        ENGINES.add(other.name, other)
        try:
            path = tmp_path / "v.fio"
            path.write_text(f"[j]\nioengine={other.name}\nfilename={tmp_path / 'x'}\nsize=64k\n")
            status, _out, err = self.fio(str(path))
            assert status == 2
            assert f"{path}:2" in err
            assert f"version {IOENGINE_VERSION + 1}" in err and f"version {IOENGINE_VERSION}" in err
        finally:
            ENGINES.unregister(other.name)

    def test_written_bytes_read_back_verified(self, round_trip):
        status, data, err = round_trip
        assert status == 0, err
        write, readback = data["jobs"]
        size = self.size_kib << 10
        assert write["error"] == 0 and readback["error"] == 0, err
        assert write["write"]["io_bytes"] == size and write["write"]["total_ios"] == size // 4096
        assert readback["read"]["io_bytes"] == size and readback["read"]["total_ios"] == size // 4096
        assert "verify" not in err.lower(), err

    def test_a_block_it_did_not_write_fails_the_readback(self, tmp_path):
        """The read-back check is real: the same read job over a region never written fails."""
        self.skip_if_unavailable()
        path = self.job_file(tmp_path, f"iodepth={self.iodepth}\nbs=4k\n[readback]\nrw=read\nverify=crc32c\n")
        status, _out, err = self.fio(str(path))
        assert status == 1, err

    def test_json_has_fios_keys(self, round_trip):
        status, data, err = round_trip
        assert status == 0, err
        for key in FIO_TOP_KEYS:
            assert key in data, key
        for job in data["jobs"]:
            missing = [k for k in FIO_JOB_KEYS if k not in job]
            assert not missing, missing
            for direction in ("read", "write"):
                missing = [k for k in FIO_DIRECTION_KEYS if k not in job[direction]]
                assert not missing, (direction, missing)

    def test_slat_and_queue_depth_follow_its_flags(self, round_trip):
        status, data, err = round_trip
        assert status == 0, err
        read = data["jobs"][1]["read"]
        measured = read["slat_ns"]["N"] > 0 and read["slat_ns"]["max"] > 0
        assert measured == self.ops.measures_slat
        depth = data["jobs"][1]["iodepth_level"]
        capped = "queue depth will be capped at 1" in err
        assert capped == (self.ops.sync and self.iodepth > 1), err  # what fio says of a synchronous engine
        if self.ops.sync:
            assert depth["1"] == 100.0  # fio caps a synchronous engine's queue at 1
        else:
            assert depth["1"] < 100.0 and sum(depth.values()) > 99.0

    def test_declared_options_are_listed_and_parse(self, tmp_path):
        from cxlhm_apps.fio.jobfile import build_jobs, read_sections
        from cxlhm_apps.fio.options import GROUP_TITLES, cmdhelp
        for opt in self.ops.options:
            assert opt.group in GROUP_TITLES and opt.help, opt.name
            assert opt.name in cmdhelp() and opt.help in cmdhelp(opt.name)
            value = self.option_values.get(opt.name, "1" if opt.flag else None)
            assert value is not None, f"give option_values[{opt.name!r}] a good value of it"
            text = (f"[j]\nioengine={self.engine}\nfilename={tmp_path / 'f'}\nsize=64k\n{self.job_lines}"
                    f"{opt.name}={value}\n")
            jobs, _ = build_jobs([read_sections(text, "t.fio")])
            assert jobs[0][opt.name] == opt.parse(value, 1024)

    def test_an_option_of_another_engine_is_refused_with_its_line(self, tmp_path):
        mine = {opt.name for opt in self.ops.options}
        foreign = next((name for name, (_o, owners) in sorted(engine_options().items())
                        if name not in mine and name not in self.ops.refused and self.engine not in owners), None)
        if foreign is None:
            pytest.skip("no other registered engine declares an option of its own")
        err, where = self.refused(tmp_path, f"{foreign}=1")
        assert f"{where}: option '{foreign}'" in err and "applies to ioengine=" in err, err

    def test_fios_options_it_refuses_are_refused_with_the_reason_and_line(self, tmp_path):
        if not self.ops.refused:
            pytest.skip(f"ioengine={self.engine} refuses none of fio's options by name")
        for name, why in self.ops.refused.items():
            err, where = self.refused(tmp_path, f"{name}=1")
            assert f"{where}: option '{name}'" in err, err
            assert why in err, err

    def test_it_is_among_the_loaded_engines(self):
        assert self.engine in {ops.name for ops in loaded_engines()}
