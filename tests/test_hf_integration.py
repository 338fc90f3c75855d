"""A real (tiny, random-weight) Llama through the Hugging Face adapter: turn 1 stores its
KV through the shim, turn 2 restores the prefix from cxlhm and computes only the new
tokens; its logits match a full recompute and the count of computed tokens proves the
reuse. The device's DRAM holds less than the KV, so the prefix comes back partly from
the SSD."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from host_runtime.kvgeometry import from_hf_config  # noqa: E402
from host_runtime.shim.api import KVShim  # noqa: E402
from host_runtime.shim.hf import HFKVCache, cache_kwarg, cache_of, layer_tensors  # noqa: E402

CHUNK_TOKENS = 16


@pytest.fixture(scope="module")
def model():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    m.tokens_computed = 0

    def count(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        m.tokens_computed += ids.numel()
    m.model.embed_tokens.register_forward_pre_hook(lambda mod, args: count(mod, args, {}))
    return m


@pytest.fixture
def shim(tmp_path):
    # 4 KiB blocks, 4 slots = 16 KiB of device DRAM; 64 tokens of this model's KV are 32 KiB
    s = KVShim.open({"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "16KiB",
                     "backend": {"path": str(tmp_path / "hf.img")}}, tenant="hf", hints="mailbox")
    yield s
    s.close()


def forward(model, ids, cache=None):
    kwargs = {"input_ids": ids, "use_cache": True}
    if cache is not None:
        kwargs[cache_kwarg(model)] = cache
    with torch.no_grad():
        return model(**kwargs)


@pytest.mark.parametrize("layout", ["layer_first", "chunk_first"])
def test_turn_two_reuses_turn_one_kv(model, shim, layout):
    geo = from_hf_config(model.config, tokens_per_chunk=CHUNK_TOKENS, dtype="float32", layout=layout)
    assert geo.bytes_per_chunk == CHUNK_TOKENS * 2 * 2 * 2 * 16 * 4  # tokens x layers x K/V x heads x dim x fp32
    kv = HFKVCache(shim, geo)
    g = torch.Generator().manual_seed(1)
    turn1 = torch.randint(0, 256, (1, 70), generator=g)
    turn2 = torch.cat([turn1, torch.randint(0, 256, (1, 30), generator=g)], dim=1)

    session = shim.session("chat")
    out1 = forward(model, turn1)
    assert kv.save(turn1[0], cache_of(out1), session=session) == 70 // CHUNK_TOKENS
    assert kv.save(turn1[0], cache_of(out1)) == 0  # already stored: nothing written twice
    session.pause()

    dev = shim.store.handle
    ssd_reads = dev.stats()["ssd_reads"]
    model.tokens_computed = 0
    cache, n = kv.restore(turn2[0], session=session)
    assert n == 64  # four full chunks of turn 1; the 6 leftover tokens were never stored
    assert dev.stats()["ssd_reads"] > ssd_reads, "the prefix should come back partly from the SSD"
    out2 = forward(model, turn2[:, n:], cache)
    assert model.tokens_computed == turn2.shape[1] - n == 36

    model.tokens_computed = 0
    full = forward(model, turn2)
    assert model.tokens_computed == 100
    torch.testing.assert_close(out2.logits, full.logits[:, n:], rtol=1e-5, atol=1e-5)
    session.end()


def test_miss_partial_hit_and_wrong_geometry(model, shim):
    geo = from_hf_config(model.config, tokens_per_chunk=CHUNK_TOKENS, dtype="float32")
    kv = HFKVCache(shim, geo)
    tokens = torch.arange(100, 180)
    cache, n = kv.restore(tokens)
    assert n == 0 and cache.get_seq_length() == 0  # a miss: compute everything
    out = forward(model, tokens[None, :48])
    kv.save(tokens[:48], cache_of(out))
    shim.remove(kv.format.key(kv.keys(tokens)[1]))  # evicted from the middle: only the first chunk is usable
    cache, n = kv.restore(tokens)
    assert n == CHUNK_TOKENS and cache.get_seq_length() == CHUNK_TOKENS
    with pytest.raises(ValueError, match="geometry"):
        HFKVCache(shim, geo.with_(num_kv_heads=4)).save(tokens[:48], cache_of(out))
    with pytest.raises(ValueError, match="dtype"):
        HFKVCache(shim, geo.with_(dtype="bfloat16")).save(tokens[:48], cache_of(out))
    # per-layer (keys, values) tensors work as well as a DynamicCache
    layers = layer_tensors(cache_of(forward(model, tokens[None, :64])))
    assert kv.save(tokens[:64], layers) == 2  # chunks 1 and 3 (0 and 2 are stored)
    assert all(kv.values.exists(kv.keys(tokens)[:4]))


@pytest.mark.parametrize("saved, restored", [("layer_first", "chunk_first"), ("chunk_first", "layer_first")])
def test_a_cache_saved_in_one_layout_is_restored_in_the_other(model, shim, saved, restored):
    geo = from_hf_config(model.config, tokens_per_chunk=CHUNK_TOKENS, dtype="float32", layout=saved)
    tokens = torch.arange(3, 3 + 40)
    assert HFKVCache(shim, geo).save(tokens[:32], cache_of(forward(model, tokens[None, :32]))) == 2
    reader = HFKVCache(shim, geo.with_(layout=restored))
    assert reader.save(tokens[:32], cache_of(forward(model, tokens[None, :32]))) == 0  # readable: not stored twice
    cache, n = reader.restore(tokens)
    assert n == 32
    torch.testing.assert_close(forward(model, tokens[None, n:], cache).logits, forward(model, tokens[None]).logits[:, n:],
                               rtol=1e-5, atol=1e-5)


def test_a_cache_of_another_geometry_is_a_miss(model, shim):
    geo = from_hf_config(model.config, tokens_per_chunk=CHUNK_TOKENS, dtype="float32")
    tokens = torch.arange(50, 90)
    HFKVCache(shim, geo).save(tokens[:32], cache_of(forward(model, tokens[None, :32])))
    for other in (geo.with_(tokens_per_chunk=8), geo.with_(head_dim=8, num_kv_heads=4)):  # same bytes per chunk or not
        cache, n = HFKVCache(shim, other).restore(tokens)
        assert n == 0 and cache.get_seq_length() == 0
