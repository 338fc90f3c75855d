"""The conformance suite of `cxlhm` subcommands: what the command line promises of every
command, shipped so an outside package can run it on the command it registers
(entry-point group cxlhm.commands):

    from cxlhm_apps.testing import CommandConformance

    class TestFootprint(CommandConformance):
        name = "footprint"

        def good_runs(self, tmp_path):     # argument lists that must succeed (exit 0)
            return [["footprint", make_trace(tmp_path)]]

        def bad_runs(self, tmp_path):      # argument lists that are bad input
            return [["footprint", str(tmp_path / "missing.cbt")]]

The checks, each through `cxlhm_apps.cli.main` as the `cxlhm` script runs it: the module
is registered under its own NAME and has HELP, add_arguments and run; `cxlhm --help` lists
it with its HELP; `cxlhm NAME --help` prints its usage; every good run exits 0 and writes
no error; every bad run exits 2 with its last line on stderr ``cxlhm NAME: error: ...``
(argparse's own usage errors included; an option no parser knows is ``cxlhm: error:
unrecognized arguments: ...``) and no traceback. It needs pytest.
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

from cxlhm_apps import cli

__all__ = ["CommandConformance", "run_cli"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `cxlhm ARGV`, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(argv))
        except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return status, out.getvalue(), err.getvalue()


class CommandConformance:
    """Subclass it in a test module (its name starting with ``Test``) and set `name`, and
    give `good_runs(tmp_path)` and `bad_runs(tmp_path)`: lists of argument lists (each
    starting with the command's name)."""
    name: str

    def good_runs(self, tmp_path: Path) -> list[list[str]]:
        raise NotImplementedError("good_runs(tmp_path) -> argument lists that succeed")

    def bad_runs(self, tmp_path: Path) -> list[list[str]]:
        raise NotImplementedError("bad_runs(tmp_path) -> argument lists that are bad input")

    def test_registered_under_its_own_name(self):
        assert self.name in cli.COMMANDS
        module = cli.COMMANDS.get(self.name)
        assert module.NAME == self.name, f"registered as {self.name!r} but its NAME is {module.NAME!r}"
        assert isinstance(module.HELP, str) and module.HELP.strip()
        assert callable(module.add_arguments) and callable(module.run)

    def test_listed_in_cxlhm_help(self):
        status, out, _ = run_cli(["--help"])
        assert status == 0
        listed = " ".join(out.split())
        assert self.name in listed and " ".join(cli.COMMANDS.get(self.name).HELP.split()[:4]) in listed

    def test_its_own_help(self):
        status, out, err = run_cli([self.name, "--help"])
        assert status == 0 and not err
        assert out.startswith(f"usage: cxlhm {self.name}")

    def test_good_runs_exit_0(self, tmp_path):
        runs = self.good_runs(tmp_path)
        assert runs, "give at least one run that succeeds"
        for argv in runs:
            assert argv[0] == self.name
            status, out, err = run_cli(argv)
            assert status == 0, f"cxlhm {' '.join(argv)}: exit {status}: {err}"
            assert "error" not in err and "Traceback" not in err, err

    def test_bad_input_is_one_line_and_status_2(self, tmp_path):
        runs = self.bad_runs(tmp_path)
        assert runs, "give at least one run with bad input"
        for argv in runs:
            assert argv[0] == self.name
            status, _, err = run_cli(argv)
            lines = [line for line in err.splitlines() if line.strip()]
            assert status == 2, f"cxlhm {' '.join(argv)}: exit {status}, not 2: {err}"
            assert "Traceback" not in err and lines, err
            # argparse reports an argument no parser knows from the top: "cxlhm: error: unrecognized ..."
            assert lines[-1].startswith((f"cxlhm {self.name}: error: ", "cxlhm: error: ")), f"not one clear line: {err}"
