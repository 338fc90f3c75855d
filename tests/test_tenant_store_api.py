"""Tenant and KVStore talk through the declared TenantStore API (kvstore/storeapi.py):
the store implements every declared member, the tenant side uses nothing else, and
neither side reads the other's private attributes."""
import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

from host_runtime.kvstore import KVStore, PinLease, PrefetchTicket, PutStatus, Reservation
from host_runtime.kvstore.storeapi import TenantStore, members

KVSTORE = Path(__file__).resolve().parents[1] / "host_runtime" / "kvstore"
API = set(members())


def test_the_api_declares_methods_and_attributes():
    assert {"reserve", "commit", "abort", "read_into", "read_many", "read_range", "pin", "unpin", "lease_pins",
            "prefetch", "open_session", "end_session", "handle", "capacity"} <= API


def test_kvstore_implements_every_declared_method_with_its_arguments():
    for name in API:
        declared = getattr(TenantStore, name, None)
        if declared is None:  # an attribute: checked on an instance below
            continue
        implemented = getattr(KVStore, name, None)
        assert callable(implemented), f"KVStore lacks {name}"
        want = list(inspect.signature(declared).parameters.values())
        got = list(inspect.signature(implemented).parameters.values())
        assert [p.kind for p in got] == [p.kind for p in want], f"KVStore.{name}{inspect.signature(implemented)}"


def _attribute_uses(path: Path):
    """(line, base expression, attribute) for every attribute access in a module."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node.lineno, ast.unparse(node.value), node.attr


def test_the_tenant_side_calls_the_store_only_through_the_api():
    for module in ("tenant.py", "pinleases.py"):
        for line, base, attr in _attribute_uses(KVSTORE / module):
            if base.endswith(".store") or base == "store":
                assert attr in API, f"{module}:{line}: {base}.{attr} is not in the TenantStore API"


@pytest.mark.parametrize("module", ["tenant.py", "pinleases.py", "store.py", "eviction.py", "audit.py"])
def test_no_private_attribute_of_another_object(module):
    """Private names are used only on `self` (an object's own state)."""
    bad = [f"{module}:{line}: {base}.{attr}" for line, base, attr in _attribute_uses(KVSTORE / module)
           if attr.startswith("_") and not attr.startswith("__") and base != "self"]
    assert not bad, bad


class OnlyTheAPI:
    """A store as a tenant may see it: the declared members and nothing else; records
    which were used."""

    def __init__(self, store):
        self._store, self.used = store, set()

    def __getattr__(self, name):
        if name not in API:
            raise AssertionError(f"the tenant side used store.{name}, which TenantStore does not declare")
        self.used.add(name)
        return getattr(self._store, name)


def test_a_tenant_works_over_the_declared_api_alone(make_device):
    store = KVStore(make_device(capacity=1 << 22, dram_bytes=8 * 4096), index_path=False)
    t = store.tenant("api")
    proxy = t.store = OnlyTheAPI(store)
    chunk = np.arange(8192, dtype=np.uint8)

    assert t.put_from(b"a", chunk) is PutStatus.STORED
    res = t.reserve(b"b", 8192)
    assert isinstance(res, Reservation)
    res.write(chunk[:4096])
    back = np.empty(4096, np.uint8)
    res.read_into(back)
    assert (back == chunk[:4096]).all()
    res.commit()
    res2 = t.reserve(b"c", 8192)
    res2.abort()
    assert not t.contains(b"c") and t.contains(b"b")

    out = np.empty(8192, np.uint8)
    assert t.get_into(b"a", out) == 8192 and (out == chunk).all()
    many = np.empty(2 * 8192, np.uint8)
    assert t.get_many_into([b"a", b"b", b"zz"], many) == 2
    part = np.empty(100, np.uint8)
    assert t.read_range(b"a", 1000, part) and (part == chunk[1000:1100]).all()
    t.touch([b"a"])

    assert t.pin([b"a"]) == 1 and t.unpin([b"a"]) == 1
    lease = t.lease_pins([b"a"], 60.0, lease_id="x")
    assert isinstance(lease, PinLease) and lease.release() == 1
    t.lease_pins([b"b"], 60.0, lease_id="y")
    assert t.release_pins("y") == 1
    ticket = t.prefetch([b"a", b"b"])
    assert isinstance(ticket, PrefetchTicket) and store.wait(ticket) == 2 and ticket.done

    s = t.open_session("s1")
    assert s.resume([b"a", b"q"]) == 1
    assert s.next_prefix([b"b"]) == 1
    s.pause(1000)
    s.end()
    assert t.remove(b"a") and not t.remove(b"a")
    store.check()

    declared_methods = {name for name in API if callable(getattr(TenantStore, name, None))}
    assert declared_methods - proxy.used == set()  # every declared method is one the tenant side needs
    assert {"handle", "capacity"} <= API and store.capacity == t.quota_bytes
    store.close()
