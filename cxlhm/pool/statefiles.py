"""The pool service's state folder: who owns it, who holds it, and how files in it are
written.

  check_folder    the folder must be a real directory (not a symlink) owned by this
                  user and writable by nobody else: otherwise another user could plant
                  links or files the service would follow or trust
  hold_folder     an exclusive lock (flock on <state>/lock) for the service's
                  lifetime: a second service on the same folder is refused, not left
                  to overwrite the first one's layout
  write_atomic    a new file beside the old one, opened O_CREAT|O_EXCL|O_NOFOLLOW (a
                  planted symlink is never followed), written, fsynced, renamed over
  read_file       O_NOFOLLOW, a regular file of this user, at most `limit` bytes
  claim_socket    room for the service's socket: nothing there, or a stale socket of ours
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from pathlib import Path


class StateError(OSError):
    """The state folder or a file in it cannot be used; the message says why."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()  # the message alone, without "[Errno N]"


def check_folder(path: Path, uid: int | None = None) -> None:
    uid = os.geteuid() if uid is None else uid
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StateError(exc.errno, f"state folder {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StateError(errno.ENOTDIR, f"state folder {path} is not a directory (a symlink or a file); "
                                        "give a real folder")
    if st.st_uid != uid:
        raise StateError(errno.EPERM, f"state folder {path} belongs to uid {st.st_uid}, not this user ({uid}); "
                                      "give a folder of your own")
    if st.st_mode & 0o022:
        raise StateError(errno.EPERM, f"state folder {path} is writable by group or others (mode "
                                      f"{stat.S_IMODE(st.st_mode):o}); chmod go-w it or give another")


def make_folder(path: Path) -> None:
    """Create the state folder (0700) if missing, then check it."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(exc.errno, f"state folder {path}: {exc.strerror}") from None
    check_folder(path)


def hold_folder(path: Path) -> int:
    """The fd holding <state>/lock exclusively; StateError if another process holds it."""
    fd = os.open(path / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateError(errno.EBUSY, f"state folder {path} is in use by another pool service (pid {holder}); "
                                          "one service owns a state folder at a time") from None
        raise StateError(exc.errno, f"cannot lock {path / 'lock'}: {exc.strerror}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` whole or not at all (never through a symlink)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        os.unlink(tmp)  # a leftover of a killed writer, or something planted: never opened
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_file(path: Path, limit: int = 1 << 20) -> bytes:
    """A regular file of this user, read without following a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateError(exc.errno, f"{path} is a symlink; the state folder holds only regular files") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise StateError(errno.EPERM, f"{path} is not a regular file of this user")
        if st.st_size > limit:
            raise StateError(errno.EFBIG, f"{path} holds {st.st_size} bytes; at most {limit} expected")
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def claim_socket(path: str) -> None:
    """Make room for our socket at `path`: nothing there, or a stale socket of this user
    (nobody answers on it), which is removed. Anything else is refused, never deleted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StateError(errno.EEXIST, f"--socket {path} exists and is not a socket; "
                                                  "refusing to replace it: give a free path")
    if st.st_uid != os.geteuid():
        raise StateError(errno.EPERM, f"--socket {path} is another user's socket (uid {st.st_uid}); "
                                                 "refusing to replace it")
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # a socket nobody listens on: left by a killed service
            return
        except OSError as exc:
            raise StateError(exc.errno or errno.EBUSY, f"--socket {path}: {exc}") from None
    raise StateError(errno.EADDRINUSE, f"--socket {path}: another service is serving on it; "
                                                  "stop it first or give another path")
