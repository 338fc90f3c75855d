"""The fio-engine example of docs/extending.md (examples/extending/fio_engine.py) through
the shipped conformance suite, registered the way a test registers an engine it does not
install (ioengine.ENGINES.register by module name), and its own option doing what it says."""
import json
import os

import pytest

from cxlhm_apps.cli import main as cli_main
from cxlhm_apps.fio.ioengine import ENGINES
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections
from cxlhm_apps.fio.testing import IOEngineConformance
from example_loader import example

MODULE = "examples.extending.fio_engine"


@pytest.fixture(scope="module", autouse=True)
def datasync_registered():
    example("fio_engine")  # the checkout's root on sys.path, so the registry can import it by name
    ENGINES.register("datasync", f"{MODULE}:OPS")
    yield
    ENGINES.unregister("datasync")


class TestExampleDatasyncEngine(IOEngineConformance):
    engine = "datasync"
    option_values = {"datasync_every": "4"}


def test_registered_by_module_name_as_an_entry_point_would_be():
    assert ENGINES.get("datasync") is example("fio_engine").OPS


@pytest.mark.parametrize("every, syncs", [(8, 8), (1, 64), (0, 0)])
def test_datasync_every_syncs_after_that_many_writes(tmp_path, monkeypatch, every, syncs):
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append(fd) or real(fd))
    job = tmp_path / "j.fio"
    job.write_text(f"[w]\nioengine=datasync\ndatasync_every={every}\nfilename={tmp_path / 'f'}\nsize=256k\n"
                   "bs=4k\nrw=randwrite\n")
    out = tmp_path / "out.json"
    assert cli_main(["fio", "--output-format=json", "--output", str(out), str(job)]) == 0
    assert json.loads(out.read_text())["jobs"][0]["write"]["total_ios"] == 64
    assert len(calls) == syncs


def test_a_bad_value_of_its_option_is_refused_with_the_line():
    with pytest.raises(JobFileError, match=r"t.fio:3: option 'datasync_every': must be an integer >= 0"):
        build_jobs([read_sections("[j]\nioengine=datasync\ndatasync_every=-1\n", "t.fio")])
