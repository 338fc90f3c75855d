"""The LMCache connector inside LMCache's own code (the release in
requirements-engines.txt): built by its ConnectorManager from a remote_storage_plugins
config and by the legacy external:// adapter, storing and returning its real
TensorMemoryObj allocated by its LocalCPUBackend, and answering its RemoteBackend /
StorageManager contains path (which slices keys[:hits]). RemoteConnector's abstract
methods and signatures are checked mechanically."""
import asyncio
import inspect
from types import SimpleNamespace

import engines  # noqa: F401 - imports the engines
import pytest
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector import ConnectorManager
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

from host_runtime.shim.lmcache import CxlhmRemoteConnector

SHAPE = torch.Size([2, 2, 16, 16])  # [K/V, layers, tokens, hidden]


def device(tmp_path):
    return {"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
            "backend": {"path": str(tmp_path / "lmcache-{worker_id}.img")}}


def engine_config(tmp_path, **extra):
    return LMCacheEngineConfig.from_defaults(
        chunk_size=16, local_cpu=False, max_local_cpu_size=0.01, remote_storage_plugins=["cxlhm"],
        extra_config={"remote_storage_plugin.cxlhm.module_path": "host_runtime.shim.lmcache",
                      "remote_storage_plugin.cxlhm.class_name": "CxlhmRemoteConnector",
                      "remote_storage_plugin.cxlhm.device": device(tmp_path),
                      "remote_storage_plugin.cxlhm.hints": "none", **extra})


@pytest.fixture
def lmcache(tmp_path):
    """(connector built by LMCache's ConnectorManager, its LocalCPUBackend, loop)."""
    config = engine_config(tmp_path)
    metadata = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                               kv_dtype=torch.bfloat16, kv_shape=(2, 2, 16, 2, 8))
    cpu = LocalCPUBackend(config, metadata)
    loop = asyncio.new_event_loop()
    connector = ConnectorManager("plugin://cxlhm", loop, cpu, config, metadata, plugin_name="cxlhm").create_connector()
    yield connector, cpu, loop
    loop.run_until_complete(connector.close())
    loop.close()


def chunk_key(i):
    return CacheEngineKey(model_name="m", world_size=1, worker_id=0, chunk_hash=i, dtype=torch.bfloat16)


def filled(cpu, seed):
    obj = cpu.allocate(SHAPE, torch.bfloat16, MemoryFormat.KV_2LTD)
    obj.tensor.view(torch.uint8).view(-1).copy_(torch.randint(0, 255, (obj.get_size(),), dtype=torch.uint8,
                                                     generator=torch.Generator().manual_seed(seed)))
    return obj


def test_every_abstract_method_is_implemented_with_lmcaches_signature():
    assert issubclass(CxlhmRemoteConnector, RemoteConnector)
    assert not CxlhmRemoteConnector.__abstractmethods__
    for name, member in vars(RemoteConnector).items():
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        theirs = list(inspect.signature(member).parameters)
        ours = list(inspect.signature(getattr(CxlhmRemoteConnector, name)).parameters)
        assert ours[:len(theirs)] == theirs, f"{name}: LMCache {theirs}, ours {ours}"
    # both plug-in paths construct connectors with these three keywords
    assert list(inspect.signature(CxlhmRemoteConnector).parameters)[:3] == ["loop", "local_cpu_backend", "config"]


def test_plugin_config_builds_our_connector_and_roundtrips_real_memory_objects(lmcache):
    connector, cpu, loop = lmcache
    assert isinstance(connector, CxlhmRemoteConnector)
    obj = filled(cpu, 1)
    want = obj.tensor.clone()
    loop.run_until_complete(connector.put(chunk_key(1), obj))
    got = loop.run_until_complete(connector.get(chunk_key(1)))
    assert type(got) is type(obj) and got.get_shapes() == [SHAPE] and got.get_dtypes() == [torch.bfloat16]
    assert got.get_memory_format() == MemoryFormat.KV_2LTD
    assert torch.equal(got.tensor.view(torch.uint8), want.view(torch.uint8))  # bytes: random bf16 has NaNs
    assert loop.run_until_complete(connector.get(chunk_key(2))) is None


def test_storage_manager_contains_path_counts_leading_hits(lmcache):
    connector, cpu, loop = lmcache
    for i in (0, 1, 3):
        loop.run_until_complete(connector.put(chunk_key(i), filled(cpu, i)))
    keys = [chunk_key(i) for i in range(5)]
    remote = SimpleNamespace(connection=connector, _mla_worker_id_as0_mode=False)
    assert RemoteBackend.batched_contains(remote, keys) == 2  # LMCache's own RemoteBackend call
    backend = SimpleNamespace(batched_contains=lambda ks, pin=False: RemoteBackend.batched_contains(remote, ks, pin))
    manager = SimpleNamespace(get_active_storage_backends=lambda: [("RemoteBackend-cxlhm", backend)])
    infos = [(k, i * 16, (i + 1) * 16) for i, k in enumerate(keys)]
    assert StorageManager.get_block_mapping(manager, infos) == {"RemoteBackend-cxlhm": infos[:2]}


def test_external_url_builds_it_too(tmp_path):
    config = LMCacheEngineConfig.from_defaults(chunk_size=16, local_cpu=False, max_local_cpu_size=0.01,
                                               extra_config={"cxlhm.device": device(tmp_path), "cxlhm.hints": "none"})
    loop = asyncio.new_event_loop()
    url = "external://host:0/host_runtime.shim.lmcache/?connector_name=CxlhmRemoteConnector"
    connector = ConnectorManager(url, loop, None, config).create_connector()
    try:
        assert isinstance(connector, CxlhmRemoteConnector) and connector.batched_contains([chunk_key(1)]) == 0
    finally:
        loop.run_until_complete(connector.close())
        loop.close()


def test_a_value_that_is_not_a_chunk_or_has_the_wrong_size_is_a_miss(lmcache):
    connector, cpu, loop = lmcache
    connector.shim.put_from(chunk_key(7), torch.zeros(100, dtype=torch.uint8))
    assert loop.run_until_complete(connector.get(chunk_key(7))) is None


def test_missing_device_settings_are_a_clear_error(tmp_path):
    config = LMCacheEngineConfig.from_defaults(chunk_size=16, extra_config={})
    with pytest.raises(ValueError, match="device"):
        CxlhmRemoteConnector(loop=None, local_cpu_backend=None, config=config)
