"""The shipped adapter conformance suite (host_runtime.testing.shim.ShimConformance) run
against every built-in adapter, built from each engine's documented semantics (fakes,
for speed; tests/test_engine_*.py run the adapters inside the real engines, and the vLLM
tier is tested there only). The suite states the behaviour in a shared vocabulary (put /
get / exists / prefix); each subclass maps it onto one engine's interface and says what
that engine returns for a miss, a duplicate put and a rejected size:

  engine     miss                      duplicate put             wrong size
  core API   get_into -> None          EXISTS                    ValueError
  SGLang     get -> None               set -> True (skipped)     get -> None, set -> False
  LMCache    get -> None               put leaves it as is       get -> None
  Mooncake   get_into -> -704          put_from -> 0             -600 (INVALID_PARAMS)
"""
import asyncio
import threading

import numpy as np
import pytest

from cxlhm.registry import BrokenEntry
from host_runtime.kvstore import PutStatus
from host_runtime.shim import mooncake as mc
from host_runtime.shim.lmcache import BytesMemoryObj, CxlhmRemoteConnector
from host_runtime.shim.registry import ADAPTERS
from host_runtime.shim.sglang import CxlhmHiCacheStorage
from host_runtime.testing.shim import MISSING, SIZE, ShimConformance, data


# ---------------------------------------------------------------- the engine-agnostic API
class TestCoreAPI(ShimConformance):
    def make(self, shim):
        return shim

    def put(self, a, key, arr):
        return a.put_from(key, arr).ok

    def get(self, a, key, size):
        out = np.empty(size, np.uint8)
        got = a.get_into(key, out)
        return MISSING if got is None else out

    def exists(self, a, keys):
        return a.exists(keys)

    def prefix(self, a, keys):
        return a.lookup_prefix(keys)

    def duplicate_put(self, a, key, arr):
        assert a.put_from(key, arr) is PutStatus.EXISTS

    def wrong_size_get(self, a, key, size):
        with pytest.raises(ValueError):
            a.get_into(key, np.empty(size - 1, np.uint8))

    def wrong_size_put(self, a, key):
        with pytest.raises(ValueError):
            a.put_from(key, np.empty(0, np.uint8))

    def test_allocate_commit_and_prefetch_wait(self, adapter):
        res = adapter.allocate(b"ac", SIZE)
        res.write(data(4))
        assert not adapter.contains(b"ac")
        assert adapter.commit(res) and adapter.contains(b"ac")
        ticket = adapter.prefetch([b"ac", b"missing"])
        assert adapter.wait(ticket) == 1
        assert adapter.pin([b"ac"]) == 1 and adapter.unpin([b"ac"]) == 1
        assert adapter.remove([b"ac", b"missing"]) == 1


# ---------------------------------------------------------------- SGLang HiCacheStorage
class FakeHostPool:
    """The parts of SGLang's HostKVCache the backend uses: page_size, kv_buffer,
    get_data_page / set_from_flat_data_page / get_dummy_flat_data_page, and (page-first
    layout) get_page_buffer_meta: a K and a V pointer per page."""

    def __init__(self, pages=8, page_size=4, meta=True):
        self.page_size, self.token_bytes = page_size, SIZE // page_size
        self.kv_buffer = np.zeros((pages * page_size, self.token_bytes), np.uint8)
        if not meta:
            self.get_page_buffer_meta = None

    def get_data_page(self, index, flat=True):
        return self.kv_buffer[index:index + self.page_size].reshape(-1).copy()

    def get_dummy_flat_data_page(self):
        return np.empty(SIZE, np.uint8)

    def set_from_flat_data_page(self, index, page):
        self.kv_buffer[index:index + self.page_size] = np.asarray(page).reshape(self.page_size, -1)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in np.asarray(indices)[::self.page_size]:
            base = self.kv_buffer[i:].ctypes.data
            ptrs += [base, base + SIZE // 2]
            sizes += [SIZE // 2, SIZE // 2]
        return ptrs, sizes


class TestSGLang(ShimConformance):
    def make(self, shim):
        return CxlhmHiCacheStorage(shim=shim)

    def put(self, a, key, arr):
        return a.set(key.decode(), arr) is True

    def get(self, a, key, size):
        target = np.empty(size, np.uint8)
        got = a.get(key.decode(), target)
        return MISSING if got is None else got

    def get_batch(self, a, keys, size):
        targets = [np.empty(size, np.uint8) for _ in keys]
        return [MISSING if g is None else g for g in a.batch_get([k.decode() for k in keys], targets)]

    def exists(self, a, keys):
        return [a.exists(k.decode()) for k in keys]

    def prefix(self, a, keys):
        return a.batch_exists([k.decode() for k in keys])

    def duplicate_put(self, a, key, arr):
        assert a.set(key.decode(), arr) is True

    def wrong_size_get(self, a, key, size):
        assert a.get(key.decode(), np.empty(size + 8, np.uint8)) is None

    def wrong_size_put(self, a, key):
        assert a.set(key.decode(), np.empty(0, np.uint8)) is False
        assert a.set(key.decode(), None, target_location=12345, target_sizes=SIZE) is False  # unregistered pointer

    @pytest.mark.parametrize("meta", [True, False], ids=["page-pointers", "flat-pages"])
    def test_batch_v1_moves_host_pool_pages(self, adapter, meta):
        pool = FakeHostPool(meta=meta)
        adapter.register_mem_pool_host(pool)
        for page in range(4):
            pool.kv_buffer[page * 4:(page + 1) * 4] = page + 10
        keys = ["h0", "h1", "h2", "h3"]
        indices = np.arange(16)
        assert adapter.batch_set_v1(keys, indices) == [True] * 4
        assert adapter.batch_exists(keys) == 4
        pool.kv_buffer[:] = 0
        back = np.r_[np.arange(16, 32)]  # load into other pages
        assert adapter.batch_get_v1(keys + ["missing"], np.r_[back, np.arange(28, 32)]) == [True] * 4 + [False]
        for page in range(4):
            assert (pool.kv_buffer[16 + page * 4:16 + (page + 1) * 4] == page + 10).all()
        assert adapter.batch_get_v1(keys, np.arange(3)) == [False] * 4  # wrong index count

    def test_v2_pools_and_hit_policies(self, adapter):
        from types import SimpleNamespace as NS
        kv, mamba = FakeHostPool(meta=False), FakeHostPool(meta=False)
        adapter.register_mem_pool_host(kv)
        adapter.register_mem_host_pool_v2(mamba, "mamba")
        kv.kv_buffer[:] = 1
        mamba.kv_buffer[:] = 2
        keys = ["v0", "v1", "v2"]
        res = adapter.batch_set_v2([NS(name="kv", keys=keys, host_indices=np.arange(12)),
                                    NS(name="mamba", keys=keys[2:], host_indices=np.arange(8, 12))])
        assert res == {"kv": [True] * 3, "mamba": [True]}
        trailing = NS(name="mamba", keys=["x"], hit_policy="trailing_pages")
        all_pages = NS(name="mamba", keys=keys, hit_policy="all_pages")
        assert adapter.batch_exists_v2(keys, [trailing]).kv_hit_pages == 3  # the last page has its state
        assert adapter.batch_exists_v2(keys, [all_pages]).kv_hit_pages == 0
        mamba.kv_buffer[:] = 0
        assert adapter.batch_get_v2([NS(name="mamba", keys=["v2"], host_indices=np.arange(4))]) == {"mamba": [True]}
        assert (mamba.kv_buffer[:4] == 2).all()


# ---------------------------------------------------------------- LMCache RemoteConnector
class TestLMCache(ShimConformance):
    def make(self, shim):
        return CxlhmRemoteConnector(shim=shim)

    @staticmethod
    def obj(arr):
        o = BytesMemoryObj(arr.nbytes, (arr.nbytes,), "uint8", 0)
        o.raw[:] = arr
        return o

    def put(self, a, key, arr):
        asyncio.run(a.put(key.decode(), self.obj(arr)))
        return a.exists_sync(key.decode())

    def get(self, a, key, size):
        got = asyncio.run(a.get(key.decode()))
        return MISSING if got is None else got.raw

    def get_batch(self, a, keys, size):
        return [MISSING if g is None else g.raw for g in asyncio.run(a.batched_get([k.decode() for k in keys]))]

    def exists(self, a, keys):
        return [a.exists_sync(k.decode()) for k in keys]

    def prefix(self, a, keys):
        n = a.batched_contains([k.decode() for k in keys])  # leading hits
        assert asyncio.run(a.batched_async_contains("lookup", [k.decode() for k in keys])) == n
        return n

    def duplicate_put(self, a, key, arr):
        asyncio.run(a.put(key.decode(), self.obj(arr)))

    def wrong_size_get(self, a, key, size):
        small = CxlhmRemoteConnector(shim=a.shim, allocate=lambda shape, dtype, fmt, n: BytesMemoryObj(n - 1))
        assert asyncio.run(small.get(key.decode())) is None
        a.shim.put_from(b"raw", np.zeros(100, np.uint8))  # a value that is not an LMCache chunk
        assert asyncio.run(a.get("raw")) is None

    def wrong_size_put(self, a, key):
        with pytest.raises(ValueError):  # an empty object; LMCache raises on bad puts too
            a.shim.put_from(key, np.empty(0, np.uint8))

    def test_list_and_metadata_roundtrip(self, adapter):
        o = BytesMemoryObj(SIZE, (2, 4, 1024), "bfloat16", 3)
        o.raw[:] = 9
        asyncio.run(adapter.put("meta", o))
        got = asyncio.run(adapter.get("meta"))
        assert (got.meta_shape, got.meta_dtype, got.meta_fmt) == ((2, 4, 1024), "bfloat16", 3)
        assert asyncio.run(adapter.list()) == ["meta"]
        assert adapter.remove_sync("meta") and not adapter.remove_sync("meta")


# ---------------------------------------------------------------- Mooncake store
class TestMooncake(ShimConformance):
    def make(self, shim):
        store = mc.CxlhmMooncakeStore(shim)
        store.pool = np.zeros(64 * SIZE, np.uint8)  # the "registered" host memory
        store.slot = 0
        store.lock = threading.Lock()
        assert store.register_buffer(store.pool.ctypes.data, store.pool.nbytes) == mc.OK
        return store

    def buf(self, a, size):
        with a.lock:
            a.slot = (a.slot + 1) % 32
            return a.pool[a.slot * 2 * SIZE: a.slot * 2 * SIZE + size]

    def put(self, a, key, arr):
        b = self.buf(a, arr.nbytes)
        b[:] = arr
        return a.put_from(key.decode(), b.ctypes.data, b.nbytes) == mc.OK

    def get(self, a, key, size):
        b = self.buf(a, size)
        rc = a.get_into(key.decode(), b.ctypes.data, size)
        if rc == mc.OBJECT_NOT_FOUND:
            return MISSING
        assert rc == size
        return b.copy()

    def get_batch(self, a, keys, size):
        bufs = [self.buf(a, size) for _ in keys]
        rcs = a.batch_get_into([k.decode() for k in keys], [b.ctypes.data for b in bufs], [size] * len(keys))
        return [MISSING if rc == mc.OBJECT_NOT_FOUND else b.copy() for rc, b in zip(rcs, bufs)]

    def exists(self, a, keys):
        return [r == 1 for r in a.batch_is_exist([k.decode() for k in keys])]

    def prefix(self, a, keys):
        hits = self.exists(a, keys)
        return hits.index(False) if False in hits else len(hits)

    def duplicate_put(self, a, key, arr):
        b = self.buf(a, arr.nbytes)
        b[:] = arr
        assert a.put_from(key.decode(), b.ctypes.data, b.nbytes) == mc.OK  # Mooncake: already stored is success

    def put_racing(self, a, key, arr):
        b = np.array(arr)
        a.register_buffer(b.ctypes.data, b.nbytes)
        assert a.put_from(key.decode(), b.ctypes.data, b.nbytes) in (mc.OK, mc.OBJECT_ALREADY_EXISTS)
        a.unregister_buffer(b.ctypes.data)

    def wrong_size_get(self, a, key, size):
        b = self.buf(a, size)
        assert a.get_into(key.decode(), b.ctypes.data, size - 1) == mc.INVALID_PARAMS  # buffer < object
        assert a.get_into(key.decode(), b.ctypes.data, size + 100) == size  # larger is fine in Mooncake

    def wrong_size_put(self, a, key):
        stray = np.zeros(SIZE, np.uint8)  # never registered
        assert a.put_from(key.decode(), stray.ctypes.data, SIZE) == mc.INVALID_PARAMS
        assert a.put_from(key.decode(), a.pool.ctypes.data, a.pool.nbytes + 1) == mc.INVALID_PARAMS
        assert a.batch_put_from([key.decode()], [], [SIZE]) == [mc.INVALID_PARAMS]
        assert a.get_size("absent") == mc.OBJECT_NOT_FOUND and a.remove("absent") == mc.OBJECT_NOT_FOUND


def test_adapters_import_without_their_engines():
    import importlib
    loaded, broken = ADAPTERS.load_all(ADAPTERS.builtin_names())
    assert not broken and set(loaded) >= {"sglang", "lmcache", "vllm", "mooncake", "hf"}
    for name, adapter in loaded.items():
        module = importlib.import_module(f"host_runtime.shim.{name}")
        assert module.__all__ and module.ADAPTER is adapter
        assert callable(adapter.load_entry()) and adapter.engine and adapter.loading


def test_every_adapter_module_is_registered():
    """A module added to host_runtime/shim is an adapter (then it is registered) or one of
    the shared helpers every adapter builds on."""
    import pkgutil
    import host_runtime.shim as package
    helpers = {"api", "registry", "value_format"}
    modules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    assert modules - helpers == set(ADAPTERS.builtin_names())


def test_a_broken_adapter_entry_is_reported_with_its_source():
    from host_runtime.shim.registry import EngineAdapter
    ADAPTERS.add("broken-for-test", EngineAdapter("none", "host_runtime.shim.nowhere:Nothing", "never"))
    try:
        with pytest.raises(BrokenEntry, match="does not load"):
            ADAPTERS.get("broken-for-test")
    finally:
        ADAPTERS.unregister("broken-for-test")
