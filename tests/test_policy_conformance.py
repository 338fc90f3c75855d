"""The built-in policies through the shipped conformance suite (cxlhm.testing.policies),
as an outside package would run it on its own policy."""
import re
import sys
from pathlib import Path

import pytest

import firmware_policies
from cxlhm.config import ConfigError
from cxlhm.testing.policies import (BLOCK, DRAM_SLOTS, ClockModel, FifoModel, LruModel, PolicyConformance,
                                    SieveModel)
from host_runtime.driver import open_device


class TestFifo(PolicyConformance):
    name, reference = "fifo", FifoModel


class TestLru(PolicyConformance):
    name, reference = "lru", LruModel


class TestClock(PolicyConformance):
    name, reference = "clock", ClockModel


class TestClock3Bit(PolicyConformance):
    name, params = "clock", {"n_bit_counter": 3}


class TestSieve(PolicyConformance):
    name, reference = "sieve", SieveModel


class TestArc(PolicyConformance):
    name = "arc"


class TestS3Fifo(PolicyConformance):
    name = "s3fifo"


class TestS3FifoTuned(PolicyConformance):
    name, params = "s3fifo", {"small_ratio": 0.25, "ghost_ratio": 0.5, "move_to_main_threshold": 1}


class TestHymcache(PolicyConformance):
    """Without hints hymcache must still be a correct cache (its LRU segment)."""
    name = "hymcache"


class TestBelady(PolicyConformance):
    name, offline = "belady", True


class TestDocsWorkedExample(PolicyConformance):
    """The example policy in docs/policies.md, run from the page itself."""
    name = "docs_random"

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def registered(cls, tmp_path_factory):
        page = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
        source = re.search(r"```python\n(.*?)```", page, re.S).group(1)
        folder = tmp_path_factory.mktemp("docs_policy")
        (folder / "docs_random.py").write_text(source.replace('name="random"', 'name="docs_random"'))
        sys.path.insert(0, str(folder))
        firmware_policies.REGISTRY.register("docs_random", "docs_random")
        yield
        firmware_policies.REGISTRY.unregister("docs_random")
        sys.path.remove(str(folder))


def test_offline_policy_refuses_a_device():
    with pytest.raises(firmware_policies.PolicyParamError, match="offline"):
        open_device({"capacity": 64 * BLOCK, "block_size": BLOCK, "dram_bytes": DRAM_SLOTS * BLOCK,
                     "firmware": {"policy": "belady"}})


def test_device_config_rejects_a_bad_policy_parameter():
    with pytest.raises(ConfigError, match="n_bit_counter"):
        open_device({"capacity": 64 * BLOCK, "block_size": BLOCK, "dram_bytes": DRAM_SLOTS * BLOCK,
                     "firmware": {"policy": "clock", "params": {"n_bit_counter": 0}}})


def test_every_builtin_policy_has_a_conformance_class():
    covered = {cls.name for cls in PolicyConformance.__subclasses__()}
    builtin = {"fifo", "lru", "clock", "sieve", "arc", "s3fifo", "belady"}
    assert builtin <= covered
    assert builtin <= set(firmware_policies.available())
