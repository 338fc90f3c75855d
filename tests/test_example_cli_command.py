"""The CLI-command example of docs/extending.md (examples/extending/cli_command.py),
registered the way a test registers a command it does not install (COMMANDS.register)
and run through `cxlhm`'s own entry, cxlhm_apps.cli.main. Commands have no shipped
conformance suite; these tests check what `cxlhm` promises of each: listed in the help,
the output, and bad input as one line with exit status 2."""
import numpy as np
import pytest

from cxlhm.traces.blocktrace import BlockTrace, write_block_trace
from cxlhm_apps import cli
from example_loader import example


@pytest.fixture(scope="module", autouse=True)
def footprint_registered():
    example("cli_command")  # the checkout's root on sys.path, so the registry can import it by name
    cli.COMMANDS.register("footprint", "examples.extending.cli_command")
    yield
    cli.COMMANDS.unregister("footprint")


@pytest.fixture
def trace(tmp_path):
    blocks = np.array([5, 1, 5, 9, 1, 5, 7, 7], np.int64)
    writes = np.array([1, 0, 0, 1, 0, 0, 0, 1], bool)
    path = tmp_path / "t.cbt"
    write_block_trace(path, BlockTrace(blocks, writes, 65536))
    return str(path)


def test_listed_in_the_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "footprint" in capsys.readouterr().out


def test_prints_the_working_set(trace, capsys):
    assert cli.main(["footprint", trace]) == 0
    assert capsys.readouterr().out.split("\n") == [
        "accesses        8", "distinct blocks 4", "writes          37.5%", "footprint       256 KiB (65536 B blocks)", ""]
    assert cli.main(["footprint", trace, "--limit", "3", "--block-size", "4KiB"]) == 0
    out = capsys.readouterr().out
    assert "distinct blocks 2" in out and "footprint       8 KiB (4096 B blocks)" in out


def test_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    assert cli.main(["footprint", str(tmp_path / "missing.cbt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cxlhm footprint: error: ") and "missing.cbt" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        cli.main(["footprint", "t.cbt", "--limit", "0"])
    assert exit_.value.code == 2
