"""KV keys: what a stored chunk is called.

Prefix keys are chained hashes, SGLang's scheme (``get_hash_str`` in
sglang/srt/mem_cache/hicache_storage.py; vLLM's prefix caching chains block hashes the
same way):

    key[0] = SHA-256(                 tokens[0:C] as 4-byte little-endian unsigned)
    key[i] = SHA-256(key[i-1] digest || tokens[iC:(i+1)C] as 4-byte little-endian)

so a key names a chunk *and everything before it*: two prompts share key i only if
they share their first (i+1) x C tokens. Without a salt the keys are bit-identical to
SGLang's (``key.hex()`` is its hash string).

Tenant salt (vLLM's ``cache_salt`` idea): a non-empty salt is mixed into the first
chunk as the chain's starting digest, ``SHA-256(b"cxlhm-salt" || salt)``; every later
key inherits it, so tenants with different salts never produce the same key for the
same tokens and cannot probe each other's prefixes by hashing guesses.

Segment keys are position-independent (CacheBlend-style sparse reuse): a segment's key
depends only on its own tokens (and the salt), not on what precedes it, so a document
chunk reused at a different offset of a new prompt is still found. Whoever reuses such
KV must fix it up for the new position (CacheBlend recomputes a few tokens); the store
only finds the bytes.

Hashing is over numpy uint32 views of the tokens. A chain of more than a few links runs
in one compiled loop over OpenSSL's SHA-256 (host_runtime/sha_chain.py: ~2x faster than
a hashlib object per link); the keys are the same either way.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

DIGEST_BYTES = 32
_COMPILED_FROM_LINKS = 8  # shorter chains: a compiled call costs more than it saves
_SALT_DOMAIN = b"cxlhm-salt"
_SEGMENT_DOMAIN = b"cxlhm-segment"


def token_bytes(tokens: Any) -> np.ndarray:
    """Token ids as a contiguous little-endian uint32 array (no copy when they already are).
    Accepts lists, numpy arrays, CPU torch tensors; rejects ids outside 0 .. 2**32-1."""
    if hasattr(tokens, "numpy") and not isinstance(tokens, np.ndarray):
        tokens = tokens.detach().cpu().numpy() if hasattr(tokens, "detach") else tokens.numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.dtype == np.dtype("<u4"):
        return np.ascontiguousarray(arr)
    if arr.size and arr.dtype.kind not in "ui":
        raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF):
        raise ValueError("token ids must be in 0 .. 2**32-1 (they are hashed as 4-byte unsigned integers)")
    return np.ascontiguousarray(arr, dtype="<u4")


def salt_digest(salt: bytes | str | None) -> bytes | None:
    """The chain's starting digest for a tenant salt (None: no salt, SGLang's keys)."""
    if not salt:
        return None
    if isinstance(salt, str):
        salt = salt.encode()
    return hashlib.sha256(_SALT_DOMAIN + bytes(salt)).digest()


def prefix_keys(tokens: Any, tokens_per_chunk: int, *, salt: bytes | str | None = None,
                prior: bytes | None = None, include_partial: bool = False) -> list[bytes]:
    """Chained keys (32-byte digests) of the full chunks of `tokens`.

    `prior`: the digest of the chunk before `tokens` (continue a chain, e.g. for the
    tokens a turn appends); when given, `salt` is ignored (the chain already carries it).
    `include_partial`: also key a trailing partial chunk (SGLang keys only full pages)."""
    if isinstance(tokens_per_chunk, bool) or not isinstance(tokens_per_chunk, int) or tokens_per_chunk <= 0:
        raise ValueError(f"tokens_per_chunk must be a positive integer, got {tokens_per_chunk!r}")
    data = token_bytes(tokens)
    step = 4 * tokens_per_chunk
    n_full = data.shape[0] // tokens_per_chunk
    n = n_full + (1 if include_partial and data.shape[0] % tokens_per_chunk else 0)
    previous = prior if prior is not None else salt_digest(salt)
    if n >= _COMPILED_FROM_LINKS and (previous is None or len(previous) == DIGEST_BYTES):
        from host_runtime import sha_chain  # (numba: loaded on the first long chain only)
        if sha_chain.COMPILED_SHA:
            return sha_chain.chain(data.view(np.uint8), step, n, previous)
    raw = memoryview(data.view(np.uint8))  # memoryview slices are cheaper than numpy ones
    keys = []
    sha = hashlib.sha256
    start = 0
    if previous is None and n:  # SGLang's unsalted first link has no prior digest
        previous = sha(raw[:step]).digest()
        keys.append(previous)
        start = 1
    for i in range(start, n):
        h = sha(previous)
        h.update(raw[i * step:(i + 1) * step])
        previous = h.digest()
        keys.append(previous)
    return keys


def sglang_hash_str(token_ids: Sequence[int], prior_hash: str | None = None) -> str:
    """One link of the chain exactly as SGLang's ``get_hash_str`` computes it (hex in,
    hex out): for checking compatibility and for engines that hand us hex keys."""
    prior = bytes.fromhex(prior_hash) if prior_hash else None
    h = hashlib.sha256(prior) if prior else hashlib.sha256()
    h.update(token_bytes(list(token_ids)).view(np.uint8))
    return h.hexdigest()


def sglang_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """The digest SGLang starts a request's storage chain from when the request carries
    an ``extra_key`` (e.g. a LoRA id) or a ``cache_salt`` (``storage_namespace_seed`` in
    sglang/srt/mem_cache/utils.py); None when it has neither (the chain is unseeded).
    ``prefix_keys(tokens, page, prior=seed)`` then gives SGLang's keys for that request."""
    if extra_key is None and cache_salt is None:
        return None
    h = hashlib.sha256(b"sglang-cache-namespace-v1")
    for part in (extra_key, cache_salt):  # presence and byte length keep absent, empty and joined parts apart
        if part is None:
            h.update(b"\x00")
            continue
        encoded = part.encode("utf-8")
        h.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return h.digest()


def segment_key(tokens: Any, *, salt: bytes | str | None = None) -> bytes:
    """Position-independent key of one segment (its tokens only, plus the salt)."""
    h = hashlib.sha256(_SEGMENT_DOMAIN)
    digest = salt_digest(salt)
    if digest is not None:
        h.update(digest)
    h.update(token_bytes(tokens).view(np.uint8))
    return h.digest()


def segment_keys(segments: Sequence[Any], *, salt: bytes | str | None = None) -> list[bytes]:
    return [segment_key(seg, salt=salt) for seg in segments]


def normalize_key(key: Any) -> bytes:
    """An engine's key as bytes: bytes as is, str as UTF-8 (SGLang's hex strings,
    LMCache's key strings), non-negative ints as 8 or 16 big-endian bytes (vLLM block
    hashes in older versions were ints), objects with ``to_string()`` (LMCache's
    CacheEngineKey) through it. Keys are limited to 1024 bytes."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        out = bytes(key)
    elif isinstance(key, str):
        out = key.encode()
    elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        value = int(key)
        if value < 0:
            value &= (1 << 128) - 1
        if value >= 1 << 128:
            raise ValueError(f"an int key must fit in 128 bits (a block hash); got one of {value.bit_length()} bits")
        out = value.to_bytes(8 if value < 1 << 64 else 16, "big")
    elif hasattr(key, "to_string"):
        out = key.to_string().encode()
    else:
        raise TypeError(f"a key must be bytes, str or int, got {type(key).__name__}")
    if not out:
        raise ValueError("a key must not be empty")
    if len(out) > 1024:
        raise ValueError(f"a key is at most 1024 bytes, got {len(out)}")
    return out
