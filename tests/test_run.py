"""`cxlhm run`, the main job: the trace's conversations through the KV store, hints through
the mailbox, on the model clock. Small slices of the shipped trace and a small device DRAM,
so the conversations' KV is evicted between turns as it is at full scale."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cxlhm_apps.cli import main
from cxlhm_apps.replay import chunk_pattern, replay_mission
from cxlhm.traces.mooncake import DEFAULT_TRACE, DEFAULT_TRACE_PATH, read_requests
from cxlhm.traces.sessions import recover_sessions
from host_runtime.driver import open_device

REQUESTS = 400
SMALL = {"capacity": "4GiB", "dram_bytes": "16MiB", "block_size": "64KiB", "clock": "model"}


@pytest.fixture(scope="module")
def slice_():
    requests = read_requests(DEFAULT_TRACE, limit=REQUESTS)
    return requests, recover_sessions(requests)


def _replay(slice_, policy, hints, **cfg):
    requests, turns = slice_
    spec = {**SMALL, **cfg, "firmware": {"policy": policy, "background": "manual"}}
    with open_device(spec) as handle:
        return replay_mission(handle, requests, turns, chunk_bytes=64 << 10, hints=hints, lead_ns=5_000_000)


def test_the_trace_ships_with_the_package():
    assert isinstance(DEFAULT_TRACE, str) and DEFAULT_TRACE.endswith(".jsonl.xz")  # no Path trap
    assert DEFAULT_TRACE_PATH.is_file() and str(DEFAULT_TRACE_PATH) == DEFAULT_TRACE
    assert "shared" not in DEFAULT_TRACE_PATH.parts
    assert len(read_requests(limit=10)) == 10


def test_hints_turn_resumed_prefixes_into_dram_hits(slice_):
    lru = _replay(slice_, "lru", False)
    hym = _replay(slice_, "hymcache", True)
    assert lru.corrupt_chunks == 0 and hym.corrupt_chunks == 0
    assert lru.chunks_loaded == hym.chunks_loaded > 0  # the same replay
    assert lru.device["prefetch_issued"] == 0
    assert hym.device["prefetch_issued"] > 0 and hym.device["prefetch_useful"] > 0
    assert hym.hint_errors == 0
    assert hym.load_hit_ratio > lru.load_hit_ratio
    assert np.percentile(hym.load_latency_ns, 99) < np.percentile(lru.load_latency_ns, 99)


def test_data_none_checks_nothing_and_reports_no_false_corruption(slice_):
    real = _replay(slice_, "lru", False)
    none = _replay(slice_, "lru", False, data="none")
    assert none.verified is False and none.corrupt_chunks == 0
    # the model clock does not depend on whether bytes move
    assert np.array_equal(real.load_latency_ns, none.load_latency_ns)


def test_wrong_bytes_are_counted(slice_, monkeypatch):
    """The check is real: a store that returns a wrong byte is caught."""
    import host_runtime.kvstore as kv
    real_get_many = kv.Tenant.get_many_into

    def flip(self, keys, out, **kw):
        got = real_get_many(self, keys, out, **kw)
        if got:
            np.asarray(out).reshape(-1)[9] ^= 1
        return got
    monkeypatch.setattr(kv.Tenant, "get_many_into", flip)
    requests, turns = slice_
    with open_device({**SMALL, "firmware": {"policy": "lru", "background": "manual"}}) as handle:
        result = replay_mission(handle, requests[:60], turns[:60], chunk_bytes=64 << 10, hints=False, lead_ns=0)
    assert result.corrupt_chunks > 0


def test_chunk_pattern_differs_per_id():
    a, b = chunk_pattern(np.array([1, 2]), 64)
    assert a.tobytes() != b.tobytes()


def test_cli_prints_both_configurations_and_writes_the_plot(tmp_path, capsys):
    out = tmp_path / "cdf.png"
    rc = main(["run", "--requests", "120", "--no-progress", "--out", str(out), "--json",
               "--set", "dram_bytes=16MiB", "--set", "capacity=4GiB", "--set", "data=none"])
    assert rc == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {"lru", "hymcache+hints"}
    assert figures["lru"]["corrupt_chunks"] is None  # data: none - nothing was checked
    assert figures["lru"]["clock"] == "model"
    assert out.stat().st_size > 0
