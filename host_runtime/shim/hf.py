"""Hugging Face transformers: save a turn's KV cache, restore it for the next turn.

    kv = HFKVCache(shim, geometry)                # geometry: kvgeometry.from_hf_config(model.config, ...)
    out = model(input_ids=turn1, use_cache=True)  # (transformers >= 5 names it `cache`,
    kv.save(turn1[0], out.cache)                  #  older versions `past_key_values`)
    cache, n = kv.restore(turn2[0])               # n leading tokens restored from cxlhm
    out = model(input_ids=turn2[:, n:], **{cache_kwarg(model): cache}, use_cache=True)

Only full chunks (geometry.tokens_per_chunk tokens) are stored; keys are this
tenant's chained prefix keys, so turn 2 finds exactly the chunks whose whole prefix
matches. Each chunk is written in place (allocate, one write per layer and K/V,
commit) in the geometry's byte layout, and read back with one device call per chunk.
With a session, restore emits SESSION_RESUME for the prefix and save emits APPEND.

Each chunk is stored under its key bound to its format (host_runtime.shim.
value_format: dtype, chunk tokens, layers, heads, head dim, layout), so a cache saved
with another geometry is a miss, and one saved in the other layout is converted.
"""
from __future__ import annotations

import inspect
from typing import Any

from host_runtime.kvgeometry import LAYOUTS, KVGeometry
from host_runtime.kvstore import PutStatus, Session
from host_runtime.shim.api import KVShim
from host_runtime.shim.registry import EngineAdapter
from host_runtime.shim.value_format import FormattedValues, geometry_format


def cache_kwarg(model: Any) -> str:
    """The forward() argument that takes a cache: `cache` (transformers 5) or `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_of(output: Any) -> Any:
    """The cache a forward() returned, whatever this transformers version calls it."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def layer_tensors(cache: Any) -> list[tuple[Any, Any]]:
    """[(keys, values)] per layer, each [batch, kv_heads, seq, head_dim]."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(k, v) for k, v, *_ in cache]  # legacy tuple of tuples


class HFKVCache:
    """Saves and restores batch-1 KV caches of a decoder model through a KV shim."""

    def __init__(self, shim: KVShim, geometry: KVGeometry):
        if geometry.mla:
            raise ValueError("HFKVCache handles K/V attention caches; MLA models keep a latent cache")
        self.shim, self.geo = shim, geometry
        self.format = geometry_format(geometry, "hf-kv")
        self.values = FormattedValues(shim, self.format, readable=[
            geometry_format(geometry.with_(layout=layout), "hf-kv") for layout in LAYOUTS])

    def keys(self, tokens: Any) -> list[bytes]:
        return self.shim.tenant.prefix_keys(tokens, self.geo.tokens_per_chunk)

    # ------------------------------------------------------------ save
    def save(self, tokens: Any, cache: Any, *, session: Session | None = None) -> int:
        """Store the KV of every full chunk of `tokens` not stored yet. `cache` may be a
        DynamicCache or a list of per-layer (keys, values) tensors. Returns the number
        of chunks written now."""
        layers = layer_tensors(cache) if not isinstance(cache, (list, tuple)) else list(cache)
        self._check(layers)
        seq = layers[0][0].shape[2]
        keys = self.keys(tokens)[: seq // self.geo.tokens_per_chunk]
        written = 0
        readable = self.values.exists(keys)
        for i, key in enumerate(keys):
            if readable[i]:
                continue  # stored already (maybe in the other layout)
            res = self.shim.allocate(self.format.key(key), self.geo.bytes_per_chunk, session=session)
            if isinstance(res, PutStatus):
                if res is PutStatus.NO_SPACE:
                    break
                continue
            try:
                self._write_chunk(res, layers, i * self.geo.tokens_per_chunk)
            except BaseException:
                res.abort()
                raise
            res.commit()
            written += 1
        return written

    def _write_chunk(self, res, layers, start: int) -> None:
        geo, end = self.geo, start + self.geo.tokens_per_chunk
        if geo.layout == "layer_first":
            for layer, (k, v) in enumerate(layers):
                for part, tensor in enumerate((k, v)):
                    # [1, heads, T, dim] -> [T, heads, dim]: the chunk's token-major row order
                    piece = tensor[0, :, start:end, :].transpose(0, 1).contiguous()
                    res.write(piece, geo.offset(layer, part, 0))
        else:
            import torch
            stacked = torch.stack([torch.stack((k[0, :, start:end, :], v[0, :, start:end, :])) for k, v in layers])
            res.write(stacked.permute(3, 0, 1, 2, 4).contiguous())  # [T, layer, kv, heads, dim]

    # ------------------------------------------------------------ restore
    def restore(self, tokens: Any, *, session: Session | None = None, max_tokens: int | None = None) -> tuple[Any, int]:
        """A DynamicCache holding the longest stored prefix of `tokens` (leaving at least
        one token to compute, so the model produces logits), and its length in tokens."""
        import torch
        from transformers import DynamicCache
        keys = self.keys(tokens)
        n_tokens = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
        keys = keys[: max(0, (n_tokens - 1) // self.geo.tokens_per_chunk)]
        formats = self.values.where(keys)
        n = formats.index(None) if None in formats else len(formats)
        if session is not None:  # SESSION_RESUME for the stored keys of the prefix
            n = session.resume([fmt.key(k) for k, fmt in zip(keys[:n], formats[:n])])
        cache = DynamicCache()
        if n == 0:
            return cache, 0
        geo = self.geo
        dtype = getattr(torch, geo.dtype)
        chunks = torch.empty((n, *geo.chunk_shape), dtype=dtype)
        got = 0
        for i in range(n):
            if not self.values.get_into(keys[i], chunks[i], session=session):
                break  # evicted since the lookup: use what was read
            got += 1
        if got == 0:
            return cache, 0
        chunks = chunks[:got]
        if geo.layout == "layer_first":  # [n, layer, kv, T, heads, dim] -> [layer, kv, heads, n*T, dim]
            full = chunks.permute(1, 2, 4, 0, 3, 5).reshape(geo.num_layers, 2, geo.num_kv_heads, got * geo.tokens_per_chunk, geo.head_dim)
        else:                            # [n, T, layer, kv, heads, dim] -> same
            full = chunks.permute(2, 3, 4, 0, 1, 5).reshape(geo.num_layers, 2, geo.num_kv_heads, got * geo.tokens_per_chunk, geo.head_dim)
        for layer in range(geo.num_layers):
            cache.update(full[layer, 0].unsqueeze(0).contiguous(), full[layer, 1].unsqueeze(0).contiguous(), layer)
        return cache, got * geo.tokens_per_chunk

    def _check(self, layers) -> None:
        geo = self.geo
        if len(layers) != geo.num_layers:
            raise ValueError(f"the cache has {len(layers)} layers, the geometry {geo.num_layers}")
        k = layers[0][0]
        if k.shape[0] != 1:
            raise ValueError("HFKVCache stores batch-1 caches (one sequence per token prefix)")
        if k.shape[1] != geo.num_kv_heads or k.shape[3] != geo.head_dim:
            raise ValueError(f"cache tensors are {tuple(k.shape)}, the geometry expects "
                             f"[1, {geo.num_kv_heads}, seq, {geo.head_dim}]")
        if str(k.dtype).replace("torch.", "") != geo.dtype:
            raise ValueError(f"cache dtype {k.dtype} differs from the geometry's {geo.dtype}")


ADAPTER = EngineAdapter(engine="Hugging Face transformers KV cache save / restore",
                        entry="host_runtime.shim.hf:HFKVCache",
                        loading="HFKVCache(shim, geometry).save(tokens, cache) / .restore(tokens) around model calls")

__all__ = ["HFKVCache", "cache_kwarg", "cache_of", "layer_tensors"]
