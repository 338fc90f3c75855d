"""Pages stored by SGLang under one host layout and page path, read after a restart under
another: the bytes SGLang gets back mean what was stored (converted), or the page is a
miss - never another layout's bytes counted as a hit.

Every (interface_v1 on/off) x (host layout) pair backs pages up through SGLang's real
HiCacheController (attach_storage_backend, its backup and prefetch threads; see
tests/sglang_engine.py), the engine is closed, and every pair prefetches them from the
reopened image. What a page means is read from SGLang's own host buffer: its axes are
told apart by their sizes (all distinct here), so the check does not share the
adapter's table of layouts."""
import numpy as np
import pytest
import torch
from sglang_engine import Engine, fill_random, page_starts

from host_runtime.shim.sglang import page_format
from host_runtime.shim.value_format import FormattedValues, Part, ValueFormat

PAGE, LAYERS, HEADS, DIM = 4, 3, 5, 8
LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
CONFIGS = [(layout, v1) for layout in LAYOUTS for v1 in (True, False)]  # interface_v1 on (zero copy) / off (copies)
TOKENS = 3 * PAGE


def engine(image, config, **kw):
    layout, v1 = config
    return Engine(image, layout=layout, v1=v1, page=PAGE, layers=LAYERS, heads=HEADS, dim=DIM, **kw)


def _one_page(buf, axes, page):
    """The tokens of `page` out of a host buffer whose axes are named `axes`: a slot axis
    (pages laid end to end) is cut to the page's tokens, a page axis selected."""
    axes = list(axes)
    if "slot" in axes:
        buf = buf.narrow(axes.index("slot"), page * PAGE, PAGE)
        axes[axes.index("slot")] = "token"
    if "page" in axes:
        buf = buf.select(axes.index("page"), page)
        axes.remove("page")
    return buf, axes


def page_meaning(pool, page):
    """[kv, layer, token, head, dim] of one page, read from SGLang's host buffer by
    naming each axis of its shape from its size."""
    buf = pool.kv_buffer
    names = {2: "kv", LAYERS: "layer", HEADS: "head", DIM: "dim", PAGE: "token", pool.size: "slot", pool.page_num: "page"}
    assert len(names) == 7, f"axis sizes must be distinct to tell the axes apart: {names}"
    buf, axes = _one_page(buf, [names[n] for n in buf.shape], page)
    meaning = buf.permute(*[axes.index(a) for a in ("kv", "layer", "token", "head", "dim")]).contiguous()
    return meaning.view(torch.int16)  # compared as bit patterns: random bytes hold NaNs


def tokens_of(n):
    return list(range(1000 * n, 1000 * n + TOKENS))


def test_every_layout_and_path_pair_reads_the_stored_meaning_after_a_restart(tmp_path):
    image = tmp_path / "sglang.img"
    stored = {}
    for n, config in enumerate(CONFIGS):
        e = engine(image, config)
        assert e.zero_copy is config[1]
        indices = e.alloc(TOKENS)
        fill_random(e.host_pool, indices, seed=n)
        assert e.backup(tokens_of(n), indices) == TOKENS
        stored[config] = [page_meaning(e.host_pool, p) for p in page_starts(indices, PAGE)]
        e.close()  # the engine restarts with another layout or path

    for reader in CONFIGS:
        e = engine(image, reader)
        for n, writer in enumerate(CONFIGS):
            found, loaded, indices = e.prefetch(tokens_of(n))
            assert (found, loaded) == (TOKENS, TOKENS), (writer, reader)
            for want, page in zip(stored[writer], page_starts(indices, PAGE)):
                assert torch.equal(page_meaning(e.host_pool, page), want), f"written {writer}, read {reader}"
            e.host_pool.free(indices)
        e.close()


MLA_DIM = DIM + 4  # kv_lora_rank + the rope part (sglang_engine's MLA pool)
MLA_CONFIGS = [(layout, v1) for layout in ("layer_first", "page_first", "page_first_direct") for v1 in (True, False)]


def mla_page_meaning(pool, page):
    """[layer, token, dim] of one MLA page, its axes named from their sizes."""
    buf = pool.kv_buffer
    names = {1: "one", LAYERS: "layer", MLA_DIM: "dim", PAGE: "token", pool.size: "slot", pool.page_num: "page"}
    assert len(names) == 6, f"axis sizes must be distinct to tell the axes apart: {names}"
    buf, axes = _one_page(buf, [names[n] for n in buf.shape], page)
    buf = buf.select(axes.index("one"), 0)
    axes.remove("one")
    return buf.permute(*[axes.index(a) for a in ("layer", "token", "dim")]).contiguous().view(torch.int16)


def test_mla_pages_read_their_meaning_under_every_layout_and_path(tmp_path):
    image = tmp_path / "mla.img"
    stored = {}
    for n, (layout, v1) in enumerate(MLA_CONFIGS):
        e = Engine(image, layout=layout, v1=v1, mla=True, page=PAGE, layers=LAYERS, dim=DIM)
        indices = e.alloc(TOKENS)
        fill_random(e.host_pool, indices, seed=n)
        assert e.backup(tokens_of(n), indices) == TOKENS
        stored[n] = [mla_page_meaning(e.host_pool, p) for p in page_starts(indices, PAGE)]
        e.close()
    for layout, v1 in MLA_CONFIGS:
        e = Engine(image, layout=layout, v1=v1, mla=True, page=PAGE, layers=LAYERS, dim=DIM)
        for n in stored:
            found, loaded, indices = e.prefetch(tokens_of(n))
            assert loaded == TOKENS, (MLA_CONFIGS[n], (layout, v1))
            assert all(torch.equal(mla_page_meaning(e.host_pool, p), w)
                       for p, w in zip(page_starts(indices, PAGE), stored[n])), (MLA_CONFIGS[n], (layout, v1))
            e.host_pool.free(indices)
        e.close()


@pytest.mark.parametrize("change", ["dtype", "heads"])
def test_a_page_of_another_geometry_is_a_miss_never_bytes(tmp_path, change):
    """float16 and bfloat16 pages are the same size: only the format tells them apart."""
    image = tmp_path / "sglang.img"
    writer = engine(image, ("page_first", True))
    indices = writer.alloc(TOKENS)
    fill_random(writer.host_pool, indices, seed=1)
    assert writer.backup(tokens_of(1), indices) == TOKENS
    writer.close()
    other = {"dtype": torch.float16} if change == "dtype" else {"heads": HEADS + 2}
    for path in ("page_first", True), ("layer_first", False):
        reader = Engine(image, layout=path[0], v1=path[1], page=PAGE, layers=LAYERS, dim=DIM,
                        **({"heads": HEADS} | other))
        assert reader.prefetch(tokens_of(1))[:2] == (0, 0)
        page = reader.host_pool.get_dummy_flat_data_page()
        assert reader.backend.batch_exists(reader.keys(tokens_of(1))) == 0
        assert reader.backend.batch_get(reader.keys(tokens_of(1))[:1], [page]) == [None]
        reader.close()


def test_toggling_interface_v1_on_a_running_controller_keeps_every_page(tmp_path):
    """detach_storage_backend / attach_storage_backend with the other page path: the
    layer-first pool's two paths lay a page out differently (K0 V0 K1 V1 against all K
    then all V), and both read what either wrote."""
    e = engine(tmp_path / "t.img", ("layer_first", True))
    want = {}
    for n, v1 in enumerate((True, False, True)):
        if n:
            e.detach()
            e.attach(v1)
        assert e.zero_copy is v1
        indices = e.alloc(TOKENS)
        fill_random(e.host_pool, indices, seed=10 + n)
        assert e.backup(tokens_of(10 + n), indices) == TOKENS
        want[n] = [page_meaning(e.host_pool, p) for p in page_starts(indices, PAGE)]
        for m in want:
            found, loaded, got = e.prefetch(tokens_of(10 + m))
            assert loaded == TOKENS
            assert all(torch.equal(page_meaning(e.host_pool, p), w) for p, w in zip(page_starts(got, PAGE), want[m]))
            e.host_pool.free(got)
    e.close()


def test_the_tenant_name_carries_the_format_scheme(tmp_path):
    e = engine(tmp_path / "t.img", ("page_first", True))
    assert e.backend.shim.tenant.name.endswith(":kvfmt1")
    e.close()


def test_the_formats_of_sglangs_layouts_are_permutations_of_one_another(tmp_path):
    pools = {layout: engine(tmp_path / f"{layout}.img", (layout, True)) for layout in LAYOUTS}
    formats = {(layout, v1): page_format(pools[layout].host_pool, zero_copy=v1) for layout, v1 in CONFIGS}
    assert len(set(formats.values())) == 4  # layer_first's two paths differ; the others' agree
    assert formats[("layer_first", True)] != formats[("layer_first", False)]
    assert formats[("layer_first", False)] == formats[("page_first_direct", True)]  # both [kv, layer, token, ...]
    page_bytes = pools["page_head"].host_pool.get_dummy_flat_data_page().nbytes
    for a in formats.values():
        for b in formats.values():
            assert a.convertible_from(b) and a.nbytes == b.nbytes == page_bytes
    for e in pools.values():
        e.close()


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
