"""Pages stored by SGLang under one host layout and page path, read after a restart under
another: the bytes SGLang gets back mean what was stored (converted), or the page is a
miss - never another layout's bytes counted as a hit.

Every (interface_v1 on/off) x (host layout) pair writes pages with SGLang's own page
functions (HiCacheController._page_set_zero_copy / _generic_page_set) through the
adapter built by SGLang's StorageBackendFactory, the store is closed, and every pair
reads them back from the reopened image. What a page means is taken from SGLang's own
host buffer: its axes are told apart by their sizes (all distinct here), so the check
does not share the adapter's table of layouts."""
import engines  # noqa: F401 - imports the engines
import numpy as np
import pytest
import torch
from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation
from sglang.srt.mem_cache import hicache_storage as hs
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from host_runtime.shim.value_format import FormattedValues, Part, ValueFormat
from host_runtime.shim.sglang import page_format

PAGE, LAYERS, HEADS, DIM, DEVICE_TOKENS = 4, 3, 5, 8, 64
LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
PATHS = [True, False]  # interface_v1 on (zero copy), off (SGLang copies pages)
CONFIGS = [(layout, v1) for layout in LAYOUTS for v1 in PATHS]
WRITE_PAGES, READ_PAGES = (1, 2, 3), (9, 10, 11)


def mha_pool(layout, dtype=torch.bfloat16, heads=HEADS):
    k = [torch.zeros(DEVICE_TOKENS, heads, DIM, dtype=dtype) for _ in range(LAYERS)]
    v = [torch.zeros(DEVICE_TOKENS, heads, DIM, dtype=dtype) for _ in range(LAYERS)]
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=heads, head_dim=DIM, v_head_dim=DIM, dtype=dtype,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0, end_layer=LAYERS)


def page_meaning(pool, page):
    """[kv, layer, token, head, dim] of one page, read from SGLang's host buffer by
    naming each axis of its shape from its size."""
    buf = pool.kv_buffer
    names = {2: "kv", LAYERS: "layer", HEADS: "head", DIM: "dim", PAGE: "token", pool.size: "slot", pool.page_num: "page"}
    assert len(names) == 7, f"axis sizes must be distinct to tell the axes apart: {names}"
    axes = [names[n] for n in buf.shape]
    if "slot" in axes:
        buf = buf.narrow(axes.index("slot"), page * PAGE, PAGE)
        axes[axes.index("slot")] = "token"
    if "page" in axes:
        buf = buf.select(axes.index("page"), page)
        axes.remove("page")
    meaning = buf.permute(*[axes.index(a) for a in ("kv", "layer", "token", "head", "dim")]).contiguous()
    return meaning.view(torch.int16)  # compared as bit patterns: random bytes hold NaNs


def storage_config(path, v1):
    return hs.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="meta-llama/Llama-3-8B",
        extra_config={"backend_name": "cxlhm", "module_path": "host_runtime.shim.sglang",
                      "class_name": "CxlhmHiCacheStorage", "interface_v1": int(v1), "hints": "none",
                      "device": {"capacity": "8MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
                                 "backend": {"path": str(path)}}})


class Engine:
    """One run of SGLang's storage side: a host pool of `layout`, the adapter from the
    factory, and the controller's page functions for the path interface_v1 picks."""

    def __init__(self, path, layout, v1, pool=None):
        self.pool = pool or mha_pool(layout)
        self.backend = StorageBackendFactory.create_backend("dynamic", storage_config(path, v1), self.pool)
        self.backend.register_mem_pool_host(self.pool)
        self.v1 = v1
        self.state = _ControllerState(self.backend, self.pool)

    def store(self, keys, pages):
        fn = HiCacheController._page_set_zero_copy if self.v1 else HiCacheController._generic_page_set
        indices = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])
        return fn(self.state, keys, indices)

    def load(self, keys, pages):
        fn = HiCacheController._page_get_zero_copy if self.v1 else HiCacheController._generic_page_get
        indices = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])
        return fn(self.state, PrefetchOperation("r", list(range(len(keys) * PAGE))), keys, indices)

    def close(self):
        self.backend.close()


class _ControllerState:
    """The attributes HiCacheController's page functions read (its constructor needs a
    device KV pool allocator and a published parallel context; see test_engine_sglang
    for the real controller)."""

    def __init__(self, backend, pool):
        self.storage_backend, self.storage_host_pool, self.mem_pool_host, self.page_size = backend, pool, pool, PAGE


def fill(pool, seed):
    gen = torch.Generator().manual_seed(seed)
    raw = pool.kv_buffer.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


def keys_of(config):
    layout, v1 = config
    return [f"{layout}-{'v1' if v1 else 'copy'}-{i}" for i in range(len(WRITE_PAGES))]


def test_every_layout_and_path_pair_reads_the_stored_meaning_after_a_restart(tmp_path):
    image = tmp_path / "sglang.img"
    stored = {}
    for n, config in enumerate(CONFIGS):
        engine = Engine(image, *config)
        fill(engine.pool, seed=n)
        assert engine.store(keys_of(config), WRITE_PAGES) is True
        stored[config] = [page_meaning(engine.pool, p) for p in WRITE_PAGES]
        engine.close()  # the engine restarts with another layout or path

    for reader in CONFIGS:
        engine = Engine(image, *reader)
        for writer in CONFIGS:
            fill(engine.pool, seed=999)
            keys = keys_of(writer)
            assert engine.backend.batch_exists(keys) == 3, (writer, reader)
            assert engine.load(keys, READ_PAGES) == 3, (writer, reader)
            for want, page in zip(stored[writer], READ_PAGES):
                assert torch.equal(page_meaning(engine.pool, page), want), f"written {writer}, read {reader}"
        engine.close()


@pytest.mark.parametrize("change", ["dtype", "heads"])
def test_a_page_of_another_geometry_is_a_miss_never_bytes(tmp_path, change):
    image = tmp_path / "sglang.img"
    writer = Engine(image, "page_first", True)
    fill(writer.pool, seed=1)
    assert writer.store(["g0", "g1"], (1, 2))
    writer.close()
    other = mha_pool("page_first", dtype=torch.float16) if change == "dtype" else mha_pool("page_first", heads=HEADS + 2)
    reader = Engine(image, "page_first", True, pool=other)
    fill(reader.pool, seed=5)
    before = reader.pool.kv_buffer.view(torch.int16).clone()
    assert reader.backend.batch_exists(["g0", "g1"]) == 0
    assert reader.load(["g0", "g1"], READ_PAGES[:2]) == 0
    assert reader.backend.get("g0", reader.pool.get_dummy_flat_data_page()) is None
    assert torch.equal(reader.pool.kv_buffer.view(torch.int16), before)  # nothing written into the pool
    reader.close()


def test_same_size_other_dtype_bytes_are_never_returned(tmp_path):
    """bfloat16 and float16 pages are the same size: only the format tells them apart."""
    image = tmp_path / "sglang.img"
    writer = Engine(image, "layer_first", False)
    fill(writer.pool, seed=2)
    assert writer.store(["d0"], (1,))
    writer.close()
    reader = Engine(image, "layer_first", False, pool=mha_pool("layer_first", dtype=torch.float16))
    assert reader.pool.get_dummy_flat_data_page().nbytes == writer.pool.get_dummy_flat_data_page().nbytes
    assert reader.backend.batch_exists(["d0"]) == 0 and reader.load(["d0"], (5,)) == 0
    reader.close()


def test_the_tenant_name_carries_the_format_scheme(tmp_path):
    engine = Engine(tmp_path / "t.img", "page_first", True)
    assert engine.backend.shim.tenant.name.endswith(":kvfmt1")
    engine.close()


def test_the_formats_of_sglangs_layouts_are_permutations_of_one_another():
    pool = mha_pool("page_head")
    formats = {(layout, v1): page_format(mha_pool(layout), zero_copy=v1) for layout, v1 in CONFIGS}
    assert len(set(formats.values())) == 4  # layer_first's two paths differ; the others' agree
    assert formats[("layer_first", True)] != formats[("layer_first", False)]
    assert formats[("layer_first", False)] == formats[("page_first_direct", True)]  # both [kv, layer, token, ...]
    for a in formats.values():
        for b in formats.values():
            assert a.convertible_from(b) and a.nbytes == b.nbytes == pool.get_dummy_flat_data_page().nbytes


# ------------------------------------------------------------------ the format module itself
def _fmt(order, dtype="bfloat16", byte_order="little"):
    sizes = {"kv": 2, "layer": 3, "token": 4}
    return ValueFormat("t", (Part("kv", dtype, 2, tuple((a, sizes[a]) for a in order)),), page_tokens=4, byte_order=byte_order)


def test_conversion_is_the_exact_permutation_and_byte_swap():
    src, dst = _fmt(("kv", "layer", "token")), _fmt(("layer", "kv", "token"), byte_order="big")
    elements = np.arange(24, dtype="<u2")  # element i = i, [kv, layer, token]
    out = dst.convert(elements.view(np.uint8), src).view(">u2").reshape(3, 2, 4)
    assert np.array_equal(out, elements.reshape(2, 3, 4).transpose(1, 0, 2))
    with pytest.raises(ValueError, match="exactly"):
        _fmt(("kv", "layer", "token"), dtype="float16").convert(elements.view(np.uint8), src)


def test_a_value_stored_in_one_format_is_found_only_by_readers_that_convert_it(make_device):
    from host_runtime.kvstore import KVStore
    from host_runtime.shim.api import KVShim
    store = KVStore(make_device(capacity=1 << 22, dram_bytes=8 * 4096), index_path=False)
    try:
        shim = KVShim(store.tenant("t"))
        a, b, c = _fmt(("kv", "layer", "token")), _fmt(("token", "layer", "kv")), _fmt(("kv", "layer", "token"), "float16")
        value = np.arange(24, dtype="<u2")
        assert FormattedValues(shim, a).put("k", value).ok
        assert FormattedValues(shim, b).exists(["k"]) == [False]  # not told it may convert from a
        reader = FormattedValues(shim, b, readable=[a, c])
        assert reader.others == [a] and reader.lookup_prefix(["k", "x"]) == 1
        out = np.zeros(24, "<u2")
        assert reader.get_into("k", out)
        assert np.array_equal(out.reshape(4, 3, 2), value.reshape(2, 3, 4).transpose(2, 1, 0))
        assert not FormattedValues(shim, c, readable=[a, b]).get_into("k", out)
        assert shim.keys() == [a.key("k")] and a.key("k").startswith(b"k#")
    finally:
        store.close()
