"""The LeCaR package of docs/policies.md, from the page itself: written as an outside
package (entry point, no cxlhm checkout on its path), put through the shipped
conformance suite, compared with libCacheSim's LeCaR by `cxlhm mrc --libcachesim`, and
run by `cxlhm run`."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "policies.md"


def _block(lang: str, first_line: str) -> str:
    """The page's ```lang block whose first line is `first_line` (without it)."""
    for body in re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), re.S):
        head, _, rest = body.partition("\n")
        if head.strip() == first_line:
            return rest
    raise AssertionError(f"docs/policies.md has no {lang} block starting {first_line!r}")


def _package(root: Path) -> Path:
    """root/site: the package exactly as the page writes it, installed as pip would (dist-info
    with the entry point from the page's pyproject.toml)."""
    project = tomllib.loads(_block("toml", "# pyproject.toml"))
    site = root / "site"
    (site / "lecar_policy").mkdir(parents=True)
    (site / "lecar_policy" / "__init__.py").write_text("")
    (site / "lecar_policy" / "lecar.py").write_text(_block("python", "# lecar_policy/lecar.py"))
    info = site / "lecar_policy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['project']['name']}\nVersion: 1.0\n")
    points = project["project"]["entry-points"]["cxlhm.firmware_policies"]
    (info / "entry_points.txt").write_text("[cxlhm.firmware_policies]\n" +
                                           "".join(f"{k} = {v}\n" for k, v in points.items()))
    tests = root / "work" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_conformance.py").write_text(_block("python", "# tests/test_conformance.py"))
    return site


def _env(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CXLHM_TRACEBACK")}
    env["PYTHONPATH"] = str(site)
    return env


def test_the_page_defines_a_lecar_policy(tmp_path):
    site = _package(tmp_path)
    spec = importlib.util.spec_from_file_location("docs_lecar_module", site / "lecar_policy" / "lecar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    policy = module.POLICY
    assert policy.name == "lecar" and set(policy.params) == {"learning_rate", "seed"}
    state = policy.make_state(8, policy.resolve_params({}))
    assert state[2].shape == (2, 8)  # a history per expert
    assert "$ cxlhm mrc --trace \"$T\" --policies lru,lecar" in PAGE.read_text()
    source = (site / "lecar_policy" / "lecar.py").read_text()
    line = next(i for i, text in enumerate(source.splitlines(), 1) if text.strip() == "freq[slot] = 1")
    assert f"policy lecar: on_insert (lecar.py:{line}) does not compile" in PAGE.read_text()


def _documented_error() -> str:
    return next(line for line in PAGE.read_text().splitlines() if line.startswith("cxlhm mrc: error: policy lecar"))


@pytest.mark.slow
def test_the_documented_compile_error_is_what_a_user_sees(tmp_path):
    site = _package(tmp_path)
    module = site / "lecar_policy" / "lecar.py"
    module.write_text(module.read_text().replace("    freq[slot] = 1\n", '    freq[slot] = "1"\n'))
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1, 2, 3]}\n')
    proc = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "mrc", "--trace", str(trace), "--policies",
                           "lecar", "--sizes", "2", "--no-plot"], cwd=tmp_path, env=_env(site), capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == _documented_error()


@pytest.mark.slow
def test_the_page_path_end_to_end(tmp_path):
    site = _package(tmp_path)
    work = tmp_path / "work"
    env = _env(site)
    cli = [sys.executable, "-m", "cxlhm_apps.cli"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=work,
                          env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = subprocess.run(cli + ["policies", "lecar"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("lecar"), proc.stderr
    from cxlhm.traces.mooncake import DEFAULT_TRACE
    proc = subprocess.run(cli + ["mrc", "--trace", DEFAULT_TRACE, "--policies", "lru,lecar", "--sizes", "1%,10%",
                                 "--limit", "20000", "--libcachesim", "--json", "--no-plot"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout)
    for size, ours in figures["lecar"].items():
        assert abs(ours - figures["libcachesim"]["lecar (LeCaR)"][size]) < 0.01  # within a point
        assert figures["lru"][size] == pytest.approx(figures["libcachesim"]["lru (LRU)"][size])
    proc = subprocess.run(cli + ["run", "--configs", "lru,lecar,lecar+hints", "--requests", "80", "--no-plot",
                                 "--no-progress", "--set", "dram_bytes=16MiB", "--set", "capacity=4GiB"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lecar has no on_hint hook" in proc.stderr
    assert re.search(r"lecar vs lru: KV-load p99 (the same|\d+\.\d\dx (lower|higher))", proc.stdout), proc.stdout
