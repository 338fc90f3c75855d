"""The worked examples of docs/extending.md (examples/extending/, one file per plug-in
family) as importable modules, the way an outside package's module would be.

examples/ is not installed with cxlhm, so the checkout's root goes at the end of
sys.path (an installed module still wins any clash; `example` refuses a foreign
`examples` package rather than test the wrong file)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "extending"


def example(name: str) -> ModuleType:
    """examples/extending/<name>.py, imported as examples.extending.<name>."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    module = importlib.import_module(f"examples.extending.{name}")
    if Path(module.__file__).resolve() != EXAMPLES / f"{name}.py":
        raise ImportError(f"examples.extending.{name} resolved to {module.__file__}, not this checkout's "
                          f"{EXAMPLES / (name + '.py')} (another package named 'examples' is installed)")
    return module
