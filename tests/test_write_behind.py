"""Write-behind (cxlhm/device/behind.py): a whole-block write of at least a chunk goes to
the SSD without the host waiting, and is settled later - by the next one, or first by
whatever would touch its blocks, from any thread. Checked against a byte model of the
address space (every kind of access mixed in, across a reopen), with a write-behind that
fails (its block stays dirty, written back later), another thread settling what an idle
thread started, and a writer killed with one in flight (its blocks read back new, or
raise; never old bytes passed off as new)."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm.config import ConfigError
from cxlhm.device import behind
from cxlhm.integrity import PoisonError, checksum
from cxlhm.media.ssd import SharedRing
from device_parts import open_parts
from host_runtime.driver import open_device
from test_crash import reopen

BLOCK = 4096
SLOTS = 32
BLOCKS = 256


def config(path):
    return {"capacity": BLOCKS * BLOCK, "block_size": BLOCK, "dram_bytes": SLOTS * BLOCK,
            "backend": {"path": str(path)}}


@pytest.fixture
def behind_calls(monkeypatch):
    """Writes of two blocks or more go behind; the blocks of each write-behind started."""
    monkeypatch.setattr(behind, "BEHIND_MIN_BYTES", 2 * BLOCK)
    started: list[int] = []
    real = behind.WriteBehind._start

    def spy(self, slots, *args):
        started.append(slots.shape[0])
        return real(self, slots, *args)

    monkeypatch.setattr(behind.WriteBehind, "_start", spy)
    return started


def _pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


_op = st.one_of(
    st.tuples(st.just("chunk"), st.integers(0, BLOCKS - 8), st.integers(2, 8)),  # whole blocks: written behind
    st.tuples(st.just("store"), st.integers(0, BLOCKS * BLOCK - 1), st.integers(1, 3 * BLOCK)),
    st.tuples(st.just("load"), st.integers(0, BLOCKS * BLOCK - 1), st.integers(1, 3 * BLOCK)),
    st.tuples(st.just("stream"), st.integers(0, BLOCKS - 16), st.integers(1, 16)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=3, max_size=14))
def test_writes_behind_read_back_as_the_byte_model_says(tmp_path_factory, behind_calls, ops):
    path = tmp_path_factory.mktemp("behind") / "b.img"
    model = np.zeros(BLOCKS * BLOCK, np.uint8)
    with open_device(config(path)) as dev:
        for i, (kind, a, b) in enumerate(ops):
            if kind == "chunk":
                data = _pattern(b * BLOCK, i)
                dev.store(a * BLOCK, data)
                model[a * BLOCK:(a + b) * BLOCK] = data
            elif kind == "store":
                data = _pattern(min(b, model.size - a), i)
                dev.store(a, data)
                model[a:a + data.size] = data
            elif kind == "load":
                n = min(b, model.size - a)
                assert dev.load(a, n) == model[a:a + n].tobytes()
            elif kind == "stream":  # 4 KiB reads at QD4 through the compiled stream
                hpas = (a + np.arange(b, dtype=np.int64)) * BLOCK
                out = np.zeros(b * BLOCK, np.uint8)
                ran = dev.stream_io(hpas, np.full(b, BLOCK, np.int64),
                                    out.ctypes.data + np.arange(b, dtype=np.int64) * BLOCK, 4)
                assert ran.count == b
                assert out.tobytes() == model[a * BLOCK:(a + b) * BLOCK].tobytes()
            else:
                dev.flush()
        assert dev.load(0, model.size) == model.tobytes()  # evicted blocks come back from the SSD, verified
        assert dev.stats()["poisoned_blocks"] == 0
    if any(kind == "chunk" for kind, _, _ in ops):
        assert behind_calls
    with open_device(config(path)) as dev:  # the checksums recorded as the writes landed hold
        assert dev.load(0, model.size) == model.tobytes()
        assert dev.stats()["poisoned_blocks"] == 0


def test_a_chunk_is_on_the_ssd_once_the_next_one_starts(tmp_path, behind_calls):
    with open_device(config(tmp_path / "n.img")) as dev:
        first, second = _pattern(4 * BLOCK, 1), _pattern(4 * BLOCK, 2)
        dev.store(0, first)
        assert dev.stats()["dirty_blocks"] == 4  # in flight: dirty until it lands
        dev.store(64 * BLOCK, second)
        stats = dev.stats()
        assert stats["dirty_blocks"] == 4 and stats["ssd_writes"] == 4  # the first landed, clean
        assert behind_calls == [4, 4]
        with open(tmp_path / "n.img", "rb") as image:  # on the image itself, before any flush
            assert image.read(4 * BLOCK) == first.tobytes()


def test_a_failed_write_behind_leaves_its_blocks_dirty_for_a_later_write_back(tmp_path, behind_calls, monkeypatch):
    real = SharedRing.reap_all
    failures = [1]

    def failing(self):
        tags, res = real(self)
        if failures[0]:
            failures[0] -= 1
            res = np.full_like(res, -5)  # EIO for every write of the first write-behind
        return tags, res

    monkeypatch.setattr(SharedRing, "reap_all", failing)
    data = _pattern(6 * BLOCK, 3)
    with open_device(config(tmp_path / "f.img")) as dev:
        dev.store(8 * BLOCK, data)
        dev.store(100 * BLOCK, _pattern(2 * BLOCK, 4))  # settles the first: it failed
        assert dev.stats()["dirty_blocks"] >= 6 and dev.stats()["poisoned_blocks"] == 0
        assert dev.load(8 * BLOCK, data.size) == data.tobytes()
        assert dev.flush() >= 6  # written back now
    with open_device(config(tmp_path / "f.img")) as dev:
        assert dev.load(8 * BLOCK, data.size) == data.tobytes()


def test_another_thread_settles_what_an_idle_thread_started(tmp_path, behind_calls):
    dev = open_device(config(tmp_path / "t.img"))
    data, patch = _pattern(8 * BLOCK, 5), _pattern(100, 6)
    started, release = threading.Event(), threading.Event()

    def writer():  # starts a write-behind, then stays away from the device
        dev.store(16 * BLOCK, data)
        started.set()
        release.wait(60)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert started.wait(60)
        done = threading.Event()

        def toucher():  # a write into the chunk must wait for the write-behind to land
            dev.store(20 * BLOCK + 7, patch)
            done.set()

        other = threading.Thread(target=toucher)
        other.start()
        other.join(60)
        assert done.is_set(), "a thread waited forever on a write-behind another thread submitted"
    finally:
        release.set()
        thread.join(60)
    want = data.copy()
    want[4 * BLOCK + 7:4 * BLOCK + 107] = patch
    assert dev.load(16 * BLOCK, want.size) == want.tobytes()
    dev.close()
    with open_device(config(tmp_path / "t.img")) as again:
        assert again.load(16 * BLOCK, want.size) == want.tobytes()


@pytest.mark.parametrize("settled", [False, True])
def test_a_writer_killed_after_a_write_behind_loses_no_byte_silently(tmp_path, behind_calls, settled):
    """Killed with the write-behind in flight: each block reads back new or raises (never
    the old bytes). Killed after the next write settled it: it landed, so every block
    reads back new - its checksum was logged before it was submitted."""
    image = tmp_path / "k.img"
    old, new = _pattern(16 * BLOCK, 7), _pattern(16 * BLOCK, 8)
    with open_device(config(image)) as dev:
        dev.store(0, old)
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            dev = open_device(config(image))
            dev.store(0, new)
            if settled:
                dev.store(128 * BLOCK, _pattern(2 * BLOCK, 9))
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    with reopen(config(image)) as dev:
        for b in range(16):
            try:
                got = dev.load(b * BLOCK, BLOCK)
            except PoisonError:
                assert not settled, f"block {b} landed before the kill but was lost"
                continue  # its write did not land whole: the checksum logged before it says so
            assert got == new[b * BLOCK:(b + 1) * BLOCK].tobytes(), f"block {b} read back bytes not written last"


def test_write_behind_off_writes_back_only_on_eviction_or_flush(tmp_path, behind_calls):
    cfg = {**config(tmp_path / "o.img"), "firmware": {"write_behind": False}}
    with open_device(cfg) as dev:
        dev.store(0, _pattern(4 * BLOCK, 10))
        dev.store(64 * BLOCK, _pattern(4 * BLOCK, 11))
        assert dev.stats()["ssd_writes"] == 0 and dev.stats()["dirty_blocks"] == 8
        assert behind_calls == []
        assert dev.flush() == 8


def test_a_bad_write_behind_value_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="firmware.write_behind.*true or false"):
        open_device({**config(tmp_path / "v.img"), "firmware": {"write_behind": "yes"}})


def test_a_long_write_behind_is_checksummed_as_it_is_copied(tmp_path, monkeypatch):
    """A write long enough for the copy engine's two threads checksums each block right
    after its copy: the sums recorded when it lands are those of the bytes written, and
    the blocks read back from the SSD (verified against them) after being evicted."""
    block, slots = 64 << 10, 16
    cfg = {"capacity": 64 * block, "block_size": block, "dram_bytes": slots * block,
           "backend": {"path": str(tmp_path / "img")}}
    monkeypatch.setattr(behind, "BEHIND_MIN_BYTES", 2 * block)
    hashed: list[int] = []
    real = behind.WriteBehind._copy_in_hashed
    monkeypatch.setattr(behind.WriteBehind, "_copy_in_hashed",
                        lambda self, s, addr: hashed.append(s.shape[0]) or real(self, s, addr))
    first = _pattern(8 * block, 1)
    with open_parts(cfg) as (dev, device):
        dev.store(0, first)
        dev.store(8 * block, _pattern(8 * block, 2))
        device.drain()
        assert hashed == [8, 8]  # (the path under test: each long write went through it)
        found, sums = device.checksums.sums.lookup(np.arange(8, dtype=np.int64))
        assert found.all()
        assert sums.tolist() == [checksum(first[b * block:(b + 1) * block]) for b in range(8)]
        for at in range(16, 64, 8):  # evict the first write's blocks: DRAM holds 16
            dev.store(at * block, _pattern(8 * block, at))
        device.drain()
        assert dev.load(0, 8 * block) == first.tobytes()
