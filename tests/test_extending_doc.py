"""docs/extending.md shows the tested code and indexes every plug-in family:

- a code block whose first line names an example file (``# examples/extending/X.py``)
  is that file, byte for byte, and every example file is shown so;
- every entry-point group a `Registry(...)` in cxlhm, host_runtime or cxlhm_apps
  declares is in the index, and every group the index names is one of them;
- every example and test path the index names exists, and the test imports its example;
- every interface and conformance suite the index names by its dotted name exists.
"""
import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
EXAMPLES = ROOT / "examples" / "extending"
PACKAGES = ("cxlhm", "host_runtime", "cxlhm_apps")
NAMES_A_FILE = re.compile(r"# (examples/extending/[\w/]+\.py)\n")


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[\w-]*\n(.*?)^```", text, re.S | re.M)


def shown_examples(text: str) -> dict[str, str]:
    """{path: the code shown for it} for every block whose first line names an example."""
    shown = {}
    for block in code_blocks(text):
        first = NAMES_A_FILE.match(block)
        if first:
            assert first.group(1) not in shown, f"{first.group(1)} is shown twice"
            shown[first.group(1)] = block[first.end():]
    return shown


def _string_constants(tree: ast.Module) -> dict[str, str]:
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def declared_groups() -> dict[str, str]:
    """{entry-point group: file} for every Registry(family, group, ...) in the packages
    (a group given as a module-level string constant is looked up)."""
    groups = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            if "Registry(" not in source:
                continue
            tree = ast.parse(source)
            constants = _string_constants(tree)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call)
                        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Registry"):
                    continue
                given = [node.args[1]] if len(node.args) >= 2 else [k.value for k in node.keywords if k.arg == "group"]
                for group in given:
                    if isinstance(group, ast.Constant) and isinstance(group.value, str):
                        groups[group.value] = str(path.relative_to(ROOT))
                    elif isinstance(group, ast.Name) and group.id in constants:
                        groups[constants[group.id]] = str(path.relative_to(ROOT))
    return groups


def resolve(dotted: str):
    """The object a dotted name such as cxlhm.testing.policies.PolicyConformance names."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def index_rows(text: str) -> list[list[str]]:
    section = text.split("## The index", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_each_example_shown_is_the_file():
    shown = shown_examples(DOC.read_text())
    assert shown, "no code block names an example file"
    for path, code in shown.items():
        assert (ROOT / path).is_file(), f"docs/extending.md shows {path}, which does not exist"
        assert code == (ROOT / path).read_text(), f"the code docs/extending.md shows for {path} is not that file"


def test_every_example_file_is_shown():
    files = {str(p.relative_to(ROOT)) for p in EXAMPLES.glob("*.py") if p.name != "__init__.py"}
    assert files and files <= set(shown_examples(DOC.read_text())), \
        f"not shown in docs/extending.md: {sorted(files - set(shown_examples(DOC.read_text())))}"


def test_every_entry_point_group_is_indexed():
    declared = declared_groups()
    assert {"cxlhm.firmware_policies", "cxlhm.backends", "cxlhm.fio_engines"} <= set(declared)  # the scan works
    indexed = {group for row in index_rows(DOC.read_text()) for group in re.findall(r"`(cxlhm\.[\w.]+)`", row[1])}
    missing = {g: f for g, f in declared.items() if g not in indexed}
    assert not missing, f"entry-point groups not in docs/extending.md's index: {missing}"
    assert indexed <= set(declared), f"the index names groups no registry declares: {sorted(indexed - set(declared))}"


def test_indexed_examples_and_tests_exist_and_belong_together():
    rows = index_rows(DOC.read_text())
    assert len(rows) >= 10
    for row in rows:
        example, test = (re.fullmatch(r"`([\w/.]+)`", cell) for cell in row[4:6])
        if example is None:
            continue
        example_path, test_path = example.group(1), test and test.group(1)
        assert (ROOT / example_path).is_file(), f"{row[0]}: {example_path} does not exist"
        assert test_path and (ROOT / test_path).is_file(), f"{row[0]}: no test file for {example_path}"
        module = Path(example_path).stem
        source = (ROOT / test_path).read_text()
        assert f'example("{module}")' in source or f"examples.extending.{module}" in source, \
            f"{test_path} does not load {example_path}"


def test_the_interfaces_and_suites_the_index_names_exist():
    named = {name for row in index_rows(DOC.read_text()) for cell in row[2:4]
             for name in re.findall(r"`((?:cxlhm|host_runtime|cxlhm_apps)\.[\w.]+)`", cell)}
    assert len(named) >= 15
    for name in sorted(named):
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            pytest.fail(f"docs/extending.md's index names {name}, which does not resolve: {exc!r}")


@pytest.mark.parametrize("page", ["policies.md", "backends.md"])
def test_family_pages_point_to_the_index(page):
    assert "extending.md" in (ROOT / "docs" / page).read_text()
