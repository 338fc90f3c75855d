"""The engine-adapter example of docs/extending.md (examples/extending/engine_adapter.py):
the shipped adapter conformance suite (host_runtime.testing.shim) over it, the adapter
inside a toy engine that loads what it stored, and its registration the way a test
registers an adapter it does not install (ADAPTERS.register)."""
import hashlib

import numpy as np
import pytest

from example_loader import example
from host_runtime.shim import ADAPTERS, KVShim
from host_runtime.testing.shim import MISSING, ShimConformance, small_store

toy = example("engine_adapter")
LAYERS, PAGE_TOKENS, DIM = 2, 4, 256  # a float16 page is 2 * 2 * 4 * 256 * 2 = 8192 bytes
SHAPE = (2, LAYERS, PAGE_TOKENS, DIM)


def page_store(shim, dtype="float16"):
    return toy.CxlhmPageStore(shim, layers=LAYERS, page_tokens=PAGE_TOKENS, dim=DIM, dtype=dtype)


class TestToyPageStore(ShimConformance):
    """The toy engine's answers: a miss is False from batch_get (the page untouched), a
    duplicate store is True, a page of the wrong size is False both ways."""

    def make(self, shim):
        return page_store(shim)

    def put(self, a, key, arr):
        return a.batch_set([key.decode()], [arr.view(np.float16).reshape(SHAPE)]) == [True]

    def get(self, a, key, size):
        return self.get_batch(a, [key], size)[0]

    def get_batch(self, a, keys, size):
        pages = [np.full(SHAPE, -1, np.float16) for _ in keys]
        got = a.batch_get([k.decode() for k in keys], pages)
        for ok, page in zip(got, pages):
            assert ok or (page == -1).all()  # a miss leaves the page as it was
        return [page.view(np.uint8).reshape(-1) if ok else MISSING for ok, page in zip(got, pages)]

    def exists(self, a, keys):
        return [a.exists(k.decode()) for k in keys]

    def prefix(self, a, keys):
        return a.batch_exists([k.decode() for k in keys])

    def duplicate_put(self, a, key, arr):
        assert a.batch_set([key.decode()], [arr.view(np.float16).reshape(SHAPE)]) == [True]

    def wrong_size_get(self, a, key, size):
        assert a.batch_get([key.decode()], [np.empty(size + 2, np.uint8)]) == [False]
        assert a.batch_get([key.decode()], [np.empty(size, np.uint8)[::2]]) == [False]  # not contiguous

    def wrong_size_put(self, a, key):
        assert a.batch_set([key.decode()], [np.zeros(16, np.float16)]) == [False]


@pytest.fixture
def store(tmp_path):
    s, handle = small_store(str(tmp_path / "toy.img"))
    yield s
    s.close()
    handle.close()


class ToyEngine:
    """The engine side of the interface: pages named by chained digests of their tokens;
    a request loads its stored leading pages and computes (and stores) the rest."""

    def __init__(self, store):
        self.store, self.computed = store, 0

    @staticmethod
    def keys(tokens):
        keys, prior = [], b""
        for i in range(len(tokens) // PAGE_TOKENS):
            prior = hashlib.sha256(prior + np.asarray(tokens[i * PAGE_TOKENS:(i + 1) * PAGE_TOKENS], "<u4").tobytes()).digest()
            keys.append(prior.hex())
        return keys

    @staticmethod
    def compute(key):
        """The "model": a page's KV, a function of its whole prefix (its key)."""
        return np.random.default_rng(int(key[:16], 16)).standard_normal(SHAPE).astype(np.float16)

    def prefill(self, tokens):
        keys = self.keys(tokens)
        hit = self.store.batch_exists(keys)
        pages = [np.empty(SHAPE, np.float16) for _ in keys]
        loaded = self.store.batch_get(keys[:hit], pages[:hit])
        n = loaded.index(False) if False in loaded else len(loaded)
        for i in range(n, len(keys)):
            pages[i] = self.compute(keys[i])
            self.computed += 1
        assert all(self.store.batch_set(keys[n:], pages[n:]))
        return pages, n


def test_the_engine_loads_a_shared_prefix_instead_of_computing_it(store):
    engine = ToyEngine(page_store(KVShim(store.tenant(f"toy:m:{toy.FORMAT_SCHEME}"))))
    first = list(range(100, 132))  # 8 pages
    pages, loaded = engine.prefill(first)
    assert loaded == 0 and engine.computed == 8
    second = first[:20] + list(range(500, 512))  # 5 shared pages, the 6th differs mid-page
    pages, loaded = engine.prefill(second)
    assert loaded == 5 and engine.computed == 8 + 3
    for key, page in zip(engine.keys(second), pages):
        assert np.array_equal(page, engine.compute(key))  # loaded bytes are what computing gives
    assert engine.prefill(list(range(1, 33)))[1] == 0  # another prefix from its first token


def test_a_page_of_another_format_is_a_miss(store):
    shim = KVShim(store.tenant("formats"))
    fp16, bf16 = page_store(shim), page_store(shim, dtype="bfloat16")
    assert fp16.page_bytes == bf16.page_bytes  # the same size: only the format tells them apart
    page = np.ones(SHAPE, np.float16)
    assert fp16.batch_set(["k"], [page]) == [True]
    assert bf16.batch_exists(["k"]) == 0 and bf16.batch_get(["k"], [np.empty(SHAPE, np.uint16)]) == [False]
    out = np.zeros(SHAPE, np.float16)
    assert fp16.batch_get(["k"], [out]) == [True] and (out == 1).all()


def test_bad_batches_say_what_is_wrong(store):
    a = page_store(KVShim(store.tenant("bad")))
    with pytest.raises(ValueError, match="2 keys but 1 pages"):
        a.batch_set(["a", "b"], [np.zeros(SHAPE, np.float16)])
    with pytest.raises(TypeError, match="a page key is a str"):
        a.batch_exists([b"bytes-key"])
    with pytest.raises(ValueError, match="dtype 'int8'"):
        toy.page_format(1, 1, 1, "int8")


def test_opened_on_a_device_its_pages_survive_a_restart(tmp_path):
    device = {"capacity": 1 << 22, "block_size": 4096, "dram_bytes": 8 * 4096,
              "backend": {"path": str(tmp_path / "toy.img")}}
    opts = dict(model="m", layers=LAYERS, page_tokens=PAGE_TOKENS, dim=DIM, hints="none")
    page = np.full(SHAPE, 3, np.float16)
    a = toy.CxlhmPageStore.open(device, **opts)
    assert a.shim.tenant.name == f"toy:m:{toy.FORMAT_SCHEME}"
    assert a.batch_set(["p0", "p1"], [page, page]) == [True, True]
    a.close()
    b = toy.CxlhmPageStore.open(device, **opts)
    out = np.zeros(SHAPE, np.float16)
    assert b.batch_exists(["p0", "p1", "p2"]) == 2 and b.batch_get(["p1"], [out]) == [True] and (out == 3).all()
    b.close()


def test_registered_like_any_adapter():
    ADAPTERS.register("toy", "examples.extending.engine_adapter:ADAPTER")
    try:
        adapter = ADAPTERS.get("toy")
        assert adapter is toy.ADAPTER and adapter.load_entry() is toy.CxlhmPageStore
        assert "toy" in ADAPTERS.names() and ADAPTERS.source("toy") == "built-in"
    finally:
        ADAPTERS.unregister("toy")
