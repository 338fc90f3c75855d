"""Names for the compiled firmware in `perf` profiles.

perf shows numba's machine code as anonymous `[JIT]` addresses. A process that calls
`write_perf_map()` after its compiled functions ran once gets /tmp/perf-<pid>.map, which
`perf report` reads by itself: each function of every numba library in the process, with
the stream's loop split into `run`, `step`, `complete`, the policy's `plan`, ... .

Only code compiled in this process has the names: point CXLHM_CACHE_DIR at an empty
folder for the profiled run (it compiles for about a minute first). For example:

    CXLHM_CACHE_DIR=$(mktemp -d) python my_loop.py &   # my_loop.py warms up, then calls write_perf_map()
    perf record -g -p <pid> -- sleep 4; perf report --no-children --sort sym
"""
from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)


def compiled_functions() -> dict[int, str]:
    """Entry address -> symbol of every function of every numba library in this process
    that was compiled here (libraries loaded from numba's cache have no symbol table)."""
    from numba.core.registry import CPUDispatcher
    found: dict[int, str] = {}
    for obj in gc.get_objects():
        # (isinstance would look through a weak proxy, and raise where its object is gone)
        if type(obj) in _PROXIES or not isinstance(obj, CPUDispatcher):
            continue
        for result in obj.overloads.values():
            library = result.library
            module = getattr(library, "_final_module", None)
            if module is None:
                continue
            for function in module.functions:
                if function.is_declaration:
                    continue
                address = library.get_pointer_to_function(function.name)
                if address:
                    found[address] = function.name
    return found


def write_perf_map(path: Path | None = None) -> int:
    """Write the perf map (default /tmp/perf-<pid>.map); returns how many functions it
    names. A function's size is taken as the gap to the next one (at most 1 MiB)."""
    functions = compiled_functions()
    starts = sorted(functions)
    path = path or Path(f"/tmp/perf-{os.getpid()}.map")
    with open(path, "w") as out:
        for start, end in zip(starts, starts[1:] + [starts[-1] + 4096] if starts else []):
            out.write(f"{start:x} {min(end - start, 1 << 20):x} {functions[start]}\n")
    return len(starts)
