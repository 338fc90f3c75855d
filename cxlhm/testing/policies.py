"""The conformance suite every firmware policy passes, shipped so an outside package can
run it on its own policy (zarr's StoreTests style):

    # tests/test_my_policy.py in the package that registers "twoq" (entry point group
    # cxlhm.firmware_policies)
    from cxlhm.testing.policies import LruModel, PolicyConformance

    class TestTwoQ(PolicyConformance):
        name = "twoq"
        params = {"kin_ratio": 0.25}

`PolicyConformance` holds the tests and their fixtures (a seeded Zipf trace and a slice
of the Mooncake trace shipped with cxlhm), so nothing from a cxlhm checkout is needed;
it needs pytest and hypothesis (``pip install cxlhm[test]``). A policy with a simple
Python model can set `reference` and must then reproduce its hit/miss decisions access
by access on a real-data device.
"""
import functools
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from cxlhm import policies as firmware_policies
from cxlhm import blocktable as btm
from cxlhm.sim import Simulator, simulate
from cxlhm.traces.mooncake_blocks import mooncake_block_trace
from cxlhm.traces.synthetic import zipf_trace
from cxlhm.config import load_config
from cxlhm.device import Device
from cxlhm.testing.device import load_bytes, store_bytes

__all__ = ["PolicyConformance", "DeviceMatchesModels", "FifoModel", "LruModel", "ClockModel", "SieveModel",
           "BLOCK", "DRAM_SLOTS"]

BLOCK = 4096
DRAM_SLOTS = 6
WINDOW_BLOCKS = 20  # the state machine's working set: more than DRAM, so evictions happen


class _Host:
    """Just enough of a host to drive the core device from a test: byte stores and
    loads at device addresses (the suite checks the firmware, not the host runtime)."""

    def __init__(self, overrides: dict):
        self.device = Device(load_config(None, overrides))

    def store(self, hpa: int, data: np.ndarray) -> None:
        store_bytes(self.device, hpa, data)

    def load(self, hpa: int, n: int) -> bytes:
        return load_bytes(self.device, hpa, n)

    def stats(self) -> dict:
        return self.device.stats()

    def close(self) -> None:
        self.device.close()

    def __enter__(self) -> "_Host":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@functools.lru_cache(maxsize=None)
def zipf_fixture_trace():
    """20,000 accesses over 2,000 blocks, Zipf 0.9, 30% writes (seeded)."""
    return zipf_trace(20_000, 2_000, 0.9, write_fraction=0.3, seed=3)


@functools.lru_cache(maxsize=None)
def mooncake_fixture_trace():
    """The first 600 block accesses of the Mooncake trace shipped with cxlhm."""
    return mooncake_block_trace(limit=600)


_belady_misses: dict = {}


def belady_misses(trace, slots) -> int:
    key = (trace.source, len(trace), slots)
    if key not in _belady_misses:
        _belady_misses[key] = simulate("belady", trace.blocks, slots).misses
    return _belady_misses[key]


# ---------------------------------------------------------------- reference models
# access(block, busy) returns True for a hit and updates the state like the policy it
# mirrors. `busy` holds the other blocks of the same host access: the device never
# evicts those (they are in flight), so neither may the model.

class FifoModel:
    def __init__(self, capacity):
        self.capacity, self.queue = capacity, OrderedDict()  # oldest first

    def access(self, block, busy=()):
        if block in self.queue:
            self.hit(block)
            return True
        if len(self.queue) == self.capacity:
            self.evict(busy)
        self.queue[block] = False
        return False

    def hit(self, block):
        pass

    def evict(self, busy):
        del self.queue[next(b for b in self.queue if b not in busy)]


class LruModel(FifoModel):
    def hit(self, block):
        self.queue.move_to_end(block)


class ClockModel(FifoModel):
    """The queue's values are reference bits; a second chance sends a block to the back."""

    def hit(self, block):
        self.queue[block] = True

    def evict(self, busy):
        while True:
            oldest, referenced = next(iter(self.queue.items()))
            if not referenced and oldest not in busy:
                del self.queue[oldest]
                return
            del self.queue[oldest]
            self.queue[oldest] = referenced and oldest in busy  # busy blocks keep their bit


class SieveModel:
    def __init__(self, capacity):
        self.capacity, self.order, self.visited, self.hand = capacity, [], {}, None  # order: oldest first

    def access(self, block, busy=()):
        if block in self.visited:
            self.visited[block] = True
            return True
        if len(self.order) == self.capacity:
            i = self.order.index(self.hand) if self.hand is not None else 0
            while self.visited[self.order[i]] or self.order[i] in busy:
                if self.order[i] not in busy:
                    self.visited[self.order[i]] = False
                i = (i + 1) % len(self.order)
            del self.visited[self.order[i]]
            self.order.pop(i)
            self.hand = self.order[i] if i < len(self.order) else None
        self.order.append(block)
        self.visited[block] = False
        return False


# ---------------------------------------------------------------- device vs model

class DeviceMatchesModels(RuleBasedStateMachine):
    """Real bytes through a tiny-DRAM device, checked against a bytearray of the window
    (no byte lost or changed across evictions) and, when the policy has one, against a
    reference model's hit/miss decisions."""
    policy = "lru"
    params: dict = {}
    reference = None

    def __init__(self):
        super().__init__()
        self.dev = _Host({"capacity": 64 * BLOCK, "block_size": BLOCK, "dram_bytes": DRAM_SLOTS * BLOCK,
                                "firmware": {"policy": self.policy, "params": self.params}})
        self.shadow = np.zeros(WINDOW_BLOCKS * BLOCK, np.uint8)
        self.model = self.reference(DRAM_SLOTS) if self.reference else None

    def _expect(self, offset, length):
        """Feed the blocks this access touches to the reference model; check the device agreed."""
        before = self.dev.stats()["hits"]
        if self.model is None:
            return before, None
        touched = range(offset // BLOCK, (offset + length - 1) // BLOCK + 1)
        return before, sum(self.model.access(b, busy=set(touched[:i])) for i, b in enumerate(touched))

    def _check_hits(self, before, predicted):
        if predicted is not None:
            assert self.dev.stats()["hits"] - before == predicted

    @rule(block=st.integers(0, WINDOW_BLOCKS - 1), value=st.integers(0, 255))
    def write_block(self, block, value):
        before, predicted = self._expect(block * BLOCK, BLOCK)
        self.dev.store(block * BLOCK, np.full(BLOCK, value, np.uint8))
        self.shadow[block * BLOCK:(block + 1) * BLOCK] = value
        self._check_hits(before, predicted)

    @rule(offset=st.integers(0, WINDOW_BLOCKS * BLOCK - 1), length=st.integers(1, 2 * BLOCK), seed=st.integers(0, 99))
    def write_bytes(self, offset, length, seed):
        length = min(length, WINDOW_BLOCKS * BLOCK - offset)
        data = np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8)
        before, predicted = self._expect(offset, length)
        self.dev.store(offset, data)
        self.shadow[offset:offset + length] = data
        self._check_hits(before, predicted)

    @rule(offset=st.integers(0, WINDOW_BLOCKS * BLOCK - 1), length=st.integers(1, 3 * BLOCK))
    def read_bytes(self, offset, length):
        length = min(length, WINDOW_BLOCKS * BLOCK - offset)
        before, predicted = self._expect(offset, length)
        assert self.dev.load(offset, length) == self.shadow[offset:offset + length].tobytes()
        self._check_hits(before, predicted)

    @invariant()
    def dram_holds_at_most_its_slots(self):
        assert self.dev.stats()["resident_blocks"] <= DRAM_SLOTS

    def teardown(self):
        self.dev.close()


# ---------------------------------------------------------------- the suite

class PolicyConformance:
    """Subclass it in a test module (its name starting with ``Test``) and set:

    name       the policy's registered name (built-in or entry point)
    params     its parameters, if not the defaults
    reference  optionally, a Python model class whose hit/miss decisions the compiled
               policy must reproduce access by access (see FifoModel, LruModel, ...)
    offline    True for a policy that needs the future (simulator only)
    """
    name: str
    params: dict = {}
    reference = None
    offline = False  # offline policies run in the simulator only

    @pytest.fixture(scope="class")
    @classmethod
    def zipf(cls):
        return zipf_fixture_trace()

    @pytest.fixture(scope="class")
    @classmethod
    def mooncake(cls):
        return mooncake_fixture_trace()

    def make_sim(self, n_slots, trace):
        policy = firmware_policies.get(self.name)
        return Simulator(policy, n_slots, params=self.params,
                         next_use=trace.next_use() if policy.needs_future else None)

    def test_capacity_never_exceeded_and_table_consistent(self, zipf):
        sim = self.make_sim(64, zipf)
        for piece_blocks, piece_writes in zip(np.array_split(zipf.blocks, 50), np.array_split(zipf.writes, 50)):
            sim.replay(piece_blocks, piece_writes)
            held = sim.bt.block[sim.bt.block >= 0]
            assert sim.resident_blocks == held.size <= 64
            assert np.unique(held).size == held.size  # no block in two slots
            for slot in np.flatnonzero(sim.bt.block >= 0):
                assert btm.lookup(sim.bt, sim.bt.block[slot]) == slot
        result = sim.result()
        assert result.hits + result.misses == len(zipf)
        assert result.evictions == result.misses - sim.resident_blocks
        assert result.misses >= zipf.unique_blocks

    def test_deterministic(self, zipf):
        runs = []
        for _ in range(2):
            sim = self.make_sim(100, zipf)
            sim.replay(zipf.blocks, zipf.writes)
            runs.append((sim.result().counters, sim.bt.block.copy()))
        assert runs[0][0] == runs[1][0]
        assert np.array_equal(runs[0][1], runs[1][1])

    def test_pinned_blocks_are_never_evicted(self, zipf):
        sim = self.make_sim(32, zipf)
        sim.replay(zipf.blocks[:3000])
        pinned = np.flatnonzero(sim.bt.block >= 0)[:8]
        kept = sim.bt.block[pinned].copy()
        sim.bt.flags[pinned] |= btm.PINNED
        sim.bt.scalars[btm.N_PINNED] += pinned.size
        sim.replay(zipf.blocks[3000:])
        assert np.array_equal(sim.bt.block[pinned], kept)
        assert sim.result().evictions > 1000  # the other slots kept turning over

    @pytest.mark.parametrize("slots", [16, 128, 1024])
    def test_belady_is_never_worse(self, zipf, mooncake, slots):
        for trace in (zipf, mooncake):
            ours = simulate(self.name, trace.blocks, slots, params=self.params, next_use=trace.next_use()).misses
            assert belady_misses(trace, slots) <= ours

    def test_wrong_parameter_names_the_accepted_ones(self):
        policy = firmware_policies.get(self.name)
        with pytest.raises(firmware_policies.PolicyParamError, match="no parameter 'bogus'; accepted: "):
            policy.resolve_params({"bogus": 1})

    def test_no_byte_lost_with_real_data(self):
        if self.offline:
            pytest.skip("offline policy: simulator only (see test_offline_policy_refuses_a_device)")
        machine = type(f"{self.name}Machine", (DeviceMatchesModels,),
                       {"policy": self.name, "params": self.params, "reference": self.reference})
        run_state_machine_as_test(machine, settings=settings(
            max_examples=12, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)))

    def test_bulk_random_traffic_round_trips(self):
        if self.offline:
            pytest.skip("offline policy: simulator only")
        rng = np.random.default_rng(7)
        shadow = np.zeros(48 * BLOCK, np.uint8)
        with _Host({"capacity": 64 * BLOCK, "block_size": BLOCK, "dram_bytes": DRAM_SLOTS * BLOCK,
                          "firmware": {"policy": self.name, "params": self.params}}) as dev:
            for _ in range(400):
                offset = int(rng.integers(0, shadow.size - 1))
                length = int(rng.integers(1, min(3 * BLOCK, shadow.size - offset) + 1))
                if rng.random() < 0.5:
                    data = rng.integers(0, 256, length, dtype=np.uint8)
                    dev.store(offset, data)
                    shadow[offset:offset + length] = data
                else:
                    assert dev.load(offset, length) == shadow[offset:offset + length].tobytes()
            assert dev.load(0, shadow.size) == shadow.tobytes()
            assert dev.stats()["evictions"] > 100 and dev.stats()["writebacks"] > 0
