"""KV geometry (bytes per chunk, layouts, presets) and KV keys (SGLang's chained hash,
tenant salts, position-independent segment keys; long chains from the compiled loop)."""
import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_runtime import kvgeometry as G
from host_runtime import kvkeys as K
from host_runtime import sha_chain

MIB, KIB = 1 << 20, 1 << 10


# ---------------------------------------------------------------- geometry
@pytest.mark.parametrize("name, per_token, chunk", [
    ("llama-3-8b", 128 * KIB, 32 * MIB),       # 2 x 32 x 8 x 128 x 2 B
    ("llama-3-70b", 320 * KIB, 80 * MIB),      # 2 x 80 x 8 x 128 x 2 B
    ("qwen2.5-7b", 56 * KIB, 14 * MIB),        # 2 x 28 x 4 x 128 x 2 B
    ("deepseek-v3", 61 * 576 * 2, 256 * 61 * 576 * 2),  # MLA: 1 x 61 x (512 + 64) x 2 B
])
def test_preset_sizes(name, per_token, chunk):
    geo = G.preset(name)
    assert geo.bytes_per_token == per_token
    assert geo.bytes_per_chunk == chunk


def test_mla_has_one_kv_part_and_gqa_two():
    assert G.preset("deepseek-v3").kv_parts == 1
    assert G.preset("qwen2.5-7b").kv_parts == 2
    with pytest.raises(ValueError, match="num_kv_heads must be 1"):
        G.KVGeometry(4, 2, 64, mla=True)


@pytest.mark.parametrize("layout", G.LAYOUTS)
def test_offsets_tile_the_chunk_exactly_once(layout):
    geo = G.KVGeometry(3, 2, 4, "float16", tokens_per_chunk=5, layout=layout)
    row = geo.num_kv_heads * geo.head_dim * geo.dtype_bytes
    offsets = sorted(geo.offset(l, kv, t) for l in range(3) for kv in range(2) for t in range(5))
    assert offsets == list(range(0, geo.bytes_per_chunk, row))
    # agrees with numpy's C order over chunk_shape
    arr = np.arange(np.prod(geo.chunk_shape)).reshape(geo.chunk_shape)
    idx = (1, 1, 3) if layout == "layer_first" else (3, 1, 1)
    assert geo.offset(1, 1, 3) == arr[idx][0, 0] * geo.dtype_bytes


def test_layer_extents_follow_the_layout():
    lf = G.KVGeometry(4, 2, 8, "bfloat16", tokens_per_chunk=16, layout="layer_first")
    assert lf.layer_extents(2) == [(2 * 2 * 16 * 2 * 8 * 2, 16 * lf.bytes_per_token_layer)]
    cf = lf.with_(layout="chunk_first")
    pieces = cf.layer_extents(2)
    assert len(pieces) == 16 and sum(n for _, n in pieces) == 16 * cf.bytes_per_token_layer


def test_bad_geometry_is_a_clear_error():
    with pytest.raises(ValueError, match="dtype"):
        G.KVGeometry(1, 1, 1, "float12")
    with pytest.raises(ValueError, match="num_layers"):
        G.KVGeometry(0, 1, 1)
    with pytest.raises(ValueError, match="unknown KV geometry preset"):
        G.preset("gpt-17")


def test_from_hf_config_reads_llama_style_fields():
    class Cfg:
        num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size = 32, 32, 8, 4096
        torch_dtype = "bfloat16"
        model_type = "llama"
    assert G.from_hf_config(Cfg()).bytes_per_chunk == G.preset("llama-3-8b").bytes_per_chunk


# ---------------------------------------------------------------- keys
def _sglang_reference(token_ids, prior_hash=None):
    """SGLang's get_hash_str, restated from its documented behaviour."""
    h = hashlib.sha256()
    if prior_hash:
        h.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        h.update(t.to_bytes(4, byteorder="little", signed=False))
    return h.hexdigest()


def test_unsalted_prefix_keys_equal_sglangs_chain():
    tokens = list(range(1000, 1000 + 40))
    keys = K.prefix_keys(tokens, 16)
    assert len(keys) == 2  # the partial third chunk is not keyed
    first = _sglang_reference(tokens[:16])
    second = _sglang_reference(tokens[16:32], first)
    assert [k.hex() for k in keys] == [first, second]
    assert K.sglang_hash_str(tokens[16:32], first) == second


def test_keys_chain_so_a_chunk_key_names_its_whole_prefix():
    a = K.prefix_keys(np.arange(64), 16)
    b = K.prefix_keys(np.r_[np.arange(16) + 1, np.arange(16, 64)], 16)  # first chunk differs
    assert a[0] != b[0] and all(x != y for x, y in zip(a, b))  # same later tokens, different keys


def test_input_types_agree_and_continuing_a_chain_matches():
    tokens = np.arange(96, dtype=np.int64)
    ref = K.prefix_keys(tokens, 32)
    assert K.prefix_keys(tokens.tolist(), 32) == ref
    assert K.prefix_keys(tokens.astype("<u4"), 32) == ref
    assert K.prefix_keys(tokens[32:], 32, prior=ref[0]) == ref[1:]


def test_tenant_salt_changes_every_key_and_is_deterministic():
    tokens = np.arange(64)
    plain, alice, bob = (K.prefix_keys(tokens, 16, salt=s) for s in (None, b"alice", b"bob"))
    assert not set(alice) & set(bob) and not set(alice) & set(plain)
    assert K.prefix_keys(tokens, 16, salt=b"alice") == alice


def test_segment_keys_are_position_independent():
    doc = np.arange(500, 532)
    prompt1 = np.r_[np.arange(10), doc]
    prompt2 = np.r_[np.arange(77), doc]
    assert K.segment_key(prompt1[10:]) == K.segment_key(prompt2[77:])
    assert K.segment_key(doc) != K.segment_key(doc[:-1])
    assert K.segment_key(doc, salt="a") != K.segment_key(doc, salt="b")
    assert K.segment_key(doc) not in K.prefix_keys(doc, 32)  # different domain than prefix keys


def test_bad_tokens_and_keys_are_rejected():
    with pytest.raises(ValueError, match="0 .. 2\\*\\*32-1"):
        K.prefix_keys([1, -2, 3], 2)
    with pytest.raises(TypeError):
        K.prefix_keys(np.array([1.5, 2.0]), 1)
    with pytest.raises(ValueError):
        K.prefix_keys([1, 2], 0)
    with pytest.raises(ValueError, match="empty"):
        K.normalize_key(b"")
    with pytest.raises(ValueError, match="1024"):
        K.normalize_key("x" * 2000)
    assert K.normalize_key(7) != K.normalize_key(-7)
    assert K.normalize_key("ab") == b"ab"


def _hashlib_chain(tokens, per_chunk, prior=None, partial=False):
    """The chain one hashlib object per link, as kvkeys' Python path computes it."""
    data = K.token_bytes(tokens).view(np.uint8).tobytes()
    step = 4 * per_chunk
    n = len(data) // step + (1 if partial and len(data) % step else 0)
    keys = []
    for i in range(n):
        h = hashlib.sha256(prior) if prior is not None else hashlib.sha256()
        h.update(data[i * step:(i + 1) * step])
        prior = h.digest()
        keys.append(prior)
    return keys


@pytest.mark.skipif(not sha_chain.COMPILED_SHA, reason="no libcrypto SHA-256 to call from compiled code")
@settings(max_examples=40, deadline=None)
@given(n_tokens=st.integers(0, 3000), per_chunk=st.integers(1, 80), salt=st.sampled_from([None, b"", b"t1", "x"]),
       use_prior=st.booleans(), partial=st.booleans(), seed=st.integers(0, 2**31))
def test_long_chains_from_the_compiled_loop_equal_hashlibs(n_tokens, per_chunk, salt, use_prior, partial, seed):
    tokens = np.random.default_rng(seed).integers(0, 2**32, n_tokens, dtype=np.uint64)
    prior = hashlib.sha256(b"before").digest() if use_prior else None
    keys = K.prefix_keys(tokens, per_chunk, salt=salt, prior=prior, include_partial=partial)
    start = prior if use_prior else K.salt_digest(salt)
    assert keys == _hashlib_chain(tokens, per_chunk, start, partial)


def test_the_python_path_gives_the_same_keys(monkeypatch):
    tokens = np.arange(5000)
    compiled = K.prefix_keys(tokens, 16, salt="s")
    monkeypatch.setattr(sha_chain, "COMPILED_SHA", False)
    assert K.prefix_keys(tokens, 16, salt="s") == compiled == _hashlib_chain(tokens, 16, K.salt_digest("s"))
    assert len(compiled) == 312 and _sglang_reference(tokens[:16].tolist()) == K.prefix_keys(tokens, 16)[0].hex()
