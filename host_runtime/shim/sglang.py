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
      "device": {"capacity": "1TiB", "dram_bytes": "256MiB",
                 "backend": {"path": "/mnt/nvme/cxlhm-{tp_rank}.img"}}}'

extra_config keys (besides SGLang's three): ``device`` (a profile name or a dict of
device settings, as ``open_device``), ``tenant`` (default: derived from the model
name and the TP rank, as SGLang's file backend suffixes its keys), ``index_path``,
``hints`` ("mailbox" | "direct" | "none"). ``{tp_rank}``, ``{tp_size}``, ``{pp_rank}``
and ``{dp_rank}`` in the image path give each rank its own device image: every rank is
its own process, and one image must never be opened by two devices.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from host_runtime.shim.api import KVShim, RegisteredBuffers

log = logging.getLogger("cxlhm.shim.sglang")

try:  # subclass SGLang's real base class when SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # noqa: BLE001 - any import failure means "no SGLang here"
    _Base = object


class CxlhmHiCacheStorage(_Base):
    def __init__(self, storage_config: Any = None, kwargs: Any = None, *, shim: KVShim | None = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self._owns_shim = shim is None
        if shim is None:
            ranks = {name: getattr(storage_config, name, 0) or 0 for name in ("tp_rank", "pp_rank", "dp_rank")}
            ranks["tp_size"] = getattr(storage_config, "tp_size", 1) or 1
            shim = KVShim.open(_device_settings(extra.get("device"), ranks), tenant=extra.get("tenant") or _tenant_name(storage_config),
                               index_path=extra.get("index_path"), hints=extra.get("hints", "mailbox"))
        self.shim = shim
        self.buffers = RegisteredBuffers()
        self.mem_pool_host = None

    # ------------------------------------------------------------ host pool
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
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
            got = self.shim.get_into(key, target)
        except (ValueError, TypeError) as exc:
            log.error("get %s: %s", key, exc)
            return None
        return target if got is not None else None

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        if self.shim.contains(key):
            return True
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
            return self.shim.put_from(key, value).ok
        except (ValueError, TypeError, OSError) as exc:
            log.error("set %s: %s", key, exc)
            return False

    def exists(self, key: str) -> bool:
        return self.shim.contains(key)

    # ------------------------------------------------------------ batches
    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
        locations = target_locations or [None] * len(keys)
        sizes = target_sizes or [None] * len(keys)
        return [self.get(k, loc, size) for k, loc, size in zip(keys, locations, sizes)]

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        values = values if values is not None else [None] * len(keys)
        locations = target_locations or [None] * len(keys)
        sizes = target_sizes or [None] * len(keys)
        return all([self.set(k, v, loc, size) for k, v, loc, size in zip(keys, values, locations, sizes)])

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        return self.shim.lookup_prefix(keys)

    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        return self._pages(keys, host_indices, write=False)

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        return self._pages(keys, host_indices, write=True)

    # ------------------------------------------------------------ v2: several host pools
    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[str(host_pool_name)] = host_pool

    def batch_exists_v2(self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
        """Longest usable prefix over the KV pages and every extra pool's pages (stored
        under ``<key>.<pool>``), with SGLang's per-pool hit policies."""
        kv_pages = self.shim.lookup_prefix(keys)
        hits = {"kv": kv_pages} if kv_pages else {}
        final = kv_pages
        for transfer in pool_transfers or []:
            if final == 0:
                break
            name = str(transfer.name)
            present = self.shim.exists([_pool_key(k, name) for k in keys[:kv_pages]])
            if str(getattr(transfer, "hit_policy", "all_pages")).endswith("trailing_pages"):
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                boundary = next((n for n in range(kv_pages, 0, -1) if all(present[max(0, n - trailing):n])), 0)
            else:
                boundary = present.index(False) if False in present else kv_pages
            if boundary:
                hits[name] = boundary
            final = min(final, boundary)
        return _pool_result(final, hits)

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

    def get_stats(self) -> dict:
        return self.shim.stats()

    def close(self) -> None:
        if self._owns_shim:
            self.shim.close()

    # ------------------------------------------------------------ internals
    def _target(self, key: str, location: Any, sizes: Any) -> Any:
        if location is None:
            size = self.shim.size_of(key)
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

    def _pages(self, keys: list[str], host_indices: Any, *, write: bool) -> list[bool]:
        pool = self.mem_pool_host
        if pool is None:
            raise RuntimeError("batch_*_v1 needs a host KV pool: call register_mem_pool_host first")
        page_size = getattr(pool, "page_size", 1) or 1
        indices = np.asarray(host_indices.cpu() if hasattr(host_indices, "cpu") else host_indices).reshape(-1)
        if indices.shape[0] != len(keys) * page_size:
            log.error("host_indices has %d entries, %d keys x page size %d expected", indices.shape[0], len(keys), page_size)
            return [False] * len(keys)
        parts = self._page_parts(pool, host_indices, len(keys))
        results = []
        for i, key in enumerate(keys):
            if write and self.shim.contains(key):
                results.append(True)
                continue
            try:
                if parts is not None:
                    bufs = parts[i]
                elif write:
                    bufs = pool.get_data_page(int(indices[i * page_size]), flat=True)
                else:
                    bufs = pool.get_dummy_flat_data_page()
                if write:
                    ok = self.shim.put_from(key, bufs).ok
                else:
                    ok = self.shim.get_into(key, bufs) is not None
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


def _pool_key(key: str, pool: str) -> str:
    """Extra pools' pages live under their own keys, as SGLang's file backend names them."""
    return key if pool in ("kv", "__default__") else f"{key}.{pool}"


def _pool_result(final: int, hits: dict) -> Any:
    try:
        from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
    except Exception:  # noqa: BLE001 - no SGLang: the same two fields
        from types import SimpleNamespace
        return SimpleNamespace(kv_hit_pages=final, extra_pool_hit_pages=hits)
    try:
        return PoolTransferResult(final, hits)
    except TypeError:  # versions that also list the restorable prefix lengths
        return PoolTransferResult(final, hits, list(range(1, final + 1)))


def _empty_bytes(size: int) -> Any:
    try:
        import torch
        return torch.empty(size, dtype=torch.uint8)
    except ImportError:
        return np.empty(size, np.uint8)


def _tenant_name(storage_config: Any) -> str:
    """SGLang's file backend keys pages per model and, for non-MLA models, per TP rank
    (each rank holds different heads); the tenant does the same here."""
    model = (getattr(storage_config, "model_name", None) or "model").replace("/", "-")
    if getattr(storage_config, "is_mla_model", False):
        return f"sglang:{model}"
    return f"sglang:{model}:tp{getattr(storage_config, 'tp_rank', 0)}-{getattr(storage_config, 'tp_size', 1)}"


def _device_settings(device: Any, ranks: dict) -> Any:
    """The device settings with {tp_rank} etc. filled in (a JSON string is accepted too)."""
    if isinstance(device, str) and device.lstrip().startswith("{"):
        device = json.loads(device)
    if isinstance(device, str):
        return device.format(**ranks)
    if device is None:
        return None

    def fill(value):
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value.format(**ranks) if isinstance(value, str) else value
    return fill(dict(device))


__all__ = ["CxlhmHiCacheStorage"]
