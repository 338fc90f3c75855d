"""The firmware-policy example of docs/extending.md (examples/extending/firmware_policy.py)
through the shipped policy conformance suite, registered the way a test registers a
policy it does not install (cxlhm.policies.REGISTRY.register), with a Python model of
MRU that its hit/miss decisions must match access by access."""
import numpy as np
import pytest

from cxlhm import policies
from cxlhm.sim import simulate
from cxlhm.testing.policies import FifoModel, PolicyConformance
from example_loader import example

MODULE = "examples.extending.firmware_policy"


class MruModel(FifoModel):
    """Queue oldest first; a hit moves the block to the newest end; the victim is the
    newest block that is not part of the access in flight."""

    def hit(self, block):
        self.queue.move_to_end(block)

    def evict(self, busy):
        del self.queue[next(b for b in reversed(self.queue) if b not in busy)]


@pytest.fixture(scope="module", autouse=True)
def mru_registered():
    example("firmware_policy")  # the checkout's root on sys.path, so the registry can import it by name
    policies.REGISTRY.register("mru", MODULE)
    yield
    policies.REGISTRY.unregister("mru")


class TestExampleMru(PolicyConformance):
    name, reference = "mru", MruModel


def test_registered_by_module_name_as_an_entry_point_would_be():
    assert policies.get("mru") is example("firmware_policy").POLICY
    assert policies.REGISTRY.source("mru") == "built-in"  # registered in-process, not installed
    assert "mru" in policies.available()


def test_mru_keeps_most_of_a_loop_larger_than_dram_where_lru_keeps_none():
    loop = np.tile(np.arange(100, dtype=np.int64), 20)  # 100 blocks cycled, 50 slots
    assert simulate("lru", loop, 50).hits == 0
    mru = simulate("mru", loop, 50)
    model = MruModel(50)
    assert mru.hits == sum(model.access(int(b)) for b in loop) > len(loop) // 3
