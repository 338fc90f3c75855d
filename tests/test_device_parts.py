"""The device is made of parts that own their state: read from the source with ast, every
class of cxlhm/device (the stream subpackage included) reads only the attributes it
defines itself - assigned to `self` in one of its methods, or a method, property or
class attribute of its own - and none inherits from another class of the device (no
mixins, whose methods use state another class defines). Whatever a part shares it gets
in its constructor (the device state, the few other parts it calls) and reaches through
that attribute.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEVICE = ROOT / "cxlhm" / "device"
SOURCES = sorted([*DEVICE.glob("*.py"), *(DEVICE / "stream").glob("*.py")])


def _classes(tree: ast.Module) -> list[ast.ClassDef]:
    return [node for node in tree.body if isinstance(node, ast.ClassDef)]


def _owned(cls: ast.ClassDef) -> set[str]:
    """What the class defines: its methods and properties, class attributes, and every
    attribute assigned to `self` anywhere in its body."""
    owned: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            owned.add(node.name)
        elif isinstance(node, ast.Assign):
            owned.update(t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            owned.add(node.target.id)
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            owned.add(node.attr)
    return owned


def borrowed_attributes(source: str, filename: str = "<source>") -> list[str]:
    """Every `self.X` a class of `source` reads without defining it, and every class
    that inherits from another class of `source` that is not a Protocol (a mixin)."""
    tree = ast.parse(source, filename)
    classes = {cls.name: cls for cls in _classes(tree)}
    found = []
    for cls in classes.values():
        for base in cls.bases:
            name = ast.unparse(base)
            if name in classes and not any(ast.unparse(b) == "Protocol" for b in classes[name].bases):
                found.append(f"{filename}: {cls.name} inherits from {name} (a mixin: its methods use state "
                             f"another class defines)")
        owned = _owned(cls)
        for node in ast.walk(cls):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr not in owned and not node.attr.startswith("__")):
                found.append(f"{filename}:{node.lineno}: {cls.name} reads self.{node.attr}, which it does not define")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_part_uses_only_attributes_it_owns(path):
    found = borrowed_attributes(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_the_device_has_no_base_classes():
    tree = ast.parse((DEVICE / "core.py").read_text())
    device = next(cls for cls in _classes(tree) if cls.name == "Device")
    assert device.bases == []


def test_the_device_module_stays_small():
    assert len((DEVICE / "core.py").read_text().splitlines()) < 600


def test_the_check_finds_a_borrowed_attribute_and_a_mixin():
    source = '''
class Behind:
    def __init__(self, state):
        self.state = state
        self._ring = None

    def settle(self):
        return self._ring, self.state.lock, self._lock  # _lock: the device's, not this part's

class Device(Behind):
    def __init__(self):
        self._lock = object()

    @property
    def closed(self):
        return self.closed_flag
'''
    found = borrowed_attributes(source)
    assert any("Behind reads self._lock" in line for line in found)
    assert any("Device inherits from Behind" in line for line in found)
    assert any("Device reads self.closed_flag" in line for line in found)
    assert not any("self.state" in line or "self._ring" in line for line in found)
    assert len(found) == 3
