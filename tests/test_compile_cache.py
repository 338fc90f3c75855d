"""The firmware and the streamed I/O loop are compiled once per install: a second
process loads every kernel it runs from the on-disk cache (no compile), the first one
says it is compiling, and the cache's source stamp covers every file their compiled
code calls into (so an edit compiles afresh)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

import firmware_policies
from cxlhm import firmware as fw
from cxlhm import jit
from cxlhm.device.stream import loop
from cxlhm import sim

SCRIPT = """
import json
from cxlhm import firmware as fw
from cxlhm.config import load_config
from cxlhm.device import Device
from host_runtime.driver import DeviceHandle
device = Device(load_config({"capacity": 1 << 22, "block_size": 4096, "dram_bytes": 8 * 4096, "firmware": {"policy": "lru"}}))
with DeviceHandle(device) as dev:
    for i in range(32):
        dev.store(i * 4096, bytes([i]) * 100)
    assert dev.load(5 * 4096, 100) == bytes([5]) * 100
    k = device.kernels
    stats = {name: getattr(k, name).stats for name in ("access",)}
    print(json.dumps({name: [sum(s.cache_hits.values()), sum(s.cache_misses.values())] for name, s in stats.items()}))
"""


# a stream of 4 KiB reads that miss (the loop and its completions run), on a file-backed device
STREAM_SCRIPT = """
import json, sys
import numpy as np
from cxlhm.device.stream import loop
from cxlhm import sim
from cxlhm.config import load_config
from cxlhm.device import Device
from host_runtime.driver import DeviceHandle
device = Device(load_config({"capacity": 1 << 24, "block_size": "4KiB", "dram_bytes": "64KiB",
                             "backend": {"path": sys.argv[1], "queue_depth": 8}}))
with DeviceHandle(device) as dev:
    n = 64
    hpas = np.arange(n, dtype=np.int64)[::-1] * 4096 * 3
    buf = np.zeros(n * 4096, np.uint8)
    result = dev.stream_io(hpas, np.full(n, 4096, np.int64), buf.ctypes.data + np.arange(n) * 4096, 8)
    assert result.count == n, result
    stats = {f.__name__: f.stats for f in loop.kernels_for(device.policy)}
    print(json.dumps({name: [sum(s.cache_hits.values()), sum(s.cache_misses.values())] for name, s in stats.items()}))
"""


def run(cache, script=SCRIPT, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, CXLHM_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.slow
def test_second_process_loads_the_firmware_from_the_cache(tmp_path):
    first = run(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "compiling the lru firmware" in first.stderr
    second = run(tmp_path)
    assert second.returncode == 0, second.stderr
    assert "compiling" not in second.stderr
    stats = json.loads(second.stdout.strip().splitlines()[-1])
    for name, (hits, misses) in stats.items():
        assert hits >= 1 and misses == 0, (name, hits, misses)


@pytest.mark.slow
def test_second_process_loads_the_stream_loop_from_the_cache(tmp_path):
    image = str(tmp_path / "image")
    first = run(tmp_path / "cache", STREAM_SCRIPT, image)
    assert first.returncode == 0, first.stderr
    assert "compiling the lru streamed I/O loop" in first.stderr
    second = run(tmp_path / "cache", STREAM_SCRIPT, image)
    assert second.returncode == 0, second.stderr
    assert "compiling" not in second.stderr
    stats = json.loads(second.stdout.strip().splitlines()[-1])
    assert set(stats) == {"complete", "run"}
    for name, (hits, misses) in stats.items():
        assert hits >= 1 and misses == 0, (name, hits, misses)


def _compiled_callees(functions) -> set[Path]:
    """The source files of every compiled function reachable from `functions` through
    module globals (what their compiled code may inline)."""
    files, seen, todo = set(), set(), list(functions)
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        py = f.py_func
        files.add(Path(py.__code__.co_filename).resolve())
        for name in py.__code__.co_names:
            value = py.__globals__.get(name)
            if isinstance(value, numba.core.registry.CPUDispatcher):
                todo.append(value)
            elif hasattr(value, "__dict__"):  # a module (or a policy) whose functions the code reaches by attribute
                todo.extend(v for v in vars(value).values() if isinstance(v, numba.core.registry.CPUDispatcher))
    return files


@pytest.mark.parametrize("policy", ["lru", "hymcache"])
def test_the_cache_stamp_covers_what_the_compiled_kernels_call(policy):
    p = firmware_policies.get(policy)
    kernels = [*fw.kernels_for(p), *loop.kernels_for(p), sim._replay_for(p), sim._replay_for(p, timed=True)]
    generated = (jit.cache_dir() / "generated").resolve()
    sources = {path.resolve() for path in jit._SOURCES}
    called = {path for path in _compiled_callees(kernels) if path.parent != generated}
    assert Path(loop.__file__).with_name("loop_kernels.py").resolve() in sources
    assert Path(sim.__file__).with_name("sim_kernels.py").resolve() in sources
    assert called and called <= sources, sorted(map(str, called - sources))


def test_threads_that_ask_for_a_generated_module_at_once_all_get_it_whole(tmp_path, monkeypatch):
    """The first import of a generated module runs its code (compiles, for the kernels);
    a thread asking meanwhile waits for it instead of taking the half-run module."""
    import threading

    from threads import run_all

    monkeypatch.setenv("CXLHM_CACHE_DIR", str(tmp_path))
    source = "import time\ntime.sleep(0.3)\n\ndef ready():\n    return 42\n"
    name = f"slow_{os.getpid()}_{threading.get_ident()}"
    got, errors = [], []

    def ask():
        try:
            got.append(jit.generated_module(name, source).ready())
        except Exception as exc:  # reported below
            errors.append(exc)

    run_all([threading.Thread(target=ask) for _ in range(4)], hang="an import never finished")
    assert errors == [] and got == [42] * 4
