"""Chained SHA-256 keys in one compiled loop (host_runtime/kvkeys.py's prefix_keys).

Each link is SHA-256(previous digest || the chunk's token bytes). In Python every link
builds a hashlib object (an OpenSSL digest context) and a digest: ~1.3 us a link on the
development machine, 0.5 ms of a 100k-token prompt's 0.85 ms at 256 tokens a chunk,
where the hashing itself (400 KB) takes 0.3 ms. Here one numba loop calls libcrypto's
SHA-256 - the OpenSSL build Python's hashlib runs, with the CPU's SHA extensions - on
one context for every link. Compiled code calls it by symbols bound to its addresses at
import (as cxlhm/sumtable.py calls xxh3), so the loop goes to numba's on-disk cache.
`COMPILED_SHA` is False where libcrypto or its SHA256 is out of reach or disagrees with
hashlib on a sample: callers then hash in Python (same keys, slower).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib

import llvmlite.binding as llvm
import numpy as np
from numba import types

from cxlhm.jit import njit

DIGEST = 32  # (kvkeys.DIGEST_BYTES; kvkeys imports this module, so not from there)
_CTX_BYTES = 256  # room for OpenSSL's SHA256_CTX (112 bytes)


def _load_sha256():
    """libcrypto's SHA256_Init / _Update / _Final (the one-shot SHA256() of OpenSSL 3
    looks the digest up anew on every call: 2.7 us a 1 KiB link against 1.7 us through
    these, from ctypes), if they agree with hashlib on a sample."""
    name = ctypes.util.find_library("crypto")
    try:
        lib = ctypes.CDLL(name) if name else None
        fns = (lib.SHA256_Init, lib.SHA256_Update, lib.SHA256_Final) if lib is not None else None
    except (OSError, AttributeError):
        return None
    if fns is None:
        return None
    init, update, final = fns
    init.argtypes = [ctypes.c_void_p]  # (SHA256_CTX *)
    update.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]  # (ctx, data, length)
    final.argtypes = [ctypes.c_void_p, ctypes.c_void_p]  # (digest out, ctx)
    for fn in fns:
        fn.restype = ctypes.c_int
    sample = bytes(range(256)) * 5
    ctx, out = ctypes.create_string_buffer(_CTX_BYTES), ctypes.create_string_buffer(DIGEST)
    init(ctx)
    update(ctx, sample, len(sample))
    final(out, ctx)
    return fns if out.raw == hashlib.sha256(sample).digest() else None


_fns = _load_sha256()
COMPILED_SHA = _fns is not None
_INIT, _UPDATE, _FINAL = "cxlhm_sha256_init", "cxlhm_sha256_update", "cxlhm_sha256_final"
if COMPILED_SHA:
    for symbol, fn in zip((_INIT, _UPDATE, _FINAL), _fns):
        llvm.add_symbol(symbol, ctypes.cast(fn, ctypes.c_void_p).value)
# pointers and lengths in the C ABI: integer registers
_init = types.ExternalFunction(_INIT, types.int32(types.intp))
_update = types.ExternalFunction(_UPDATE, types.int32(types.intp, types.intp, types.intp))
_final = types.ExternalFunction(_FINAL, types.int32(types.intp, types.intp))


@njit(nogil=True)
def _chain(data, step, n, prior, out, ctx):
    """out[i] = SHA-256(out[i-1] || data[i*step : (i+1)*step]) for i < n (the last chunk
    may be short); out[-1] is `prior` (an empty prior: the first link hashes its chunk
    alone, SGLang's unsalted start)."""
    c = ctx.ctypes.data
    for i in range(n):
        chunk = data[i * step:min((i + 1) * step, data.shape[0])]
        _init(c)
        if i > 0:
            _update(c, out[i - 1].ctypes.data, DIGEST)
        elif prior.shape[0]:
            _update(c, prior.ctypes.data, DIGEST)
        _update(c, chunk.ctypes.data, chunk.shape[0])
        _final(out[i].ctypes.data, c)


def chain(data: np.ndarray, step: int, n: int, prior: bytes | None) -> list[bytes]:
    """The n chained digests of `data` (uint8) in chunks of `step` bytes (see _chain)."""
    out = np.empty((n, DIGEST), np.uint8)
    start = np.frombuffer(prior if prior is not None else b"", np.uint8)  # (read-only either way: one signature)
    _chain(data, step, n, start, out, np.empty(_CTX_BYTES, np.uint8))
    blob = out.tobytes()
    return [blob[i:i + DIGEST] for i in range(0, n * DIGEST, DIGEST)]
