"""Fuzzing the parsers that take outside input: config (dicts, YAML files, --set),
fio job files, trace files (tests/fuzz_parsers.py holds what is drawn and what each
input must do). These runs are small, for the default suite; `make fuzz` runs every
input at volume (tests/fuzz_volume.py). The shim adapters have tests/test_fuzz_shim.py,
the mailbox tests/test_mailbox_fuzz.py. Each target counts the cases it ran
(docs/reliability.md collects the figures).

An optional atheris harness (coverage-guided, libFuzzer) drives the config, fio and
trace targets when atheris is installed: ``cd tests && python test_fuzz.py TARGET
[CORPUS_DIR] [libFuzzer args]`` (seed a corpus directory with ``atheris_corpus``).
"""
import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_parsers as fp
from cxlhm.config import ConfigError, load_config
from cxlhm.traces import TraceError
from cxlhm.traces.lcs_csv import read_csv
from cxlhm.traces.mooncake import read_requests
from cxlhm.traces.oracle_general import write_oracle_general
from fuzzkit import FAST, Tally

config_tally, fio_tally, trace_tally = Tally("config_parser"), Tally("fio_job_parser"), Tally("trace_readers")


# ====================================================================== config
@FAST
@given(fp.config_layer())
def test_fuzz_config_dicts(layer):
    config_tally.run(fp.check_config_layer, layer)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fp.YAML_TEXT)
def test_fuzz_config_yaml_files(tmp_path, text):
    config_tally.run(fp.check_config_yaml, text, str(tmp_path))


@FAST
@given(fp.SET_OPTIONS)
def test_fuzz_set_options(items):
    config_tally.run(fp.check_set_options, items)


def test_a_home_directory_that_does_not_exist_is_a_config_error():
    with pytest.raises(ConfigError, match="backend.path"):
        load_config({"backend": {"path": "~no_such_user_here/ssd.img"}})


def test_an_image_name_with_no_room_for_its_sidecar_files_is_a_config_error(tmp_path):
    # found by test_fuzz_config_dicts: the name fit, "<name>.cxlhm.json" did not (OSError)
    with pytest.raises(ConfigError, match="backend.path.*at most 240"):
        load_config({"backend": {"path": str(tmp_path / ("x" * 241))}})
    assert load_config({"backend": {"path": str(tmp_path / ("x" * 240))}}).backend.path.endswith("x" * 240)


def test_zz_record_config_cases():
    config_tally.record()


# ====================================================================== fio job files
@FAST
@given(fp.fio_text())
def test_fuzz_fio_job_files(text):
    fio_tally.run(fp.check_fio_text, text)


def test_an_include_name_the_file_system_refuses_is_a_job_file_error():
    # found by the coverage-guided run: `include <300 bytes>` raised OSError (name too long)
    from cxlhm_apps.fio.jobfile import JobFileError, read_sections
    with pytest.raises(JobFileError, match="include: cannot use"):
        read_sections(f"[job]\ninclude {'x' * 300}\n", "<test>")


def test_zz_record_fio_cases():
    fio_tally.record()


# ====================================================================== trace readers
@FAST
@given(fp.BINARY_TRACES)
def test_fuzz_binary_trace_readers(tmp_path, case):
    trace_tally.run(fp.check_binary_trace, case, str(tmp_path))


@FAST
@given(fp.CSV_TRACES)
def test_fuzz_csv_trace_reader(tmp_path, case):
    trace_tally.run(fp.check_csv_trace, case, str(tmp_path))


@FAST
@given(fp.JSONL_TRACES)
def test_fuzz_mooncake_trace_reader(tmp_path, case):
    trace_tally.run(fp.check_jsonl_trace, case, str(tmp_path))


@pytest.mark.parametrize("reader", ["mooncake", "csv"])
def test_non_utf8_trace_text_is_a_trace_error(tmp_path, reader):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\x81\x00abc\n1,2\n")
    with pytest.raises(TraceError):
        read_requests(path) if reader == "mooncake" else read_csv(path, "obj-id-col=1")


def test_zz_record_trace_cases():
    trace_tally.record()


# ====================================================================== longer runs
@pytest.mark.slow
@settings(max_examples=3000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(fp.CONFIG_INPUTS.map(lambda x: ("config", x)), fp.fio_text().map(lambda x: ("fio", x))))
def test_fuzz_parsers_long(case):
    kind, value = case
    if kind == "config":
        config_tally.run(fp.check_config_input, value, tempfile.gettempdir())
    else:
        fio_tally.run(fp.check_fio_text, value)


# ====================================================================== atheris (optional)
def atheris_corpus(target: str, folder: Path) -> Path:
    """A seed corpus for a target: the project's own valid inputs (libFuzzer adds to it)."""
    import shutil
    folder.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parent.parent
    if target == "fio":
        for job in (repo / "bench" / "jobs").glob("*.fio"):
            shutil.copy(job, folder)
    elif target == "config":
        for profile in (repo / "cxlhm" / "profiles").glob("*.yaml"):
            shutil.copy(profile, folder)
    else:
        trace = fp._valid_block_trace(folder / "seed.cbt", 20, True)
        write_oracle_general(folder / "seed.oracle", trace)
        (folder / "seed.jsonl").write_text('{"timestamp": 1, "input_length": 600, "output_length": 5, '
                                           '"hash_ids": [1, 2]}\n')
    return folder


def test_atheris_harness_runs_when_installed(tmp_path):
    """The coverage-guided harness below, 500 executions per target from a seed corpus,
    when atheris is installed (it is not a dependency)."""
    pytest.importorskip("atheris")
    import subprocess
    for target in ATHERIS_TARGETS:
        corpus = atheris_corpus(target, tmp_path / target)
        out = subprocess.run([sys.executable, __file__, target, str(corpus), "-runs=500",
                              f"-artifact_prefix={tmp_path}/"],
                             capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent)
        assert out.returncode == 0, (target, out.stderr[-3000:])
        runs = int(next(line.split()[1] for line in out.stderr.splitlines() if line.startswith("Done ")))
        from test_reliability import record_figure
        record_figure("fuzz", f"atheris_{target}", "cases", runs, accumulate=True)


def _mod(name: str):
    """The module as loaded now (the atheris runner reloads cxlhm instrumented)."""
    import importlib
    return importlib.import_module(name)


def _atheris_config(data: bytes) -> None:
    text = data.decode("utf-8", "replace")  # as a file is read: a seed corpus of YAML files works as is
    path = Path(tempfile.gettempdir()) / f"cxlhm-atheris-{os.getpid()}.yaml"
    path.write_text(text)
    config = _mod("cxlhm.config")
    try:
        config.load_config(str(path))
    except config.ConfigError:
        pass


def _atheris_fio(data: bytes) -> None:
    text = data.decode("utf-8", "replace")  # seed with bench/jobs/*.fio
    jobfile = _mod("cxlhm_apps.fio.jobfile")
    try:
        jobfile.build_jobs([jobfile.read_sections(text, "<atheris>")])
    except jobfile.JobFileError:
        pass


def _atheris_traces(data: bytes) -> None:
    path = Path(tempfile.gettempdir()) / f"cxlhm-atheris-{os.getpid()}.trace"
    path.write_bytes(data)
    error = _mod("cxlhm.traces").TraceError
    for reader in (_mod("cxlhm.traces.blocktrace").read_block_trace,
                   _mod("cxlhm.traces.oracle_general").read_oracle_general,
                   _mod("cxlhm.traces.mooncake").read_requests):
        try:
            reader(path)
        except error:
            pass


ATHERIS_TARGETS = {"config": _atheris_config, "fio": _atheris_fio, "traces": _atheris_traces}

if __name__ == "__main__":  # python tests/test_fuzz.py TARGET [CORPUS_DIR] [libFuzzer options]
    import atheris
    # reload cxlhm with coverage instrumentation (only cxlhm: instrumenting numpy and
    # hypothesis too would make every run crawl)
    for name in [m for m in sys.modules if m.split(".")[0] in ("cxlhm", "cxlhm_apps")]:
        del sys.modules[name]
    with atheris.instrument_imports(include=["cxlhm", "cxlhm_apps"]):
        import cxlhm.config  # noqa: F401
        import cxlhm_apps.fio.jobfile  # noqa: F401
        import cxlhm.traces.blocktrace  # noqa: F401
        import cxlhm.traces.mooncake  # noqa: F401
        import cxlhm.traces.oracle_general  # noqa: F401
    target = ATHERIS_TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0]] + sys.argv[2:], target)
    atheris.Fuzz()
