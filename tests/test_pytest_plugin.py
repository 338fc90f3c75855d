"""The pytest plugin shows cxlhm's "compiling" notice through pytest's output capture."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

# the runs below load plugins by name only, installed or not (an installed cxlhm registers
# this one as "cxlhm" under pytest11, checked last)
PLUGIN = ["-p", "cxlhm.testing.pytest_plugin"]

TEST_FILE = """
from pathlib import Path

from cxlhm import jit


def test_a_fresh_compile(tmp_path):
    jit.compiling_notice("the demo firmware", tmp_path)  # nothing cached there: cxlhm announces it


def test_a_cached_one(tmp_path):
    (tmp_path / "x.nbi").write_bytes(b"")
    jit.compiling_notice("the cached firmware", tmp_path)
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_notice=TEST_FILE)
    return pytester


def test_the_notice_shows_while_pytest_captures(suite):
    result = suite.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    shown = [line for line in result.outlines if "cxlhm: compiling" in line]
    assert len(shown) == 1 and "cxlhm: compiling the demo firmware (once per install; cached in" in shown[0]
    assert "the cached firmware" not in result.stdout.str()


def test_without_the_plugin_pytest_swallows_it(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "cxlhm: compiling" not in result.stdout.str()


def test_with_capture_off_cxlhms_own_line_shows_once(suite):
    result = suite.runpytest_subprocess(*PLUGIN, "-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert sum("cxlhm: compiling the demo firmware" in line for line in result.errlines + result.outlines) == 1


def test_the_install_registers_the_plugin():
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {"cxlhm": "cxlhm.testing.pytest_plugin"}


FORKED_TEST_FILE = """
import os
import sys
import tempfile

from cxlhm import jit


def test_a_forked_child_keeps_its_own_stderr(tmp_path):
    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # a test's child, as the CLI tests run the command
            os.dup2(err.fileno(), 2)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            jit.compiling_notice("the demo firmware", tmp_path)
            print("said after the compile", file=sys.stderr, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        err.seek(0)
        said = err.read().decode()
    assert "said after the compile" in said, said
"""


def test_a_compile_in_a_forked_child_leaves_the_childs_stderr_alone(pytester, monkeypatch):
    # resuming pytest's capture in the child would put pytest's capture file back on its fd 2
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_forked=FORKED_TEST_FILE)
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
