"""The back-end conformance suite: subclass `BackendTests` in a test module, set `kind`
(a name in cxlhm.media.registry.BACKENDS) or override `open_backend`, and pytest runs
every check below against it - the round trip, batches, holes, the one-owner lock,
reopen (if `caps.persistent`), split-phase I/O and the AsyncBackend protocol (if
`caps.async_io`), and a hypothesis state machine against a dict model.

    from cxlhm.testing.backends import BackendTests

    class TestMyBackend(BackendTests):
        kind = "my-backend"

I/O rows follow cxlhm.media.ssd's layout; buffers are page-aligned and offsets and
lengths multiples of 4 KiB (what the device issues, and what O_DIRECT needs).
"""
from __future__ import annotations

import mmap
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from cxlhm.config import ConfigError
from cxlhm.media.backend import AsyncBackend, Backend, BackendCaps, SplitPhaseRing
from cxlhm.media.registry import BACKENDS
from cxlhm.media.ssd import IO_FIELDS

BLOCK = 4096


class Buffers:
    """`n` page-aligned host buffers of one block each."""

    def __init__(self, n: int):
        self._map = mmap.mmap(-1, n * BLOCK)
        self.arrays = np.frombuffer(self._map, np.uint8).reshape(n, BLOCK)
        self.base = self.arrays.ctypes.data

    def address(self, i: int) -> int:
        return self.base + i * BLOCK


def protocol_members(protocol) -> list[str]:
    """The attributes and methods a typing.Protocol declares (its own and its bases')."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls is object or cls.__name__ in ("Protocol", "Generic"):
            continue
        names |= set(getattr(cls, "__annotations__", {}))
        names |= {n for n, v in vars(cls).items() if (callable(v) or isinstance(v, property)) and not n.startswith("_")}
    return sorted(names)


def missing_members(obj, protocol) -> list[str]:
    """What `obj` lacks of `protocol` (a method that is not callable counts as missing)."""
    wanted = protocol_members(protocol)
    methods = {n for n in wanted if callable(vars(protocol).get(n))}
    return [n for n in wanted if not hasattr(obj, n) or (n in methods and not callable(getattr(obj, n)))]


def rows(entries) -> np.ndarray:
    """I/O rows from (buffer address, file block, is_write) triples."""
    ops = np.zeros((len(entries), IO_FIELDS), np.int64)
    for i, (addr, block, write) in enumerate(entries):
        ops[i] = (addr, BLOCK, block * BLOCK, int(write))
    return ops


class BackendTests:
    kind: str = ""
    capacity = 1 << 20

    def open_backend(self, path: str | None, capacity: int | None = None) -> Backend:
        cls = BACKENDS.get(self.kind)
        return cls(path, capacity or self.capacity, 32, source="conformance test")

    @pytest.fixture
    def image(self, tmp_path) -> str:
        return str(tmp_path / "backend.img")

    def test_is_a_backend_with_declared_caps(self, image):
        backend = self.open_backend(image)
        try:
            assert isinstance(backend, Backend) and isinstance(backend.caps, BackendCaps)
            assert backend.capacity == self.capacity and backend.path == image and not backend.temporary
            assert backend.queue_depth >= 1
        finally:
            backend.close()

    def test_written_blocks_read_back_and_holes_read_zero(self, image):
        backend = self.open_backend(image)
        bufs = Buffers(6)
        try:
            bufs.arrays[:3] = np.random.default_rng(0).integers(0, 256, (3, BLOCK), dtype=np.uint8)
            res = backend.submit(rows([(bufs.address(i), b, True) for i, b in enumerate((0, 7, 255))]))
            assert res.tolist() == [BLOCK] * 3
            bufs.arrays[3:] = 0xEE
            res = backend.submit(rows([(bufs.address(3 + i), b, False) for i, b in enumerate((255, 7, 1))]))
            assert res.tolist() == [BLOCK] * 3
            assert (bufs.arrays[3] == bufs.arrays[2]).all() and (bufs.arrays[4] == bufs.arrays[1]).all()
            assert (bufs.arrays[5] == 0).all()
            assert backend.submit(rows([])).shape == (0,)
        finally:
            backend.close()

    def test_one_owner_per_image(self, image):
        backend = self.open_backend(image)
        try:
            with pytest.raises(ConfigError, match="already open") as err:
                self.open_backend(image)
            assert err.value.key == "backend.path"
        finally:
            backend.close()
        self.open_backend(image).close()  # close() let go of it

    def test_temporary_image(self):
        backend = self.open_backend(None)
        bufs = Buffers(2)
        try:
            assert backend.temporary
            bufs.arrays[0] = 7
            backend.submit(rows([(bufs.address(0), 3, True)]))
            backend.submit(rows([(bufs.address(1), 3, False)]))
            assert (bufs.arrays[1] == 7).all()
        finally:
            backend.close()

    def test_bytes_survive_sync_close_and_reopen(self, image):
        backend = self.open_backend(image)
        if not backend.caps.persistent:
            backend.close()
            pytest.skip("not persistent")
        bufs = Buffers(2)
        bufs.arrays[0] = 0x5A
        backend.submit(rows([(bufs.address(0), 9, True)]))
        backend.sync()
        backend.close()
        backend = self.open_backend(image)
        try:
            backend.submit(rows([(bufs.address(1), 9, False)]))
            assert (bufs.arrays[1] == 0x5A).all()
        finally:
            backend.close()

    def test_a_back_end_claiming_async_io_is_an_async_backend(self, image):
        """caps.async_io promises the AsyncBackend protocol (what the device's streams,
        split-phase reads, write waves and writes behind call), its shared ring too."""
        backend = self.open_backend(image)
        try:
            if not backend.caps.async_io:
                pytest.skip("no split-phase I/O claimed")
            missing = missing_members(backend, AsyncBackend)
            assert not missing, f"{type(backend).__name__} claims caps.async_io but lacks {missing} (AsyncBackend)"
            assert isinstance(backend, AsyncBackend)
            assert 1 <= backend.async_room() <= backend.queue_depth and backend.queued() == 0
            ring = backend.shared_ring(4)
            missing = missing_members(ring, SplitPhaseRing)
            assert not missing, f"its shared_ring() lacks {missing} (SplitPhaseRing)"
        finally:
            backend.close()

    def test_split_phase_io_completes_by_tag(self, image):
        backend = self.open_backend(image)
        try:
            if not backend.caps.async_io:
                pytest.skip("no split-phase I/O")
            bufs = Buffers(4)
            bufs.arrays[:2] = [[1], [2]]
            backend.submit(rows([(bufs.address(0), 4, True), (bufs.address(1), 5, True)]))
            assert backend.queue(rows([(bufs.address(2), 4, False), (bufs.address(3), 5, False)]),
                                 np.array([40, 50])) == 2
            got: dict[int, int] = {}
            while len(got) < 2:
                tags, res = backend.reap(1)
                got.update(zip(tags.tolist(), res.tolist()))
            assert got == {40: BLOCK, 50: BLOCK} and backend.queued() == 0
            assert (bufs.arrays[2] == 1).all() and (bufs.arrays[3] == 2).all()
        finally:
            backend.close()

    def test_matches_a_dict_model(self, tmp_path):
        """Random writes, reads, syncs and reopens against a dict of block -> bytes."""
        suite = self

        class Machine(RuleBasedStateMachine):
            def __init__(self):
                super().__init__()
                self.path = str(Path(tempfile.mkdtemp(dir=tmp_path)) / "m.img")
                self.backend = suite.open_backend(self.path)
                self.bufs = Buffers(4)
                self.model: dict[int, bytes] = {}

            @rule(blocks=st.lists(st.integers(0, 31), min_size=1, max_size=4, unique=True), seed=st.integers(0, 255))
            def write(self, blocks, seed):
                for i, block in enumerate(blocks):
                    self.bufs.arrays[i] = (np.arange(BLOCK) * (seed + 1) + block) % 256
                res = self.backend.submit(rows([(self.bufs.address(i), b, True) for i, b in enumerate(blocks)]))
                assert res.tolist() == [BLOCK] * len(blocks)
                for i, block in enumerate(blocks):
                    self.model[block] = self.bufs.arrays[i].tobytes()

            @rule(blocks=st.lists(st.integers(0, 31), min_size=1, max_size=4, unique=True))
            def read(self, blocks):
                res = self.backend.submit(rows([(self.bufs.address(i), b, False) for i, b in enumerate(blocks)]))
                assert res.tolist() == [BLOCK] * len(blocks)
                for i, block in enumerate(blocks):
                    assert self.bufs.arrays[i].tobytes() == self.model.get(block, bytes(BLOCK))

            @rule()
            def sync(self):
                self.backend.sync()

            @rule()
            def reopen(self):
                if self.backend.caps.persistent:
                    self.backend.sync()
                    self.backend.close()
                    self.backend = suite.open_backend(self.path)

            @invariant()
            def capacity_unchanged(self):
                assert self.backend.capacity == suite.capacity

            def teardown(self):
                self.backend.close()

        run_state_machine_as_test(Machine, settings=settings(max_examples=15, stateful_step_count=20, deadline=None))
