"""Serving topologies live in the project's registry: the built-ins by name, an outside
engine joins by name, unknown names are one clear error, and the two engine modules
do not import each other (the registry loads each on first use)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from cxlhm_apps.serving import workloads as W
from cxlhm_apps.serving.disagg import DisaggEngine
from cxlhm_apps.serving.params import ServingParams
from cxlhm_apps.serving.scheduler import Engine
from cxlhm_apps.serving.topologies import TOPOLOGIES, engine_for, parse_topologies, replay

SERVING = Path(engine_for.__code__.co_filename).parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_the_built_in_topologies_are_registered_engines():
    assert {"colocated", "disagg"} <= set(TOPOLOGIES.names())
    assert engine_for("colocated") is Engine and engine_for("disagg") is DisaggEngine
    assert parse_topologies("both") == ["colocated", "disagg"]
    assert parse_topologies("disagg,colocated") == ["disagg", "colocated"]


@pytest.mark.parametrize("text", ["ring", "colocated,ring", ""])
def test_an_unknown_topology_is_one_error_naming_the_known_ones(text):
    with pytest.raises(ValueError, match="colocated.*disagg"):
        parse_topologies(text)
    with pytest.raises(ValueError, match="unknown serving topology 'ring'"):
        replay(W.build(W.default_spec("agent", sessions=2)), "recompute", topology="ring")


def test_the_scheduler_does_not_import_the_disaggregated_engine():
    assert not any("disagg" in name for name in _imports(SERVING / "scheduler.py"))
    assert not any("topologies" in name for name in _imports(SERVING / "scheduler.py") | _imports(SERVING / "disagg.py"))
    # and choosing a topology is not the scheduler's business any more
    code = "import sys, cxlhm_apps.serving.scheduler; print('cxlhm_apps.serving.disagg' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_an_outside_topology_joins_by_name():
    class Recorded(Engine):
        topology = "recorded"
        made = []

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            Recorded.made.append(self)

    TOPOLOGIES.register("recorded", lambda: Recorded)
    try:
        w = W.build(W.default_spec("agent", sessions=2))
        res = replay(w, "lmcache-local", ServingParams(), 1.0, topology="recorded")
        assert len(Recorded.made) == 1 and res.topology == "recorded"
        assert parse_topologies("recorded,colocated") == ["recorded", "colocated"]
    finally:
        TOPOLOGIES.unregister("recorded")
    with pytest.raises(ValueError, match="recorded"):
        engine_for("recorded")


def test_serve_bench_rejects_an_unknown_topology_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "serve-bench", "--quick", "--topology", "ring",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("cxlhm serve-bench: error: ") and "ring" in proc.stderr
    assert "Traceback" not in proc.stderr
