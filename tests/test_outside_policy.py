"""An outside package - its own policy module, registered by an entry point, its own
tests subclassing the shipped conformance suite - runs the suite, `cxlhm policies` and
`cxlhm mrc` from a folder with no cxlhm checkout on its path."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import firmware_policies

POLICY_NAME = "outside_lru"


def _package(root: Path) -> Path:
    """root/site: the package `outside_pkg` (a copy of the LRU policy under another name)
    and its dist-info with the entry point, as pip would leave them."""
    site = root / "site"
    pkg = site / "outside_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    source = Path(firmware_policies.__file__).with_name("lru.py").read_text()
    (pkg / "policy.py").write_text(source.replace('name="lru"', f'name="{POLICY_NAME}"'))
    info = site / "outside_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[cxlhm.firmware_policies]\n{POLICY_NAME} = outside_pkg.policy\n")
    tests = root / "work" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_conformance.py").write_text(
        "from cxlhm.testing.policies import LruModel, PolicyConformance\n\n\n"
        f"class TestOutside(PolicyConformance):\n    name, reference = {POLICY_NAME!r}, LruModel\n")
    return site


def _env(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    return env


def test_the_entry_point_policy_is_listed_from_outside(tmp_path):
    site = _package(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "policies", POLICY_NAME], cwd=tmp_path / "work",
                          env=_env(site), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(POLICY_NAME)


@pytest.mark.slow
def test_an_outside_package_runs_the_shipped_suite_and_mrc(tmp_path):
    site = _package(tmp_path)
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=work,
                          env=_env(site), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout
    trace = work / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i}, "input_length": 512, "output_length": 1, '
                             f'"hash_ids": [{i % 7}, {i % 13 + 7}]}}\n' for i in range(200)))
    proc = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "mrc", "--trace", str(trace), "--policies",
                           f"lru,{POLICY_NAME}", "--sizes", "4,8", "--json", "--no-plot"], cwd=work,
                          env=_env(site), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    import json
    curves = json.loads(proc.stdout)
    assert curves[POLICY_NAME] == curves["lru"]  # the same algorithm under another name
