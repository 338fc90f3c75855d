"""The window's firmware as one C-callable function: thin wrappers, no firmware logic.

The fault-service thread (native/cxlhm_uffd.c) runs without the interpreter: a thread
that holds the GIL may be the one waiting for the fault, so calling back into Python
would deadlock. It reaches the firmware (cxlhm/firmware.py, the very kernels the device
and the trace simulator run) through one numba ``@cfunc`` per policy:

    int64 firmware(int64 *ctx, int64 op, int64 *args, int64 *out)

``op`` is one of the operations declared in native/cxlhm_uffd.h. ``ctx`` holds the raw
address and shape of every array the firmware works on - the block table, the policy
state, the counters and the logical clock. The cfunc rebuilds views over them on each
call (``numba.carray``: no allocation, no GIL). A policy's state is a tree of tuples /
namedtuples of arrays of its own choosing, so the function is generated from the tree's
shape.

Compiling it takes 10-30 s, so the module is made by the glue generator
(cxlhm/policy_glue.py) like the firmware kernels: written to the compile cache and
compiled with numba's on-disk cache, so a process that ran it once loads it.

The numpy arrays stay owned by Python: `FirmwareBridge` keeps them alive as long as the
native thread may use their addresses. Every call is made with the window's mutex held.
"""
from __future__ import annotations

import ctypes

import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from cxlhm import blocktable as btm
from cxlhm import firmware as fw
from cxlhm import policy_glue as glue
from cxlhm.policies import Policy, no_background

OPS = fw.OPS  # the operations, from native/cxlhm_uffd.h through cffi

SIGNATURE = types.int64(types.CPointer(types.int64), types.int64, types.CPointer(types.int64),
                        types.CPointer(types.int64))
_int64_p = ctypes.POINTER(ctypes.c_int64)


@intrinsic
def voidptr(typingctx, address):
    """An int64 address as a void pointer, so numba.carray can view it."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(address), codegen


class UnsupportedPolicyState(TypeError):
    """A policy's state holds something native code cannot be handed (not an array)."""


# ---------------------------------------------------------------- code generation

_DISPATCH = '''
@jit.njit(refcounts=True)
def load(ctx):
    return {state}


@jit.cfunc(SIGNATURE)
def firmware(ctx_p, op, args_p, out_p):
    ctx = numba.carray(ctx_p, ({n_ctx},), np.int64)
    args = numba.carray(args_p, (8,), np.int64)
    out = numba.carray(out_p, (8,), np.int64)
    bt, ps, counters, clock = load(ctx)
    if op == {PLACE}:
        return _fault_place(bt, ps, counters, clock, args[0], args[1], args[2], out)
    if op == {HIT}:
        return _fault_hit(bt, ps, counters, clock, args[0], args[1] != 0)
    if op == {LOOKUP}:
        return btm.lookup(bt, args[0])
    if op == {FINISH}:
        fw.fault_finish(bt, args[0])
        return 0
    if op == {DIRTY}:
        fw.set_dirty(bt, args[0], args[1] != 0)
        return 0
    if op == {INVALIDATE}:  # a block whose bytes could not be read: forget it
        _invalidate(bt, ps, args[0], clock[0])
        return 0
    if op == {HINT}:
        _hint(bt, ps, clock, args[0], args[1], args[2], args[3], args[4])
        return 0
    if op == {BACKGROUND}:
        jobs = numba.carray(voidptr(args[1]), (args[0], 3), np.int64)
        return _background(bt, ps, clock, args[0], jobs)
    if op == {PIN}:
        return btm.set_pinned(bt, args[0], args[1], args[2] != 0)
    return -1
'''


class _Layout:
    """Where each array of a state tree goes in ctx, and the loader expression."""

    def __init__(self, tree):
        self.leaves: list[np.ndarray] = []
        self.offsets: list[int] = []
        self.imports: dict[str, str] = {}  # global name -> "module:qualname"
        self.size = 0
        self.expr = self._expr(tree)

    def _expr(self, node) -> str:
        if isinstance(node, np.ndarray):
            if not node.flags.c_contiguous:
                raise UnsupportedPolicyState("policy state arrays must be C-contiguous")
            off = self.size
            self.leaves.append(node)
            self.offsets.append(off)
            self.size += 1 + node.ndim
            dims = "".join(f"ctx[{off + 1 + d}], " for d in range(node.ndim))
            return f"numba.carray(voidptr(ctx[{off}]), ({dims}), np.{node.dtype.name})"
        if isinstance(node, tuple):
            parts = ", ".join(self._expr(child) for child in node)
            if hasattr(node, "_fields"):  # a namedtuple: rebuild the same class
                cls = type(node)
                name = f"_nt_{cls.__name__}_{len(self.imports)}"
                self.imports[name] = f"{cls.__module__}:{cls.__qualname__}"
                return f"{name}({parts})"
            return f"({parts},)" if node else "()"
        raise UnsupportedPolicyState(
            f"policy state element of type {type(node).__name__} cannot be shared with the native "
            "fault handler; policy state must be (nested) tuples of numpy arrays")

    def fill(self, ctx: np.ndarray) -> None:
        for arr, off in zip(self.leaves, self.offsets):
            ctx[off] = arr.ctypes.data
            ctx[off + 1: off + 1 + arr.ndim] = arr.shape


def _module_source(layout: _Layout) -> str:
    """The glue module for one state layout (its policy bound by glue.POLICY_LINE)."""
    lines = [
        "# Generated by cxlhm.window.firmware_cfuncs: the firmware for the window's fault service.",
        "import importlib",
        "import numba",
        "import numpy as np",
        "from cxlhm import blocktable as btm",
        "from cxlhm import firmware as fw",
        "from cxlhm import jit",
        "from cxlhm import policies",
        "from cxlhm.window.firmware_cfuncs import SIGNATURE, voidptr",
        glue.POLICY_LINE,
        "_k = fw.kernels_for(_policy)",
        "_fault_place, _fault_hit, _invalidate, _hint, _background = (_k.fault_place, _k.fault_hit, _k.invalidate,",
        "                                                              _k.hint, _k.background)",
    ]
    for name, ref in layout.imports.items():
        module, qualname = ref.split(":")
        lines.append(f"{name} = importlib.import_module({module!r}).{qualname}")
    return "\n".join(lines) + "\n" + _DISPATCH.format(state=layout.expr, n_ctx=layout.size, **OPS)


def _compile(policy: Policy, layout: _Layout):
    """The firmware cfunc for (policy, state shape): from this process, from numba's
    disk cache (cxlhm/jit.py), or compiled now."""
    module = glue.policy_module("window", policy, _module_source(layout), f"the {policy.name} firmware for the window")
    return module.firmware


class FirmwareBridge:
    """The firmware of one window, reachable from C: `address` is the cfunc to call,
    `ctx` the int64 array of raw pointers it takes. Holding this object keeps every
    array those pointers point into alive."""

    def __init__(self, policy: Policy, bt: btm.BlockTable, ps: tuple, counters: np.ndarray, clock: np.ndarray):
        self.policy = policy
        self.state = (bt, ps, counters, clock)
        layout = _Layout(self.state)
        self.cfunc = _compile(policy, layout)
        self.ctx = np.zeros(layout.size, np.int64)
        layout.fill(self.ctx)
        self.address = self.cfunc.address
        self.has_background = policy.background is not no_background

    def call(self, op: int, *args: int) -> tuple[int, np.ndarray]:
        """Call the firmware from Python (tests; the window itself goes through C,
        which takes the window's mutex first)."""
        a = np.zeros(8, np.int64)
        a[:len(args)] = args
        out = np.zeros(8, np.int64)
        r = self.cfunc.ctypes(self.ctx.ctypes.data_as(_int64_p), op, a.ctypes.data_as(_int64_p),
                              out.ctypes.data_as(_int64_p))
        return int(r), out
