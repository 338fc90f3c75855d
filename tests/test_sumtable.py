"""The compiled checksum map and hash (cxlhm/sumtable.py): the map against a dict
(hypothesis state machine through growth and backward-shift deletes, Python's calls
and compiled code's), the compiled xxh3 against Python's, the integrity layer's
checksums kept in it, and streamed reads verifying in their compiled loop."""
import ctypes.util

import numpy as np
import pytest
import xxhash
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cxlhm import sumtable
from cxlhm.integrity import BlockChecksums
from device_parts import open_parts
from host_runtime.driver import open_device

# few distinct blocks, so probe runs collide and deletes shift entries
blocks = st.integers(0, 200) | st.integers(0, 1 << 40)
sums = st.integers(0, (1 << 64) - 1)


class SumTableMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.table = sumtable.SumTable(capacity=4)  # starts tiny: growth is exercised
        self.model: dict[int, int] = {}

    @rule(block=blocks, value=sums)
    def set(self, block, value):
        self.table.set(block, value)
        self.model[block] = value

    @rule(pairs=st.lists(st.tuples(blocks, sums), max_size=40))
    def set_many(self, pairs):
        if not pairs:
            return
        b = np.array([p[0] for p in pairs], np.int64)
        v = np.array([p[1] for p in pairs], np.uint64)
        self.table.set_many(b, v)
        self.model.update(pairs)  # the last of a repeated block wins, as in the table

    @rule(block=blocks)
    def discard(self, block):
        assert self.table.discard(block) == (block in self.model)
        self.model.pop(block, None)

    @rule(some=st.lists(blocks, max_size=30))
    def discard_many(self, some):
        self.table.discard_many(np.array(some, np.int64))
        for block in some:
            self.model.pop(block, None)

    @rule(some=st.lists(blocks, max_size=30))
    def add_missing(self, some):
        """The dirty set's add: those not there yet come back, once each, in order."""
        added = self.table.add_missing(np.array(some, np.int64))
        expected = list(dict.fromkeys(b for b in some if b not in self.model))
        assert added.tolist() == expected
        self.model.update((b, 0) for b in expected)

    @rule(block=blocks, value=sums)
    def compiled_put(self, block, value):
        """What a stream's loop does: insert only while the table stays half empty."""
        keys, values, meta = self.table.compiled()
        room = 2 * (self.table.count + 1) <= keys.shape[0]
        assert sumtable.put_if_room(keys, values, meta, block, np.uint64(value)) == room
        if room:
            self.model[block] = value

    @rule(block=blocks)
    def compiled_remove(self, block):
        sumtable.remove(*self.table.compiled(), block)
        self.model.pop(block, None)

    @rule(more=st.integers(0, 100))
    def reserve(self, more):
        self.table.reserve(more)
        assert 2 * (self.table.count + more) <= self.table.keys.shape[0]

    @rule()
    def clear(self):
        self.table.clear()
        self.model.clear()

    @invariant()
    def agrees_with_the_dict(self):
        assert self.table.count == len(self.model)
        probe = np.array(list(self.model) + [201, 202, 1 << 41], np.int64)
        found, values = self.table.lookup(probe)
        for block, f, v in zip(probe.tolist(), found.tolist(), values.tolist()):
            assert f == (block in self.model)
            if f:
                assert v == self.model[block]
        assert 2 * self.table.count <= self.table.keys.shape[0]  # never more than half full
        blocks_, values_ = self.table.entries()
        assert dict(zip(blocks_.tolist(), values_.tolist())) == self.model
        assert len(self.table) == len(self.model)


TestSumTable = SumTableMachine.TestCase
TestSumTable.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


@pytest.mark.skipif(not sumtable.COMPILED_HASH, reason="this xxhash build exports no XXH3_64bits")
@pytest.mark.parametrize("size", [0, 1, 17, 4096, 65536 + 3])
def test_the_compiled_hash_is_pythons_xxh3(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    out = np.zeros(1, np.uint64)
    sumtable.hash_blocks(np.array([data.ctypes.data], np.int64), size, out)
    assert int(out[0]) == xxhash.xxh3_64_intdigest(data.tobytes())


def test_the_hash_comes_from_the_first_library_that_agrees_with_pythons_xxh3():
    """libxxhash's run-time dispatching XXH3 goes first; a library that is not there, a
    symbol it lacks, or a function whose sums differ from Python's is passed over."""
    wheel = ("the wheel", "xxhash._xxhash", "XXH3_64bits")
    missing = ("absent", "libcxlhm-no-such-library.so.0", "XXH3_64bits")
    no_symbol = ("no symbol", "xxhash._xxhash", "XXH3_no_such_function")
    wrong = ("another hash", "xxhash._xxhash", "XXH64")  # xxh64 (with a seed argument): other sums
    fn, name = sumtable._load_xxh3((missing, no_symbol, wrong, wheel))
    assert name == "the wheel" and fn(0, 0) == xxhash.xxh3_64_intdigest(b"")  # (no bytes: the pointer is not read)
    assert sumtable._load_xxh3((missing, no_symbol, wrong)) == (None, None)
    if sumtable.COMPILED_HASH and ctypes.util.find_library("xxhash"):
        assert sumtable.HASH_SOURCE == sumtable._XXH3_SOURCES[0][0]


def test_the_checksums_live_in_the_table_and_behave_as_a_dict(tmp_path):
    sums = BlockChecksums(None, 4096).sums
    sums[5] = 50
    sums.pending.update({6: 1, 8: 2})  # logged ahead of their write-backs
    sums.set_many(np.array([6, 7, 5], np.int64), np.array([60, 70, 55], np.uint64))
    assert sums.pending == {8: 2}  # 6 landed: recorded, no longer pending
    assert sums.pop(6) == 60
    assert sums.forget(7, None) == 70 and sums.forget(99, None) is None
    with pytest.raises(KeyError):
        sums.forget(99)
    with pytest.raises(KeyError):
        sums[6]
    assert dict(sums.items()) == {5: 55} and len(sums) == 1 and 5 in sums and 6 not in sums
    assert sums.get(5) == 55 and sums.get(6, -1) == -1
    found, values = sums.table.lookup(np.array([5, 6, 7], np.int64))
    assert found.tolist() == [True, False, False] and int(values[0]) == 55
    sums.forget_many(np.array([5, 8], np.int64))
    assert not sums and sums.pending == {}
    sums[1] = 2**64 - 1  # the full 64 bits survive
    assert sums[1] == 2**64 - 1
    sums.clear()
    assert sums.table.count == 0 and not sums


def test_checksums_saved_at_close_are_verified_after_reopen(tmp_path):
    cfg = {"capacity": 64 * 4096, "block_size": 4096, "dram_bytes": 4 * 4096,
           "backend": {"path": str(tmp_path / "d.img")}}
    with open_device(cfg) as dev:
        dev.write_from(0, np.full(16 * 4096, 9, np.uint8))
    with open_parts(cfg) as (dev, device):
        table = device.checksums.sums.table
        assert table.count == 16  # loaded into the table
        found, _ = table.lookup(np.arange(16, dtype=np.int64))
        assert found.all()


@pytest.mark.skipif(not sumtable.COMPILED_HASH, reason="this xxhash build exports no XXH3_64bits")
def test_streamed_reads_of_checksummed_blocks_verify_without_leaving_the_loop(tmp_path, monkeypatch):
    cfg = {"capacity": 64 * 4096, "block_size": 4096, "dram_bytes": 4 * 4096,
           "backend": {"path": str(tmp_path / "v.img")}}
    with open_parts(cfg) as (dev, device):
        data = np.random.default_rng(1).integers(0, 256, 32 * 4096, dtype=np.uint8)
        dev.write_from(0, data)
        dev.flush()  # every block has a checksum record now
        calls = []
        real = device.streams._verify
        monkeypatch.setattr(device.streams, "_verify", lambda *a: (calls.append(1), real(*a))[1])
        out = np.zeros(32 * 4096, np.uint8)
        result = dev.stream_io(np.arange(32, dtype=np.int64) * 4096, np.full(32, 4096, np.int64),
                               out.ctypes.data + np.arange(32, dtype=np.int64) * 4096, 4)
        assert result.count == 32 and result.misses >= 28
        assert (out == data).all()
        assert calls == []  # good blocks were verified in the compiled loop


def test_deletes_keep_every_probe_run_whole_even_where_runs_wrap_around_the_end():
    """Many random sets and deletes on a small, crowded table (16 buckets, up to 8
    entries): probe runs often cross the end of the bucket array."""
    keys, values = sumtable.new_table(8)
    assert keys.shape[0] == 16
    rng = np.random.default_rng(3)
    model: dict[int, int] = {}
    for _ in range(20_000):
        block = int(rng.integers(0, 40))
        if block in model or len(model) >= 8:
            sumtable.delete(keys, values, block)
            model.pop(block, None)
        else:
            sumtable.put(keys, values, block, np.uint64(block * 3 + 1))
            model[block] = block * 3 + 1
        for b in range(40):
            i = sumtable.find(keys, b)
            assert (i >= 0) == (b in model)
            assert i < 0 or int(values[i]) == model[b]
