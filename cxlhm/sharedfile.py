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
