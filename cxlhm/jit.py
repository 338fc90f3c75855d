"""Compile flags and the on-disk compile cache shared by cxlhm's compiled code.

Compiling the firmware takes tens of seconds, so every compiled function of the firmware
(cxlhm's block table and firmware runtime, the streamed I/O loop, the policies in
firmware_policies) is built with numba's ``cache=True`` and lands in one cache folder,
``$CXLHM_CACHE_DIR/numba/<stamp>`` (default ``~/.cache/cxlhm``). numba checks only the
timestamp of the file a cached function is defined in, but a function compiled here has
its callees from other files inlined; so the stamp is a hash of every source file those
functions may call (and of numba's version), and a change to any of them starts a fresh
folder.

A policy's hooks reach the firmware kernels as module globals of a module generated per
policy (`generated_module`, called by the one generator of per-policy glue,
cxlhm/policy_glue.py), not as closure cells: numba's cache keys a closure by its
pickled cells, and a pickled dispatcher carries a random id, so a closure is never found
again in another process. For the same reason compiled code calls C functions by symbol
name (`c_function`), not through ctypes: numba does not cache code that holds a ctypes
function's address.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import llvmlite.binding as llvm
import numba
from llvmlite import ir
from numba.core import caching, cgutils
from numba.extending import intrinsic

_PACKAGE = Path(__file__).resolve().parent
_POLICIES = _PACKAGE.parent / "firmware_policies"
# the sources whose functions the firmware's compiled code may call, and the C headers
# whose constants and function signatures it has compiled in (a checkout's)
_SOURCES = [*sorted(_PACKAGE.glob("*.py")), _PACKAGE / "mailbox" / "hints.py", _PACKAGE / "window" / "firmware_cfuncs.py",
            *sorted((_PACKAGE / "timing").glob("*.py")), *sorted((_PACKAGE / "device" / "stream").glob("*.py")),
            *sorted(_POLICIES.glob("*.py")),
            *sorted((_PACKAGE.parent / "native").glob("*.h"))]


def cache_dir() -> Path:
    return Path(os.environ.get("CXLHM_CACHE_DIR", Path.home() / ".cache" / "cxlhm"))


def _stamp() -> str:
    digest = hashlib.sha256(numba.__version__.encode())
    for path in _SOURCES:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


STAMP = _stamp()


def _numba_cache_dir() -> Path:
    return cache_dir() / "numba" / STAMP


UNUSED_DAYS = 7


def _drop_unused_stamps() -> None:
    """Folders of other source stamps untouched for UNUSED_DAYS: an older install's
    (another checkout sharing the cache folder may still use a recent one)."""
    cutoff = time.time() - UNUSED_DAYS * 86400
    for folder in [*_numba_cache_dir().parent.iterdir(), *(cache_dir() / "generated").glob("*.py")]:
        try:
            if STAMP not in folder.name and folder.stat().st_mtime < cutoff:
                if folder.is_dir():
                    shutil.rmtree(folder, ignore_errors=True)
                else:
                    folder.unlink()
        except OSError:
            pass


class _SourceTreeLocator(caching._CacheLocator):
    """Where numba caches a function of cxlhm's firmware (see the module docstring):
    the folder of the current source stamp, which is also the cache's source stamp."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(_numba_cache_dir() / Path(py_file).stem)

    def ensure_cache_path(self):
        fresh = not Path(self._cache_path).exists()
        super().ensure_cache_path()
        if fresh:
            _drop_unused_stamps()

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return STAMP

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        path = Path(py_file).resolve()
        ours = path.parent in (_PACKAGE, _POLICIES) or path.parent == (cache_dir() / "generated").resolve()
        if not ours:
            return None
        self = cls(py_func, py_file)
        try:
            self.ensure_cache_path()
        except OSError:
            return None  # no writable cache folder: numba's own locators decide (or nothing is cached)
        return self


_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # public from numba 0.61
if _SourceTreeLocator not in _IMPL._locator_classes:
    _IMPL._locator_classes.insert(0, _SourceTreeLocator)


def njit(fn=None, *, refcounts: bool = False, **options):
    """numba.njit(nogil=True, cache=True) without numba's reference counting: a firmware
    function, compiled once per install (see the module docstring).

    The firmware's functions take the block table, the policy's state and the stream's
    tables - tens of arrays - and call each other once or more per block accessed. With
    numba's reference counting every call increfs and decrefs each array it unpacks, an
    atomic operation and a call each: a 4 KiB read spent ~0.4 us of its ~1.6 us of
    user-space CPU on them (docs/fio.md, "Reference counting"). Their arrays are their
    callers', kept alive by them, so none is needed. A function without it cannot
    allocate an array (numba refuses to compile one that does, naming np.zeros or the
    like): those take `refcounts=True`. Nor may it return a view it made inside a tuple
    (numba would box the view's parent instead). A closure is compiled in memory: numba
    never finds one in its cache again in another process."""
    def decorate(f):
        # code compiled from a string (an unregistered policy's kernels) has no file to cache beside
        cache = f.__closure__ is None and Path(f.__code__.co_filename).is_file()
        flags = {"nogil": True, "cache": cache, **options}
        if not refcounts:
            try:
                return numba.njit(**flags, _nrt=False)(f)
            except (KeyError, TypeError):  # a numba without the private flag: correct, just slower
                pass
        return numba.njit(**flags)(f)
    return decorate if fn is None else decorate(fn)


def cfunc(signature, **options):
    """numba.cfunc(signature, nopython=True, nogil=True), cached on disk when its code
    lives in a file (a generated module's; see `njit`)."""
    def decorate(f):
        cache = f.__closure__ is None and Path(f.__code__.co_filename).is_file()
        return numba.cfunc(signature, nopython=True, nogil=True, cache=cache, **options)(f)
    return decorate


@intrinsic
def prefetch(typingctx, address):
    """Ask the CPU to bring the cache line at integer `address` in (a hint: never
    faults, whatever the address). A replay that knows its next accesses uses it to
    have their table rows in cache by the time it reaches them."""
    if not isinstance(address, numba.types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        # a read, kept in every cache level, of data (not instructions)
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return numba.types.void(address), codegen


def c_function(symbol: str, function: ctypes._CFuncPtr, signature) -> numba.types.ExternalFunction:
    """The C `function` (from a library ctypes loaded) as compiled code calls it: by
    `symbol`, which the JIT's linker resolves to its address in this process. Code that
    holds a ctypes function's address is not cached on disk (numba: "dynamic globals");
    code that calls a symbol is. `signature`: numba's, pointers as intp."""
    llvm.add_symbol(symbol, ctypes.cast(function, ctypes.c_void_p).value)
    return numba.types.ExternalFunction(symbol, signature)


_IMPORTING = threading.RLock()


def generated_module(name: str, source: str) -> types.ModuleType | None:
    """Import `source` as module `name` from a file in the cache folder, so numba can
    cache what it compiles (the file name carries the source stamp). None when no cache
    folder is writable: the caller compiles in memory."""
    folder = cache_dir() / "generated"
    path = folder / f"{name}_{STAMP}.py"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != source:
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(source)
            os.replace(tmp, path)
    except OSError:
        return None
    module_name = f"cxlhm_generated_{name}_{STAMP}"
    # One thread imports it; others wait: sys.modules holds it from before its code runs,
    # and a thread that found it there half run would miss its functions. (Reentrant: a
    # module's code asks for the firmware's module.)
    with _IMPORTING:
        if module_name in sys.modules:
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # numba's cache re-imports the module by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        return module


def compiling_notice(what: str, folder: Path) -> None:
    """Print, before a compile whose cache `folder` holds nothing yet, that it is
    happening (the first run after an install or a source change waits for it)."""
    if not any(Path(folder).glob("*.nbi")):
        print(f"cxlhm: compiling {what} (once per install; cached in {cache_dir()}) ...", file=sys.stderr, flush=True)
