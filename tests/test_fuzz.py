"""Fuzzing the parsers that take outside input: config (dicts, YAML files, --set),
fio job files, trace files (tests/fuzz_parsers.py holds what is drawn and what each
input must do). These runs are small, for the default suite; `make fuzz` runs every
input at volume (tests/fuzz_volume.py). The shim adapters have tests/test_fuzz_shim.py,
the mailbox tests/test_mailbox_fuzz.py. Each target counts the cases it ran
(docs/reliability.md collects the figures).
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


# ====================================================================== the coverage-guided run
def test_the_coverage_guided_volume_run_works_when_atheris_is_installed(tmp_path):
    """`make fuzz`'s atheris workers (config, fio, traces), 500 cases each."""
    pytest.importorskip("atheris")
    import subprocess
    env = {**os.environ, "CXLHM_RELIABILITY_FIGURES": str(tmp_path / "figures.json")}  # not the real figures
    out = subprocess.run([sys.executable, "fuzz_volume.py", "--cases", "500", "--jobs", "2", "config", "fio", "traces"],
                         capture_output=True, text=True, timeout=900, cwd=Path(__file__).parent, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("atheris (coverage-guided)") == 3 and "0 failures" in out.stdout, out.stdout
