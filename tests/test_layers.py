"""The import graph keeps the layers: the device (cxlhm, firmware_policies) <- the host
runtime (host_runtime) <- the applications (cxlhm_apps: fio, replay, serving, the CLI).
No import points up a layer, no module takes part in an import cycle at load time, no
two top-level packages import each other (the core finds policies through its registry,
cxlhm.policies, never by importing firmware_policies), and no module uses another's
private names (a private module belongs to its package). Read from the source with ast, so a lazy import inside a
function counts too (it is a dependency all the same)."""
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


def test_no_cycle_between_top_level_packages():
    """Lazy imports included: a top-level package (the core, the policies, the host
    runtime, the applications) can be understood before the ones that use it."""
    graph: dict[str, set[str]] = {top: set() for top in LAYERS}
    edges: dict[tuple[str, str], str] = {}
    for module, path in sorted(MODULES.items()):
        top = module.split(".")[0]
        for target in sorted(_imports(module, path, load_time_only=False)):
            other = target.split(".")[0]
            if other in LAYERS and other != top:
                graph[top].add(other)
                edges.setdefault((top, other), f"{path.relative_to(ROOT)} imports {target}")
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" <-> ".join(c) + ": " + "; ".join(edges[(a, b)] for a in c for b in c if (a, b) in edges)
                                  for c in cycles)


def _private(dotted: str) -> bool:
    """A leading underscore; not a dunder, nor an enum's _sunder_ API (_value2member_map_)."""
    return any(part.startswith("_") and not part.startswith("__") and not part.endswith("_")
               for part in dotted.split("."))


EXTENSIONS = {"cxlhm._native"}  # compiled modules (native/), private to the package that builds them


def _is_module(dotted: str) -> bool:
    return dotted in MODULES or dotted in EXTENSIONS


def _may_use(module: str, dotted: str) -> bool:
    """Whether `module` may name `dotted` (a module, or a name inside one): a private name
    inside a module is that module's own; a private module (cxlhm._native) is open to the
    package that holds it."""
    parts = dotted.split(".")
    cut = next((i for i in range(len(parts), 0, -1) if _is_module(".".join(parts[:i]))), 1)
    owner, names = ".".join(parts[:cut]), parts[cut:]
    if names and _private(names[0]) and owner != module:
        return False
    owner_parts = owner.split(".")
    for i, part in enumerate(owner_parts):
        package = ".".join(owner_parts[:i])
        if _private(part) and not (module == package or module.startswith(package + ".")):
            return False
    return True


def _private_uses(module: str, where: str, source: str) -> list[str]:
    """Private names (a leading underscore) of another module that `module` imports, or
    reads as an attribute of a module it imported. A module's private names are its own;
    a private module (cxlhm._native) belongs to the package that holds it."""
    tree = ast.parse(source, where)
    bound: dict[str, str] = {}  # local name -> the module (or module attribute) it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in LAYERS:
                    continue
                if not _may_use(module, alias.name):
                    found.append(f"{where}:{node.lineno} imports {alias.name}")
                bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node, where.endswith("__init__.py"))
            if target.split(".")[0] not in LAYERS:
                continue
            for alias in node.names:
                if not _may_use(module, f"{target}.{alias.name}"):
                    found.append(f"{where}:{node.lineno} imports {target}.{alias.name}")
                bound[alias.asname or alias.name] = f"{target}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                and _is_module(bound[node.value.id]) and not _may_use(module, f"{bound[node.value.id]}.{node.attr}"):
            found.append(f"{where}:{node.lineno} uses {bound[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_used_across_modules():
    wrong = [use for module, path in sorted(MODULES.items())
             for use in _private_uses(module, str(path.relative_to(ROOT)), path.read_text())]
    assert not wrong, "\n".join(wrong)


def test_the_private_use_check_sees_imports_and_attributes():
    """The check above can fail: a module reaching into another module's privates, in
    its own package or another's; a private module is open to its own package only."""
    source = ("from cxlhm.blocktable import _home\nimport cxlhm._native\nfrom cxlhm import blocktable as btm\n"
              "x = btm._bucket\nfrom firmware_policies import lists\ny = lists.home\nz = btm.lookup\n"
              "from cxlhm.sumtable import _xxh3\n")
    uses = _private_uses("firmware_policies.probe", "firmware_policies/probe.py", source)
    assert [u.split(" ", 1)[1] for u in uses] == ["imports cxlhm.blocktable._home", "imports cxlhm._native",
                                                  "imports cxlhm.sumtable._xxh3", "uses cxlhm.blocktable._bucket"]
    inside = _private_uses("cxlhm.media.native", "cxlhm/media/native.py",
                           "from cxlhm import _native\nfrom cxlhm.sumtable import _xxh3\nfrom cxlhm import sumtable\n"
                           "a = sumtable._xxh3\n")
    assert [u.split(" ", 1)[1] for u in inside] == ["imports cxlhm.sumtable._xxh3", "uses cxlhm.sumtable._xxh3"]


@pytest.mark.parametrize("top", sorted(LAYERS))
def test_no_file_over_600_lines_without_a_reason(top):
    """Small modules that own one thing: a longer file says at its top why it is one."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in (ROOT / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600 and "one file because" not in p.read_text()[:2000]]
    assert not long, "\n".join(long)


# ---------------------------------------------------------------- no reaching past the handle
# host_runtime.driver.DeviceHandle offers the declared device interface itself and keeps
# its device private; outside the device package (cxlhm/device/) and the handle's own
# module nothing reads the device behind a handle. Types are not known to ast, so this
# is a heuristic over names; it matches
#   - `<r>.device` / `<r>._device` where the receiver r's last name ends in "handle"
#     (handle, self.handle, share.handle, device_handle, ...) or is one of the short
#     names handles go by here (h, h2, dev, dev_handle);
#   - `<r>._device` on any receiver but `self` (a part's own `self._device` is its own);
#   - getattr(<r>, "device" / "_device") with such an r.
# It does not see a handle renamed to another name first (x = handle; x.device).
HANDLE_SHORT_NAMES = {"h", "h2", "dev", "dev_handle"}
REACH_ROOTS = ("cxlhm", "host_runtime", "cxlhm_apps", "bench", "examples")
REACH_ALLOWED = {"cxlhm/device", "host_runtime/driver.py"}  # the device itself; the handle's own module


def _last_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _handle_like(node: ast.AST) -> bool:
    name = _last_name(node)
    return name is not None and (name.endswith("handle") or name in HANDLE_SHORT_NAMES)


def _reaches_past_a_handle(where: str, source: str) -> list[str]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Attribute) and node.attr in ("device", "_device"):
            receiver = node.value
            if _handle_like(receiver) or (node.attr == "_device" and _last_name(receiver) != "self"):
                found.append((node.lineno, f"{where}:{node.lineno} reads {ast.unparse(node)}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in ("device", "_device") and _handle_like(node.args[0]):
            found.append((node.lineno, f"{where}:{node.lineno} reads {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def _reach_checked_files() -> list[Path]:
    files = []
    for root in REACH_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel == allowed or rel.startswith(allowed + "/") for allowed in REACH_ALLOWED):
                files.append(path)
    return files


def test_nothing_outside_the_device_reaches_past_a_device_handle():
    """Callers use DeviceHandle's declared interface (cxlhm.device.interface); a white-box
    test or bench that needs the device's parts opens the Device itself."""
    files = _reach_checked_files()
    assert any(p.parts[-2:] == ("fio", "engines.py") for p in files) and any(p.name == "replay.py" for p in files)
    wrong = [use for path in files for use in _reaches_past_a_handle(str(path.relative_to(ROOT)), path.read_text())]
    assert not wrong, "\n".join(wrong)


def test_the_reach_check_sees_a_handle_s_device_read():
    """The check above can fail: each form it matches, reintroduced; and what it leaves alone."""
    source = ("d = handle.device\nself.handle.device.thread_hits_misses()\nshare.handle._device.ssd\n"
              "h.device.flush()\nx = getattr(device_handle, 'device', None)\nother._device.hint(1)\n"
              "self.dev.device\n"
              # left alone: a part's own device, a mailbox context's, a result's dict, a tensor's
              "self._device.warm_up()\nctx.device.capacity\nresult.device['hits']\ntensor.device.type\n")
    uses = _reaches_past_a_handle("cxlhm_apps/probe.py", source)
    assert [u.split(" reads ", 1)[1] for u in uses] == [
        "handle.device", "self.handle.device", "share.handle._device", "h.device",
        "getattr(device_handle, 'device', None)", "other._device", "self.dev.device"]
