"""The built-in workloads, serving systems and topologies through the shipped conformance suites
(cxlhm_apps.serving.testing), as an outside package would run them on its own."""
from __future__ import annotations

import pytest

from cxlhm_apps.serving.testing import ServingSystemConformance, TopologyConformance, WorkloadConformance


class TestMooncakeWorkload(WorkloadConformance):
    name, changes = "mooncake", {"requests": 120}


class TestMooncakeSyntheticWorkload(WorkloadConformance):
    name, changes = "mooncake-synthetic", {"requests": 80}


class TestAgentWorkload(WorkloadConformance):
    name, changes = "agent", {"sessions": 5}


class TestCodingAgentWorkload(WorkloadConformance):
    name, changes = "coding-agent", {"sessions": 3, "max_context_tokens": 30_000}


class TestQaWorkload(WorkloadConformance):
    name, changes = "qa", {"users": 4, "rounds": 3, "history_tokens": 3000}


class TestRecompute(ServingSystemConformance):
    name = "recompute"


class TestLmcacheLocal(ServingSystemConformance):
    name = "lmcache-local"


class TestMooncakeDram(ServingSystemConformance):
    name = "mooncake-dram"


class TestIdeal(ServingSystemConformance):
    name = "ideal"


class TestLmcacheLocalPerInstance(ServingSystemConformance):
    name = "lmcache-local-n"


class TestLmcacheP2p(ServingSystemConformance):
    name = "lmcache-p2p"


@pytest.mark.slow  # the emulated device: numba compiles its firmware on a cold cache
class TestCxlHmLru(ServingSystemConformance):
    name = "cxlhm-lru"


@pytest.mark.slow
class TestCxlHmHymcache(ServingSystemConformance):
    name = "cxlhm-hymcache"


class TestColocated(TopologyConformance):
    name = "colocated"


class TestDisaggregated(TopologyConformance):
    name = "disagg"
