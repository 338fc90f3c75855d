"""The host-loadable part of the pooled device's DRAM: one segment per tenant that the
service writes and every host granted the tenant maps read-only.

Why a segment of its own: the emulated device's DRAM arena and block table are private
to the service process (the firmware moves slots at will), so a host cannot safely load
from them without asking. The service therefore keeps, per tenant, a direct-mapped set
of whole blocks it has just read or written - what a host may load without a round trip
- and invalidates an entry before it changes the block on the device.

Entry layout: 64-byte header (seq, tag = partition block + 1, xxh3-64 of the block),
then the block. A host's read (`MirrorReader.read`):
  seq even, tag matches  ->  copy the block  ->  xxh3 of the copy matches the header
  and seq unchanged      ->  a hit; anything else is a miss (ask the service).
The hash check makes a torn copy (a writer racing the reader) a miss, never wrong bytes.

What a host cannot do to it: the memfd is sealed (no shrinking or growing, no write(2)
and no writable mapping from anyone after the service's own; F_SEAL_SEAL so the seals
stay) and the host is sent a read-only descriptor, so it can neither forge an entry
for other hosts nor truncate the segment under the service (which would SIGBUS it).

Service lives (`ServiceLife`): a counter in <state>/life that every service start and
every clean close bumps; hosts map it read-only beside the mirrors and a read counts as
a hit only while the counter still holds the life they attached in. A host left over
from a service that was killed and restarted (its mirror mapping frozen, never
invalidated again) therefore misses, and its next request says why.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import stat
from pathlib import Path

import numpy as np
import xxhash

from cxlhm.pool.maps import unmap

HEADER = 64
SEQ, TAG, SUM = 0, 1, 2
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
LIFE_BYTES = 4096


def read_only_fd(fd: int) -> int:
    """A new read-only descriptor of the file open as `fd` (to hand to a host)."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)


class ServiceLife:
    """The service's life counter (see the module docstring)."""

    def __init__(self, state_dir: Path | None):
        if state_dir is None:
            self.fd = os.memfd_create("cxlhm-pool-life", os.MFD_CLOEXEC)
        else:
            self.fd = os.open(state_dir / "life", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{state_dir}/life is not a regular file")
            if st.st_size < LIFE_BYTES:
                os.ftruncate(self.fd, LIFE_BYTES)
            self._mm = mmap.mmap(self.fd, LIFE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self._word = np.frombuffer(self._mm, np.uint64, 1)
        self._word[0] += 1
        self.value = int(self._word[0])

    def end(self) -> None:
        """This life is over: hosts attached in it miss from now on."""
        if self._mm is not None:
            self._word[0] += 1
            self._word = None
            self._mm.flush()
            self._mm.close()
            self._mm = None
            os.close(self.fd)


class LifeReader:
    def __init__(self, fd: int, expected: int):
        try:
            self._mm = mmap.mmap(fd, LIFE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        self.word = np.frombuffer(self._mm, np.uint64, 1)
        self.expected = expected

    @property
    def current(self) -> bool:
        return self.word is not None and int(self.word[0]) == self.expected

    def close(self) -> None:
        self.word = None
        unmap(self._mm)
        self._mm = None


def segment_bytes(entries: int, block_size: int) -> int:
    return entries * (HEADER + block_size)


class _Segment:
    def __init__(self, mm: mmap.mmap, entries: int, block_size: int):
        self._mm = mm
        self.entries, self.block_size = entries, block_size
        stride = HEADER + block_size
        raw = np.frombuffer(mm, np.uint8).reshape(entries, stride)
        self.headers = raw[:, :HEADER].view(np.uint64)  # (entries, 8)
        self.blocks = raw[:, HEADER:]

    def entry(self, block: int) -> int:
        return block % self.entries

    def close(self) -> None:
        self.headers = self.blocks = None
        unmap(self._mm)
        self._mm = None


class MirrorWriter(_Segment):
    """The service's side: owns the memfd; hosts get the fd (and map it read-only)."""

    def __init__(self, name: str, entries: int, block_size: int):
        self.fd = os.memfd_create(f"cxlhm-mirror-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, segment_bytes(entries, block_size))
            mm = mmap.mmap(self.fd, segment_bytes(entries, block_size), mmap.MAP_SHARED,
                           mmap.PROT_READ | mmap.PROT_WRITE)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)  # the service's own mapping stays writable
        except BaseException:
            os.close(self.fd)
            raise
        super().__init__(mm, entries, block_size)
        self.installs = self.invalidations = 0

    def _runs(self, first_block: int, n_blocks: int):
        """(first entry, first block, count) of the contiguous entry runs that blocks
        [first_block, first_block + n_blocks) map to (at most two: the mirror wraps)."""
        while n_blocks > 0:
            e = first_block % self.entries
            k = min(n_blocks, self.entries - e)
            yield e, first_block, k
            first_block += k
            n_blocks -= k

    def invalidate(self, first_block: int, n_blocks: int) -> None:
        """Before the blocks change on the device: no host may hit their old copies."""
        h = self.headers
        runs = self._runs(first_block, n_blocks) if n_blocks <= self.entries \
            else [(0, 0, self.entries)]  # a range wider than the mirror: any entry may hold one of its blocks
        for e, _, k in runs:
            tags = h[e:e + k, TAG]
            hit = np.flatnonzero((tags > np.uint64(first_block)) & (tags <= np.uint64(first_block + n_blocks)))
            if not hit.shape[0]:
                continue
            rows = hit + e
            h[rows, SEQ] += np.uint64(1)  # odd: readers back off
            h[rows, TAG] = 0
            h[rows, SEQ] += np.uint64(1)
            self.invalidations += int(hit.shape[0])

    def install(self, first_block: int, data: np.ndarray) -> None:
        """Whole blocks just read from or written to the device, in block order."""
        bs = self.block_size
        n = data.shape[0] // bs
        skip = max(0, n - self.entries)  # more blocks than entries: the last ones win
        h = self.headers
        digest = xxhash.xxh3_64_intdigest
        for e, b, k in self._runs(first_block + skip, n - skip):
            rows = h[e:e + k]
            src = data[(b - first_block) * bs:(b - first_block + k) * bs].reshape(k, bs)
            rows[:, SEQ] += np.uint64(1)  # odd: readers treat the entries as missing
            rows[:, TAG] = 0
            self.blocks[e:e + k] = src
            rows[:, SUM] = np.array([digest(self.blocks[e + i]) for i in range(k)], np.uint64)
            rows[:, TAG] = np.arange(b + 1, b + 1 + k, dtype=np.uint64)
            rows[:, SEQ] += np.uint64(1)
            self.installs += k

    def close(self) -> None:
        super().close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class MirrorReader(_Segment):
    """A host's read-only mapping of a tenant's mirror."""

    def __init__(self, fd: int, entries: int, block_size: int, life: LifeReader | None = None):
        try:
            size = os.fstat(fd).st_size
            if size != segment_bytes(entries, block_size):
                raise OSError(f"a mirror of {size} bytes; {entries} entries of {block_size}-byte blocks expected")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        super().__init__(mm, entries, block_size)
        self.life = life

    def _read_wrapped(self, offset: int, out: np.ndarray, first: int, last: int) -> bool:
        """read() of a range whose entries wrap around the end of the segment: block by block."""
        bs, n = self.block_size, out.shape[0]
        h, blocks = self.headers, self.blocks
        for b in range(first, last + 1):
            e = b % self.entries
            seq = int(h[e, SEQ])
            if seq & 1 or int(h[e, TAG]) != b + 1:
                return False
            want = int(h[e, SUM])
            lo = max(offset, b * bs)
            hi = min(offset + n, (b + 1) * bs)
            whole = hi - lo == bs
            dst = out[lo - offset:hi - offset] if whole else np.empty(bs, np.uint8)
            np.copyto(dst, blocks[e])
            if int(h[e, SEQ]) != seq or xxhash.xxh3_64_intdigest(dst) != want:
                return False
            if not whole:
                out[lo - offset:hi - offset] = dst[lo - b * bs:hi - b * bs]
        return self.life is None or self.life.current

    def read(self, offset: int, out: np.ndarray) -> bool:
        """Fill `out` with the bytes at partition `offset` if every block is mirrored
        and verifies; False (out partly written) otherwise."""
        bs = self.block_size
        n = out.shape[0]
        if n == 0:
            return True
        if offset < 0 or self.headers is None:
            return False
        first, last = offset // bs, (offset + n - 1) // bs
        k = last - first + 1
        if k > self.entries:
            return False
        e0 = first % self.entries
        if e0 + k > self.entries:
            return self._read_wrapped(offset, out, first, last)
        # the blocks sit in entries e0 .. e0+k-1: check, copy and verify them together
        # (each step a call into compiled code, so the loads happen in this order)
        hdr = self.headers[e0:e0 + k]
        rows = hdr[:, :SUM + 1].tolist()  # (seq, tag, sum) per entry, in one pass (numpy reductions cost more)
        for i, (seq, tag, _) in enumerate(rows):
            if seq & 1 or tag != first + 1 + i:
                return False
        aligned = offset == first * bs and n == k * bs
        dst = out.reshape(k, bs) if aligned else np.empty((k, bs), np.uint8)  # (per call: threads share readers)
        np.copyto(dst, self.blocks[e0:e0 + k])
        digest = xxhash.xxh3_64_intdigest
        for i in range(k):
            if digest(dst[i]) != rows[i][SUM]:
                return False
        if hdr[:, SEQ].tolist() != [row[SEQ] for row in rows]:
            return False
        if not aligned:
            out[:] = dst.reshape(-1)[offset - first * bs:offset - first * bs + n]
        return self.life is None or self.life.current  # checked last: a life that ended meanwhile is a miss
