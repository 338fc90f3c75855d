"""KV chunks shared across hosts: chunks live in a tenant partition of the pooled device,
a global content directory says where, and every read is verified.

    kv = PooledKV(host.tenant("t"), directory)
    kv.put(fingerprint, data, tokens=256)               # store + publish
    found = kv.get_many(fingerprints)                    # sparse: a hit bitmap and the bytes
    kv.prefetch(fingerprints, session=7)                 # NEXT_PREFIX to the firmware, for any host's chunks

A chunk on the device is a 64-byte header (magic, fingerprint, length, xxh3-64 of the
payload) and the payload. A directory entry is trusted for nothing: the header and the
checksum decide, so an entry whose chunk was overwritten (ring reuse), a stale or torn
entry, or a failed read is a miss - counted as stale, its bytes as wasted - and the
caller recomputes. Locations of other tenants, or in another instance's local tier
with no peer reader given, are misses too (this host cannot read them).

Nothing the directory holds or does stops a lookup: an entry of an unknown kind or
outside the partition is a miss (counted: bad_entries), and a directory that cannot
answer (Redis down, a truncated table) is misses plus a counted error
(directory_errors) - `put` then returns the location of the chunk it stored, unpublished.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import xxhash

from cxlhm.pool import protocol as P
import logging

from host_runtime.directory import (ContentDirectory, DirectoryMetrics, DirectoryUnavailable, Location, LocationKind,
                                    SparseHits)

log = logging.getLogger("cxlhm.pooled_kv")

HEADER = P.CHUNK_HEADER.size


def chunk_bytes(fingerprint: bytes, data) -> bytes:
    payload = memoryview(data).cast("B")
    head = P.CHUNK_HEADER.pack(P.CHUNK_MAGIC, fingerprint[:32].ljust(32, b"\0"), len(payload),
                               xxhash.xxh3_64_intdigest(payload), 0)
    return head + bytes(payload)


def verify_chunk(fingerprint: bytes, raw: np.ndarray, length: int) -> bool:
    if raw.shape[0] < HEADER + length:
        return False
    magic, fp, n, digest, _ = P.CHUNK_HEADER.unpack_from(raw[:HEADER].tobytes())
    return (magic == P.CHUNK_MAGIC and fp == fingerprint[:32].ljust(32, b"\0") and n == length
            and xxhash.xxh3_64_intdigest(raw[HEADER:HEADER + length]) == digest)


class PooledKV:
    def __init__(self, tenant, directory: ContentDirectory, *, metrics: DirectoryMetrics | None = None,
                 peer_reader: Callable[[bytes, Location], bytes | None] | None = None):
        self.tenant, self.directory = tenant, directory
        self.host_id = tenant.host.host_id
        self.metrics = metrics if metrics is not None else DirectoryMetrics()
        self.peer_reader = peer_reader
        self._prefetched: dict[bytes, bool] = {}  # fingerprint -> stored by another host

    # ------------------------------------------------------------ store
    def put(self, fingerprint: bytes, data, *, tokens: int = 0) -> Location:
        offset, generation = self.tenant.put_chunk(chunk_bytes(fingerprint, data))
        where = Location(LocationKind.POOL, self.host_id, self.tenant.id, offset,
                         memoryview(data).nbytes, generation)
        self.metrics.metadata_ops += 1
        try:
            self.directory.publish(fingerprint, where)
        except DirectoryUnavailable as exc:  # stored, not findable: a miss for others, not an error here
            self._directory_failed(exc)
        return where

    def _directory_failed(self, exc: Exception) -> None:
        self.metrics.directory_errors += 1
        log.warning("pooled KV: %s (treated as misses)", exc)

    # ------------------------------------------------------------ lookup
    def lookup_sparse(self, fingerprints: Sequence[bytes]) -> SparseHits:
        """The directory's answer, unverified (best-effort)."""
        fps = list(fingerprints)
        try:
            hits = self.directory.lookup_sparse(fps)
        except DirectoryUnavailable as exc:
            self._directory_failed(exc)
            return SparseHits(np.zeros(len(fps), bool), np.zeros((len(fps), 3), np.uint64))
        self.metrics.metadata_ops += len(hits)
        return hits

    def _location(self, hits: SparseHits, i: int) -> Location | None:
        """Entry i as a Location this tenant can read, or None (counted as a bad entry)."""
        try:
            where = hits.location(i)
        except ValueError:  # an unknown kind, a field out of range: written by something else
            self.metrics.bad_entries += 1
            return None
        if where.kind is LocationKind.POOL and where.tenant == self.tenant.id \
                and where.offset + HEADER + where.length > self.tenant.size:
            self.metrics.bad_entries += 1
            return None
        return where

    def get_many(self, fingerprints: Sequence[bytes], *, tokens_per_chunk: int = 0) -> tuple[np.ndarray, list]:
        """Sparse get: (verified hit bitmap, the payloads as uint8 arrays or None)."""
        fps = list(fingerprints)
        hits = self.lookup_sparse(fps)
        m = self.metrics
        m.keys_looked_up += len(fps)
        ok = np.zeros(len(fps), bool)
        out: list = [None] * len(fps)
        for i in np.flatnonzero(hits.hit):
            m.entries_returned += 1
            where = self._location(hits, int(i))
            if where is None:
                continue
            data = self._read(fps[i], where)
            if data is None:
                continue
            ok[i], out[i] = True, data
            m.verified_hits += 1
            m.useful_bytes += data.shape[0]
            m.useful_tokens += tokens_per_chunk
            remote = where.host != self.host_id
            m.remote_hits += remote
            if self._prefetched.pop(fps[i], None) is not None:
                m.prefetched_used += 1
                m.prefetched_remote_used += remote
        return ok, out

    def get(self, fingerprint: bytes) -> np.ndarray | None:
        return self.get_many([fingerprint])[1][0]

    def prefix_hits(self, fingerprints: Sequence[bytes], **kw) -> int:
        """Chunks of the longest verified prefix (a prefix match stops at the first gap)."""
        ok, _ = self.get_many(fingerprints, **kw)
        misses = np.flatnonzero(~ok)
        return int(misses[0]) if misses.shape[0] else len(ok)

    def _read(self, fingerprint: bytes, where: Location) -> np.ndarray | None:
        m = self.metrics
        if where.kind is LocationKind.INSTANCE:
            raw = self.peer_reader(fingerprint, where) if self.peer_reader is not None else None
            if raw is None:
                m.stale_entries += self.peer_reader is not None
                return None
            return np.frombuffer(raw, np.uint8)
        if where.tenant != self.tenant.id or where.offset + HEADER + where.length > self.tenant.size:
            return None  # not this tenant's partition: unreadable here, and never another tenant's bytes
        raw = np.empty(HEADER + where.length, np.uint8)
        try:
            self.tenant.read_into(where.offset, raw)
        except P.PoolError:
            raw = None
        if raw is None or not verify_chunk(fingerprint, raw, where.length):
            m.stale_entries += 1
            m.wasted_bytes += HEADER + where.length
            return None
        return raw[HEADER:]

    # ------------------------------------------------------------ hints
    def prefetch(self, fingerprints: Sequence[bytes], session: int, deadline_ns: int = 0) -> int:
        """Tell the firmware (this host's mailbox) which chunks this session reads next,
        wherever they were stored from; returns the chunks hinted."""
        fps = list(fingerprints)
        hits = self.lookup_sparse(fps)
        ranges = []
        remote = 0
        for i in np.flatnonzero(hits.hit):
            where = self._location(hits, int(i))
            if where is not None and where.kind is LocationKind.POOL and where.tenant == self.tenant.id:
                ranges.append((self.tenant.window_base + where.offset, HEADER + where.length))
                self._prefetched[fps[i]] = where.host != self.host_id
                remote += where.host != self.host_id
        if ranges:
            self.tenant.host.hints.next_prefix(session, ranges, deadline_ns)
        m = self.metrics
        m.prefetched += len(ranges)
        m.prefetched_remote += remote
        return len(ranges)
