"""The CLI-command example of docs/extending.md (examples/extending/cli_command.py)
through the shipped command conformance suite (cxlhm_apps.testing), registered the way a
test registers a command it does not install (COMMANDS.register), and what it prints."""
import numpy as np
import pytest

from cxlhm.traces.blocktrace import BlockTrace, write_block_trace
from cxlhm_apps import cli
from cxlhm_apps.testing import CommandConformance, run_cli
from example_loader import example


@pytest.fixture(scope="module", autouse=True)
def footprint_registered():
    example("cli_command")  # the checkout's root on sys.path, so the registry can import it by name
    cli.COMMANDS.register("footprint", "examples.extending.cli_command")
    yield
    cli.COMMANDS.unregister("footprint")


def a_trace(folder) -> str:
    """8 accesses to 4 blocks of 64 KiB, 3 of them writes."""
    path = folder / "t.cbt"
    write_block_trace(path, BlockTrace(np.array([5, 1, 5, 9, 1, 5, 7, 7], np.int64),
                                       np.array([1, 0, 0, 1, 0, 0, 0, 1], bool), 65536))
    return str(path)


class TestFootprint(CommandConformance):
    name = "footprint"

    def good_runs(self, tmp_path):
        return [["footprint", a_trace(tmp_path)], ["footprint", a_trace(tmp_path), "--limit", "3"]]

    def bad_runs(self, tmp_path):
        (tmp_path / "t.csv").write_text("1,7\n2,seven\n")  # an object id that is not a number
        return [["footprint", str(tmp_path / "missing.cbt")], ["footprint", a_trace(tmp_path), "--limit", "0"],
                ["footprint", str(tmp_path / "t.csv"), "--format", "nope"], ["footprint", str(tmp_path / "t.csv")]]


def test_prints_the_working_set(tmp_path):
    status, out, _ = run_cli(["footprint", a_trace(tmp_path)])
    assert status == 0 and out.split("\n") == [
        "accesses        8", "distinct blocks 4", "writes          37.5%", "footprint       256 KiB (65536 B blocks)", ""]
    status, out, _ = run_cli(["footprint", a_trace(tmp_path), "--limit", "3", "--block-size", "4KiB"])
    assert status == 0 and "distinct blocks 2" in out and "footprint       8 KiB (4096 B blocks)" in out
