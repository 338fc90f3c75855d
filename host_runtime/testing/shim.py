"""Conformance suite for engine adapters (shims) over the KV store.

An engine adapter maps one serving engine's storage interface (SGLang's HiCacheStorage,
LMCache's RemoteConnector, Mooncake's store API, ...) onto ``host_runtime.shim.KVShim``.
Engines differ in how they say "miss", "already stored" or "wrong size"; the suite
states the behaviour once, in a shared vocabulary (put / get / exists / prefix), and a
subclass translates each word into its engine's calls, asserting the engine's own
answers on the way. Subclass it in a test module:

    from host_runtime.testing.shim import MISSING, ShimConformance

    class TestMyAdapter(ShimConformance):
        def make(self, shim):                    # the adapter, built on a KVShim
            return MyConnector(shim=shim)
        def put(self, a, key, arr):              # store arr (uint8) under key -> stored?
        def get(self, a, key, size):             # the value read back (uint8 array), or
                                                 # MISSING after asserting the engine's miss value
        def exists(self, a, keys):               # [bool] per key
        def prefix(self, a, keys):               # how many leading keys are stored
        def duplicate_put(self, a, key, arr):    # put a stored key again; assert the engine's answer
        def wrong_size_get(self, a, key, size):  # read into a buffer of the wrong size; assert rejection
        def wrong_size_put(self, a, key):        # put a value of a size the engine rejects; assert rejection

Optional overrides: ``get_batch`` (default: one get per key) and ``put_racing`` (one of
six threads putting the same key at once; default: ``put``) for engines with batch or
thread-safety entry points of their own; ``shim_of(adapter)`` when the adapter keeps its
KVShim somewhere other than ``adapter.shim``; ``open_store(path)`` to run the suite on
another device or store configuration (default: a small in-process device on a
temporary image, index in memory); ``size`` (bytes per value, default 8192).

What it checks (one test each): a miss is the engine's not-found value in get, exists
and prefix; a value round-trips; prefix counts only the leading hits; batch answers are
per key; a duplicate put keeps the first value; six concurrent puts of one key store it
once; wrong sizes are rejected without damaging stored values; two tenants never see
each other's keys; and a hypothesis state machine of puts, gets, exists and prefix
probes agrees with a dict. Keys are bytes; an adapter taking strings decodes them.
The suite needs nothing from the project's tests: its fixtures are below.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from host_runtime.kvstore import KVStore
from host_runtime.shim.api import KVShim

SIZE = 8192  # bytes per value unless a subclass sets `size`


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()  # what a subclass's `get` returns for a miss, after checking the engine's own value


def data(i: int, size: int = SIZE) -> np.ndarray:
    """A value whose every byte says which value it is."""
    return np.full(size, i % 251, np.uint8)


def small_store(path: str) -> tuple[KVStore, Any]:
    """A KV store on a 4 MiB in-process device (4 KiB blocks, 32 KiB DRAM tier) whose
    SSD image is `path`; the index is kept in memory. Returns (store, device handle)."""
    from host_runtime.driver import open_device
    handle = open_device({"capacity": 1 << 22, "block_size": 4096, "dram_bytes": 8 * 4096,
                          "backend": {"path": path}})
    try:
        return KVStore(handle, index_path=False), handle
    except BaseException:
        handle.close()
        raise


class ShimConformance:
    """The adapter contract; see the module doc for what a subclass provides."""

    size = SIZE
    MISSING = MISSING

    # ------------------------------------------------------------ what a subclass provides
    def make(self, shim: KVShim) -> Any:
        raise NotImplementedError("return the adapter under test, built on `shim`")

    def put(self, a, key: bytes, arr: np.ndarray) -> bool:
        raise NotImplementedError

    def get(self, a, key: bytes, size: int) -> Any:
        raise NotImplementedError

    def exists(self, a, keys: list[bytes]) -> list[bool]:
        raise NotImplementedError

    def prefix(self, a, keys: list[bytes]) -> int:
        raise NotImplementedError

    def duplicate_put(self, a, key: bytes, arr: np.ndarray) -> None:
        raise NotImplementedError

    def wrong_size_get(self, a, key: bytes, size: int) -> None:
        raise NotImplementedError

    def wrong_size_put(self, a, key: bytes) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ defaults a subclass may override
    def get_batch(self, a, keys: list[bytes], size: int) -> list[Any]:
        return [self.get(a, k, size) for k in keys]

    def put_racing(self, a, key: bytes, arr: np.ndarray) -> None:
        self.put(a, key, arr)

    def shim_of(self, adapter) -> KVShim:
        return adapter if isinstance(adapter, KVShim) else adapter.shim

    def open_store(self, path: str) -> tuple[KVStore, Any]:
        """(store, thing to close after the store) for one test."""
        return small_store(path)

    # ------------------------------------------------------------ fixtures
    @pytest.fixture
    def store(self, tmp_path):
        s, owner = self.open_store(str(tmp_path / "shim-conformance.img"))
        try:
            yield s
        finally:
            s.close()
            if owner is not None:
                owner.close()

    @pytest.fixture
    def adapter(self, store):
        return self.make(KVShim(store.tenant("engine")))

    def value(self, i: int) -> np.ndarray:
        return data(i, self.size)

    # ------------------------------------------------------------ the checks
    def test_miss_returns_the_engines_not_found_value(self, adapter):
        assert self.get(adapter, b"nope", self.size) is MISSING
        assert self.exists(adapter, [b"nope"]) == [False]
        assert self.prefix(adapter, [b"nope"]) == 0

    def test_roundtrip(self, adapter):
        assert self.put(adapter, b"k1", self.value(7))
        got = self.get(adapter, b"k1", self.size)
        assert got is not MISSING and (np.asarray(got) == 7).all()

    def test_partial_prefix_hits(self, adapter):
        keys = [b"p0", b"p1", b"p2", b"p3", b"p4"]
        for i in (0, 1, 3):
            assert self.put(adapter, keys[i], self.value(i))
        assert self.prefix(adapter, keys) == 2
        assert self.prefix(adapter, keys[:2]) == 2
        assert self.prefix(adapter, keys[2:]) == 0

    def test_batch_results_are_per_key(self, adapter):
        keys = [b"b0", b"b1", b"b2", b"b3"]
        for i in (1, 3):
            assert self.put(adapter, keys[i], self.value(i))
        assert self.exists(adapter, keys) == [False, True, False, True]
        got = self.get_batch(adapter, keys, self.size)
        assert got[0] is MISSING and got[2] is MISSING
        assert (np.asarray(got[1]) == 1).all() and (np.asarray(got[3]) == 3).all()

    def test_duplicate_put_keeps_the_first_value(self, adapter):
        assert self.put(adapter, b"dup", self.value(1))
        self.duplicate_put(adapter, b"dup", self.value(2))
        assert (np.asarray(self.get(adapter, b"dup", self.size)) == 1).all()

    def test_concurrent_puts_of_one_key(self, adapter):
        barrier = threading.Barrier(6)
        errors = []

        def worker():
            barrier.wait()
            try:
                self.put_racing(adapter, b"race", self.value(5))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        threads = [threading.Thread(target=worker) for _ in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors
        assert (np.asarray(self.get(adapter, b"race", self.size)) == 5).all()
        assert self.shim_of(adapter).stats()["entries"] == 1

    def test_wrong_sizes_are_rejected(self, adapter):
        assert self.put(adapter, b"sized", self.value(3))
        self.wrong_size_get(adapter, b"sized", self.size)
        self.wrong_size_put(adapter, b"bad")
        assert self.exists(adapter, [b"bad"]) == [False]
        assert (np.asarray(self.get(adapter, b"sized", self.size)) == 3).all()  # nothing was damaged

    def test_tenants_do_not_see_each_other(self, store):
        a = self.make(KVShim(store.tenant("a")))
        b = self.make(KVShim(store.tenant("b")))
        assert self.put(a, b"shared-key", self.value(1))
        assert self.get(b, b"shared-key", self.size) is MISSING
        assert self.exists(b, [b"shared-key"]) == [False] and self.prefix(b, [b"shared-key"]) == 0
        assert (np.asarray(self.get(a, b"shared-key", self.size)) == 1).all()

    def test_agrees_with_a_dict(self, store):
        """Random puts, duplicate puts, gets and probes over a few keys, checked against a
        dict after every step (each example runs in a fresh tenant)."""
        suite, tenants = self, itertools.count()
        keys = [b"m%d" % i for i in range(6)]

        class AdapterMachine(RuleBasedStateMachine):
            def __init__(self):
                super().__init__()
                self.a = suite.make(KVShim(store.tenant(f"machine-{next(tenants)}")))
                self.model: dict[bytes, int] = {}

            @rule(k=st.sampled_from(keys), v=st.integers(0, 250))
            def put(self, k, v):
                if k in self.model:
                    suite.duplicate_put(self.a, k, suite.value(v))  # the first value stays
                else:
                    assert suite.put(self.a, k, suite.value(v))
                    self.model[k] = v

            @rule(k=st.sampled_from(keys))
            def get(self, k):
                got = suite.get(self.a, k, suite.size)
                if k in self.model:
                    assert got is not MISSING and (np.asarray(got) == self.model[k]).all()
                else:
                    assert got is MISSING

            @rule(ks=st.lists(st.sampled_from(keys), min_size=1, max_size=4))
            def probe(self, ks):
                assert suite.exists(self.a, ks) == [k in self.model for k in ks]
                lead = next((i for i, k in enumerate(ks) if k not in self.model), len(ks))
                assert suite.prefix(self.a, ks) == lead

            @invariant()
            def entries(self):
                assert suite.shim_of(self.a).stats()["entries"] == len(self.model)

        run_state_machine_as_test(AdapterMachine, settings=settings(
            max_examples=15, stateful_step_count=12, deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]))


__all__ = ["MISSING", "SIZE", "ShimConformance", "data", "small_store"]
