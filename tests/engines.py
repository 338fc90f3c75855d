"""Imports the real serving engines (SGLang, vLLM, LMCache, Mooncake) on a CPU-only machine.

`make` installs their wheels without dependencies (requirements-engines.txt). Two packages
SGLang imports at top level have no place here and are stubbed, for SGLang's importers only:

  triton       sglang/srt/utils/common.py imports it to define GPU kernels; the real
               package is 1 GB and needs a GPU. torch and vLLM probe for it too, so they
               are imported first and never see the stub (they take its absence as "no
               triton", as on any CPU machine).
  torchvision  imported by SGLang's multimodal helpers; the PyPI wheel does not load
               against the CPU torch build.

Nothing else is stubbed: every class and function the tests call is the engine's own.
A missing engine is an ImportError here, so its tests fail (never skip).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("triton", "torchvision")

# vLLM and LMCache first: their imports probe torch for triton and must not find a stub.
import torch  # noqa: E402,F401
import vllm  # noqa: E402
import vllm.v1.kv_offload.base  # noqa: E402,F401
import vllm.v1.kv_offload.factory  # noqa: E402,F401
import vllm.v1.kv_offload.tiering.base  # noqa: E402,F401
import vllm.v1.kv_offload.tiering.spec  # noqa: E402,F401
import lmcache  # noqa: E402
import lmcache.v1.storage_backend.connector  # noqa: E402,F401
import lmcache.v1.storage_backend.storage_manager  # noqa: E402,F401


class _Anything:
    """Any attribute of a stubbed package: callable, a decorator, a base class."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator (@triton.jit): the function itself
        return _Anything()

    def __getattr__(self, name):
        return _Anything()

    def __getitem__(self, item):
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _SGLangOnlyStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stubs to imports made from SGLang's modules, nobody else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in STUBBED or not _imported_from_sglang():
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        if module.__name__ == "triton":
            module.__version__ = "0.0.0+cxlhm-stub"


def _imported_from_sglang() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib", __name__)):
            return name.startswith("sglang")
        frame = frame.f_back
    return False


sys.meta_path.insert(0, _SGLangOnlyStubs())

import sglang  # noqa: E402
import sglang.srt.managers.cache_controller  # noqa: E402,F401
import sglang.srt.mem_cache.hicache_storage  # noqa: E402,F401
import sglang.srt.mem_cache.memory_pool_host  # noqa: E402,F401
import sglang.srt.mem_cache.storage.backend_factory  # noqa: E402,F401
import sglang.srt.observability.metrics_collector  # noqa: E402,F401

for _name in [n for n in sys.modules if n.split(".")[0] in STUBBED and isinstance(sys.modules[n], _StubModule)]:
    del sys.modules[_name]  # later probes (torch, transformers) find no triton, as before

# An adapter imported before SGLang could be (an earlier test module, without these stubs)
# took `object` as its base class; import it again so it subclasses SGLang's real one.
_shim = sys.modules.get("host_runtime.shim.sglang")
if _shim is not None and not issubclass(_shim.CxlhmHiCacheStorage,
                                        sys.modules["sglang.srt.mem_cache.hicache_storage"].HiCacheStorage):
    importlib.reload(_shim)


def version(dist: str) -> str:
    from importlib.metadata import version as _version
    return _version(dist)


VERSIONS = {name: version(name) for name in ("sglang", "vllm", "lmcache", "mooncake-transfer-engine")}


def module(name: str):
    return importlib.import_module(name)


def lmcache_name(module: str, name: str):
    """`name` from an LMCache module given by its 0.5.6 place under ``lmcache.v1``; 0.5.7
    moved several (event_manager, rpc_utils, lookup_client, protocol, ...) under
    ``lmcache.inprocess.v1``, sometimes leaving a module of the old name without them."""
    errors = []
    for package in ("lmcache.v1", "lmcache.inprocess.v1"):
        try:
            found = importlib.import_module(f"{package}.{module}")
        except ModuleNotFoundError as exc:
            errors.append(str(exc))
            continue
        if hasattr(found, name):
            return getattr(found, name)
        errors.append(f"{package}.{module} has no {name}")
    raise ImportError(f"LMCache's {name}: " + "; ".join(errors))
