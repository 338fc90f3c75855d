"""The Mooncake-store drop-in against Mooncake's real API (the releases in
requirements-engines.txt). mooncake.store is a CUDA-linked extension that does not load
on a CPU machine, so its method set is read from the installed extension's symbol
strings, and the engines' own call sites (SGLang's, vLLM's and LMCache's Mooncake
backends) are parsed: every ``store.<method>(...)`` they make must exist on
CxlhmMooncakeStore and accept the arguments they pass. Then the calls those backends
make in order (setup, register_buffer, batch_put_from_multi_buffers, ...) run against a
device, with Mooncake's return codes."""
import ast
import importlib.util
import inspect
import json
from pathlib import Path

import engines  # noqa: F401 - imports the engines
import numpy as np
import pytest

from host_runtime.shim import mooncake as mc

SITE = Path(importlib.util.find_spec("sglang").origin).parent.parent
CALLERS = [
    "sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py",
    "lmcache/v1/storage_backend/connector/mooncakestore_connector.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py",
    "vllm/distributed/mooncake_store.py",
]
STORE_NAMES = {"store", "_store", "mooncake_store"}


def store_calls():
    """(file, line, method, positional count, keywords) of every store.<m>(...) call."""
    calls = []
    for rel in CALLERS:
        path = SITE / rel
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            if name not in STORE_NAMES:
                continue
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue
            calls.append((rel, node.lineno, node.func.attr, len(node.args), [k.arg for k in node.keywords]))
    return calls


class MooncakeNames:
    """Method names in the installed store.so's strings (pybind11 keeps each one as a
    NUL-terminated string; the linker may share a short name with the tail of a longer
    one, e.g. "put" inside "batch_put", so a name is looked for as a string tail)."""

    def __init__(self):
        so = Path(importlib.util.find_spec("mooncake").submodule_search_locations[0]) / "store.so"
        self.data = so.read_bytes()

    def __contains__(self, name: str) -> bool:
        return name.encode() + b"\0" in self.data


def mooncake_symbols() -> MooncakeNames:
    return MooncakeNames()


def test_the_engines_calls_exist_on_the_drop_in_and_bind():
    calls = store_calls()
    assert len(calls) >= 15, "the engines' Mooncake backends moved: update CALLERS"
    real = mooncake_symbols()
    ours = mc.CxlhmMooncakeStore
    for rel, line, method, npos, keywords in calls:
        if method not in real:
            continue  # not a MooncakeDistributedStore method (another object named store)
        assert hasattr(ours, method), f"{rel}:{line} calls store.{method}, which CxlhmMooncakeStore lacks"
        sig = inspect.signature(getattr(ours(), method))  # bound: self is not passed
        sig.bind(*range(npos), **{k: None for k in keywords})  # TypeError names the mismatch


def test_the_drop_in_methods_are_mooncakes():
    real = mooncake_symbols()
    public = [n for n, m in vars(mc.CxlhmMooncakeStore).items() if not n.startswith("_") and callable(m)]
    assert [n for n in public if n not in real] == []
    assert "definitely_not_a_mooncake_method" not in real


def test_the_backends_sequence_with_mooncakes_codes(tmp_path, monkeypatch):
    monkeypatch.setenv("CXLHM_MOONCAKE_DEVICE", json.dumps(
        {"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
         "backend": {"path": str(tmp_path / "mooncake-{pid}.img")}}))
    monkeypatch.setenv("CXLHM_MOONCAKE_HINTS", "none")
    store = mc.CxlhmMooncakeStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 1 << 30, 1 << 28, "tcp", "", "127.0.0.1:50051") == mc.OK
    try:
        assert store.put("warmup", b"x" * 64) == mc.OK and store.get("warmup") == b"x" * 64  # SGLang's warm-up
        assert store.get("missing") == b""
        pool = np.zeros(8 * 1024, np.uint8)
        assert store.register_buffer(pool.ctypes.data, pool.nbytes) == mc.OK
        pool[:2048] = np.arange(2048) % 251
        k, v = pool.ctypes.data, pool.ctypes.data + 1024
        assert store.batch_put_from_multi_buffers(["p0"], [[k, v]], [[1024, 1024]]) == [mc.OK]
        assert store.batch_put_from_multi_buffers(["p0"], [[k, v]], [[1024, 1024]]) == [mc.OK]  # exists = success
        assert store.batch_is_exist(["p0", "p1"]) == [1, 0]
        out = pool.ctypes.data + 4096
        assert store.batch_get_into_multi_buffers(["p0", "p1"], [[out, out + 1024], [out, out + 1024]],
                                                  [[1024, 1024], [1024, 1024]]) == [2048, mc.OBJECT_NOT_FOUND]
        assert np.array_equal(pool[4096:6144], pool[:2048])
        assert store.batch_get_into_multi_buffers(["p0"], [[12345]], [[2048]]) == [mc.INVALID_PARAMS]  # unregistered
        assert store.batch_get_into_multi_buffers(["p0"], [[out]], [[100]]) == [mc.INVALID_PARAMS]  # too small
        assert store.remove("p0", force=True) == mc.OK and store.remove("p0") == mc.OBJECT_NOT_FOUND
        assert store.remove_all() == 1  # the warm-up object
    finally:
        store.close()


def test_setup_without_a_device_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("CXLHM_MOONCAKE_DEVICE", raising=False)
    with pytest.raises(ValueError, match="CXLHM_MOONCAKE_DEVICE"):
        mc.CxlhmMooncakeStore().setup("localhost", "P2PHANDSHAKE")
