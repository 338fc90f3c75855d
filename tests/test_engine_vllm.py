"""The vLLM tier inside vLLM's own code (the release in requirements-engines.txt): its
OffloadingSpecFactory builds TieringOffloadingSpec from kv_connector_extra_config, the
spec builds its TieringOffloadingManager with the CPU primary tier and our tier loaded
by module path, and the manager's scheduler call sequence (on_new_request, lookup,
prepare_store, complete_store, on_schedule_end, reset_cache) cascades chunks to the
device and promotes them back. SecondaryTierManager's abstract methods and signatures
are checked mechanically."""
import inspect
import time

import engines  # noqa: F401 - imports the engines
import numpy as np
import pytest
from vllm.v1.kv_offload import base as vb
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                       OffloadingModelConfig, OffloadingParallelConfig)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from host_runtime.shim.vllm import CxlhmTier

BLOCK_BYTES = 4096


def offloading_config(tmp_path, engine_id, **tier):
    tier_config = {"type": "CxlhmTier", "module_path": "host_runtime.shim.vllm", "hints": "none",
                   "device": {"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
                              "backend": {"path": str(tmp_path / "vllm-{engine}.img")}}, **tier}
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8 * BLOCK_BYTES, "tier_poll_interval_s": 0,
             "secondary_tiers": [tier_config]}
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("model.layers.0.attn",), group_id=0),),
        worker_kv_bytes_per_block=BLOCK_BYTES, enable_kv_cache_events=True, extra_config=extra, engine_id=engine_id,
        model=OffloadingModelConfig(name="meta-llama/Llama-3.1-8B", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=False))


@pytest.fixture
def manager(tmp_path):
    spec = OffloadingSpecFactory.create_spec(offloading_config(tmp_path, f"cxlhm-test-{time.monotonic_ns()}"))
    mgr = spec.get_manager()
    yield mgr
    mgr.shutdown()


def key(i):
    return vb.make_offload_key(i.to_bytes(32, "big"), 0)


def step(mgr):
    mgr.on_schedule_end(vb.ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


def settle(mgr, until, steps=20):
    """Scheduler steps, each waiting for the tier's jobs (no wall-clock bound)."""
    for _ in range(steps):
        step(mgr)
        for tier in mgr.secondary_tiers:
            tier.drain_jobs()
        step(mgr)
        if until():
            return True
    return False


def test_every_abstract_method_is_implemented_with_vllms_signature():
    assert issubclass(CxlhmTier, SecondaryTierManager)
    assert not CxlhmTier.__abstractmethods__
    for name, member in vars(SecondaryTierManager).items():
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        theirs = list(inspect.signature(member).parameters)
        ours = list(inspect.signature(getattr(CxlhmTier, name)).parameters)
        assert ours[:len(theirs)] == theirs, f"{name}: vLLM {theirs}, ours {ours}"
    init = inspect.signature(SecondaryTierManager.__init__).parameters
    assert list(inspect.signature(CxlhmTier.__init__).parameters)[:len(init)] == list(init)


def test_the_factory_builds_the_tiering_manager_with_our_tier(manager):
    assert isinstance(manager, TieringOffloadingManager)
    (tier,) = manager.secondary_tiers
    assert isinstance(tier, CxlhmTier)
    assert tier.shim.tenant.name == "vllm:meta-llama/Llama-3.1-8B:bfloat16:tp1-pp1-pcp1-dcp1:kvfmt1"


def test_chunks_cascade_to_the_device_and_come_back_after_the_primary_forgets_them(manager):
    tier = manager.secondary_tiers[0]
    ctx = vb.ReqContext(req_id="r1")
    manager.on_new_request(ctx)
    keys = [key(i) for i in range(3)]
    assert all(manager.lookup(k, ctx) is vb.LookupResult.MISS for k in keys)
    out = manager.prepare_store(keys, ctx)
    assert isinstance(out, vb.PrepareStoreOutput) and list(out.keys_to_store) == keys
    view = np.asarray(manager.primary_tier.get_kv_memoryview()).view(np.uint8)
    rows = view.reshape(view.shape[0], -1)
    chunk_ids = list(out.store_spec.block_ids)
    want = {}
    for k, chunk in zip(keys, chunk_ids):  # what vLLM's GPU worker would have copied in
        rows[chunk] = np.frombuffer(np.random.default_rng(chunk).bytes(rows.shape[1]), np.uint8)
        want[k] = rows[chunk].copy()
    manager.complete_store(keys, ctx)
    manager.on_request_finished(ctx)
    assert settle(manager, lambda: all(tier.shim.contains(tier.format.key(k)) for k in keys))
    events = list(manager.take_events())
    assert any(not e.removed and set(e.keys) >= set(keys) and e.medium is vb.Medium.STORAGE for e in events)

    manager.reset_cache()  # the primary tier forgets everything; the device keeps it
    manager.on_reset_flushed()  # the workers reported their in-flight jobs
    rows[:] = 0
    assert settle(manager, lambda: not manager.has_pending_work())
    ctx2 = vb.ReqContext(req_id="r2")
    manager.on_new_request(ctx2)

    def all_hit():
        return all(manager.lookup(k, ctx2) is vb.LookupResult.HIT for k in keys)
    assert settle(manager, all_hit)
    spec = manager.prepare_load(keys, ctx2)
    for k, chunk in zip(keys, spec.block_ids):
        assert np.array_equal(rows[chunk], want[k])
    manager.complete_load(keys, ctx2)
    manager.on_request_finished(ctx2)


def test_a_failed_read_is_a_failed_key_never_bytes(manager):
    tier = manager.secondary_tiers[0]
    rows = np.asarray(tier._primary)
    rows[1] = 7
    tier.submit_store(TransferJob(job_id=101, keys=[key(9)], chunk_ids=np.array([1]), is_promotion=False,
                                  req_context=vb.ReqContext(req_id="x")))
    tier.drain_jobs()
    tier.shim.remove([tier.format.key(key(9))])  # evicted after a lookup said HIT
    rows[2] = 0
    tier.submit_load(TransferJob(job_id=102, keys=[key(9)], chunk_ids=np.array([2]), is_promotion=True,
                                 req_context=vb.ReqContext(req_id="x")))
    tier.drain_jobs()
    results = {r.job_id: r for r in tier.get_finished_jobs()}
    assert results[101].success and not results[102].success and list(results[102].successful_keys) == []
    assert not rows[2].any()
    with pytest.raises(ValueError, match="outside the primary tier"):
        tier.submit_load(TransferJob(job_id=103, keys=[key(1)], chunk_ids=np.array([10**6]), is_promotion=True,
                                     req_context=vb.ReqContext(req_id="x")))


def test_unknown_tier_settings_are_a_clear_error(tmp_path):
    spec = OffloadingSpecFactory.create_spec(offloading_config(tmp_path, "cxlhm-bad", capacity_gb=3))
    with pytest.raises(ValueError, match="unknown tier settings"):
        spec.get_manager()


# ------------------------------------------------------------------ formats across restarts, both releases
def _manager(tmp_path, image, **config_changes):
    config = offloading_config(tmp_path, f"cxlhm-restart-{time.monotonic_ns()}", device={
        "capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB", "backend": {"path": str(image)}})
    if config_changes:
        import dataclasses
        config = dataclasses.replace(config, **config_changes)
    return OffloadingSpecFactory.create_spec(config).get_manager()


def _store_one(tier, k, chunk, seed):
    rows = np.asarray(tier._primary)
    rows[chunk] = np.frombuffer(np.random.default_rng(seed).bytes(rows.shape[1]), np.uint8)
    tier.submit_store(TransferJob(job_id=1, keys=[k], chunk_ids=np.array([chunk]), is_promotion=False,
                                  req_context=vb.ReqContext(req_id="s")))
    tier.drain_jobs()
    assert tier.get_finished_jobs()[0].success
    return rows[chunk].copy()


def _load_one(tier, k, chunk):
    rows = np.asarray(tier._primary)
    rows[chunk] = 0
    tier.submit_load(TransferJob(job_id=2, keys=[k], chunk_ids=np.array([chunk]), is_promotion=True,
                                 req_context=vb.ReqContext(req_id="l")))
    tier.drain_jobs()
    return tier.get_finished_jobs()[0].success, rows[chunk].copy()


@pytest.mark.parametrize("change", [None, "kv_cache_layout", "layer_names"])
def test_a_chunk_survives_a_restart_only_under_the_settings_that_laid_it_out(tmp_path, change):
    image = tmp_path / "vllm.img"
    writer = _manager(tmp_path, image)
    want = _store_one(writer.secondary_tiers[0], key(5), 1, seed=5)
    writer.shutdown()

    if change == "kv_cache_layout":  # the same row size, another order of its bytes
        reader = _manager(tmp_path, image, kv_cache_layout="HND")
    elif change == "layer_names":
        base = offloading_config(tmp_path, "x").groups[0]
        import dataclasses
        reader = _manager(tmp_path, image, groups=(dataclasses.replace(base, layer_names=("model.layers.1.attn",)),))
    else:
        reader = _manager(tmp_path, image)
    try:
        tier = reader.secondary_tiers[0]
        assert tier._primary.shape[1] == want.size
        hit = tier.lookup(key(5), vb.ReqContext(req_id="l"))
        ok, got = _load_one(tier, key(5), 3)
        if change is None:
            assert hit is vb.LookupResult.HIT and ok and np.array_equal(got, want)
        else:
            assert hit is vb.LookupResult.MISS and not ok and not got.any()  # a miss, never bytes
    finally:
        reader.shutdown()


def test_recency_reaches_the_tier_with_or_without_touch(manager, monkeypatch):
    """vLLM 0.33 calls touch() on every tier; 0.34 removed it, and a lookup hit marks
    the chunk recently used instead. Either way the store hears of the use."""
    tier = manager.secondary_tiers[0]
    _store_one(tier, key(7), 1, seed=7)
    touched = []
    monkeypatch.setattr(tier.shim, "touch", lambda keys: touched.extend(keys))
    ctx = vb.ReqContext(req_id="t")
    manager.on_new_request(ctx)
    if hasattr(SecondaryTierManager, "touch"):
        manager.touch([key(7)], ctx)
        assert touched == [tier.format.key(key(7))]
        touched.clear()
    assert tier.lookup(key(7), ctx) is vb.LookupResult.HIT
    assert touched == [tier.format.key(key(7))]
