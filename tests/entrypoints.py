"""Install entry points for a test the way a pip-installed package does: a *.dist-info
folder with entry_points.txt on sys.path, found by importlib.metadata like any other."""
from __future__ import annotations

from pathlib import Path


def install_entry_points(folder: Path, monkeypatch, groups: dict[str, dict[str, str]],
                         dist: str = "cxlhm_test_plugin") -> Path:
    info = folder / f"{dist}-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) + "\n"
        for group, eps in groups.items()))
    monkeypatch.syspath_prepend(str(folder))
    return folder
