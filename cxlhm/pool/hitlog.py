"""Mirror hits, reported to the firmware in batches.

A host that loads blocks from a tenant's mirror never asks the service, so without a
report the firmware would not see that traffic: no recency, no hit counted. Each host
therefore appends every mirror hit to a ring of its own in shared memory (no system
call: two stores), and the service drains every host's ring every `REPORT_INTERVAL_S`
and replays the hits as device reads of the same blocks (the firmware counts them as
hits and updates its recency as for any read; a block it had since evicted is a miss
and comes back into device DRAM, as a host's read through the device would bring it).

Layout (a memfd the service makes, sealed against shrinking and growing, mapped
read-write by the host): a 64-byte header (u64 tail: entries the host has appended),
then ENTRIES u64 entries, entry = tenant index << 56 | n_blocks << 40 | first block of
the partition. The service keeps its own count of what it consumed, so nothing a host
writes there can make the service read outside the ring, report blocks outside the
host's own partitions, or spend more than ENTRIES reports per pass; a host that
appends faster than the service drains loses its oldest reports (advisory data).

Reports cost the host two stores and the service a device read each, so the service
also bounds what one pass replays: at most `budget` blocks (the service gives the
blocks of the host's tenants' mirrors plus ENTRIES: what a host really hitting that
much in one pass would cost it), and of those only blocks the tenant's mirror holds at
the time (a block the mirror does not hold was not a hit). The rest is dropped and
counted.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import threading

import numpy as np

from cxlhm.pool.maps import unmap

ENTRIES = 4096
HEADER_WORDS = 8
TAIL = 0
BYTES = (HEADER_WORDS + ENTRIES) * 8
MAX_BLOCKS = 0xFFFF
REPORT_INTERVAL_S = 0.01


def _map(fd: int) -> tuple[mmap.mmap, np.ndarray, np.ndarray]:
    mm = mmap.mmap(fd, BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    words = np.frombuffer(mm, np.uint64)
    return mm, words[:HEADER_WORDS], words[HEADER_WORDS:]


class HitLog:
    """The service's side of one host's hit ring."""

    def __init__(self, host: str):
        self.fd = os.memfd_create(f"cxlhm-hits-{host}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, BYTES)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._mm, self._header, self._ring = _map(self.fd)
        except BaseException:
            os.close(self.fd)
            raise
        self.consumed = 0
        self.reported_blocks = 0
        self.dropped = 0      # reports overwritten before they were drained, or malformed
        self._lock = threading.Lock()

    def drain(self, n_tenants: int, partition_blocks: int, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """(tenant index, partition block) of each block hit since the last drain,
        entries checked against the host's own partitions (in grant order), at most
        `budget` blocks (the first ones; the rest dropped, counted)."""
        with self._lock:
            if self._ring is None:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            tail = int(self._header[TAIL])
            if tail < self.consumed or tail - self.consumed > ENTRIES:  # rewound or lapped: keep the last ring
                self.dropped += max(0, tail - self.consumed - ENTRIES) if tail >= self.consumed else 0
                self.consumed = max(0, tail - ENTRIES)
            n = tail - self.consumed
            if n == 0:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            idx = np.arange(self.consumed, tail, dtype=np.uint64) % np.uint64(ENTRIES)
            entries = self._ring[idx].copy()  # a private copy: the host may write meanwhile
            self.consumed = tail
        tenant = (entries >> np.uint64(56)).astype(np.int64)
        count = ((entries >> np.uint64(40)) & np.uint64(MAX_BLOCKS)).astype(np.int64)
        first = (entries & np.uint64((1 << 40) - 1)).astype(np.int64)
        ok = (tenant < n_tenants) & (count > 0) & (first + count <= partition_blocks)
        self.dropped += int(n - np.count_nonzero(ok))
        tenant, count, first = tenant[ok], count[ok], first[ok]
        ends = np.cumsum(count)
        if ends.shape[0] and ends[-1] > budget:  # cut to the budget before expanding to blocks
            keep = int(np.searchsorted(ends, budget, side="left")) + 1
            tenant, count, first = tenant[:keep], count[:keep].copy(), first[:keep]
            over = int(ends[keep - 1]) - budget
            count[-1] -= over
            self.dropped += int(ends[-1]) - budget
        total = int(count.sum())
        starts = np.repeat(np.cumsum(count) - count, count)
        blocks = np.repeat(first, count) + (np.arange(total, dtype=np.int64) - starts)
        self.reported_blocks += total
        return np.repeat(tenant, count), blocks

    def close(self) -> None:
        with self._lock:
            self._header = self._ring = None
            if self._mm is not None:
                self._mm.close()
                self._mm = None
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class HitRecorder:
    """A host's side: append a hit (two stores; a lock between its own threads)."""

    def __init__(self, fd: int):
        try:
            if os.fstat(fd).st_size != BYTES:
                raise OSError(f"a hit log of {os.fstat(fd).st_size} bytes; {BYTES} expected")
            self._mm, self._header, self._ring = _map(fd)
        finally:
            os.close(fd)
        self._lock = threading.Lock()
        self._tail = int(self._header[TAIL])  # the host's own count (the shared one is for the service)

    def record(self, tenant_index: int, first_block: int, n_blocks: int) -> None:
        if self._ring is None:
            return
        with self._lock:
            while n_blocks > 0:
                take = min(n_blocks, MAX_BLOCKS)
                tail = self._tail
                self._ring[tail % ENTRIES] = tenant_index << 56 | take << 40 | first_block
                self._tail = tail + 1
                self._header[TAIL] = tail + 1
                first_block += take
                n_blocks -= take

    def close(self) -> None:
        with self._lock:
            self._header = self._ring = None
            unmap(self._mm)
            self._mm = None
