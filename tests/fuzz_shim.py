"""The shim fuzz target: random call sequences over KVShim and the four engine adapters
(Mooncake with raw pointers in and out of registered buffers, SGLang get/set/v1 pages,
LMCache, vLLM store/load jobs), with wrong sizes, read-only, non-contiguous and
wrong-dtype buffers and bad keys.

Allowed outcomes per call: a result, or the documented ValueError / TypeError /
KeyError / PermissionError or return code, with a clear message. After every sequence
another tenant's chunks and this tenant's own pinned chunks read back exactly, and
KVStore.check() passes (index and allocator agree). A case is one call."""
from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from hypothesis import strategies as st

from fuzzkit import clear_message, no_hang

SHIM_SIZE = 8192
REFERENCE = {f"ref-{i}".encode(): np.full(SHIM_SIZE, 200 + i, np.uint8) for i in range(4)}
KEYS = st.one_of(st.sampled_from([b"a", b"b", "c", "d", 7, 2**64 + 3, b"x" * 1024]),
                 st.binary(min_size=0, max_size=12), st.text(max_size=8), st.integers(-5, 2**128 - 1),  # see below
                 st.sampled_from([None, 1.5, b"", [b"a"], True, b"y" * 1025]))
SIZES_ = st.one_of(st.sampled_from([SHIM_SIZE, SHIM_SIZE - 1, SHIM_SIZE + 1, 0, 1, 4096, 1 << 40]),
                   st.integers(-10, 3 * SHIM_SIZE))
BUFFERS = st.one_of(SIZES_.map(lambda n: ("np", n)), st.just(("bytes", SHIM_SIZE)), st.just(("readonly", SHIM_SIZE)),
                    st.just(("list", SHIM_SIZE)), st.just(("f32", SHIM_SIZE)), st.just(("noncontig", SHIM_SIZE)),
                    st.sampled_from([("none", 0), ("str", 0), ("int", 0)]))
OPS = st.lists(st.tuples(st.sampled_from([
    "put", "get", "get_loose", "exists", "prefix", "allocate", "remove", "pin", "unpin", "prefetch", "read_range",
    "get_many", "touch", "session",
    "mc_put", "mc_get", "mc_register", "mc_exist", "mc_size", "mc_remove", "mc_batch",
    "sg_set", "sg_get", "sg_exists", "sg_batch", "sg_v1",
    "lm_put", "lm_get", "lm_contains", "lm_remove",
    "vl_lookup", "vl_store", "vl_load", "vl_events"]),
    KEYS, SIZES_, BUFFERS, st.integers(-2**64, 2**64)), min_size=1, max_size=14)

SHIM_ERRORS = (ValueError, TypeError, KeyError, PermissionError)


def _buffer(kind, n):
    if kind == "np":
        return np.zeros(max(0, min(n, 1 << 20)), np.uint8)
    if kind == "bytes":
        return bytes(n)
    if kind == "readonly":
        a = np.zeros(n, np.uint8)
        a.flags.writeable = False
        return a
    if kind == "list":
        return [np.zeros(n // 2, np.uint8), np.zeros(n - n // 2, np.uint8)]
    if kind == "f32":
        return np.zeros(n // 4, np.float32)
    if kind == "noncontig":
        return np.zeros(2 * n, np.uint8)[::2]
    return {"none": None, "str": "abc", "int": 5}[kind]


class _HostPool:
    """SGLang's host KV pool, the parts the backend uses (flat pages, 4 tokens each)."""
    page_size = 4
    get_page_buffer_meta = None

    def __init__(self):
        self.kv_buffer = np.zeros((32, SHIM_SIZE // 4), np.uint8)

    def get_data_page(self, index, flat=True):
        return self.kv_buffer[index:index + 4].reshape(-1).copy()

    def get_dummy_flat_data_page(self):
        return np.empty(SHIM_SIZE, np.uint8)

    def set_from_flat_data_page(self, index, page):
        self.kv_buffer[index:index + 4] = np.asarray(page).reshape(4, -1)


def open_shim_world(folder):
    from host_runtime.driver import open_device
    from host_runtime.kvstore import KVStore, NullHints
    from host_runtime.shim.api import KVShim
    from host_runtime.shim.lmcache import CxlhmRemoteConnector
    from host_runtime.shim.mooncake import CxlhmMooncakeStore
    from host_runtime.shim.sglang import CxlhmHiCacheStorage
    from host_runtime.shim.vllm import CxlhmTier
    path = Path(folder) / "s.img"
    handle = open_device({"capacity": 1 << 22, "block_size": 4096, "dram_bytes": 8 * 4096, "backend": {"path": str(path)}})
    store = KVStore(handle, hints=NullHints())
    ref = KVShim(store.tenant("reference"))
    for key, value in REFERENCE.items():  # another tenant's data ...
        ref.put_from(key, value)
    shim = KVShim(store.tenant("fuzz"))
    for key, value in REFERENCE.items():  # ... and the fuzzed tenant's own, under keys the fuzzer never names
        shim.put_from(b"own-" + key, value)
    ref.pin(list(REFERENCE))  # pinned: the fuzzer's puts fill the window, and must not evict them
    shim.pin([b"own-" + k for k in REFERENCE])
    store.flush()
    pool = np.zeros(4 * SHIM_SIZE, np.uint8)
    world = {"store": store, "handle": handle, "ref": ref, "shim": shim, "pool": pool,
             "mc": CxlhmMooncakeStore(shim), "sg": CxlhmHiCacheStorage(shim=shim),
             "lm": CxlhmRemoteConnector(shim=shim),
             "vl": CxlhmTier(SimpleNamespace(kv_events_config=SimpleNamespace(enable_kv_cache_events=True)),
                             memoryview(np.zeros((4, SHIM_SIZE), np.uint8)), "CxlhmTier", shim=shim),
             "reservations": [], "tickets": []}
    world["mc"].register_buffer(pool.ctypes.data, pool.nbytes)
    world["sg"].register_mem_pool_host(_HostPool())
    return world


def close_shim_world(world) -> None:
    world["store"].close()
    world["handle"].close()


def _run_op(w, op, key, size, buf_kind, number):
    from host_runtime.kvstore import PutStatus, Reservation
    from host_runtime.shim import mooncake as mc
    shim, pool = w["shim"], w["pool"]
    buf = _buffer(*buf_kind) if buf_kind[0] != "np" else _buffer("np", size)
    ptr = pool.ctypes.data + (number % (2 * pool.nbytes)) - pool.nbytes // 2 if number % 3 else number
    if op == "put":
        assert isinstance(shim.put_from(key, buf), PutStatus)
    elif op == "get":
        got = shim.get_into(key, buf)
        assert got is None or isinstance(got, int)
    elif op == "get_loose":
        shim.get_into(key, buf, exact=False)
    elif op == "exists":
        assert isinstance(shim.exists([key, b"a"]), list)
    elif op == "prefix":
        assert 0 <= shim.lookup_prefix([key, b"b", key]) <= 3
    elif op == "allocate":
        res = shim.allocate(key, size)
        if isinstance(res, Reservation):
            try:
                res.write(buf, number % (abs(size) + 1))
            except SHIM_ERRORS:
                pass
            (shim.commit if number % 2 else shim.abort)(res)
    elif op == "remove":
        shim.remove(key)
    elif op in ("pin", "unpin"):
        getattr(shim, op)([key])
    elif op == "prefetch":
        shim.wait(shim.prefetch([key, b"a"], deadline_ns=abs(number) % 10**9))
    elif op == "read_range":
        shim.read_range(key, number % (2 * SHIM_SIZE) - 10, buf)
    elif op == "get_many":
        shim.get_many_into([key, b"a"], buf)
    elif op == "touch":
        shim.touch([key])
    elif op == "session":
        s = shim.session(str(number % 3))
        s.append(key, buf) if number % 2 else s.end()
    elif op == "mc_put":
        assert shim_code(w["mc"].put_from(key, ptr, size))
    elif op == "mc_get":
        assert shim_code(w["mc"].get_into(key, ptr, size))
    elif op == "mc_register":
        assert w["mc"].register_buffer(number, size) in (mc.OK, mc.INVALID_PARAMS)
        w["mc"].unregister_buffer(number)
    elif op == "mc_exist":
        assert w["mc"].is_exist(key) in (1, 0, -1)
    elif op == "mc_size":
        assert isinstance(w["mc"].get_size(key), int)
    elif op == "mc_remove":
        assert w["mc"].remove(key) in (mc.OK, mc.OBJECT_NOT_FOUND, mc.INVALID_PARAMS)
    elif op == "mc_batch":
        assert all(shim_code(c) for c in w["mc"].batch_get_into([key, key], [ptr, ptr], [size]))
    elif op == "sg_set":
        assert w["sg"].set(key, buf) in (True, False)
    elif op == "sg_get":
        w["sg"].get(key, buf)
        w["sg"].get(key, None, target_location=ptr, target_sizes=size)
    elif op == "sg_exists":
        assert w["sg"].exists(key) in (True, False)
    elif op == "sg_batch":
        assert isinstance(w["sg"].batch_exists([key, key]), int)
    elif op == "sg_v1":
        getattr(w["sg"], "batch_set_v1" if number % 2 else "batch_get_v1")([key], np.arange(abs(size) % 9) + number % 24)
    elif op == "lm_put":
        from host_runtime.shim.lmcache import BytesMemoryObj
        obj = BytesMemoryObj(max(0, min(size, 1 << 16)))
        asyncio.run(w["lm"].put(key, obj))
    elif op == "lm_get":
        asyncio.run(w["lm"].get(key))
    elif op == "lm_contains":
        w["lm"].batched_contains([key, b"a"])
    elif op == "lm_remove":
        w["lm"].remove_sync(key)
    elif op == "vl_lookup":
        assert w["vl"].lookup(key, None).name in ("HIT", "MISS", "RETRY")
    elif op in ("vl_store", "vl_load"):
        job = SimpleNamespace(job_id=number, keys=[key], chunk_ids=[number % 6], is_promotion=op == "vl_load")
        try:
            (w["vl"].submit_store if op == "vl_store" else w["vl"].submit_load)(job)
        finally:
            w["vl"].drain_jobs()
            w["vl"].get_finished_jobs()
    elif op == "vl_events":
        list(w["vl"].take_events())


def shim_code(code) -> bool:
    from host_runtime.shim import mooncake as mc
    return isinstance(code, int) and (code >= 0 or code in (mc.INVALID_PARAMS, mc.OBJECT_NOT_FOUND,
                                                            mc.OBJECT_ALREADY_EXISTS, mc.NO_AVAILABLE_HANDLE))


def _reserved(key) -> bool:
    try:
        from host_runtime import kvkeys
        return kvkeys.normalize_key(key).startswith((b"own-", b"ref-"))
    except Exception:  # noqa: BLE001 - not a key at all
        return False


def check_shim_ops(w, ops, tally) -> None:
    """One sequence: each call is a case of `tally`; then the stored data is checked."""
    for op, key, size, buf_kind, number in ops:
        if _reserved(key):
            continue
        tally.run(_check_call, w, op, key, size, buf_kind, number)
    tally.run(check_stored_data, w, count=False)


def _check_call(w, op, key, size, buf_kind, number) -> None:
    with no_hang(f"shim {op}"):
        try:
            _run_op(w, op, key, size, buf_kind, number)
        except SHIM_ERRORS as exc:
            clear_message(exc)


def check_stored_data(w) -> None:
    """The other tenant's and this tenant's own chunks read back exact; index and allocator agree."""
    out = np.empty(SHIM_SIZE, np.uint8)
    for key, value in REFERENCE.items():
        assert w["ref"].get_into(key, out) == SHIM_SIZE and np.array_equal(out, value), f"reference chunk {key!r}"
        assert w["shim"].get_into(b"own-" + key, out) == SHIM_SIZE and np.array_equal(out, value), f"own {key!r}"
    w["store"].check()
