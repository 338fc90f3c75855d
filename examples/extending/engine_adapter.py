"""An engine adapter in one file: a toy serving engine's page store on cxlhm.

The toy engine keeps its KV cache in pages of ``page_tokens`` tokens, each page an array
shaped ``[2 (K, V), layers, page_tokens, dim]``. It names a page by a string (a digest of
the page's tokens and everything before them, so a key names a whole prefix) and asks
an outside store through three batch calls, the shape SGLang's HiCacheStorage and
LMCache's connectors have:

    store.batch_exists(keys) -> int          how many leading keys are stored (the prefix hit)
    store.batch_get(keys, pages) -> [bool]   fill pages[i]; False: a miss (the page is untouched)
    store.batch_set(keys, pages) -> [bool]   True: stored, or stored already (keys name content)

The adapter maps them onto the public shim API (host_runtime.shim):
  key scheme    the engine's string, UTF-8 encoded (KVShim keys are bytes); the tenant
                names the engine and the model, so engines and models never share keys
  value format  a ValueFormat describing the page (dtype and axes), bound into every
                stored key by FormattedValues: a page stored for another shape or dtype
                is a miss, never bytes of another layout
  batches       lookup_prefix for batch_exists, get_into / put_from per page (zero-copy
                between the engine's arrays and the device)
  bad input     a page of the wrong size is False (a miss or a refused store), as the
                engine expects; keys and pages of different lengths are a ValueError

Registered as ``toy`` (entry-point group ``cxlhm.engine_adapters``, value
``examples.extending.engine_adapter:ADAPTER``); tests/test_example_engine_adapter.py runs
it through host_runtime.testing.shim.ShimConformance and inside a toy engine.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from host_runtime.shim import EngineAdapter, KVShim, byte_view
from host_runtime.shim.value_format import FORMAT_SCHEME, FormattedValues, Part, ValueFormat

log = logging.getLogger("cxlhm.shim.toy")
DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4}


def page_format(layers: int, page_tokens: int, dim: int, dtype: str = "float16") -> ValueFormat:
    """What a page's bytes mean: one part, K and V of every layer, token-major within a layer."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    axes = (("kv", 2), ("layer", layers), ("token", page_tokens), ("dim", dim))
    return ValueFormat("toy-page", (Part("kv", dtype, DTYPES[dtype], axes),), page_tokens=page_tokens)


class CxlhmPageStore:
    """The toy engine's page store, one tenant of a cxlhm KV store (see the module doc)."""

    def __init__(self, shim: KVShim, *, layers: int, page_tokens: int, dim: int, dtype: str = "float16",
                 owns_shim: bool = False):
        self.shim, self.owns_shim = shim, owns_shim
        self.fmt = page_format(layers, page_tokens, dim, dtype)
        self.values = FormattedValues(shim, self.fmt)
        self.page_bytes = self.fmt.nbytes

    @classmethod
    def open(cls, device: Mapping | str, *, model: str, layers: int, page_tokens: int, dim: int,
             dtype: str = "float16", **shim_options: Any) -> "CxlhmPageStore":
        """Open a device (a profile, YAML path or dict, as host_runtime.open_device) and this
        engine's tenant for `model` on it; close() closes them."""
        shim = KVShim.open(device, tenant=f"toy:{model}:{FORMAT_SCHEME}", **shim_options)
        return cls(shim, layers=layers, page_tokens=page_tokens, dim=dim, dtype=dtype, owns_shim=True)

    # ------------------------------------------------------------ the engine's interface
    def batch_exists(self, keys: Sequence[str]) -> int:
        return self.values.lookup_prefix([self._key(k) for k in keys])

    def exists(self, key: str) -> bool:
        return self.values.contains(self._key(key))

    def batch_get(self, keys: Sequence[str], pages: Sequence[Any]) -> list[bool]:
        self._check_lengths(keys, pages)
        return [self._fits(key, page, writable=True) and self.values.get_into(self._key(key), page)
                for key, page in zip(keys, pages)]

    def batch_set(self, keys: Sequence[str], pages: Sequence[Any]) -> list[bool]:
        self._check_lengths(keys, pages)
        return [self._fits(key, page, writable=False) and self.values.put(self._key(key), page).ok
                for key, page in zip(keys, pages)]

    def close(self) -> None:
        if self.owns_shim:
            self.shim.close()

    # ------------------------------------------------------------ mapping
    @staticmethod
    def _key(key: str) -> bytes:
        if not isinstance(key, str):
            raise TypeError(f"a page key is a str, got {type(key).__name__}")
        return key.encode()

    def _fits(self, key: str, page: Any, *, writable: bool) -> bool:
        """Whether `page` is a usable page of this store's size; if not, says why in the
        log and the engine gets False (a miss, or a store refused), as it expects."""
        try:
            nbytes = byte_view(page, writable=writable).nbytes
        except (TypeError, ValueError) as exc:
            log.warning("page %r: %s", key, exc)
            return False
        if nbytes != self.page_bytes:
            log.warning("page %r: %d bytes, this store's pages are %d (%s)", key, nbytes, self.page_bytes, self.fmt.text)
            return False
        return True

    @staticmethod
    def _check_lengths(keys: Sequence[str], pages: Sequence[Any]) -> None:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} pages: one page per key")


ADAPTER = EngineAdapter(engine="toy engine page store (batch_exists / batch_get / batch_set)",
                        entry="examples.extending.engine_adapter:CxlhmPageStore",
                        loading="CxlhmPageStore.open(device, model=..., layers=..., page_tokens=..., dim=...) "
                                "given to the engine as its page store")
