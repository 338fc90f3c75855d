"""Attaching to a file that another process shares through mmap (the mailbox register
block, the embedded content directory): open, check it is big enough, map it, and hand
fd and mapping to the object that owns them - closing both if any step fails."""
from __future__ import annotations

import mmap
import os
from typing import Callable, TypeVar

T = TypeVar("T")


def attach_shared(name: str, min_size: int, too_small: Callable[[int], Exception],
                  wrap: Callable[[mmap.mmap, int], T]) -> T:
    """`wrap(mapping, fd)` over the whole of file `name`, mapped shared read-write;
    `too_small(size)` is raised when the file holds fewer than `min_size` bytes."""
    fd = os.open(name, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < min_size:
            raise too_small(size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    try:
        return wrap(mm, fd)
    except BaseException:
        mm.close()
        os.close(fd)
        raise


# a killed owner's lock outlives it for a moment: the kernel drops a flock when the last
# reference to the open file goes, and an io_uring ring torn down in the background holds
# one for ~50-100 ms after the process is gone
OWNER_EXIT_WAIT_S = 0.5


def lock_exclusive(fd: int, wait_s: float = OWNER_EXIT_WAIT_S) -> float | None:
    """flock(fd, LOCK_EX) without blocking for longer than `wait_s`: the seconds it
    waited (0.0 when free at once), or None if another owner still held it then."""
    import fcntl
    import time
    started = time.monotonic()
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return time.monotonic() - started
        except BlockingIOError:
            if time.monotonic() - started >= wait_s:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
