"""Can this process run the load/store window, and if not, what is the fix.

The window needs userfaultfd with write-protect mode on anonymous memory. What stops
it, in the order people meet it:

* `vm.unprivileged_userfaultfd=0` (the default on most distributions) and no
  CAP_SYS_PTRACE: the syscall answers EPERM. The native side then tries
  /dev/userfaultfd (file permissions decide) and, failing that, a user-mode-only
  userfaultfd, which unprivileged processes may always create (see `USER_MODE_ONLY`).
* a seccomp profile (Docker's and Podman's defaults) that blocks the syscall: EPERM
  or ENOSYS.
* a kernel without CONFIG_USERFAULTFD (ENOSYS) or without write-protect support for
  anonymous memory (Linux < 5.7, or an architecture without uffd-wp).

None of this affects the explicit-access API (load/store/read_into/write_from).
"""
from __future__ import annotations

import errno
import os

STAGE_CREATE, STAGE_API, STAGE_REGISTER, STAGE_OTHER = 1, 2, 3, 4

USER_MODE_ONLY = (
    "userfaultfd runs in user-mode-only mode (vm.unprivileged_userfaultfd=0 and no CAP_SYS_PTRACE): plain "
    "loads and stores on the window work, but a system call handed a window address that is not resident "
    "(read(2) into it, O_DIRECT I/O from it) fails with EFAULT. Fix: `sysctl -w vm.unprivileged_userfaultfd=1`, "
    "run with CAP_SYS_PTRACE, or give this user read/write access to /dev/userfaultfd."
)


class WindowUnavailable(RuntimeError):
    """The load/store window cannot run in this process; the message names the fix.
    The explicit-access API is unaffected."""

    def __init__(self, message: str, errno_: int = 0):
        super().__init__(message)
        self.errno = errno_


def explain(stage: int, err: int, detail: str) -> str:
    """A message for a failed window open: what failed, why, and what to do."""
    name = errno.errorcode.get(err, str(err))
    prefix = f"the load/store window needs userfaultfd, which is unavailable here ({detail}; {name})"
    if stage == STAGE_CREATE and err == errno.EPERM:
        return (f"{prefix}. Either vm.unprivileged_userfaultfd=0 and this process (uid {os.geteuid()}) lacks "
                "CAP_SYS_PTRACE - fix: `sysctl -w vm.unprivileged_userfaultfd=1`, run with CAP_SYS_PTRACE, or "
                "give this user read/write access to /dev/userfaultfd (Linux 6.1+) - or a seccomp profile blocks "
                "the syscall - fix: Docker/Podman `--security-opt seccomp=unconfined` or a profile allowing "
                "userfaultfd. The explicit-access API (mode: explicit) still works.")
    if stage == STAGE_CREATE and err == errno.ENOSYS:
        return (f"{prefix}. The kernel has no userfaultfd (CONFIG_USERFAULTFD=n) or a seccomp filter answers "
                "ENOSYS for it - fix: a kernel with CONFIG_USERFAULTFD=y, or a seccomp profile that allows "
                "userfaultfd. The explicit-access API (mode: explicit) still works.")
    if stage == STAGE_CREATE and err in (errno.EMFILE, errno.ENFILE):
        return f"{prefix}. Out of file descriptors - fix: raise `ulimit -n`."
    if stage in (STAGE_API, STAGE_REGISTER) and err in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return (f"{prefix}. The kernel's userfaultfd lacks write-protect mode for anonymous memory, which the "
                "window uses to track written pages - fix: Linux 5.7+ on x86-64 or arm64 "
                "(CONFIG_HAVE_ARCH_USERFAULTFD_WP); UFFDIO_MOVE (Linux 6.8+) and UFFDIO_POISON (6.6+) are used "
                "when present. The explicit-access API (mode: explicit) still works.")
    if stage == STAGE_REGISTER and err == errno.ENOMEM:
        return (f"{prefix}. The window's address range could not be reserved - fix: a smaller capacity, or "
                "check `ulimit -v` and vm.max_map_count.")
    return f"{prefix}. The explicit-access API (mode: explicit) still works."


def probe() -> str | None:
    """None when a window can be opened in this process, else the reason (with the fix).
    Opens and closes a one-block window without starting its service thread."""
    from cxlhm.media import native

    try:
        ffi, lib = native.load()
    except native.NativeUnavailable as exc:
        return f"the native extension is unavailable: {exc}"
    params = ffi.new("struct cxlhm_window_params *")
    params.capacity = params.block_size = params.granule = 4096
    params.n_slots = params.n_staging = 1
    params.sample_bytes = 4096
    params.ssd_fd = -1
    params.queue_depth = 1
    stage, err_no = ffi.new("int *"), ffi.new("int *")
    message = ffi.new("char[256]")
    w = lib.cxlhm_window_open(params, stage, err_no, message, 256)
    if w == ffi.NULL:
        if stage[0] == STAGE_OTHER:
            return f"the window could not be set up: {ffi.string(message).decode()}"
        return explain(stage[0], err_no[0], ffi.string(message).decode())
    lib.cxlhm_window_close(w, 0, ffi.NULL, 0)
    return None
