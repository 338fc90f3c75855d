"""The KV allocator shim serving engines plug into.

`api.KVShim` is the engine-agnostic API (lookup_prefix / exists / allocate + commit /
put_from / get_into / prefetch + wait / pin / unpin / remove / stats). Each adapter
module maps one engine's storage interface onto it and imports without its engine
installed (subclassing the engine's real base class when it is importable):

  sglang    SGLang HiCache storage backend (HiCacheStorage; loadable as "dynamic")
  lmcache   LMCache remote connector (RemoteConnector; remote_storage_plugins)
  vllm      vLLM offloading tier (SecondaryTierManager of TieringOffloadingSpec)
  mooncake  MooncakeDistributedStore's API (setup / put_from / get_into / batch_*)
  hf        Hugging Face transformers DynamicCache save / restore

Each adapter module describes itself as ``ADAPTER`` (registry.EngineAdapter) and is
listed in ``ADAPTERS`` (registry.py; outside packages publish under the entry-point
group ``cxlhm.engine_adapters``). Every adapter passes the conformance suite
host_runtime.testing.shim.ShimConformance. docs/kvstore.md documents each, with the
command line or config a user types.
"""
from host_runtime.shim.api import KVShim, RegisteredBuffers, byte_view
from host_runtime.shim.registry import ADAPTERS, EngineAdapter

__all__ = ["ADAPTERS", "EngineAdapter", "KVShim", "RegisteredBuffers", "byte_view"]
