"""The import graph keeps the layers: the device (cxlhm, firmware_policies) <- the host
runtime (host_runtime) <- the applications (cxlhm_apps: fio, replay, serving, the CLI).
No import points up a layer, and no module takes part in an import cycle at load time.
Read from the source with ast, so a lazy import inside a function counts for the layers
too (it is a dependency all the same)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"cxlhm": 0, "firmware_policies": 0, "host_runtime": 1, "cxlhm_apps": 2}
LAYER_NAMES = ("device", "host runtime", "applications")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in LAYERS for p in (ROOT / top).rglob("*.py")}


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, *, load_time_only: bool) -> set[str]:
    """Modules `module` imports; with load_time_only, only those run when it is imported
    (not inside functions, not under `if TYPE_CHECKING`)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if load_time_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if load_time_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node, path.name == "__init__.py")
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from pkg import mod`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


MODULES = _modules()


def test_every_layer_has_modules():
    assert {name.split(".")[0] for name in MODULES} == set(LAYERS)


def test_no_import_points_up_a_layer():
    wrong = []
    for module, path in sorted(MODULES.items()):
        layer = LAYERS[module.split(".")[0]]
        for target in sorted(_imports(module, path, load_time_only=False)):
            top = target.split(".")[0]
            if top in LAYERS and LAYERS[top] > layer:
                wrong.append(f"{path.relative_to(ROOT)} ({LAYER_NAMES[layer]}) imports {target} "
                             f"({LAYER_NAMES[LAYERS[top]]})")
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def _package_of(module: str) -> set[str]:
    """A module's import also runs its packages' __init__ files."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def test_no_import_cycle_at_load_time():
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets = set()
        for target in _imports(module, path, load_time_only=True):
            targets |= {m for m in _package_of(target) if m in MODULES and m != module}
        # a package's __init__ importing its own submodules is how packages work, not a cycle
        graph[module] = {t for t in targets if not (path.name == "__init__.py" and t.startswith(module + "."))}
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_no_cycle_between_packages():
    """Between the packages of a layer (cxlhm.device, cxlhm.media, host_runtime.kvstore,
    ...), lazy imports included: a package can be understood before the ones that use it."""
    def package(name: str) -> str:
        return ".".join(name.split(".")[:2])
    packages = {package(m) for m in MODULES}
    graph: dict[str, set[str]] = {p: set() for p in packages}
    for module, path in MODULES.items():
        for target in _imports(module, path, load_time_only=False):
            if target.split(".")[0] in LAYERS and package(target) in packages and package(target) != package(module):
                graph[package(module)].add(package(target))
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("top", sorted(LAYERS))
def test_no_file_over_600_lines_without_a_reason(top):
    """Small modules that own one thing: a longer file says at its top why it is one."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in (ROOT / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600 and "one file because" not in p.read_text()[:2000]]
    assert not long, "\n".join(long)
