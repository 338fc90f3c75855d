"""The serving-topology example of docs/extending.md (examples/extending/serving_topology.py),
registered the way a test registers a topology it does not install (TOPOLOGIES.register),
through the shipped suite (TopologyConformance), and beyond it: every request finishes on
both GPUs the same way every time, and the router does what it says. All on LinearGpu's
model clock (no machine's speed in any figure)."""
import numpy as np
import pytest

from cxlhm_apps.serving.testing import SMALL, LinearGpu, TopologyConformance, small_agent_workload
from cxlhm_apps.serving.topologies import TOPOLOGIES, parse_topologies, replay
from example_loader import example

NAME = "least-loaded"


@pytest.fixture(scope="module", autouse=True)
def least_loaded_registered():
    example("serving_topology")  # the checkout's root on sys.path, so the registry can import it by name
    TOPOLOGIES.register(NAME, "examples.extending.serving_topology:LeastLoadedEngine")
    yield
    TOPOLOGIES.unregister(NAME)


class TestLeastLoaded(TopologyConformance):
    name = NAME


@pytest.fixture(scope="module")
def workload():
    return small_agent_workload(12)


def test_selected_by_name():
    assert parse_topologies(f"colocated,{NAME}") == ["colocated", NAME]
    assert TOPOLOGIES.get(NAME) is example("serving_topology").LeastLoadedEngine


@pytest.mark.parametrize("config", ["recompute", "lmcache-local"])
def test_every_request_finishes_on_both_gpus_the_same_way_every_time(workload, config):
    runs = [replay(workload, config, SMALL, 4.0, NAME, LinearGpu()) for _ in range(2)]
    result = runs[0]
    assert result.topology == NAME and len(result.gpu_busy_ns) == 2 and min(result.gpu_busy_ns) > 0
    assert not np.isnan(result.done).any()
    assert (result.first_token >= result.arrival).all() and (result.done >= result.first_token).all()
    assert np.array_equal(result.first_token, runs[1].first_token) and np.array_equal(result.done, runs[1].done)


def test_each_request_goes_to_the_least_loaded_gpu_and_stays_there(workload):
    base = TOPOLOGIES.get(NAME)
    decisions = []

    class Watched(base):
        def prefill_gpu(self, i):
            first = i not in self.routed
            loads = [len(g.waiting) + g.running for g in self.gpus]
            inst = super().prefill_gpu(i)
            if first:
                decisions.append((loads, inst.index))
            assert inst.index == self.routed[i]  # asked again: the same GPU
            return inst

    engine = Watched(workload, "lmcache-local", SMALL, 4.0, LinearGpu(), False)
    engine.run()
    assert len(decisions) == len(workload.requests)
    for loads, chosen in decisions:
        assert chosen == loads.index(min(loads))  # the fewest waiting or running; ties to GPU 0
    assert {chosen for _, chosen in decisions} == {0, 1}


def test_two_gpus_cut_the_queueing_of_one(workload):
    ttft = {topology: np.mean(r.first_token - r.arrival) for topology in ("colocated", NAME)
            for r in [replay(workload, "lmcache-local", SMALL, 4.0, topology, LinearGpu())]}
    assert ttft[NAME] < 0.6 * ttft["colocated"]
