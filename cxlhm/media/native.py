"""Loads the compiled native back end and the liburing C API it calls.

The liburing shared library comes from the python-liburing wheel (it exports the
liburing C API, not only its Python bindings), so no system package is needed.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path


class NativeUnavailable(RuntimeError):
    """The native back end or the liburing C API cannot be used on this machine."""


def _liburing_path() -> Path:
    spec = importlib.util.find_spec("liburing")
    if spec is None or not spec.submodule_search_locations:
        raise NativeUnavailable(
            "the 'liburing' package (python-liburing) is not installed; "
            "`pip install liburing` provides the liburing shared library cxlhm calls"
        )
    for folder in spec.submodule_search_locations:
        for candidate in sorted(Path(folder).glob("liburing*.so*")):
            return candidate
    raise NativeUnavailable(
        f"no liburing*.so in {list(spec.submodule_search_locations)}; "
        "the installed python-liburing wheel does not ship the C library"
    )


def load():
    """Return (ffi, lib) with liburing's symbols resolved, or raise NativeUnavailable."""
    try:
        from cxlhm import _native
    except ImportError as exc:  # pragma: no cover - only when the build step was skipped
        raise NativeUnavailable(
            "cxlhm's native extension is not built; install the package with "
            "`pip install -e .` (or run `make test`), which compiles native/ with cffi"
        ) from exc
    ffi, lib = _native.ffi, _native.lib
    path = _liburing_path()
    err = ffi.new("char[512]")
    if lib.cxlhm_uring_load(str(path).encode(), err, 512) != 0:
        raise NativeUnavailable(ffi.string(err).decode())
    return ffi, lib
