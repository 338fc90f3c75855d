"""Window mode keeps explicit mode's crash guarantee: after a kill -9, every block reads
back as the bytes last written to it or as an error (poison), never as older bytes -
whichever mode reopens the image. A load from a poisoned window page raises SIGBUS (a
machine-check on real CXL memory), so reads that may meet poison run in a child."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from cxlhm.integrity import PoisonError
from cxlhm.window import probe
from host_runtime.driver import open_device

KIB = 16 * 1024
UNAVAILABLE = probe()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"userfaultfd window unavailable: {UNAVAILABLE}")

PRELUDE = """
import json, os, signal, sys
import numpy as np
from cxlhm.window import WindowOptions, open_window
cfg = {"capacity": 4 << 20, "block_size": %d, "dram_bytes": 8 * %d, "backend": {"path": sys.argv[1]}}
""" % (KIB, KIB)


def child(tmp_path, body: str, image) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, str(script), str(image)], capture_output=True, text=True, timeout=300,
                          env=env)


def crash_after_overwrite(tmp_path, image):
    """Write A to blocks 0-3 and flush (on the SSD), write B over blocks 1 and 2 (device
    DRAM only), then die by SIGKILL."""
    r = child(tmp_path, """
        w = open_window(cfg, WindowOptions(sample_interval_ms=0))
        a = w.ndarray(0, 4 * %d, np.uint8)
        a[:] = ord("A")
        w.flush()
        a[%d + 5] = ord("B")          # one byte of block 1
        a[2 * %d: 3 * %d] = ord("B")  # all of block 2
        print("written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """ % (KIB, KIB, KIB, KIB), image)
    assert r.returncode == -signal.SIGKILL and "written" in r.stdout, r.stderr


def test_explicit_reopen_after_a_window_kill9_serves_no_stale_bytes(tmp_path):
    image = tmp_path / "img"
    crash_after_overwrite(tmp_path, image)
    with open_device({"capacity": 4 << 20, "block_size": KIB, "dram_bytes": 8 * KIB, "backend": {"path": str(image)}}) as dev:
        assert dev.load(0, KIB) == b"A" * KIB and dev.load(3 * KIB, KIB) == b"A" * KIB  # flushed: intact
        for block in (1, 2):
            with pytest.raises(PoisonError):
                dev.load(block * KIB, KIB)  # newer bytes were lost: an error, not the flushed A


def test_window_reopen_after_a_window_kill9_serves_no_stale_bytes(tmp_path):
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    crash_after_overwrite(tmp_path, crashed / "img")
    for block, expect in ((0, "A"), (3, "A"), (1, None), (2, None)):
        image = tmp_path / f"reopen{block}" / "img"  # each reader starts from the crashed image
        shutil.copytree(crashed, image.parent)
        r = child(tmp_path, """
            w = open_window(cfg, WindowOptions(sample_interval_ms=0))
            assert w.unclean_shutdown_detected
            print("read", bytes(w.memoryview(%d * %d, %d))[:1].decode(), flush=True)
            w.close()
        """ % (block, KIB, KIB), image)
        if expect is None:  # poisoned: the load raises SIGBUS, no bytes come back
            assert r.returncode == -signal.SIGBUS and "read" not in r.stdout, (block, r.stdout, r.stderr)
        else:
            assert r.returncode == 0 and f"read {expect}" in r.stdout, (block, r.stdout, r.stderr)


def test_window_clean_close_keeps_checksums_explicit_mode_verifies(tmp_path):
    """Blocks the window wrote back carry checksums: explicit mode verifies them (a
    flipped bit on the SSD is poison, not data) and finds the window's bytes intact."""
    image = tmp_path / "img"
    r = child(tmp_path, """
        with open_window(cfg, WindowOptions(sample_interval_ms=0)) as w:
            a = w.ndarray(0, 64 * %d, np.uint8)   # 64 blocks through 8 slots: evictions write back
            a[:] = np.arange(a.size) %% 251
            del a
    """ % KIB, image)
    assert r.returncode == 0, r.stderr
    cfg = {"capacity": 4 << 20, "block_size": KIB, "dram_bytes": 8 * KIB, "backend": {"path": str(image)}}
    with open_device(cfg) as dev:
        import numpy as np
        assert dev.load(0, 64 * KIB) == (np.arange(64 * KIB) % 251).astype(np.uint8).tobytes()
    with open(image, "r+b") as f:  # a bit flips on the medium
        f.seek(5 * KIB + 100)
        byte = f.read(1)
        f.seek(5 * KIB + 100)
        f.write(bytes([byte[0] ^ 1]))
    with open_device(cfg) as dev:
        with pytest.raises(PoisonError):
            dev.load(5 * KIB, KIB)
