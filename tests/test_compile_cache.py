"""The firmware is compiled once per install: a second process loads every kernel it
runs from the on-disk cache (no compile), and the first one says it is compiling."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json
from cxlhm import firmware as fw
from host_runtime.driver import open_device
with open_device({"capacity": 1 << 22, "block_size": 4096, "dram_bytes": 8 * 4096, "firmware": {"policy": "lru"}}) as dev:
    for i in range(32):
        dev.store(i * 4096, bytes([i]) * 100)
    assert dev.load(5 * 4096, 100) == bytes([5]) * 100
    k = dev.device.kernels
    stats = {name: getattr(k, name).stats for name in ("access",)}
    print(json.dumps({name: [sum(s.cache_hits.values()), sum(s.cache_misses.values())] for name, s in stats.items()}))
"""


def run(cache) -> subprocess.CompletedProcess:
    env = dict(os.environ, CXLHM_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)


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
