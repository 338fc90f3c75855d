"""The LMCache connector inside LMCache's own code (the release in
requirements-engines.txt): built by its ConnectorManager from a remote_storage_plugins
config and by the legacy external:// adapter, storing and returning its real
TensorMemoryObj allocated by its LocalCPUBackend; and inside LMCache's real
StorageManager with async loading, fed by its real async lookup server (zmq to a
scheduler socket): puts, lookups that pin, gets, and the pins released the engine's way
(LMCache never unpins a remote back end). RemoteConnector's abstract methods and
signatures are checked mechanically."""
import asyncio
import inspect
import tempfile

import engines  # imports the engines
import pytest
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector import ConnectorManager
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

from host_runtime.shim.lmcache import CxlhmRemoteConnector

EventManager = engines.lmcache_name("event_manager", "EventManager")
EventType = engines.lmcache_name("event_manager", "EventType")
LookupCleanupMsg = engines.lmcache_name("lookup_client.async_lookup_message", "LookupCleanupMsg")
LookupResponseMsg = engines.lmcache_name("lookup_client.async_lookup_message", "LookupResponseMsg")
LMCacheAsyncLookupServer = engines.lmcache_name("lookup_client.lmcache_async_lookup_client", "LMCacheAsyncLookupServer")
get_zmq_rpc_path_lmcache = engines.lmcache_name("rpc_utils", "get_zmq_rpc_path_lmcache")

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


# ---------------------------------------------------------------- the real StorageManager, async loading
BIG = torch.Size([2, 2, 256, 64])  # one 128 KiB chunk (132 KiB with its header, in 4 KiB blocks)


class Engine:
    """LMCache's StorageManager with async loading and its async lookup server, the way
    LMCache's worker builds them (no GPU: the KV is never copied to a device), and the
    scheduler's end of the lookup socket."""

    def __init__(self, tmp_path, monkeypatch, **extra):
        import msgspec
        import zmq
        self.rpc_dir = tempfile.mkdtemp(prefix="lmc", dir="/tmp")  # ipc paths are short
        monkeypatch.setenv("VLLM_RPC_BASE_PATH", self.rpc_dir)
        self.config = LMCacheEngineConfig.from_defaults(
            chunk_size=256, local_cpu=False, max_local_cpu_size=0.05, enable_async_loading=True,
            remote_storage_plugins=["cxlhm"],
            extra_config={"remote_storage_plugin.cxlhm.module_path": "host_runtime.shim.lmcache",
                          "remote_storage_plugin.cxlhm.class_name": "CxlhmRemoteConnector",
                          "remote_storage_plugin.cxlhm.device": device(tmp_path),
                          "remote_storage_plugin.cxlhm.hints": "none", **extra})
        self.metadata = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0,
                                        local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(2, 2, 256, 4, 16),
                                        engine_id="cxlhm-test")
        self.ctx = zmq.Context()
        self.scheduler = self.ctx.socket(zmq.PULL)  # where the lookup server answers
        self.scheduler.bind("ipc://" + get_zmq_rpc_path_lmcache("cxlhm-test", "lookup_scheduler", 0, 0))
        self.scheduler.setsockopt(zmq.RCVTIMEO, 600_000)  # generous: a fresh install compiles its firmware first
        self.decode = lambda buf: msgspec.msgpack.decode(buf, type=LookupResponseMsg)
        self.server = LMCacheAsyncLookupServer(None, self.metadata)  # requests come from us, not the socket
        self.manager = StorageManager(self.config, self.metadata, EventManager(), async_lookup_server=self.server)
        self.backend = self.manager.storage_backends["RemoteBackend-cxlhm"]
        self.connector = our_connector(self.backend)

    def put(self, hashes) -> None:
        keys = [chunk_key(h) for h in hashes]
        objs = []
        for h in hashes:
            obj = self.manager.allocate(BIG, torch.bfloat16, MemoryFormat.KV_2LTD)
            obj.tensor.view(torch.uint8).view(-1).fill_(h % 251)
            objs.append(obj)
        self.manager.batched_put(keys, objs)  # asynchronous: tasks on the manager's loop
        self.drain()

    def drain(self) -> None:
        """Wait for the tasks queued on the manager's loop (our connector's coroutines never
        yield, so a coroutine queued after them finishes after them)."""
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.manager.loop).result(600)

    def lookup(self, lookup_id, hashes) -> int:
        """The worker's async lookup (pin=True, as LMCache's lookup server always asks):
        returns the hit tokens the scheduler is told."""
        keys = [chunk_key(h) for h in hashes]
        cum = [256 * i for i in range(len(keys) + 1)]
        asyncio.run_coroutine_threadsafe(
            self.manager.async_lookup_and_prefetch(lookup_id, keys, cum, pin=True), self.manager.loop).result(600)
        reply = self.decode(self.scheduler.recv())
        assert reply.lookup_id == lookup_id
        return reply.num_hit_tokens

    def retrieve(self, lookup_id) -> list:
        """The loaded (key, memory object) pairs of a finished lookup, released after
        reading their first byte, as the worker does once it copied them to the GPU."""
        tiers = self.manager.event_manager.pop_event(EventType.LOADING, lookup_id).result()
        got = []
        for tier in tiers:
            for key, obj in tier:
                got.append((key.chunk_hash, int(obj.tensor.view(torch.uint8).view(-1)[0])))
                obj.ref_count_down()
        return got

    def stored(self, hashes) -> int:
        return sum(self.connector.exists_sync(chunk_key(h)) for h in hashes)

    def close(self) -> None:
        import msgspec
        import zmq
        self.drain()  # LMCache frees its CPU buffers before it closes the remote back end
        self.manager.close()
        self.server.running = False  # wake its receive loop so it sees that
        wake = self.ctx.socket(zmq.PUSH)
        wake.connect("ipc://" + get_zmq_rpc_path_lmcache("cxlhm-test", "lookup_worker", 0, 0))
        wake.send(msgspec.msgpack.encode(LookupCleanupMsg(lookup_id="stop")))
        wake.close(linger=1000)
        self.server.close()
        self.ctx.destroy(linger=0)  # closes the scheduler socket too, never waits on a peer


def our_connector(backend):
    """The CxlhmRemoteConnector inside LMCache's RemoteBackend (LMCache may wrap it)."""
    conn = backend.connection
    while not isinstance(conn, CxlhmRemoteConnector):
        conn = conn._connector
    return conn


@pytest.fixture
def engine(tmp_path, monkeypatch):
    made = []

    def make(**extra):
        made.append(Engine(tmp_path, monkeypatch, **extra))
        return made[-1]
    yield make
    for e in made:
        e.close()


def test_async_loading_releases_each_lookups_pins_after_its_get(engine):
    e = engine()
    e.put(range(20))
    assert e.stored(range(20)) == 20
    for i in range(20):
        assert e.lookup(f"req{i}", [i, 1000 + i]) == 256  # one chunk hit, the next a miss
        assert e.retrieve(f"req{i}") == [(i, i % 251)]
    assert e.connector.shim.stats()["pinned_bytes"] == 0
    e.manager.batched_unpin([chunk_key(i) for i in range(20)])  # LMCache's unpin: a no-op for us
    e.put(range(100, 120))  # the store holds 31 such chunks: the new 20 evict 9 of the old ones
    assert e.stored(range(100, 120)) == 20


def test_lookups_whose_get_never_comes_are_released_by_their_lease(engine):
    e = engine(**{"remote_storage_plugin.cxlhm.pin_lease_s": 5})
    clock = [1000.0]
    e.connector.shim.store._leases.clock = lambda: clock[0]  # the lease's time, not the machine's
    e.put(range(20))
    for i in range(20):  # LMCache's remote back end's own async contains, pinning, no get after it
        hits = asyncio.run_coroutine_threadsafe(
            e.backend.batched_async_contains(f"lost{i}", [chunk_key(i)], pin=True), e.manager.loop).result(30)
        assert hits == 1
    stats = e.connector.shim.stats()
    budget = e.connector.shim.tenant.max_pinned_bytes
    assert budget == 1 << 20 and 0 < stats["pinned_bytes"] <= budget  # a quarter of the 4 MiB store at most
    clock[0] += 5.1  # past the lease: the engine's next put releases them first, then evicts
    e.put(range(100, 120))
    assert e.stored(range(100, 120)) == 20
    assert e.connector.shim.stats()["pinned_bytes"] == 0
    assert e.connector.shim.stats()["leases_expired"] >= 1


def test_a_construction_error_lmcache_swallows_is_logged_at_error_under_cxlhms_name(tmp_path, caplog):
    """LMCache's StorageManager catches the plug-in's error and runs without the tier;
    cxlhm's own logger says so at ERROR, naming `cxlhm doctor`."""
    config = engine_config(tmp_path, **{"remote_storage_plugin.cxlhm.device": {
        "capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
        "backend": {"path": "/proc/no-such-dir/kv.img"}}})
    config.local_cpu, config.max_local_cpu_size = True, 0.01
    metadata = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                               kv_dtype=torch.bfloat16, kv_shape=(2, 2, 16, 2, 8))
    with caplog.at_level("ERROR", logger="cxlhm.shim.lmcache"):
        manager = StorageManager(config, metadata, EventManager())
    try:
        ours = [r for r in caplog.records if r.name == "cxlhm.shim.lmcache" and r.levelname == "ERROR"]
        assert ours and "/proc/no-such-dir" in ours[0].getMessage() and "cxlhm doctor" in ours[0].getMessage()
        remote = manager.storage_backends.get("RemoteBackend-cxlhm")
        assert remote is None or remote.connection is None  # the engine runs on without the tier
    finally:
        manager.close()
