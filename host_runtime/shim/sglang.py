"""SGLang HiCache storage backend (L3) on cxlhm.

SGLang's interface (sglang/srt/mem_cache/hicache_storage.py, ``HiCacheStorage``):
  get(key, target_location=None, target_sizes=None) -> tensor | None   (None: miss)
  batch_get(keys, target_locations=None, target_sizes=None) -> [tensor | None]
  set(key, value=None, target_location=None, target_sizes=None) -> bool
  batch_set(keys, values=None, ...) -> bool   (all stored)
  exists(key) -> bool
  batch_exists(keys, extra_info=None) -> int  (consecutive hits from the start)
  batch_get_v1 / batch_set_v1(keys, host_indices, extra_info=None) -> [bool]
      zero-copy pages of the registered host KV pool (register_mem_pool_host)
  clear(), get_stats()
A key already stored is not written again (set returns True): keys are content hashes.

Loading it: SGLang's ``dynamic`` storage backend imports ``module_path.class_name`` and
calls ``cls(storage_config, kwargs)`` (storage/backend_factory.py)::

  python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct \\
    --page-size 64 --enable-hierarchical-cache --hicache-ratio 2 \\
    --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "cxlhm",
      "module_path": "host_runtime.shim.sglang", "class_name": "CxlhmHiCacheStorage",
      "interface_v1": 1,
      "device": {"capacity": "1TiB", "dram_bytes": "256MiB",
                 "backend": {"path": "/mnt/nvme/cxlhm-{rank}.img"}}}'

``interface_v1: 1`` makes SGLang's controller move pages with batch_get_v1 /
batch_set_v1 (zero-copy from its host pool); without it SGLang copies every page
through get_data_page / batch_set.

extra_config keys (besides SGLang's): ``device`` (a profile name or a dict of device
settings, as ``open_device``), ``tenant`` (default: the model and this rank's shard),
``index_path``, ``hints`` ("mailbox" | "direct" | "none"), ``mla_replicas`` (default
true, see below).

Topology. Every rank is its own process with its own device image: ``{rank}`` in the
image path becomes this rank's full shard name (``tp0-pp0-dp0-cp0``; ``{tp_rank}``,
``{tp_size}``, ``{pp_rank}``, ``{dp_rank}``, ``{cp_rank}`` also work), and a path that
names no rank gets ``.{rank}`` appended whenever the engine runs more than one rank,
so PP stages, DP-attention groups and CP ranks never open one image twice. For MLA
models SGLang lets only one TP rank write (``backup_skip``) and takes the MIN of the
ranks' hits, so a rank whose image never saw a write would veto every hit; with
``mla_replicas`` every TP rank writes the (identical) pages to its own image, and all
ranks report the same hits.

Storage format. A page's bytes depend on the host layout (``--hicache-mem-layout``:
layer_first, page_first, page_first_direct, page_head; SGLang also switches it from
its io-backend flags) and on the path: the zero-copy pieces of a layer-first MHA page
are K0 V0 K1 V1 ..., its copied page all K layers then all V. Every page is stored
under its key bound to a ValueFormat (host_runtime.shim.value_format: pool kind,
dtype, page size, axis order) and the tenant name ends in ``:kvfmt1``. A reader under
another layout or path converts pages of the same geometry (an exact permutation) and
misses everything else (another dtype, head count, page size, an unknown pool class
or an MLA pool split by DCP, whose pages are opaque and read back only as written).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import numpy as np

from host_runtime.shim.api import KVShim, RegisteredBuffers, device_settings
from host_runtime.shim.registry import EngineAdapter
from host_runtime.shim.value_format import FORMAT_SCHEME, FormattedValues, Part, ValueFormat, raw_format

log = logging.getLogger("cxlhm.shim.sglang")

try:  # subclass SGLang's real base class when SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # noqa: BLE001 - any import failure means "no SGLang here"
    _Base = object

ALL_PAGES, TRAILING_PAGES, BLOCK_GROUPS = "all_pages", "trailing_pages", "block_groups"


class CxlhmHiCacheStorage(_Base):
    def __init__(self, storage_config: Any = None, kwargs: Any = None, *, shim: KVShim | None = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self._owns_shim = shim is None
        self.storage_config = storage_config
        if storage_config is not None and extra.get("mla_replicas", True):
            _every_mla_rank_writes(storage_config)
        if shim is None:
            ranks = rank_fields(storage_config)
            shim = KVShim.open(device_settings(extra.get("device"), ranks, ranks["rank"] if ranks["multi_rank"] else None), tenant=extra.get("tenant") or _tenant_name(storage_config),
                               index_path=extra.get("index_path"), hints=extra.get("hints", "mailbox"))
        self.shim = shim
        self.buffers = RegisteredBuffers()
        self.mem_pool_host = None
        self._raw = FormattedValues(shim, raw_format("sglang-value", 0))  # values of no host pool
        self._views: dict[tuple[int, bool], FormattedValues] = {}  # per host pool and page path
        self.metrics = _PageMetrics(bool(getattr(storage_config, "enable_storage_metrics", False)))

    # ------------------------------------------------------------ host pool
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        self.metrics.page_bytes = int(getattr(mem_pool_host, "size_per_token", 0) or 0) * int(getattr(mem_pool_host, "page_size", 1) or 1)
        for name in ("kv_buffer", "k_buffer", "v_buffer"):
            buf = getattr(mem_pool_host, name, None)
            for tensor in (buf if isinstance(buf, (list, tuple)) else [buf]):
                if tensor is None:
                    continue
                try:  # its memory becomes a valid target for zero-copy page pointers
                    self.buffers.add_tensor(tensor)
                except (ValueError, TypeError) as exc:
                    log.debug("host pool buffer %s not registered: %s", name, exc)

    # ------------------------------------------------------------ single keys
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        target = self._target(key, target_location, target_sizes)
        if target is None:
            return None
        try:
            got = self._view_for(target).get_into(key, target)
        except (ValueError, TypeError) as exc:
            log.error("get %s: %s", key, exc)
            return None
        return target if got else None

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        if value is None:
            if isinstance(target_location, (int, np.integer)) and isinstance(target_sizes, (int, np.integer)):
                try:
                    value = self.buffers.view(int(target_location), int(target_sizes))
                except ValueError as exc:
                    log.error("set %s: %s", key, exc)
                    return False
            else:
                log.error("set %s: no value given", key)
                return False
        try:
            return self._view_for(value).put(key, value).ok
        except (ValueError, TypeError, OSError) as exc:
            log.error("set %s: %s", key, exc)
            return False

    def exists(self, key: str) -> bool:
        return self._readable([key])[0]

    # ------------------------------------------------------------ batches
    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
        locations = target_locations or [None] * len(keys)
        sizes = target_sizes or [None] * len(keys)
        with self.metrics.timed(write=False) as results:
            got = [self.get(k, loc, size) for k, loc, size in zip(keys, locations, sizes)]
            results += [g is not None for g in got]
        return got

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        values = values if values is not None else [None] * len(keys)
        locations = target_locations or [None] * len(keys)
        sizes = target_sizes or [None] * len(keys)
        with self.metrics.timed(write=True) as results:
            results += [self.set(k, v, loc, size) for k, v, loc, size in zip(keys, values, locations, sizes)]
        return all(results)

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        hits = self._readable(keys)
        return hits.index(False) if False in hits else len(hits)

    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        with self.metrics.timed(write=False) as results:
            results += self._pages(keys, host_indices, write=False)
        return results

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        with self.metrics.timed(write=True) as results:
            results += self._pages(keys, host_indices, write=True)
        return results

    # ------------------------------------------------------------ v2: several host pools
    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[str(host_pool_name)] = host_pool

    def batch_exists_v2(self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
        """Longest usable prefix over the KV pages and every extra pool's pages (stored
        under ``<key>.<pool>``), with SGLang's per-pool hit policies: ALL_PAGES (every
        page of the prefix), TRAILING_PAGES (only the last len(keys) pages: Mamba / SWA
        state, so 5 pages may be restorable while 4 are not), BLOCK_GROUPS (the pool
        reports the pages its leading complete key groups cover; it never gates the KV
        hit). ``restorable_prefix_pages`` lists every restorable prefix length."""
        kv_pages = self.batch_exists(keys)
        hits = {"kv": kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            name, policy = str(transfer.name), hit_policy(transfer)
            if policy == BLOCK_GROUPS:
                covered = self._block_group_pages(transfer, kv_pages)
                if covered:
                    hits[name] = covered
                continue
            if not restorable:
                break
            present = self._pool_readable(name, [_pool_key(k, name) for k in keys[:kv_pages]])
            if policy == ALL_PAGES:
                boundary = present.index(False) if False in present else kv_pages
                pool_restorable = set(range(1, boundary + 1))
            elif policy == TRAILING_PAGES:
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                pool_restorable = {n for n in range(1, kv_pages + 1) if all(present[max(0, n - trailing):n])}
                boundary = max(pool_restorable, default=0)
            else:
                raise ValueError(f"pool {name!r}: unsupported hit policy {policy!r} "
                                 f"(accepted: {ALL_PAGES}, {TRAILING_PAGES}, {BLOCK_GROUPS})")
            if boundary:
                hits[name] = boundary
            restorable &= pool_restorable
        ordered = sorted(restorable)
        return _pool_result(ordered[-1] if ordered else 0, hits, ordered)

    def _block_group_pages(self, transfer: Any, kv_pages: int) -> int:
        """FULL pages covered by the leading complete key groups of a BLOCK_GROUPS pool."""
        group, block = int(getattr(transfer, "group_pages", 0) or 0), int(getattr(transfer, "block_pages", 0) or 0)
        pool_keys = list(transfer.keys or [])
        if group <= 0 or block <= 0 or not pool_keys:
            return 0
        present = self._pool_readable(str(transfer.name), [_pool_key(k, str(transfer.name)) for k in pool_keys])
        groups = 0
        while (groups + 1) * group <= len(present) and all(present[groups * group:(groups + 1) * group]):
            groups += 1
        return min(groups * block, kv_pages)

    def batch_get_v2(self, transfers: list, extra_info: Any = None) -> dict[str, list[bool]]:
        return {str(t.name): self._pool_pages(t, write=False) for t in transfers}

    def batch_set_v2(self, transfers: list, extra_info: Any = None) -> dict[str, list[bool]]:
        return {str(t.name): self._pool_pages(t, write=True) for t in transfers}

    def _pool_pages(self, transfer: Any, *, write: bool) -> list[bool]:
        name = str(transfer.name)
        pool = getattr(self, "registered_pools", {}).get(name)
        if pool is None and name == "kv":
            pool = self.mem_pool_host
        keys = [_pool_key(k, name) for k in (transfer.keys or [])]
        if pool is None:
            log.error("no host pool registered as %r", name)
            return [False] * len(keys)
        saved, self.mem_pool_host = self.mem_pool_host, pool
        try:
            return self._pages(keys, transfer.host_indices, write=write)
        finally:
            self.mem_pool_host = saved

    def clear(self) -> bool:
        self.shim.remove(self.shim.keys())
        return True

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics (pages and bandwidth per prefetch / backup call since
        the last call) when the engine runs with --enable-metrics, else None."""
        return self.metrics.take()

    def close(self) -> None:
        if self._owns_shim:
            self.shim.close()

    # ------------------------------------------------------------ internals
    def _target(self, key: str, location: Any, sizes: Any) -> Any:
        if location is None:
            pool = self.mem_pool_host
            if pool is not None and self._page_view(pool, zero_copy=False).contains(key):
                return _empty_bytes(self._page_view(pool, zero_copy=False).fmt.nbytes)
            size = self.shim.size_of(self._raw.key(key))
            if size is None:
                return None
            return _empty_bytes(size)
        if isinstance(location, (int, np.integer)):  # a raw pointer: only into registered memory
            try:
                return self.buffers.view(int(location), int(sizes))
            except (ValueError, TypeError) as exc:
                log.error("get %s: %s", key, exc)
                return None
        return location

    # ------------------------------------------------------------ value formats
    def _page_view(self, pool: Any, *, zero_copy: bool, nbytes: int | None = None) -> FormattedValues:
        """Pages of `pool` as the copy path (get_data_page) or the zero-copy path
        (get_page_buffer_meta's pieces) lays them out, readable from every layout of
        the same geometry that converts exactly."""
        view = self._views.get((id(pool), zero_copy))
        if view is None or view.pool is not pool or (nbytes is not None and view.fmt.nbytes != nbytes):
            view = FormattedValues(self.shim, page_format(pool, zero_copy=zero_copy, nbytes=nbytes),
                                   readable=page_formats(pool))
            view.pool = pool
            self._views[(id(pool), zero_copy)] = view
        return view

    def _view_for(self, value: Any) -> FormattedValues:
        """set/get values: a page of the registered pool (SGLang's copy path hands those
        over) is a page in the copy layout; anything else is an opaque value."""
        pool = self.mem_pool_host
        if pool is not None:
            view = self._page_view(pool, zero_copy=False)
            if _nbytes(value) == view.fmt.nbytes:
                return view
        return self._raw

    def _readable(self, keys: list[str]) -> list[bool]:
        """Per key: readable by one of the paths this adapter moves pages with."""
        pool = self.mem_pool_host
        if pool is None:
            return self._raw.exists(keys)
        copy, zero_copy = self._page_view(pool, zero_copy=False), self._page_view(pool, zero_copy=True)
        hits = copy.exists(keys)
        missing = [i for i, hit in enumerate(hits) if not hit]
        if missing and zero_copy.fmt != copy.fmt and zero_copy.fmt not in copy.others:  # else probed already
            for i, hit in zip(missing, zero_copy.exists([keys[i] for i in missing])):
                hits[i] = hit
        return hits

    def _pool_readable(self, name: str, keys: list[str]) -> list[bool]:
        pool = getattr(self, "registered_pools", {}).get(name)
        if pool is None:
            return [False] * len(keys)
        saved, self.mem_pool_host = self.mem_pool_host, pool
        try:
            return self._readable(keys)
        finally:
            self.mem_pool_host = saved

    def _pages(self, keys: list[str], host_indices: Any, *, write: bool) -> list[bool]:
        pool = self.mem_pool_host
        if pool is None:
            raise RuntimeError("batch_get_v1 / batch_set_v1 move pages of the host KV pool, and none is "
                               "registered: call register_mem_pool_host(pool) first")
        page_size = getattr(pool, "page_size", 1) or 1
        indices = np.asarray(host_indices.cpu() if hasattr(host_indices, "cpu") else host_indices).reshape(-1)
        if indices.shape[0] != len(keys) * page_size:
            log.error("host_indices has %d entries, %d keys x page size %d expected", indices.shape[0], len(keys), page_size)
            return [False] * len(keys)
        parts = self._page_parts(pool, host_indices, len(keys))
        try:
            view = self._page_view(pool, zero_copy=parts is not None,
                                   nbytes=sum(int(p.nbytes) for p in parts[0]) if parts else None)
        except (ValueError, TypeError, AttributeError, NotImplementedError) as exc:
            log.error("pages of %s: %s", type(pool).__name__, exc)
            return [False] * len(keys)
        results = []
        for i, key in enumerate(keys):
            try:
                if write and view.contains(key):
                    results.append(True)
                    continue
                if parts is not None:
                    bufs = parts[i]
                elif write:
                    bufs = pool.get_data_page(int(indices[i * page_size]), flat=True)
                else:
                    bufs = pool.get_dummy_flat_data_page()
                if write:
                    ok = view.put(key, bufs).ok
                else:
                    ok = view.get_into(key, bufs)
                    if ok and parts is None:
                        pool.set_from_flat_data_page(int(indices[i * page_size]), bufs)
            except (ValueError, TypeError, OSError) as exc:
                log.error("%s page %s: %s", "set" if write else "get", key, exc)
                ok = False
            results.append(ok)
        return results

    def _page_parts(self, pool: Any, host_indices: Any, n_keys: int) -> list[list[np.ndarray]] | None:
        """Zero-copy views of each page's pieces (page-first layouts expose them through
        get_page_buffer_meta: K and V pointers per page for MHA, one for MLA), or None
        when the pool cannot give pointers inside its registered buffers."""
        meta = getattr(pool, "get_page_buffer_meta", None)
        if meta is None or not len(self.buffers):
            return None
        try:
            ptrs, sizes = meta(host_indices)
        except Exception as exc:  # noqa: BLE001 - e.g. a layer-first pool: use the generic path
            log.debug("get_page_buffer_meta unavailable: %s", exc)
            return None
        if not ptrs or len(ptrs) % n_keys or len(sizes) != len(ptrs):
            return None
        per = len(ptrs) // n_keys
        try:
            views = [self.buffers.view(int(p), int(s)) for p, s in zip(ptrs, sizes)]
        except ValueError:
            return None
        return [views[i * per:(i + 1) * per] for i in range(n_keys)]


# ------------------------------------------------------------------ page formats
# Axis order of one page as each path of each SGLang host pool lays it out (the copy
# path: get_data_page(flat=True); zero copy: get_page_buffer_meta's pieces end to end).
# Only the layer-first MHA pool differs between the two: its zero-copy pieces are one
# K and one V per layer (K0 V0 K1 V1 ...), its copy page all K layers, then all V.
_MHA_ORDERS = {
    ("layer_first", False): ("kv", "layer", "token", "head", "dim"),
    ("layer_first", True): ("layer", "kv", "token", "head", "dim"),
    ("page_first", False): ("kv", "token", "layer", "head", "dim"),
    ("page_first_direct", False): ("kv", "layer", "token", "head", "dim"),
    ("page_head", False): ("kv", "head", "token", "layer", "dim"),
}
_MLA_ORDERS = {
    ("layer_first", False): ("layer", "token", "head", "dim"),
    ("page_first", False): ("token", "layer", "head", "dim"),
    ("page_first_direct", False): ("layer", "token", "head", "dim"),
}


def _orders(table: dict, layout: str, zero_copy: bool) -> tuple[str, ...] | None:
    return table.get((layout, zero_copy)) or table.get((layout, False))


def _dtype(dtype: Any) -> tuple[str, int]:
    return str(dtype).replace("torch.", ""), int(getattr(dtype, "itemsize", 0) or np.dtype(dtype).itemsize)


def _pool_kind(pool: Any) -> str | None:
    """The pool classes whose page layouts are known exactly (subclasses may change
    them, so only these exact classes; anything else is an opaque page)."""
    name = f"{type(pool).__module__}.{type(pool).__qualname__}"
    return {"sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost": "mha",
            "sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost": "mla",
            "sglang.srt.mem_cache.pool_host.mamba.MambaPoolHost": "mamba"}.get(name)


def _geometry(pool: Any) -> dict:
    dtype, size = _dtype(pool.dtype)
    return {"dtype": dtype, "itemsize": size, "page": int(getattr(pool, "page_size", 1) or 1),
            "layer": int(pool.layer_num), "head": int(getattr(pool, "head_num", 1) or 1),
            "dim": int(getattr(pool, "head_dim", 0) or getattr(pool, "kv_cache_dim", 0))}


def _kv_format(kind: str, layout: str, zero_copy: bool, geo: dict) -> ValueFormat | None:
    order = _orders(_MHA_ORDERS if kind == "mha" else _MLA_ORDERS, layout, zero_copy)
    if order is None:
        return None
    dims = {"kv": 2, "layer": geo["layer"], "token": geo["page"], "head": geo["head"] if kind == "mha" else 1,
            "dim": geo["dim"]}
    return ValueFormat(f"sglang-{kind}", (Part("kv", geo["dtype"], geo["itemsize"], tuple((a, dims[a]) for a in order)),),
                       page_tokens=geo["page"])


def page_format(pool: Any, *, zero_copy: bool, nbytes: int | None = None) -> ValueFormat:
    """The format of one page of `pool` as the copy or the zero-copy path moves it."""
    kind, layout = _pool_kind(pool), str(getattr(pool, "layout", ""))
    page = int(getattr(pool, "page_size", 1) or 1)
    if kind == "mla" and getattr(pool, "dcp_size", 1) != 1:
        kind = None  # a DCP rank holds an interleaved share of each page: opaque
    if kind in ("mha", "mla"):
        fmt = _kv_format(kind, layout, zero_copy, _geometry(pool))
        if fmt is not None:
            return fmt
    if kind == "mamba" and layout in ("page_first", "page_first_direct"):
        names = ["temporal"] + [f"conv{i}" for i in range(len(pool.conv_buffer))] + \
                [f"state{i}" for i in range(len(getattr(pool, "slot_state_buffers", ()) or ()))]
        parts = []
        for name, tensor in zip(names, pool._iter_page_tensors(0)):
            if name == "temporal" and not tensor.numel():
                continue  # conv-only models: no temporal piece on either path
            dtype, size = _dtype(tensor.dtype)
            parts.append(Part(name, dtype, size, tuple((f"a{i}", int(n)) for i, n in enumerate(tensor.shape))))
        return ValueFormat("sglang-mamba", tuple(parts), page_tokens=page)
    if nbytes is None:
        nbytes = _nbytes(pool.get_dummy_flat_data_page())
    return raw_format(f"sglang-page:{type(pool).__qualname__}:{layout}:{'zero-copy' if zero_copy else 'copy'}",
                      nbytes, page_tokens=page)


def page_formats(pool: Any) -> list[ValueFormat]:
    """Every format a page of this pool's geometry may have been stored in under any
    host layout and either path (the reader converts those that convert exactly)."""
    kind = _pool_kind(pool)
    if kind not in ("mha", "mla") or (kind == "mla" and getattr(pool, "dcp_size", 1) != 1):
        return []
    geo = _geometry(pool)
    return [_kv_format(kind, layout, zero_copy, geo) for layout, zero_copy in (_MHA_ORDERS if kind == "mha" else _MLA_ORDERS)]


def _nbytes(value: Any) -> int:
    if hasattr(value, "untyped_storage"):
        return int(value.numel() * value.element_size())
    return int(getattr(value, "nbytes", len(value) if hasattr(value, "__len__") else 0))


def _pool_key(key: str, pool: str) -> str:
    """Extra pools' pages live under their own keys, as SGLang's file backend names them."""
    return key if pool in ("kv", "__default__") else f"{key}.{pool}"


def _pool_result(final: int, hits: dict, restorable: list[int]) -> Any:
    try:
        from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
    except Exception:  # noqa: BLE001 - no SGLang: the same fields
        from types import SimpleNamespace
        return SimpleNamespace(kv_hit_pages=final, extra_pool_hit_pages=hits, restorable_prefix_pages=restorable)
    return PoolTransferResult(final, hits, restorable)


def hit_policy(transfer: Any) -> str:
    """A PoolTransfer's hit policy as its value: SGLang's PoolHitPolicy is a str enum
    (its str() is "PoolHitPolicy.TRAILING_PAGES"), so compare values, not str()."""
    policy = getattr(transfer, "hit_policy", ALL_PAGES)
    return str(getattr(policy, "value", policy))


class _PageMetrics:
    """Counts for SGLang's StorageMetrics: pages and bandwidth (GB/s) of each
    batch_get_v1 (prefetch) and batch_set_v1 (backup) call."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._lock = threading.Lock()
        self._prefetch: list[tuple[int, float]] = []
        self._backup: list[tuple[int, float]] = []
        self.page_bytes = 0

    @contextlib.contextmanager
    def timed(self, *, write: bool):
        results: list[bool] = []
        start = time.perf_counter()
        yield results
        if not self.enabled:
            return
        pages = sum(results)
        seconds = max(time.perf_counter() - start, 1e-9)
        with self._lock:
            (self._backup if write else self._prefetch).append((pages, pages * self.page_bytes / seconds / 1e9))

    def take(self) -> Any:
        if not self.enabled:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics
        with self._lock:
            prefetch, self._prefetch = self._prefetch, []
            backup, self._backup = self._backup, []
        return StorageMetrics(prefetch_pgs=[p for p, _ in prefetch], backup_pgs=[p for p, _ in backup],
                              prefetch_bandwidth=[b for _, b in prefetch], backup_bandwidth=[b for _, b in backup])


def rank_fields(storage_config: Any) -> dict:
    """This rank's place in the engine's topology, for image paths and tenant names."""
    get = lambda name, default: getattr(storage_config, name, default) if storage_config is not None else default  # noqa: E731
    ranks = {"tp_rank": get("tp_rank", 0) or 0, "tp_size": get("tp_size", 1) or 1,
             "pp_rank": get("pp_rank", 0) or 0, "pp_size": get("pp_size", 1) or 1,
             "dp_rank": get("dp_rank", 0) or 0, "cp_rank": get("attn_cp_rank", 0) or 0,
             "cp_size": get("attn_cp_size", 1) or 1}
    ranks["rank"] = "tp{tp_rank}-pp{pp_rank}-dp{dp_rank}-cp{cp_rank}".format(**ranks)
    ranks["multi_rank"] = ranks["tp_size"] * ranks["pp_size"] * ranks["cp_size"] > 1 or ranks["dp_rank"] > 0
    return ranks


def _every_mla_rank_writes(storage_config: Any) -> None:
    """MLA KV is the same on every TP rank and SGLang lets one rank write it, then
    takes the MIN of all ranks' hits; with one image per rank the others would answer
    0 forever. Make this rank a writer of its own replica (the controller reads
    ``is_storage_writer`` through ``backup_skip`` only)."""
    if not getattr(storage_config, "is_mla_model", False) or getattr(storage_config, "is_storage_writer", True):
        return
    base = type(storage_config)
    storage_config.__class__ = type(f"CxlhmReplica{base.__name__}", (base,), {"is_storage_writer": property(lambda self: True)})


def _empty_bytes(size: int) -> Any:
    try:
        import torch
        return torch.empty(size, dtype=torch.uint8)
    except ImportError:
        return np.empty(size, np.uint8)


def _tenant_name(storage_config: Any) -> str:
    """SGLang's file backend keys pages per model, pipeline stage and CP rank and, for
    non-MLA models, per TP rank (each rank holds different heads); the tenant does the
    same, and adds the DP-attention group (its TP ranks are group-local)."""
    model = (getattr(storage_config, "model_name", None) or "model").replace("/", "-")
    r = rank_fields(storage_config)
    shard = f":pp{r['pp_rank']}-{r['pp_size']}:dp{r['dp_rank']}:cp{r['cp_rank']}-{r['cp_size']}"
    if getattr(storage_config, "is_mla_model", False):
        return f"sglang:{model}{shard}:{FORMAT_SCHEME}"
    return f"sglang:{model}:tp{r['tp_rank']}-{r['tp_size']}{shard}:{FORMAT_SCHEME}"


ADAPTER = EngineAdapter(engine="SGLang HiCache storage backend (HiCacheStorage)",
                        entry="host_runtime.shim.sglang:CxlhmHiCacheStorage",
                        loading="--hicache-storage-backend dynamic with module_path host_runtime.shim.sglang, class_name CxlhmHiCacheStorage")

__all__ = ["CxlhmHiCacheStorage", "hit_policy", "rank_fields"]
