"""A policy hook numba cannot compile is reported as one line naming the policy, the
hook, the file and line, and numba's reason - exit status 2, not an internal error - with
numba's whole text behind CXLHM_TRACEBACK=1."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest

from cxlhm import compile_errors
from cxlhm.compile_errors import PolicyCompileError, explain, one_line_reason

BROKEN_HOOKS = textwrap.dedent('''\
    import numba
    import numpy as np
    from firmware_policies.base import Policy
    from firmware_policies import fifo
    from firmware_policies.fifo import POLICY as FIFO


    @numba.njit
    def _remember(slot):
        return slot + "x"  # HELPER-LINE: an int plus a str does not type


    @numba.njit
    def on_insert(ps, bt, slot, is_write, now):
        label = slot + "x"  # HOOK-LINE: an int plus a str does not type
        fifo.on_insert(ps, bt, slot, is_write, now)


    @numba.njit
    def on_hit(ps, bt, slot, is_write, now):
        _remember(slot)  # CALL-LINE


    POLICY = Policy(name="NAME", description="broken on purpose", make_state=FIFO.make_state,
                    on_hit=on_hit, on_insert=on_insert, victim=FIFO.victim, on_evict=FIFO.on_evict)
''')


def _line_of(source: str, marker: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if marker in line)


def _import(tmp_path: Path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(BROKEN_HOOKS.replace("NAME", name))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _typing_error(call):
    with pytest.raises(numba.core.errors.TypingError) as info:
        call()
    return info.value


def test_a_broken_hook_is_named_with_its_line_and_numbas_reason(tmp_path):
    module = _import(tmp_path, "broken_hook_policy")
    try:
        exc = _typing_error(lambda: module.on_insert((np.zeros(2, np.int64),), 0, 1, False, 0))
        error = explain(exc, [module.POLICY])
        line = _line_of(BROKEN_HOOKS, "HOOK-LINE")
        assert isinstance(error, PolicyCompileError)
        assert str(error).startswith(f"policy broken_hook_policy: on_insert (broken_hook_policy.py:{line}) "
                                     "does not compile: No implementation of function")
        assert "\n" not in str(error) and len(str(error)) < 400
        assert "Failed in nopython mode pipeline" in error.full_text
        # a helper in the policy's own file: the helper's line, under the hook that calls it
        exc = _typing_error(lambda: module.on_hit((np.zeros(2, np.int64),), 0, 1, False, 0))
        error = explain(exc, [module.POLICY])
        assert (error.hook, error.where) == ("on_hit", f"broken_hook_policy.py:{_line_of(BROKEN_HOOKS, 'HELPER-LINE')}")
    finally:
        sys.modules.pop("broken_hook_policy", None)


def test_errors_outside_any_policy_hook_stay_internal(tmp_path):
    @numba.njit
    def not_a_hook(x):
        return x + "y"
    exc = _typing_error(lambda: not_a_hook(1))
    assert explain(exc, []) is None
    assert explain(ValueError("plain"), []) is None


def test_one_line_reason_drops_the_pipeline_preamble():
    text = ("Failed in nopython mode pipeline (step: nopython frontend)\n"
            "\x1b[1mCannot unify int64 and float64 for 'x.2', defined at /a/b.py (3)\x1b[0m\n\nFile \"b.py\", line 3:\n")
    assert one_line_reason(text) == "Cannot unify int64 and float64 for 'x.2', defined at /a/b.py (3)"
    assert one_line_reason("Failed in nopython mode pipeline (step: x)\nNo implementation found for signature:\n"
                           " >>> f(int64)\n") == "No implementation found for signature: >>> f(int64)"
    assert one_line_reason("") == "numba could not compile it"


def test_the_cli_says_it_in_one_line_from_an_outside_package(tmp_path):
    """The way docs/policies.md registers an outside package: an entry point."""
    site = tmp_path / "site"
    (site / "brokenpkg").mkdir(parents=True)
    (site / "brokenpkg" / "__init__.py").write_text("")
    # only on_insert broken here (the helper's error is the test above)
    (site / "brokenpkg" / "policy.py").write_text(BROKEN_HOOKS.replace("NAME", "brokenfifo").replace(
        "_remember(slot)  # CALL-LINE", "return"))
    info = site / "brokenpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenpkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[cxlhm.firmware_policies]\nbrokenfifo = brokenpkg.policy\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i}, "input_length": 512, "output_length": 1, "hash_ids": [{i % 5}]}}\n'
                             for i in range(20)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CXLHM_TRACEBACK")}
    env["PYTHONPATH"] = str(site)
    command = [sys.executable, "-m", "cxlhm_apps.cli", "mrc", "--trace", str(trace), "--policies", "brokenfifo",
               "--sizes", "2", "--no-plot"]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(error) == 1, proc.stderr[-2000:]
    hook_line = _line_of(BROKEN_HOOKS, "HOOK-LINE")
    assert re.match(rf"cxlhm mrc: error: policy brokenfifo: on_insert \(policy\.py:{hook_line}\) does not compile: "
                    r"No implementation of function .*add.* \(set CXLHM_TRACEBACK=1 for numba's full text\)$",
                    error[0]), error[0]
    assert "internal error" not in proc.stderr
    proc = subprocess.run(command, cwd=tmp_path, env={**env, "CXLHM_TRACEBACK": "1"}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "Failed in nopython mode pipeline" in proc.stderr
    assert f"brokenpkg/policy.py\", line {hook_line}" in proc.stderr


def test_is_compile_error_needs_no_numba_import():
    assert not compile_errors.is_compile_error(RuntimeError("x"))
