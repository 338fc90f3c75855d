"""cffi build script for cxlhm's native back end (API mode, compiled at install time).

The extension does not link against liburing: it dlopen()s the shared library
shipped in the python-liburing wheel at run time (see cxlhm/media/native.py).
"""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = (HERE / "cxlhm_native.h").read_text()
WINDOW_HEADER = (HERE / "cxlhm_uffd.h").read_text()  # the load/store window's fault service
COPY_HEADER = (HERE / "cxlhm_copy.h").read_text()  # the device's copy engine

ffibuilder = FFI()
ffibuilder.cdef(HEADER.replace("#include", "//"))
ffibuilder.cdef(WINDOW_HEADER)
ffibuilder.cdef(COPY_HEADER)
ffibuilder.set_source(
    "cxlhm._native",
    '#include <stdint.h>\n#include "cxlhm_native.h"\n#include "cxlhm_uffd.h"\n#include "cxlhm_copy.h"\n',
    sources=["native/cxlhm_native.c", "native/cxlhm_uffd.c", "native/cxlhm_copy.c"],  # relative: setuptools rejects absolute paths
    include_dirs=["native"],
    libraries=["dl", "pthread"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
