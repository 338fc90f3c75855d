"""The data plane between one host and the service: a submission ring, a completion
ring and a payload buffer in one shared-memory segment (as io_uring lays them out), and
two eventfds to wake the other side. A miss, a write or a chunk put is a ring entry; the
bytes move through the shared buffer, never through the socket (which carries the
attach and the rare control requests: FLUSH, STATS).

Segment (a memfd the service makes, sealed against shrinking and growing; the host maps
it read-write):
  header (4096 B)   u64 SQ_TAIL (host: entries submitted), CQ_TAIL (service: entries
                    completed), 64 bytes apart
  SQ  DEPTH x 32 B  op | tenant index << 8 | tag << 32, offset, length, buffer offset
  CQ  DEPTH x 32 B  tag, status, v1, v2
  payload           PAYLOAD bytes: a READ's bytes land at its buffer offset, a WRITE's
                    or PUT's are taken from there; an error's message is put there
                    (v1 = its length)

The service trusts nothing in the segment or the eventfds: it keeps its own counts of
consumed and completed entries (the host may rewrite both tails), its eventfds are
non-blocking (a host that pushes a counter to its maximum, where a write would block,
costs itself its wake-ups, never the service a thread),
copies each entry out before checking it, checks the op, the tenant index against the
host's own tenants, the length and buffer offset against the buffer and the offset
against the partition, copies a WRITE's bytes out before the device and the mirror see
them (so both get the same bytes however the host changes the buffer meanwhile), and
reads into a buffer of its own before it installs the mirror and copies out to the host.
A host that scribbles on its segment can only get errors or wrong answers for itself.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import select
import threading
import time

import numpy as np

from cxlhm.pool.maps import unmap

DEPTH = 64
HEADER = 4096
SQ_TAIL, CQ_TAIL = 0, 8          # u64 word indices in the header (64 bytes apart)
ENTRY_WORDS = 4
PAYLOAD = 4 << 20
SQ_AT = HEADER
CQ_AT = SQ_AT + DEPTH * ENTRY_WORDS * 8
PAYLOAD_AT = CQ_AT + DEPTH * ENTRY_WORDS * 8
BYTES = PAYLOAD_AT + PAYLOAD
SPIN_S = 0.00005  # a host waits this long spinning on the completion before it sleeps on the eventfd


def _ring(fd: int) -> None:
    """Add 1 to an eventfd; a counter at its maximum (only a host writing huge values
    gets it there) already wakes its reader, so the 1 is not needed."""
    try:
        os.eventfd_write(fd, 1)
    except BlockingIOError:
        pass


def _drain(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass  # (woken, then the counter was read meanwhile)


class _Segment:
    def __init__(self, fd: int):
        self._mm = mmap.mmap(fd, BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.header = np.frombuffer(self._mm, np.uint64, HEADER // 8, 0)
        self.sq = np.frombuffer(self._mm, np.uint64, DEPTH * ENTRY_WORDS, SQ_AT).reshape(DEPTH, ENTRY_WORDS)
        self.cq = np.frombuffer(self._mm, np.uint64, DEPTH * ENTRY_WORDS, CQ_AT).reshape(DEPTH, ENTRY_WORDS)
        self.payload = np.frombuffer(self._mm, np.uint8, PAYLOAD, PAYLOAD_AT)

    def close(self) -> None:
        self.header = self.sq = self.cq = self.payload = None
        unmap(self._mm)
        self._mm = None


class ServiceRings(_Segment):
    """The service's side of one host's rings."""

    def __init__(self, host: str):
        self.fd = os.memfd_create(f"cxlhm-rings-{host}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, BYTES)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            super().__init__(self.fd)
        except BaseException:
            os.close(self.fd)
            raise
        self.submitted = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)   # the host rings it after submitting
        self.completed = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)   # the service rings it after completing
        self._poll = select.poll()
        self._poll.register(self.submitted, select.POLLIN)
        self.consumed = 0
        self.completions = 0  # the service's own count (CQ_TAIL in the segment is the host's to read, and write)
        self.malformed = 0
        self.stopping = False
        self._closing = threading.Lock()  # wake() and close() from different threads: never a reused fd

    def fds(self) -> list[int]:
        """Descriptors for the host: the segment, then the two eventfds (dup'd)."""
        return [os.dup(self.fd), os.dup(self.submitted), os.dup(self.completed)]

    def wait(self, timeout_ms: int = 200) -> None:
        """Until the host rings, or `timeout_ms` passed (the service's ring thread looks
        at whether the service is stopping between waits, so close() never waits on it)."""
        if self._poll.poll(timeout_ms):
            _drain(self.submitted)

    def wake(self) -> None:
        """Wake the service's ring thread (to stop it)."""
        self.stopping = True
        with self._closing:
            if self.submitted >= 0:
                _ring(self.submitted)

    def pending(self) -> list[np.ndarray]:
        """Entries submitted since the last call, each a private copy; a tail that
        rewound or leapt more than the ring is malformed: skipped, counted. The tail is
        a u64 that wraps (2**64 is a multiple of DEPTH, so slots stay in step)."""
        tail = int(self.header[SQ_TAIL])
        n = (tail - self.consumed) % (1 << 64)
        if n > DEPTH:
            self.malformed += 1
            self.consumed = tail
            return []
        out = [self.sq[(self.consumed + k) % DEPTH].copy() for k in range(n)]
        self.consumed = tail
        return out

    def complete(self, tag: int, status: int, v1: int = 0, v2: int = 0) -> None:
        at = self.completions
        self.cq[at % DEPTH] = (tag, status, v1, v2)
        self.completions = at + 1
        self.header[CQ_TAIL] = self.completions
        _ring(self.completed)

    def close(self) -> None:
        with self._closing:
            if self.fd < 0:
                return
            super().close()
            for fd in (self.fd, self.submitted, self.completed):
                os.close(fd)
            self.fd = self.submitted = self.completed = -1


class HostRings(_Segment):
    """A host's side: one request at a time (the caller serialises)."""

    def __init__(self, fd: int, submitted: int, completed: int, watch: int = -1):
        """`watch`: a descriptor that turns readable or hangs up when the service goes
        (the host's socket: the service never writes to it unasked)."""
        try:
            if os.fstat(fd).st_size != BYTES:
                raise OSError(f"a ring segment of {os.fstat(fd).st_size} bytes; {BYTES} expected")
            super().__init__(fd)
        finally:
            os.close(fd)
        self.submitted, self.completed = submitted, completed
        self._poll = select.poll()
        self._poll.register(completed, select.POLLIN)
        self.watch = watch
        if watch >= 0:
            self._poll.register(watch, select.POLLIN | select.POLLHUP | select.POLLERR)
        self.tag = int(self.header[SQ_TAIL])
        self._lock = threading.Lock()

    def call(self, op: int, tenant_index: int, offset: int, length: int, alive) -> tuple[int, int, int]:
        """Submit one entry (its payload already at buffer offset 0) and wait for its
        completion: (status, v1, v2). The watched socket stirring, or `alive()` (asked
        each second) saying False, ends the wait with ConnectionError."""
        tail = int(self.header[SQ_TAIL])
        want = int(self.header[CQ_TAIL]) + 1
        tag = tail & 0xFFFFFFFF
        self.sq[tail % DEPTH] = (op | tenant_index << 8 | tag << 32, offset, length, 0)
        self.header[SQ_TAIL] = (tail + 1) % (1 << 64)
        _ring(self.submitted)
        spin_until = time.perf_counter() + SPIN_S
        while int(self.header[CQ_TAIL]) < want:
            if time.perf_counter() < spin_until:
                continue
            events = self._poll.poll(1000)
            for fd, _ in events:
                if fd == self.completed:
                    _drain(self.completed)
                else:
                    raise ConnectionError("the service closed this host's connection")
            if not events and not alive():
                raise ConnectionError("the service stopped answering its rings")
        entry = self.cq[(want - 1) % DEPTH].copy()
        if int(entry[0]) != tag:
            raise ConnectionError(f"completion {int(entry[0])} for request {tag}: the rings are out of step")
        return int(entry[1]), int(entry[2]), int(entry[3])

    def close(self) -> None:
        super().close()
        for fd in (self.submitted, self.completed):
            if fd >= 0:
                os.close(fd)
        self.submitted = self.completed = -1
