"""The SGLang adapter inside SGLang's own code (the release in requirements-engines.txt):
built by its StorageBackendFactory from a real HiCacheStorageConfig, or attached by a
real HiCacheController (tests/sglang_engine.py: SGLang's device pool, allocator and
host pool on CPU tensors, its four storage threads) that backs pages up and prefetches
them; hybrid models with a real MambaPoolHost, compared with SGLang's own HiCacheFile;
TP=2 MLA over two processes with the controller's own hit reduction (gloo MIN); media
corruption; hit policies as its PoolHitPolicy enum, metrics as its StorageMetrics, and
every abstract method and signature of HiCacheStorage checked mechanically."""
import inspect
import json
import multiprocessing
import random
import re
from pathlib import Path

import engines  # noqa: F401 - imports the engines (stubs only what SGLang needs and cannot have here)
import pytest
import torch
from sglang_engine import TIMEOUT_S, Engine, fill_random, mla_rank, page_starts
from sglang.srt.mem_cache import hicache_storage as hs
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import storage_namespace_seed
from sglang.srt.observability.metrics_collector import StorageMetrics

from host_runtime import kvkeys
from host_runtime.shim.sglang import CxlhmHiCacheStorage

PAGE = 4
DOCS = Path(__file__).resolve().parent.parent / "docs" / "kvstore.md"


def storage_config(tmp_path, **overrides):
    fields = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
                  enable_storage_metrics=False, is_page_first_layout=True, model_name="meta-llama/Llama-3-8B",
                  extra_config={"backend_name": "cxlhm", "module_path": "host_runtime.shim.sglang",
                                "class_name": "CxlhmHiCacheStorage", "interface_v1": 1, "hints": "none",
                                "device": {"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
                                           "backend": {"path": str(tmp_path / "cxlhm-{rank}.img")}}})
    fields.update(overrides)
    return hs.HiCacheStorageConfig(**fields)


def host_pool(layout, layers=2, heads=2, dim=8):
    """SGLang's MHA host pool over CPU tensors standing in for the GPU pool."""
    k = [torch.zeros(64, heads, dim, dtype=torch.bfloat16) for _ in range(layers)]
    v = [torch.zeros(64, heads, dim, dtype=torch.bfloat16) for _ in range(layers)]
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=torch.bfloat16,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=64, start_layer=0, end_layer=layers)


@pytest.fixture
def backend(tmp_path):
    made = []

    def make(pool=None, **overrides):
        b = StorageBackendFactory.create_backend("dynamic", storage_config(tmp_path, **overrides), pool)
        made.append(b)
        if pool is not None:
            b.register_mem_pool_host(pool)  # as HiCacheController.attach_storage_backend does
        return b
    yield make
    for b in made:
        b.close()


def fill_pages(pool, pages, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in pages:
        page = torch.randint(0, 255, (pool.get_dummy_flat_data_page().numel() * 2,), dtype=torch.uint8, generator=gen)
        pool.set_from_flat_data_page(p * PAGE, page.view(torch.bfloat16))


def page_bytes(pool, p):
    return pool.get_data_page(p * PAGE, flat=True).view(torch.uint8).clone()


# ------------------------------------------------------------------ interface, mechanically
def test_every_abstract_method_is_implemented_with_sglangs_signature():
    assert issubclass(CxlhmHiCacheStorage, hs.HiCacheStorage)
    assert not getattr(CxlhmHiCacheStorage, "__abstractmethods__", None)
    for name, member in vars(hs.HiCacheStorage).items():
        if name.startswith("_") or not callable(member):
            continue
        ours = getattr(CxlhmHiCacheStorage, name)
        theirs_params = list(inspect.signature(member).parameters)
        ours_params = list(inspect.signature(ours).parameters)
        assert ours_params[:len(theirs_params)] == theirs_params, f"{name}: SGLang {theirs_params}, ours {ours_params}"


def test_the_factory_loads_the_adapter_the_way_the_documented_command_says(backend, tmp_path):
    b = backend()
    assert isinstance(b, CxlhmHiCacheStorage)
    assert b.set("k", torch.arange(8, dtype=torch.uint8)) and b.exists("k")
    assert (tmp_path / "cxlhm-tp0-pp0-dp0-cp0.img").exists()
    command = DOCS.read_text().split("--hicache-storage-backend-extra-config '", 1)[1].split("'", 1)[0]
    extra = json.loads(command)
    assert extra["interface_v1"] == 1  # else SGLang copies every page through batch_get/batch_set
    assert getattr(__import__(extra["module_path"], fromlist=["x"]), extra["class_name"]) is CxlhmHiCacheStorage
    # what the key switches is checked on a real controller: test_the_controller_backs_pages_up_and_prefetches_them


# ------------------------------------------------------------------ pages through the real controller
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct", "page_head"])
@pytest.mark.parametrize("zero_copy", [True, False], ids=["interface_v1", "generic"])
def test_the_controller_backs_pages_up_and_prefetches_them(tmp_path, layout, zero_copy):
    e = Engine(tmp_path / "c.img", layout=layout, v1=zero_copy)
    try:
        assert isinstance(e.backend, CxlhmHiCacheStorage) and e.zero_copy is zero_copy
        assert e.controller.backup_skip is False
        tokens = list(range(3 * PAGE))
        source = e.alloc(len(tokens))
        fill_random(e.host_pool, source, seed=7)
        want = [page_bytes(e.host_pool, p) for p in page_starts(source, PAGE)]
        assert e.backup(tokens, source) == len(tokens)
        found, loaded, target = e.prefetch(tokens + list(range(500, 500 + PAGE)))  # one page never stored
        assert (found, loaded) == (len(tokens), len(tokens))  # the hit prefix; the missing page is a miss
        assert [torch.equal(page_bytes(e.host_pool, p), w) for p, w in zip(page_starts(target, PAGE), want)] == [True] * 3
        assert e.prefetch(list(range(900, 900 + 2 * PAGE)))[:2] == (0, 0)
    finally:
        e.close()


def test_media_corruption_is_a_miss_never_bytes(tmp_path):
    """The image rots under the stored pages while the engine is down: the reopened
    store finds the keys, the device's checksums refuse the bytes, and SGLang's
    prefetch loads only what is intact."""
    image = tmp_path / "rot.img"
    e = Engine(image, layout="page_first", v1=True)
    tokens = list(range(4 * PAGE))
    source = e.alloc(len(tokens))
    fill_random(e.host_pool, source, seed=3)
    want = [page_bytes(e.host_pool, p) for p in page_starts(source, PAGE)]
    assert e.backup(tokens, source) == len(tokens)
    backend = e.backend
    rotten = backend._page_view(e.host_pool, zero_copy=True).key(e.keys(tokens)[2])
    hpa, nbytes = backend.shim.tenant.extent_of(rotten)
    e.close()
    with open(image, "r+b") as f:  # the third page's bytes on the medium change behind the device's back
        f.seek(hpa + nbytes // 2)
        f.write(b"rot")
    e = Engine(image, layout="page_first", v1=True)
    try:
        found, loaded, target = e.prefetch(tokens)
        assert found == len(tokens)  # the index still lists all four
        assert loaded == 2 * PAGE  # pages 0 and 1; page 2 fails its checksum, and the prefix stops there
        assert all(torch.equal(page_bytes(e.host_pool, p), w) for p, w in zip(page_starts(target, PAGE)[:2], want))
    finally:
        e.close()


def test_failed_reads_are_misses_and_bad_indices_a_clear_answer(backend, caplog):
    pool = host_pool("page_first")
    b = backend(pool)
    fill_pages(pool, [1], seed=3)
    assert b.batch_set_v1(["a"], torch.arange(PAGE, 2 * PAGE)) == [True]
    before = page_bytes(pool, 5)
    assert b.batch_get_v1(["a"], torch.arange(3)) == [False]  # 3 indices for one page of 4
    assert "host_indices has 3 entries" in caplog.text
    assert b.batch_get_v1(["unknown"], torch.arange(5 * PAGE, 6 * PAGE)) == [False]
    assert torch.equal(page_bytes(pool, 5), before)  # nothing written into the pool
    unregistered = backend(None, dp_rank=1)  # another rank: one image is never opened twice
    with pytest.raises(RuntimeError, match="register_mem_pool_host"):
        unregistered.batch_get_v1(["a"], torch.arange(PAGE))


# ------------------------------------------------------------------ hybrid models, real Mamba pool
def mamba_pool(slots=16, layers=2):
    """SGLang's MambaPoolHost over CPU state tensors (one temporal SSM state and one conv
    state per layer and slot, of different dtypes, as a hybrid model's are)."""
    info = MambaStateBufferInfo(temporal=torch.zeros(layers, slots, 2, 3, dtype=torch.float32),
                                conv=(torch.zeros(layers, slots, 5, dtype=torch.bfloat16),))
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu", layout="page_first")


def fill_states(pool, slots, seed):
    gen = torch.Generator().manual_seed(seed)
    for slot in slots:
        page = pool.get_data_page(slot, flat=True)
        pool.set_from_flat_data_page(slot, torch.randint(0, 256, page.shape, dtype=torch.uint8, generator=gen))


def hybrid_pair(backend, tmp_path):
    """Our backend and SGLang's HiCacheFile, each with the same KV and Mamba host pools."""
    kv, mamba = host_pool("page_first"), mamba_pool()
    ours = backend(kv)
    cfg = storage_config(tmp_path, dp_rank=1)
    cfg.extra_config["file_storage_path"] = str(tmp_path / "hicache-files")
    theirs = StorageBackendFactory.create_backend("file", cfg, kv)
    assert isinstance(theirs, hs.HiCacheFile)
    theirs.register_mem_pool_host(kv)
    for b in (ours, theirs):
        b.register_mem_host_pool_v2(kv, hs.PoolName.KV)
        b.register_mem_host_pool_v2(mamba, hs.PoolName.MAMBA)
    return kv, mamba, ours, theirs


def test_batch_exists_v2_equals_sglangs_file_backend_on_random_hybrid_layouts(backend, tmp_path):
    kv, mamba, ours, theirs = hybrid_pair(backend, tmp_path)
    fill_pages(kv, range(8), seed=1)
    fill_states(mamba, range(8), seed=2)
    rng = random.Random(40)
    for trial in range(40):
        n = rng.randint(1, 8)
        keys = [f"h{trial}-{i}" for i in range(n)]
        kv_stored = [k for k in keys if rng.random() < 0.85]
        state_stored = [k for k in keys if rng.random() < 0.5]
        writes = [hs.PoolTransfer(name=hs.PoolName.KV, keys=kv_stored, host_indices=torch.arange(len(kv_stored) * PAGE)),
                  hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=state_stored, host_indices=torch.arange(len(state_stored)))]
        for b in (ours, theirs):
            assert all(all(v) for v in b.batch_set_v2(writes).values())
        policy = rng.choice([hs.PoolHitPolicy.TRAILING_PAGES, hs.PoolHitPolicy.ALL_PAGES])
        query = [hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=keys[-rng.randint(1, n):], hit_policy=policy)]
        got, want = ours.batch_exists_v2(keys, query), theirs.batch_exists_v2(keys, query)
        assert (got.kv_hit_pages, got.extra_pool_hit_pages, got.restorable_prefix_pages) == \
               (want.kv_hit_pages, want.extra_pool_hit_pages, want.restorable_prefix_pages), (trial, policy)


def test_mamba_states_come_back_as_sglangs_file_backend_returns_them(backend, tmp_path):
    kv, mamba, ours, theirs = hybrid_pair(backend, tmp_path)
    fill_states(mamba, range(4), seed=5)
    stored = [mamba.get_data_page(s, flat=True).clone() for s in range(4)]
    write = [hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=["s0", "s1", "s2", "s3"], host_indices=torch.arange(4))]
    for b in (ours, theirs):
        assert b.batch_set_v2(write) == {"mamba": [True] * 4}
    read = [hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=["s0", "s1", "s2", "s3", "none"], host_indices=torch.arange(8, 13))]
    for b in (theirs, ours):
        fill_states(mamba, range(8, 13), seed=9)
        assert b.batch_get_v2(read) == {"mamba": [True] * 4 + [False]}
        assert all(torch.equal(mamba.get_data_page(8 + s, flat=True), stored[s]) for s in range(4))


# ------------------------------------------------------------------ hit policies, real enum
def test_hit_policies_with_sglangs_enum(backend):
    kv, mamba = host_pool("page_first"), mamba_pool()
    b = backend(kv)
    b.register_mem_host_pool_v2(mamba, hs.PoolName.MAMBA)
    keys = ["p0", "p1", "p2", "p3"]
    assert b.batch_set_v1(keys, torch.arange(4 * PAGE)) == [True] * 4
    # Mamba state stored at the ends of prefixes 2 and 4 only
    for page in ("p1", "p3"):
        res = b.batch_set_v2([hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=[page], host_indices=torch.arange(1))])
        assert res == {"mamba": [True]}
    trailing = hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=["x"], hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)
    result = b.batch_exists_v2(keys, [trailing])
    assert isinstance(result, hs.PoolTransferResult)
    assert result.kv_hit_pages == 4 and result.restorable_prefix_pages == [2, 4]
    every = hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=keys, hit_policy=hs.PoolHitPolicy.ALL_PAGES)
    assert b.batch_exists_v2(keys, [every]).kv_hit_pages == 0
    # BLOCK_GROUPS reports its own coverage and never lowers the KV hit
    groups = hs.PoolTransfer(name=hs.PoolName.DEEPSEEK_V4_C4, keys=["g0", "g1", "g2", "g3"],
                             hit_policy=hs.PoolHitPolicy.BLOCK_GROUPS, block_pages=2, group_pages=2)
    b.register_mem_host_pool_v2(host_pool("page_first"), hs.PoolName.DEEPSEEK_V4_C4)
    assert b.batch_set_v2([hs.PoolTransfer(name=hs.PoolName.DEEPSEEK_V4_C4, keys=["g0", "g1"],
                                           host_indices=torch.arange(2 * PAGE))]) == {"deepseek_v4_c4": [True, True]}
    result = b.batch_exists_v2(keys, [groups])
    assert result.kv_hit_pages == 4 and result.extra_pool_hit_pages["deepseek_v4_c4"] == 2
    with pytest.raises(ValueError, match="unsupported hit policy"):
        b.batch_exists_v2(keys, [hs.PoolTransfer(name="kv2", keys=None, hit_policy="newest_pages")])  # no such policy


def test_get_stats_is_storage_metrics_with_metrics_on_and_none_off(backend):
    pool = host_pool("page_first")
    assert backend(pool, dp_rank=1).get_stats() is None
    b = backend(pool, enable_storage_metrics=True)
    b.batch_set_v1(["m0", "m1"], torch.arange(2 * PAGE))
    b.batch_get_v1(["m0", "zz"], torch.arange(2 * PAGE))
    stats = b.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert stats.backup_pgs == [2] and stats.prefetch_pgs == [1]
    assert b.get_stats().backup_pgs == []  # taken since the last call


# ------------------------------------------------------------------ topology
def run_tp_ranks(tmp_path, replicas, world=2):
    """An MLA model's TP ranks, each its own process with its own controller, joined by
    gloo; see sglang_engine.mla_rank. Forked from a fork server that imported the
    engines once: forking this process instead could copy a lock some earlier test's
    thread holds."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["sglang_engine"])
    results = ctx.Queue()
    image = str(tmp_path / "mla-{rank}.img")
    procs = [ctx.Process(target=mla_rank, args=(rank, world, str(tmp_path / "rendezvous"), image, replicas, results))
             for rank in range(world)]
    for p in procs:
        p.start()
    try:
        got = sorted(results.get(timeout=TIMEOUT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(TIMEOUT_S)
            if p.is_alive():
                p.kill()
    for row in got:
        assert row[1] != "error", row[2]
    return got


def test_tp2_mla_every_rank_writes_its_replica_and_hits_through_the_engines_min(tmp_path):
    """SGLang lets only MLA rank 0 write (backup_skip) and takes the MIN of the ranks'
    hits over gloo: with one image per rank, rank 1's would veto every hit. Each rank
    writes its own replica, and each hits 24/24 with the pages' bytes."""
    ranks = run_tp_ranks(tmp_path, replicas=True)
    assert [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in ranks] == [(0, 24, 24, 24, True, False),
                                                                     (1, 24, 24, 24, True, False)]
    assert ranks[0][6] == ranks[1][6]  # one tenant name: the replicas are the same KV
    assert {p.name for p in tmp_path.glob("mla-*.img")} == {"mla-tp0-pp0-dp0-cp0.img", "mla-tp1-pp0-dp0-cp0.img"}


def test_tp2_mla_without_replicas_shows_the_engines_min_vetoing(tmp_path):
    """The same run with SGLang's own writer choice: rank 1 skips its backups, its
    image stays empty, and the engine's MIN makes both ranks miss."""
    ranks = run_tp_ranks(tmp_path, replicas=False)
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in ranks] == [(0, 24, 0, 0, False), (1, 0, 0, 0, True)]


def test_pipeline_stages_and_dp_groups_get_their_own_images_and_tenants(backend, tmp_path):
    made = [backend(pp_size=2, pp_rank=0), backend(pp_size=2, pp_rank=1), backend(dp_rank=1)]
    names = {b.shim.tenant.name for b in made}
    assert len(names) == 3
    assert {p.name for p in tmp_path.glob("*.img")} == {"cxlhm-tp0-pp0-dp0-cp0.img", "cxlhm-tp0-pp1-dp0-cp0.img",
                                                         "cxlhm-tp0-pp0-dp1-cp0.img"}


def test_a_path_naming_no_rank_is_made_per_rank(tmp_path):
    cfg = storage_config(tmp_path, tp_size=2, tp_rank=1)
    cfg.extra_config["device"]["backend"]["path"] = str(tmp_path / "kv.img")
    b = StorageBackendFactory.create_backend("dynamic", cfg, None)
    try:
        assert (tmp_path / "kv.img.tp1-pp0-dp0-cp0").exists()
    finally:
        b.close()


def test_salted_chains_start_where_sglangs_do():
    for extra_key, salt in [(None, None), ("lora-7", None), (None, "tenant-a"), ("", ""), ("a", "b")]:
        ours = kvkeys.sglang_namespace_seed(extra_key, salt)
        theirs = storage_namespace_seed(extra_key, salt)
        assert (ours.hex() if ours else None) == theirs
    seed = kvkeys.sglang_namespace_seed(None, "tenant-a")
    tokens = list(range(2 * PAGE))
    keys = kvkeys.prefix_keys(tokens, PAGE, prior=seed)
    assert keys[0].hex() == kvkeys.sglang_hash_str(tokens[:PAGE], seed.hex())
    assert keys[1].hex() == kvkeys.sglang_hash_str(tokens[PAGE:], keys[0].hex())
    assert re.fullmatch("[0-9a-f]{64}", keys[1].hex())
