"""cxlhm.registry: built-ins and entry points by name; broken entry points named, the rest load."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import firmware_policies
from cxlhm.registry import BrokenEntry, Registry, UnknownName
from entrypoints import install_entry_points

GROUP = "cxlhm.test_family"


def _registry(**kw):
    return Registry("widget", GROUP, builtins={"json": "json:dumps", "made": lambda: "made-value"}, **kw)


def test_builtins_load_lazily_and_are_cached():
    reg = _registry()
    import json
    assert reg.names() == ["json", "made"]
    assert reg.get("json") is json.dumps
    assert reg.get("made") == "made-value"
    assert reg.source("json") == "built-in"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownName, match=r"unknown widget 'nope'; available: json, made"):
        _registry().get("nope")


def test_entry_points_join_and_a_broken_one_is_named_while_the_rest_load(tmp_path, monkeypatch):
    (tmp_path / "good_widget.py").write_text("WIDGET = 'good'\n")
    (tmp_path / "bad_widget.py").write_text("import no_such_module_cxlhm\n")
    install_entry_points(tmp_path, monkeypatch, {GROUP: {
        "good": "good_widget:WIDGET", "bad": "bad_widget:WIDGET", "missing": "not_a_module_cxlhm"}})
    reg = _registry()
    assert reg.names() == ["bad", "good", "json", "made", "missing"]
    assert reg.get("good") == "good"
    with pytest.raises(BrokenEntry) as info:
        reg.get("bad")
    message = str(info.value)
    assert "'bad'" in message and "bad_widget:WIDGET" in message and GROUP in message
    assert "ModuleNotFoundError" in message and "no_such_module_cxlhm" in message
    loaded, broken = reg.load_all()
    assert set(loaded) == {"good", "json", "made"}
    assert sorted(b.name for b in broken) == ["bad", "missing"]


def test_check_rejects_the_wrong_kind_naming_the_source(tmp_path, monkeypatch):
    (tmp_path / "odd_widget.py").write_text("WIDGET = 42\n")
    install_entry_points(tmp_path, monkeypatch, {GROUP: {"odd": "odd_widget:WIDGET"}})

    def must_be_str(obj):
        if not isinstance(obj, str):
            raise TypeError(f"{obj!r} is not a str")
        return obj
    with pytest.raises(BrokenEntry, match=r"'odd' \(odd_widget:WIDGET\).*42 is not a str"):
        _registry(check=must_be_str).get("odd")


def test_a_builtin_cannot_be_shadowed_by_an_entry_point(tmp_path, monkeypatch):
    (tmp_path / "shadow_widget.py").write_text("WIDGET = 'shadow'\n")
    install_entry_points(tmp_path, monkeypatch, {GROUP: {"made": "shadow_widget:WIDGET"}})
    assert _registry().get("made") == "made-value"


def test_register_twice_needs_replace():
    reg = _registry()
    with pytest.raises(ValueError, match="already registered"):
        reg.register("made", lambda: 1)
    reg.register("made", lambda: 2, replace=True)
    assert reg.get("made") == 2


def test_policies_lists_the_rest_when_an_entry_point_is_broken(tmp_path):
    """A broken third-party policy is named with its error; every built-in is still listed."""
    site = tmp_path / "site"
    site.mkdir()
    info = site / "brokenpolicy-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenpolicy\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[cxlhm.firmware_policies]\nzz_broken = zz_missing_pkg.policy\n")
    proc = subprocess.run([sys.executable, "-m", "cxlhm_apps.cli", "policies"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, timeout=120)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1
    assert "zz_broken" in proc.stderr and "zz_missing_pkg.policy" in proc.stderr
    for name in firmware_policies.REGISTRY.builtin_names():
        assert any(line.startswith(name) for line in proc.stdout.splitlines()), name
