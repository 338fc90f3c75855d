"""The Mooncake-store drop-in against Mooncake's real API and the engines that use it
(the releases in requirements-engines.txt, and the next ones through make
test-engines-next). mooncake.store is a CUDA-linked extension that does not load on a
CPU machine, so its method set is read from the installed extension's symbol strings,
and every attribute SGLang's, vLLM's and LMCache's sources take from a store object -
calls and references handed to asyncio.to_thread alike - is found with ast and must
exist on CxlhmMooncakeStore and accept the arguments it will get. Then the engines' own
back ends run unmodified over the drop-in (install_as_mooncake_store): SGLang's
MooncakeStore detaching and attaching again, LMCache's MooncakestoreConnector in both
save_chunk_meta modes, re-attach and a rotten chunk; and the raw call sequence with
Mooncake's return codes."""
import ast
import asyncio
import gc
import importlib.util
import inspect
import json
import sys
from pathlib import Path

import engines  # noqa: F401 - imports the engines
import numpy as np
import pytest
import torch

from host_runtime.shim import mooncake as mc

SITE = Path(importlib.util.find_spec("sglang").origin).parent.parent
ENGINES = ("sglang", "vllm", "lmcache")


def mooncake_callers() -> list[Path]:
    """Every source file of the engines that names Mooncake's store class."""
    return sorted(p for pkg in ENGINES for p in (SITE / pkg).rglob("*.py")
                  if "MooncakeDistributedStore" in p.read_text(errors="ignore"))


def store_uses():
    """(file, line, method, args) of every attribute the engines take from a Mooncake
    store object: calls (``self.store.put(k, v)``) and references handed to another call
    (``asyncio.to_thread(self.store.batch_get_buffer, keys)``: the arguments after it are
    the ones it will get). A store object is whatever a file assigns
    ``MooncakeDistributedStore()`` to, or a parameter named ``store``. args is None where
    the arguments cannot be known (``*args``, ``**kw``)."""
    uses = []
    for path in mooncake_callers():
        tree = ast.parse(path.read_text())
        names = {"store"} if any(isinstance(n, ast.arg) and n.arg == "store" for n in ast.walk(tree)) else set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    _name(node.value.func) == "MooncakeDistributedStore":
                names.update(_name(t) for t in node.targets)
        rel = str(path.relative_to(SITE))
        calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        passed = {id(a): (n, i) for n in calls.values() for i, a in enumerate(n.args)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _name(node.value) in names and node.attr[0] != "_"):
                continue
            if id(node) in calls:
                call = calls[id(node)]
                uses.append((rel, node.lineno, node.attr, _args(call.args, call.keywords)))
            elif id(node) in passed:
                call, i = passed[id(node)]
                uses.append((rel, node.lineno, node.attr, _args(call.args[i + 1:], call.keywords, forwarded=True)))
            elif isinstance(node.ctx, ast.Load):
                uses.append((rel, node.lineno, node.attr, None))
    return uses


def _name(node) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)


def _args(args, keywords, *, forwarded=False):
    if any(isinstance(a, ast.Starred) for a in args) or any(k.arg is None for k in keywords):
        return None
    # keywords of the outer call (to_thread's, wait_for's timeout) are not the method's
    return (len(args), [] if forwarded else [k.arg for k in keywords])


class MooncakeNames:
    """Method names in the installed store.so's strings (pybind11 keeps each one as a
    NUL-terminated string; the linker may share a short name with the tail of a longer
    one, e.g. "put" inside "batch_put", so a name is looked for as a string tail)."""

    def __init__(self):
        so = Path(importlib.util.find_spec("mooncake").submodule_search_locations[0]) / "store.so"
        self.data = so.read_bytes()

    def __contains__(self, name: str) -> bool:
        return name.encode() + b"\0" in self.data


def mooncake_symbols() -> MooncakeNames:
    return MooncakeNames()


# Methods of Mooncake releases newer than the pinned one that an engine probes for
# (getattr) before it uses them; the drop-in has them too.
NEWER_MOONCAKE = {"batch_probe_key"}  # vLLM 0.34's VLLM_MOONCAKE_STORE_SELECTIVE_LEASE


def test_every_store_method_the_engines_use_exists_on_the_drop_in_and_binds():
    uses = store_uses()
    files = {u[0] for u in uses}
    assert {"sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py",
            "lmcache/v1/storage_backend/connector/mooncakestore_connector.py",
            "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py"} <= files, \
        "the engines' Mooncake back ends moved: mooncake_callers() finds no store there"
    methods = {u[2] for u in uses}
    assert {"batch_get_buffer", "put_parts", "batch_put_from_multi_buffers", "setup"} <= methods  # a reference among them
    real = mooncake_symbols()
    ours = mc.CxlhmMooncakeStore()
    for rel, line, method, args in uses:
        assert method in real or method in NEWER_MOONCAKE, \
            f"{rel}:{line} uses store.{method}, which Mooncake's store.so does not name"
        assert hasattr(ours, method), f"{rel}:{line} uses store.{method}, which CxlhmMooncakeStore lacks"
        if args is not None:
            npos, keywords = args
            inspect.signature(getattr(ours, method)).bind(*range(npos), **{k: None for k in keywords})


def test_every_method_answers_invalid_params_before_setup():
    store = mc.CxlhmMooncakeStore()
    for rel, line, method, args in store_uses():
        if method in ("setup", "setup_dummy", "get_hostname", "close", "register_buffer", "unregister_buffer"):
            continue
        npos = args[0] if args else 1
        answer = getattr(store, method)(*[["k"]] * npos)  # a list of keys where one is wanted
        flat = answer if isinstance(answer, list) else [answer]
        assert answer == {} or all(a in (mc.INVALID_PARAMS, -1, b"", None) for a in flat), \
            f"{method} before setup answered {answer!r}"
    assert store.put("k", b"v") == mc.INVALID_PARAMS and store.get("k") == b"" and store.batch_is_exist(["a"]) == [-1]
    assert store.batch_get_buffer(["a", "b"]) == [None, None] and store.close() == mc.OK


def test_the_drop_in_methods_are_mooncakes():
    real = mooncake_symbols()
    public = [n for n, m in vars(mc.CxlhmMooncakeStore).items() if not n.startswith("_") and callable(m)]
    assert [n for n in public if n not in real and n not in NEWER_MOONCAKE] == []
    assert "definitely_not_a_mooncake_method" not in real


def test_the_backends_sequence_with_mooncakes_codes(tmp_path, monkeypatch):
    monkeypatch.setenv("CXLHM_MOONCAKE_DEVICE", json.dumps(
        {"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
         "backend": {"path": str(tmp_path / "mooncake-{pid}.img")}}))
    monkeypatch.setenv("CXLHM_MOONCAKE_HINTS", "none")
    store = mc.CxlhmMooncakeStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 1 << 30, 1 << 28, "tcp", "", "127.0.0.1:50051") == mc.OK
    try:
        assert store.put("warmup", b"x" * 64) == mc.OK and store.get("warmup") == b"x" * 64  # SGLang's warm-up
        assert store.get("missing") == b""
        pool = np.zeros(8 * 1024, np.uint8)
        assert store.register_buffer(pool.ctypes.data, pool.nbytes) == mc.OK
        pool[:2048] = np.arange(2048) % 251
        k, v = pool.ctypes.data, pool.ctypes.data + 1024
        assert store.batch_put_from_multi_buffers(["p0"], [[k, v]], [[1024, 1024]]) == [mc.OK]
        assert store.batch_put_from_multi_buffers(["p0"], [[k, v]], [[1024, 1024]]) == [mc.OK]  # exists = success
        assert store.batch_is_exist(["p0", "p1"]) == [1, 0] == store.batch_probe_key(["p0", "p1"])
        out = pool.ctypes.data + 4096
        assert store.batch_get_into_multi_buffers(["p0", "p1"], [[out, out + 1024], [out, out + 1024]],
                                                  [[1024, 1024], [1024, 1024]]) == [2048, mc.OBJECT_NOT_FOUND]
        assert np.array_equal(pool[4096:6144], pool[:2048])
        assert store.batch_get_into_multi_buffers(["p0"], [[12345]], [[2048]]) == [mc.INVALID_PARAMS]  # unregistered
        assert store.batch_get_into_multi_buffers(["p0"], [[out]], [[100]]) == [mc.INVALID_PARAMS]  # too small
        assert store.remove("p0", force=True) == mc.OK and store.remove("p0") == mc.OBJECT_NOT_FOUND
        assert store.remove_all() == 1  # the warm-up object
    finally:
        store.close()


def test_setup_without_a_device_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("CXLHM_MOONCAKE_DEVICE", raising=False)
    with pytest.raises(ValueError, match="CXLHM_MOONCAKE_DEVICE"):
        mc.CxlhmMooncakeStore().setup("localhost", "P2PHANDSHAKE")


# ---------------------------------------------------------------- the engines' back ends, unmodified
def device_env(monkeypatch, tmp_path, name="mooncake-{pid}.img"):
    monkeypatch.setenv("CXLHM_MOONCAKE_DEVICE", json.dumps(
        {"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB", "backend": {"path": str(tmp_path / name)}}))
    monkeypatch.setenv("CXLHM_MOONCAKE_HINTS", "none")


@pytest.fixture
def as_mooncake(monkeypatch, tmp_path):
    """mooncake.store served by the drop-in (install_as_mooncake_store), for this test only."""
    device_env(monkeypatch, tmp_path)
    monkeypatch.delitem(sys.modules, "mooncake.store", raising=False)
    module = mc.install_as_mooncake_store()
    yield module
    sys.modules.pop("mooncake.store", None)
    gc.collect()
    assert not mc._IMAGES._open, "an image outlived every store using it"


def test_batch_get_buffer_returns_mooncakes_buffer_handles(as_mooncake):
    store = as_mooncake.MooncakeDistributedStore()
    assert store.setup({"master_server_address": "localhost:50051"}) == mc.OK
    value = bytes(range(256)) * 3
    assert store.put_parts("k", value[:100], value[100:]) == mc.OK
    got, missing = store.batch_get_buffer(["k", "nope"])
    assert missing is None and isinstance(got, as_mooncake.BufferHandle)
    assert got.size() == len(value) and bytes(memoryview(got)) == value
    assert torch.equal(torch.frombuffer(got, dtype=torch.uint8, offset=28, count=10), torch.tensor(list(value[28:38]),
                                                                                                  dtype=torch.uint8))
    assert np.ctypeslib.as_array((np.ctypeslib.ctypes.c_ubyte * 4).from_address(got.ptr())).tobytes() == value[:4]
    store.close()


def test_an_image_is_shared_by_live_instances_and_released_by_the_last(as_mooncake, tmp_path):
    first = as_mooncake.MooncakeDistributedStore()
    first.setup("localhost", "P2PHANDSHAKE")
    assert first.put("a", b"1" * 64) == mc.OK
    second = as_mooncake.MooncakeDistributedStore()  # attached again while the first still lives
    assert second.setup("localhost", "P2PHANDSHAKE") == mc.OK and second.get("a") == b"1" * 64
    first.close()
    assert second.is_exist("a") == 1 and first.is_exist("a") == -1  # a closed store answers as before setup
    del second  # dropped without close(), as SGLang's MooncakeStore does
    gc.collect()
    assert not mc._IMAGES._open
    third = as_mooncake.MooncakeDistributedStore()
    assert third.setup("localhost", "P2PHANDSHAKE") == mc.OK and third.get("a") == b"1" * 64  # reopened from disk
    third.close()


def test_register_buffer_refuses_a_gpu_pointer(monkeypatch, tmp_path, caplog):
    """No GPU here: the CUDA runtime's answer for a device pointer is simulated; the
    decision (refuse with an ERROR naming the staging path) is the drop-in's."""
    device_env(monkeypatch, tmp_path)
    store = mc.CxlhmMooncakeStore()
    store.setup()
    host = np.zeros(4096, np.uint8)
    assert mc.pointer_kind(host.ctypes.data) == "host"
    assert store.register_buffer(host.ctypes.data, host.nbytes) == mc.OK

    class Runtime:
        @staticmethod
        def cudaPointerGetAttributes(attributes, ptr):
            attributes._obj.type = 2 if ptr.value == 0xD000 else 1  # cudaMemoryTypeDevice / Host
            return 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mc, "_cudart", lambda: Runtime)
    assert mc.pointer_kind(0xD000) == "device" and mc.pointer_kind(host.ctypes.data) == "host"
    with caplog.at_level("ERROR", logger="cxlhm.shim.mooncake"):
        assert store.register_buffer(0xD000, 1 << 20) == mc.INVALID_PARAMS
    assert "GPU pointer" in caplog.text and "staging" in caplog.text
    assert store.put_from("k", 0xD000, 64) == mc.INVALID_PARAMS  # never registered, never touched
    store.close()


def sglang_host_pool(layers=2, heads=2, dim=8, page=4):
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    k = [torch.zeros(64, heads, dim, dtype=torch.bfloat16) for _ in range(layers)]
    v = [torch.zeros(64, heads, dim, dtype=torch.bfloat16) for _ in range(layers)]
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
                         page_size=page, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=torch.bfloat16,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, page, "page_first", pin_memory=False, device="cpu",
                                device_capacity_tokens=64, start_layer=0, end_layer=layers)


def sglang_mooncake_store(pool):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
    config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name="m", extra_config={"master_server_address": "127.0.0.1:50051",
                                                                "global_segment_size": 0, "check_server": False})
    store = MooncakeStore(config, pool)
    store.register_mem_pool_host(pool)  # as HiCacheController.attach_storage_backend does
    return store


def test_sglangs_mooncake_store_detaches_and_attaches_again_in_one_process(as_mooncake):
    pool = sglang_host_pool()
    gen = torch.Generator().manual_seed(5)
    page_numel = pool.get_dummy_flat_data_page().numel()
    for p in range(3):
        pool.set_from_flat_data_page(p * 4, torch.randn(page_numel, generator=gen).to(torch.bfloat16))
    want = [pool.get_data_page(p * 4, flat=True).clone() for p in range(3)]
    keys = ["h0", "h1", "h2"]
    store = sglang_mooncake_store(pool)
    assert store.batch_set_v1(keys, torch.arange(12)) == [True] * 3
    assert store.batch_exists(keys + ["h3"]) == 3
    store.close()  # SGLang's close: does nothing
    del store  # HiCacheController.detach_storage_backend drops it
    again = sglang_mooncake_store(pool)  # attach again, same process: no "already open"
    target = torch.arange(12, 24)
    assert again.batch_get_v1(keys, target) == [True] * 3
    for p, w in enumerate(want):
        assert torch.equal(pool.get_data_page(12 + p * 4, flat=True).view(torch.uint8), w.view(torch.uint8))
    del again


def lmcache_mooncake(loop, tmp_path, **extra):
    """LMCache's MooncakestoreConnector built by its ConnectorManager from a mooncakestore:// URL."""
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import ConnectorManager
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=16, local_cpu=False, max_local_cpu_size=0.01,
        extra_config={"mooncake_master_server_address": "127.0.0.1:50051", "mooncake_global_segment_size": 0,
                      **extra})
    metadata = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                               kv_dtype=torch.bfloat16, kv_shape=(2, 2, 16, 2, 8))
    cpu = LocalCPUBackend(config, metadata)
    connector = ConnectorManager("mooncakestore://127.0.0.1:50051/", loop, cpu, config, metadata).create_connector()
    return connector, cpu


def lmcache_chunk(cpu, seed):
    from lmcache.v1.memory_management import MemoryFormat
    obj = cpu.allocate(torch.Size([2, 2, 16, 16]), torch.bfloat16, MemoryFormat.KV_2LTD)
    obj.tensor.view(torch.uint8).view(-1).copy_(torch.randint(0, 255, (obj.get_size(),), dtype=torch.uint8,
                                                     generator=torch.Generator().manual_seed(seed)))
    return obj


def lmcache_key(i):
    from lmcache.utils import CacheEngineKey
    return CacheEngineKey(model_name="m", world_size=1, worker_id=0, chunk_hash=i, dtype=torch.bfloat16)


@pytest.mark.parametrize("save_chunk_meta", [True, False], ids=["default-save_chunk_meta", "zero-copy"])
def test_lmcaches_mooncake_connector_stores_and_loads_real_chunks(as_mooncake, tmp_path, save_chunk_meta):
    from lmcache.v1.storage_backend.connector.mooncakestore_connector import MooncakestoreConnector
    loop = asyncio.new_event_loop()
    extra = {} if save_chunk_meta else {"save_chunk_meta": False}
    connector, cpu = lmcache_mooncake(loop, tmp_path, **extra)
    try:
        assert type(connector).__name__ == MooncakestoreConnector.__name__
        assert isinstance(connector.store, mc.CxlhmMooncakeStore) and connector.save_chunk_meta is save_chunk_meta
        objs = [lmcache_chunk(cpu, i) for i in range(4)]
        want = [o.tensor.view(torch.uint8).clone() for o in objs]
        loop.run_until_complete(connector.batched_put([lmcache_key(i) for i in range(4)], objs))
        keys = [lmcache_key(i) for i in range(5)]
        assert loop.run_until_complete(connector.batched_async_contains("l", keys)) == 4
        got = loop.run_until_complete(connector.batched_get(keys))
        assert got[4] is None and all(g is not None for g in got[:4])
        assert all(torch.equal(g.tensor.view(torch.uint8), w) for g, w in zip(got[:4], want))
    finally:
        loop.run_until_complete(connector.close())
        loop.close()


def test_lmcaches_mooncake_connector_reattaches_and_media_corruption_is_a_miss(as_mooncake, tmp_path, monkeypatch):
    device_env(monkeypatch, tmp_path, name="lmc-mooncake.img")
    loop = asyncio.new_event_loop()
    connector, cpu = lmcache_mooncake(loop, tmp_path)
    objs = [lmcache_chunk(cpu, i) for i in range(3)]
    want = [o.tensor.view(torch.uint8).clone() for o in objs]
    loop.run_until_complete(connector.batched_put([lmcache_key(i) for i in range(3)], objs))
    shim = connector.store.shim
    hpa, nbytes = shim.tenant.extent_of(lmcache_key(1).to_string())
    loop.run_until_complete(connector.close())
    gc.collect()
    assert not mc._IMAGES._open
    with open(tmp_path / "lmc-mooncake.img", "r+b") as f:  # chunk 1's bytes rot while nothing has it open
        f.seek(hpa + nbytes // 2)
        f.write(b"rot")
    connector, cpu = lmcache_mooncake(loop, tmp_path)  # attached again: same process, same image
    try:
        got = loop.run_until_complete(connector.batched_get([lmcache_key(i) for i in range(3)]))
        assert got[1] is None  # the device's checksum refuses the rotten chunk: a miss, never its bytes
        assert torch.equal(got[0].tensor.view(torch.uint8), want[0]) and torch.equal(got[2].tensor.view(torch.uint8),
                                                                                     want[2])
    finally:
        loop.run_until_complete(connector.close())
        loop.close()
