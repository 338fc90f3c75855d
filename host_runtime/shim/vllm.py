"""vLLM KV offloading onto cxlhm: a secondary tier of vLLM's TieringOffloadingSpec.

Why a tier and not a whole OffloadingSpec: vLLM's tiering spec keeps its CPU primary
tier, which does every GPU<->host copy with vLLM's own worker (canonical layouts, TP,
hybrid groups, CUDA streams); a secondary tier only moves chunks between that host
buffer and its medium, in the scheduler process, which is what a CXL memory device
behind the host is. A full spec would have to reimplement vLLM's GPU worker.

Loading it (vLLM's out-of-tree tier: ``type`` is the class name, ``module_path`` its
module; the remaining keys reach the constructor)::

  vllm serve meta-llama/Llama-3.1-8B-Instruct --kv-transfer-config '{
    "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
    "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
      "cpu_bytes_to_use": 8589934592,
      "secondary_tiers": [{"type": "CxlhmTier", "module_path": "host_runtime.shim.vllm",
        "device": {"capacity": "1TiB", "dram_bytes": "256MiB",
                   "backend": {"path": "/mnt/nvme/vllm-{engine}.img"}}}]}}'

vLLM's interface (vllm/v1/kv_offload/tiering/base.py, ``SecondaryTierManager``):
lookup(key, req_context) -> LookupResult (HIT / MISS / RETRY while the chunk is being
written); submit_store(job) / submit_load(job) copy between the primary tier's
chunks (``job.chunk_ids`` rows of ``primary_kv_view``) and the device, on a worker
thread; get_finished_jobs() -> JobResult; drain_jobs(); take_events() ->
OffloadingEvent (stored and evicted keys, this tenant's only); on_new_request().
Keys are vLLM's OffloadKey bytes (block hash + group index). A chunk read that fails
(evicted since the lookup, a device read error) is reported as a failed key of the
load job, never as bytes.

Tenant: ``vllm:<model>:<dtype>:<parallel layout>:kvfmt1`` (a chunk's bytes depend on
the engine's TP/PP/PCP/DCP split unless vLLM says they are parallelism-agnostic).
Every chunk is stored under its key bound to a value format (host_runtime.shim.
value_format; see chunk_format): chunk size, block bytes, blocks per chunk, groups
and their layers, KV cache layout and vLLM's minor version. vLLM's worker lays a row
out in ways a tier cannot convert, so a chunk stored under other settings is a miss.
Tested with vLLM 0.33 (which calls touch()) and 0.34 (which does not: a lookup hit or
a repeated store then marks the chunk recently used). ``{engine}`` in
the image path is vLLM's engine id (one per DP replica: each replica's scheduler is
its own process and needs its own image); a path naming it not gets ``.<engine>``
appended when there is more than one replica.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from host_runtime.kvkeys import normalize_key as _key
from host_runtime.shim.api import KVShim, device_settings
from host_runtime.shim.registry import EngineAdapter
from host_runtime.shim.value_format import FORMAT_SCHEME, FormattedValues, ValueFormat, base_key, raw_format

log = logging.getLogger("cxlhm.shim.vllm")

try:  # vLLM's real classes when vLLM is installed
    from vllm.v1.kv_offload.base import LookupResult, Medium, OffloadingEvent, RequestOffloadingContext
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager as _Base
except Exception:  # noqa: BLE001 - no vLLM here: the tier cannot be loaded by vLLM anyway
    _Base = object
    LookupResult = Medium = OffloadingEvent = RequestOffloadingContext = JobResult = None  # type: ignore[assignment]


class CxlhmTier(_Base):
    medium = getattr(Medium, "STORAGE", None)

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, *, device: Any = None, tenant: str | None = None,
                 index_path: Any = None, hints: str = "mailbox", shim: KVShim | None = None, **unknown: Any):
        if unknown:
            raise ValueError(f"CxlhmTier: unknown tier settings {sorted(unknown)} "
                             "(accepted: device, tenant, index_path, hints, backpressure)")
        if _Base is object:
            raise ImportError("CxlhmTier is a vLLM secondary tier: vLLM is not importable here")
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type,
                         backpressure_detector=backpressure_detector)
        self._owns_shim = shim is None
        if shim is None:
            if device is None:
                raise ValueError("CxlhmTier needs 'device' in its tier config: a profile name or "
                                 "device settings with backend.path")
            engine = str(offloading_spec.config.engine_id)
            several = offloading_spec.config.parallel.data_parallel_size > 1
            shim = KVShim.open(device_settings(device, {"engine": engine}, engine if several else None), tenant=tenant or _tenant_name(offloading_spec),
                               index_path=index_path, hints=hints)
        self.shim = shim
        rows = np.asarray(primary_kv_view).view(np.uint8)
        self._primary = rows.reshape(rows.shape[0], -1)  # one row per primary chunk
        self.format = chunk_format(offloading_spec, self._primary.shape[1])
        self._values = FormattedValues(shim, self.format)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cxlhm-tier")
        self._lock = threading.Lock()
        self._writing: set[bytes] = set()
        self._jobs: dict[int, Future] = {}
        self._finished: deque = deque()
        self._stored: list[bytes] = []
        self._events = bool(getattr(getattr(offloading_spec, "kv_events_config", None), "enable_kv_cache_events", False))

    # ------------------------------------------------------------ scheduler calls
    def lookup(self, key: Any, req_context: Any) -> Any:
        with self._lock:
            if _key(key) in self._writing:
                return LookupResult.RETRY
        if not self._values.contains(key):
            return LookupResult.MISS
        self.shim.touch([self.format.key(key)])  # recency: vLLM >= 0.34 no longer calls touch()
        return LookupResult.HIT

    def touch(self, keys: Any, req_context: Any) -> None:
        """vLLM 0.33 marks chunks recently used here; 0.34 dropped the call (recency
        then comes from lookups, loads and repeated stores)."""
        self.shim.touch([self.format.key(k) for k in keys])

    def on_new_request(self, req_context: Any) -> Any:
        return RequestOffloadingContext()

    def submit_store(self, job_metadata: Any) -> None:
        pairs = [(_key(k), int(c)) for k, c in zip(job_metadata.keys, job_metadata.chunk_ids)]
        if len(pairs) != len(job_metadata.keys) or len(pairs) != len(job_metadata.chunk_ids):
            raise ValueError(f"store job {job_metadata.job_id}: {len(job_metadata.keys)} keys but "
                             f"{len(job_metadata.chunk_ids)} chunk ids")
        with self._lock:
            held = [k for k, _ in pairs if k not in self._writing and self._values.contains(k)]
            pairs = [(k, c) for k, c in pairs if k not in self._writing and k not in held]
            self._writing.update(k for k, _ in pairs)
        if held:  # stored again by the primary tier: it used them recently
            self.shim.touch([self.format.key(k) for k in held])
        self._submit(job_metadata.job_id, self._store, pairs)

    def submit_load(self, job_metadata: Any) -> None:
        pairs = [(_key(k), int(c)) for k, c in zip(job_metadata.keys, job_metadata.chunk_ids)]
        self._submit(job_metadata.job_id, self._load, pairs)

    def get_finished_jobs(self) -> list:
        done = []
        while self._finished:
            done.append(self._finished.popleft())
        return done

    def drain_jobs(self) -> None:
        with self._lock:
            futures = list(self._jobs.values())
        for future in futures:
            future.result()

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def take_events(self) -> list:
        evicted = self.shim.tenant.evicted_keys  # this tenant's evictions only
        removed = []
        while evicted:
            removed.append(base_key(evicted.popleft()))
        events = []
        with self._lock:
            stored, self._stored = self._stored, []
        if self._events and stored:
            events.append(OffloadingEvent(keys=stored, medium=self.medium, removed=False))
        if self._events and removed:
            events.append(OffloadingEvent(keys=removed, medium=self.medium, removed=True))
        return events

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
        if self._owns_shim:
            self.shim.close()

    # ------------------------------------------------------------ worker thread
    def _submit(self, job_id: int, work, pairs: list) -> None:
        row_bytes = self._primary.shape[1]
        bad = [c for _, c in pairs if not 0 <= c < self._primary.shape[0]]
        if bad:
            raise ValueError(f"job {job_id}: chunk ids {bad[:4]} outside the primary tier's "
                             f"{self._primary.shape[0]} chunks")
        with self._lock:  # registered before the job can finish and unregister itself
            self._jobs[job_id] = self._pool.submit(work, job_id, pairs, row_bytes)

    def _store(self, job_id: int, pairs: list, row_bytes: int) -> None:
        start, ok = time.perf_counter(), True
        try:
            for key, chunk in pairs:
                try:
                    status = self._values.put(key, self._primary[chunk])
                except (ValueError, OSError) as exc:
                    log.error("store of %s failed: %s", key.hex(), exc)
                    ok = False
                    continue
                ok &= status.ok
                if status.ok:
                    with self._lock:
                        self._stored.append(key)
        finally:
            with self._lock:
                self._writing.difference_update(k for k, _ in pairs)
            self._finish(JobResult(job_id=job_id, success=ok, transfer_time=time.perf_counter() - start,
                                   transfer_bytes=len(pairs) * row_bytes))

    def _load(self, job_id: int, pairs: list, row_bytes: int) -> None:
        start, loaded = time.perf_counter(), []
        for key, chunk in pairs:
            try:
                if self._values.get_into(key, self._primary[chunk]):
                    loaded.append(key)
            except (ValueError, OSError) as exc:  # wrong size, device error: a failed key, never bytes
                log.error("load of %s failed: %s", key.hex(), exc)
        self._finish(JobResult(job_id=job_id, success=len(loaded) == len(pairs),
                               successful_keys=None if len(loaded) == len(pairs) else loaded,
                               transfer_time=time.perf_counter() - start, transfer_bytes=len(loaded) * row_bytes))

    def _finish(self, result: Any) -> None:
        with self._lock:
            self._jobs.pop(result.job_id, None)
            self._finished.append(result)


def _tenant_name(spec: Any) -> str:
    config = spec.config
    p = config.parallel
    layout = ("any" if p.is_parallelism_agnostic else
              f"tp{p.tp_size}-pp{p.pp_size}-pcp{p.pcp_size}-dcp{p.dcp_size}")
    return f"vllm:{config.model.name}:{config.model.dtype}:{layout}:{FORMAT_SCHEME}"


def chunk_format(spec: Any, row_bytes: int) -> ValueFormat:
    """What a primary-tier chunk's bytes mean. vLLM's CPU tier lays a chunk out by
    its own worker (canonical or per-layer blocks, the KV cache layout, the groups'
    block sizes), which a tier cannot convert: every setting that shapes the row is
    part of the format, with vLLM's minor version (its worker may lay rows out
    differently in another release), so a chunk stored under other settings is a miss."""
    config = getattr(spec, "config", None)
    attrs: dict[str, Any] = {"vllm": _vllm_minor()}
    if config is not None:
        attrs.update(dtype=config.model.dtype, block_bytes=config.worker_kv_bytes_per_block,
                     blocks_per_chunk=config.cache.blocks_per_chunk, tokens_per_hash=config.cache.tokens_per_hash,
                     groups=_digest(repr([(g.group_id, g.tokens_per_block, tuple(g.layer_names),
                                           getattr(g, "sliding_window_size_in_chunks", None)) for g in config.groups])),
                     kv_cache_layout=getattr(config, "kv_cache_layout", None),
                     canonical=getattr(config, "canonical_layout", None), replicated=getattr(config, "replicated_layout", None))
    return raw_format("vllm-chunk", row_bytes, **attrs)


def _vllm_minor() -> str:
    try:
        from importlib.metadata import version
        return ".".join(version("vllm").split(".")[:2])
    except Exception:  # noqa: BLE001 - no vLLM installed (a tier built around a shim in tests)
        return "none"


def _digest(text: str) -> str:
    import hashlib
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


ADAPTER = EngineAdapter(engine="vLLM offloading secondary tier (SecondaryTierManager of TieringOffloadingSpec)",
                        entry="host_runtime.shim.vllm:CxlhmTier",
                        loading="--kv-transfer-config secondary_tiers: [{type: CxlhmTier, module_path: host_runtime.shim.vllm}]")

__all__ = ["CxlhmTier", "chunk_format"]
