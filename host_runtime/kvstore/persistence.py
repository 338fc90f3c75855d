"""KVStore's persistent index: open and replay the journal, compact it, flush (the
point from which committed chunks survive a crash) and close. Part of KVStore."""
from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path

from host_runtime.allocator import AllocatorError, ExtentAllocator
from host_runtime.kvstore.entries import INDEX_FORMAT, READABLE_FORMATS, Entry, IndexCorrupt
from host_runtime.kvstore.journal import (CLEAN_CLOSE, FLUSH, Journal, chunk_fingerprint, fp_record, parse_records,
                                          put_record, tenant_record)

log = logging.getLogger("cxlhm.kvstore")


class PersistenceMixin:
    # ------------------------------------------------------------ persistence
    def _index_path(self, index_path) -> Path | None:
        if index_path is False:
            return None
        if index_path is not None:
            return Path(index_path)
        image = self.handle.image_path
        return None if image is None else Path(image + ".kvindex")

    def _meta(self) -> dict:
        return {"format": INDEX_FORMAT, "base": self.base, "capacity": self.capacity, "grain": self.grain,
                "secret": self._secret.hex(), "image": self._image_identity()}

    def _image_identity(self) -> list | None:
        image = self.handle.image_path
        if image is None:
            return None
        st = os.stat(image)
        return [st.st_dev, st.st_ino]

    def _open_index(self, path: Path) -> None:
        existed = path.exists() and path.stat().st_size > 0
        self._journal = Journal(path)
        try:
            if existed:
                self._replay(self._journal.read_all(), path)
            self._compact()
        except BaseException:
            self._journal.close()
            self._journal = None
            raise

    def _replay(self, payloads: list[bytes], path: Path) -> None:
        if not payloads or payloads[0][:1] != b"M":
            raise IndexCorrupt(f"{path}: not a cxlhm KV index (delete it to start empty)")
        try:
            meta = json.loads(payloads[0][1:])
            bytes.fromhex(meta["secret"])
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexCorrupt(f"{path}: its header does not decode ({exc}); delete the index to start empty") from None
        mine = self._meta()
        if meta.get("format") not in READABLE_FORMATS:
            raise IndexCorrupt(f"{path}: index format {meta.get('format')!r}, this store reads {READABLE_FORMATS}")
        for field in ("base", "capacity", "grain"):
            if meta.get(field) != mine[field]:
                raise IndexCorrupt(f"{path}: index was written for {field}={meta.get(field)}, this store has "
                                   f"{mine[field]} (open the store with the same window and grain, or delete the index)")
        if meta.get("image") is not None and mine["image"] is not None and meta["image"] != mine["image"]:
            log.warning("%s: the device image was replaced since the index was written; starting empty", path)
            self._secret = bytes.fromhex(meta["secret"])
            return
        self._secret = bytes.fromhex(meta["secret"])
        try:
            replayed = parse_records(payloads)
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            raise IndexCorrupt(f"{path}: a record does not decode ({exc}); delete the index to start empty") from None
        device = self.handle
        # Unclean: the device says so, or this journal was not closed by close(). The
        # second matters when the device was reopened and closed on its own after a
        # crash (its own unclean mark is gone then, the chunks' durability is not known).
        unclean = device.unclean_shutdown_detected or (
            meta["format"] >= 2 and not replayed.closed_cleanly)
        for tid, (name, salt, verifier) in sorted(replayed.tenants.items()):
            self._add_tenant(tid, name, salt, verifier)
        kept = {}
        # After an unclean shutdown every chunk kept is checked against the fingerprint of
        # its durable bytes (taken at the flush after its commit) - metadata only, from the
        # device's crash-consistent block checksums: a chunk whose blocks no longer hold
        # those bytes (lost, torn, or reused for another chunk) is dropped, never served.
        has_checksums = device.caps.integrity  # a device without them gives no fingerprints
        for (tid, key), (hpa, nbytes, pos, fp) in replayed.live.items():
            if (unclean and pos > replayed.last_flush) or tid not in self._tenant_ids:
                self.counters["dropped_on_open"] += 1  # its bytes may never have reached the SSD
                continue
            if unclean and has_checksums and (fp is None or self._fingerprint(hpa, nbytes) != fp):
                self.counters["dropped_on_open"] += 1
                self.counters["failed_verification"] += 1
                continue
            kept[(tid, key)] = (hpa, nbytes, fp)
        try:
            self.alloc = ExtentAllocator.restore(self.capacity, self.grain,
                                                 ((hpa, nbytes) for hpa, nbytes, _ in kept.values()), base=self.base)
        except AllocatorError as exc:
            raise IndexCorrupt(f"{path}: {exc} (delete the index to start empty)") from None
        for (tid, key), (hpa, nbytes, fp) in kept.items():
            t = self._tenant_ids[tid]
            entry = Entry(t, key, hpa, nbytes)
            # A chunk kept without a fingerprint (from an index that had none for it) gets
            # one now: after a clean start the SSD holds exactly its durable bytes, and
            # without one the next unclean start could not tell it from a lost chunk.
            entry.fp = fp if fp is not None or not has_checksums else self._fingerprint(hpa, nbytes)
            t.index[key] = entry
            t.used_bytes += self._extent_bytes(entry)
            self._stamp_entry(entry)
            self._place(entry)

    def _fingerprint(self, hpa: int, nbytes: int) -> int:
        """The fingerprint of the durable bytes of the chunk at [hpa, +nbytes)."""
        bs = self.handle.block_size
        first = hpa // bs
        return chunk_fingerprint(self.handle.block_checksums(first, (hpa + nbytes - 1) // bs - first + 1))

    def _log(self, payload: bytes) -> None:
        if self._journal is not None:
            self._journal.append(payload)

    def _maybe_compact(self) -> None:
        if self._journal is None:
            return
        live = sum(len(t.index) for t in self._tenants.values())  # O(tenants)
        if self._journal.records > self.compact_factor * (live + len(self._tenants)) + 1024:
            self._compact()

    def _compact(self) -> None:
        """Rewrite the journal as: meta, tenants, durable chunks, FLUSH, not-yet-flushed chunks."""
        if self._journal is None:
            return
        payloads = [b"M" + json.dumps(self._meta()).encode()]
        payloads += [tenant_record(t.id, t.name, t.salt if not t.verifier else b"", t.verifier)
                     for t in self._tenant_ids.values()]
        pending = []
        for t in self._tenant_ids.values():
            for entry in t.index.values():
                (pending if (t.id, entry.key) in self._unflushed else payloads).append(
                    put_record(t.id, entry.key, entry.hpa, entry.nbytes, entry.fp))
        payloads.append(FLUSH)
        payloads += pending
        self._journal.rewrite(payloads)
        self.counters["compactions"] += 1

    def flush(self) -> None:
        """Make every committed chunk durable: device flush, then the fingerprints of the
        chunks committed since the last flush, then a journal FLUSH mark (fsynced).
        When flush() returns, every chunk committed before it survives a crash."""
        with self._lock:
            self.handle.flush()
            if self._journal is not None:
                if self.handle.caps.integrity:
                    for (tid, key), entry in self._unflushed.items():
                        entry.fp = self._fingerprint(entry.hpa, entry.nbytes)
                        self._journal.append(fp_record(tid, key, entry.fp))
            self._unflushed.clear()  # everything committed so far is on the SSD now
            if self._journal is not None:
                self._journal.append(FLUSH)
                self._journal.sync()

    def close(self) -> None:
        """Flush and close the index (the device handle stays open: it is the caller's)."""
        with self._lock:
            self._leases.disarm()
            if self._journal is None:
                return
            try:
                if not self.handle.closed:
                    self.flush()
                self._compact()
                self._journal.append(CLEAN_CLOSE)
            finally:
                self._journal.close()
                self._journal = None
