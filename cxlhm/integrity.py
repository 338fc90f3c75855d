"""End-to-end integrity of the SSD back end: per-block checksums, the poison list, and
the integrity log that keeps both right across an unclean shutdown.

Checksums: when the device writes a block to the SSD it records the block's xxh3-64;
every later SSD read of that block is verified against it, and a mismatch is poison,
never data. Blocks the device never wrote (sparse zeros, or an image laid out by
someone else) have no checksum and are not checked. Memory: 32-70 bytes per block ever
written back (16 per bucket, a quarter to a half of them used), in a compiled hash table (cxlhm/sumtable.py) that Python and compiled code
share: streamed reads verify in their loop, and record their write-backs' checksums
there as they land; on disk 16 bytes per block.

Poison: a block whose current bytes the device cannot produce (a failed read after
retries, a checksum mismatch, a write-back that failed so its latest bytes are lost,
bytes that were only in device DRAM when the power went). Reads of it fail with
PoisonError; a host write clears the poison of the bytes it covers, as a real
device's write-clears-poison does: reads inside rewritten ranges succeed, and once
every byte of the block was rewritten the block is whole again.

Crash consistency (the integrity log, ``<image>.cxlhm.ilog``). A clean close saves the
checksums (``<image>.cxlhm.sums``) and the poison list (the metadata file) whole. What
happens between two clean closes is appended to the log, in the order the device does
it, each batch one framed record (length, CRC32) written with one write(2) before the
device goes on:

  SUM b s     before a write-back of block b is submitted: the SSD is about to hold
              bytes whose checksum is s (write-ahead: if the write tears, the bytes
              on the SSD do not match s, and the read that meets them is poison)
  DIRTY b     before a host write to block b returns (and after a failed write-back):
              device DRAM holds bytes of b newer than anything on the SSD
  POISON b r  block b poisoned, for reason r (its checksum is dropped: the SSD's bytes
              of it are not the ones last written)
  REWRITTEN b lo hi   the host wrote bytes [lo, hi) of poisoned block b: they read
              back again, the rest of the block stays poison
  CLEAR b     every byte of poisoned block b was written again: it is whole
  RESET       (first record of a compacted log) forget the saved state: what follows
              is all of it

Reopening after an unclean shutdown replays the log over the last clean close's saved
state: a block whose last record is SUM is verified against that sum, one whose last
record is DIRTY had its latest bytes in device DRAM only - they are gone, and the SSD's
older bytes must not be served - so it is poisoned ("lost at an unclean shutdown").
So after any crash a read returns the bytes last written or an error, never stale,
torn or mixed bytes. After a clean shutdown the log is emptied.

The log is the emulated device's power-safe metadata store: a record is durable once
its write(2) returned (the kernel keeps it across a kill -9 of the process); flush()
also fsyncs it (Device.flush calls IntegrityLog.sync through BlockChecksums.sync). It
is compacted (rewritten as RESET + the live state, then renamed over) when it holds
more than 4x the live records. A DIRTY record costs one write(2) per host write that
dirties blocks not already logged dirty, batched per firmware pass. The streamed loop
(cxlhm/device/stream/state.py) writes its frames itself - DIRTY records of the blocks it wrote,
then the SUMs of the victims it is about to write back - to the descriptor in
IntegrityLog.ctl, keeps the dirty set and the checksums in step itself (both are
compiled tables: BlockChecksums.dirty, sums.table), and tells this module how many
records it wrote at its next return (logged_elsewhere; `unrecorded` names its
write-backs out, for a compaction).
"""
from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import xxhash

from cxlhm.sumtable import BlockSet, SumTable

log = logging.getLogger("cxlhm.integrity")


class PoisonError(OSError):
    """The device cannot return the bytes last written to this range."""


def checksum(data) -> int:
    return xxhash.xxh3_64_intdigest(data)


LOST_AT_UNCLEAN_SHUTDOWN = "lost at an unclean shutdown: its latest bytes were only in device DRAM"

# ---------------------------------------------------------------- the integrity log
_FRAME = struct.Struct("<II")   # payload length, crc32(payload)
_REC = struct.Struct("<cQQ")    # kind, block, value (SUM: the checksum; POISON: the reason's length)
# the same record as a numpy dtype, for packing a batch of them in one go
_REC_DTYPE = np.dtype([("kind", "S1"), ("block", "<u8"), ("value", "<u8")])
assert _REC_DTYPE.itemsize == _REC.size
SUM, DIRTY, POISON, CLEAR, RESET, REWRITTEN = b"S", b"D", b"P", b"C", b"R", b"W"
COMPACT_MIN_RECORDS = 1 << 16


class IntegrityLog:
    """Append-only, framed, crash-safe record of SUM / DIRTY / POISON / CLEAR events
    (see the module docstring). Thread-safe; `freeze()` makes every later append a
    no-op (the power is gone).

    Compiled code may append frames itself (the streamed loop logs its victims' SUMs,
    cxlhm/device/stream/state.py): `ctl[0]` is the descriptor to write to, -1 once frozen or
    closed. It does so under the device lock, as every compaction runs, so it never
    writes to a descriptor a compaction is replacing; O_APPEND keeps its frames whole
    beside the ones written here."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.ctl = np.array([self.fd], np.int64)
        self.records = 0  # records in the file (replayed + appended), for compaction
        self.frozen = False
        self._lock = threading.Lock()

    def replay(self) -> list[tuple[bytes, int, int | str]]:
        """Every record of the intact frames, in order; a torn or corrupt frame (a crash
        in the middle of a write) ends the replay there."""
        data = self.path.read_bytes()
        out: list[tuple[bytes, int, int | str]] = []
        pos = 0
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            payload = data[pos + _FRAME.size: pos + _FRAME.size + length]
            if len(payload) != length or zlib.crc32(payload) != crc:
                break
            out.extend(_records(payload))
            pos += _FRAME.size + length
        self.records = len(out)
        if pos != len(data):  # drop the torn tail, so appends after it are read back
            os.ftruncate(self.fd, pos)
        return out

    def append(self, payload: bytes) -> None:
        """One framed batch of records, one write(2)."""
        if not payload:
            return
        frame = _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            if self.frozen or self.fd < 0:
                return
            written = os.write(self.fd, frame)
            if written != len(frame):  # a full file system: the frame is torn, and so is everything after it
                raise OSError(f"{self.path}: short write of the integrity log ({written} of {len(frame)} bytes)")
            self.records += len(payload) // _REC.size

    def rewrite(self, payload: bytes) -> None:
        """Replace the whole log with one frame (compaction), atomically."""
        with self._lock:
            if self.frozen or self.fd < 0:
                return
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(_FRAME.pack(len(payload), zlib.crc32(payload)) + payload if payload else b"")
                f.flush()
                os.fsync(f.fileno())
            fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            os.replace(tmp, self.path)
            os.close(self.fd)
            self.fd = fd
            self.ctl[0] = fd
            self.records = len(payload) // _REC.size

    def truncate(self) -> None:
        with self._lock:
            if not self.frozen and self.fd >= 0:
                os.ftruncate(self.fd, 0)
                self.records = 0

    def sync(self) -> None:
        with self._lock:
            if not self.frozen and self.fd >= 0:
                os.fsync(self.fd)

    def freeze(self) -> None:
        with self._lock:
            self.frozen = True
            self.ctl[0] = -1

    def close(self) -> None:
        with self._lock:
            if self.fd >= 0:
                self.ctl[0] = -1
                os.close(self.fd)
                self.fd = -1


def _records(payload: bytes):
    pos = 0
    while pos + _REC.size <= len(payload):
        kind, block, value = _REC.unpack_from(payload, pos)
        pos += _REC.size
        if kind == POISON:
            reason = payload[pos:pos + value].decode("utf-8", "replace")
            pos += value
            yield kind, block, reason
        else:
            yield kind, block, value


def pack_records(kind: bytes, blocks, values=0) -> bytes:
    """One `kind` record per block (value: values[i], or one value for all), as
    `_REC.pack` writes each, packed in one go."""
    blocks = np.asarray(blocks, np.int64)
    recs = np.empty(blocks.shape[0], _REC_DTYPE)
    recs["kind"] = kind
    recs["block"] = blocks  # (int64 -> uint64: the bits, as struct's Q of a block number)
    recs["value"] = np.asarray(values).astype(np.uint64, copy=False)
    return recs.tobytes()


def _poison_record(block: int, reason: str) -> bytes:
    raw = reason.encode("utf-8", "replace")[:1024]
    return _REC.pack(POISON, block, len(raw)) + raw


class _LoggedSums:
    """block -> checksum, kept in a SumTable (cxlhm/sumtable.py) - the only copy - that
    compiled code reads (streamed reads verify in their loop) and writes (a stream records
    its landed write-backs). Dropping a block's sum (its write-back failed: the SSD holds
    neither the old nor the new bytes) is logged as DIRTY - a crash now loses it;
    forget() drops one without a record (replay decides what the log already says).
    `pending`: sums logged ahead of a write-back (SUM) by the driver and not recorded
    here yet - the log's last word on those blocks, which a compaction must keep."""
    __slots__ = ("owner", "table", "pending")

    def __init__(self):
        self.owner: BlockChecksums | None = None
        self.table = SumTable()
        self.pending: dict[int, int] = {}

    def __len__(self) -> int:
        return self.table.count

    def __contains__(self, block: int) -> bool:
        return block in self.table

    def get(self, block: int, default=None):
        value = self.table.get(block)
        return default if value is None else value

    def __getitem__(self, block: int) -> int:
        value = self.table.get(block)
        if value is None:
            raise KeyError(block)
        return value

    def __setitem__(self, block: int, value: int) -> None:
        self.table.set(block, value)
        self.pending.pop(block, None)

    def set_many(self, blocks: np.ndarray, sums: np.ndarray) -> None:
        """sums[i] for blocks[i] (int64 / uint64 arrays), in one call."""
        self.table.set_many(blocks, sums)
        if self.pending:
            for block in blocks.tolist():
                self.pending.pop(block, None)

    def lookup(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, sums) of `blocks` (int64)."""
        return self.table.lookup(blocks)

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(blocks, sums) of every recorded checksum."""
        return self.table.entries()

    def items(self):
        blocks, sums = self.entries()
        return zip(blocks.tolist(), sums.tolist())

    def pop(self, block, *default):
        if self.owner is not None:
            self.owner.note_dirty((block,))
        return self.forget(block, *default)

    def forget(self, block, *default):
        self.pending.pop(block, None)
        value = self.table.get(block)
        if value is None:
            if default:
                return default[0]
            raise KeyError(block)
        self.table.discard(block)
        return value

    def forget_many(self, blocks: np.ndarray) -> None:
        for block in blocks.tolist() if self.pending else ():
            self.pending.pop(block, None)
        self.table.discard_many(blocks)

    def clear(self) -> None:
        self.table.clear()
        self.pending.clear()


class SidecarCorrupt(ValueError):
    """A file the device keeps beside its image is unreadable or fails its checksum."""


_SUMS_MAGIC = b"CXLHMSU2"
_SUMS_HEADER = struct.Struct("<8sQQQ")  # magic, block size, entries, xxh3-64 of the entries


def load_sums(path: Path, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, sums) saved at `path` by BlockChecksums.save; SidecarCorrupt says why not."""
    data = path.read_bytes()
    if len(data) < _SUMS_HEADER.size:
        raise SidecarCorrupt(f"{path}: truncated ({len(data)} bytes, the header alone is {_SUMS_HEADER.size})")
    magic, saved_block_size, count, digest = _SUMS_HEADER.unpack_from(data)
    if magic != _SUMS_MAGIC:
        raise SidecarCorrupt(f"{path}: not a cxlhm checksum file (bad magic)")
    body = memoryview(data)[_SUMS_HEADER.size:]
    if len(body) != 16 * count:
        raise SidecarCorrupt(f"{path}: truncated or padded ({len(body)} bytes of entries, {16 * count} expected)")
    if checksum(body) != digest:
        raise SidecarCorrupt(f"{path}: its checksum does not match its contents (a flipped or overwritten byte)")
    if saved_block_size != block_size:
        raise SidecarCorrupt(f"{path}: made for block_size {saved_block_size}, not {block_size}")
    blocks = np.frombuffer(body, np.int64, count)
    return blocks.copy(), np.frombuffer(body, np.uint64, count, 8 * count).copy()


class BlockChecksums:
    def __init__(self, path: Path | None, block_size: int = 0):
        self.path, self.block_size = path, block_size
        self.sums = _LoggedSums()
        self.log: IntegrityLog | None = None
        self.poison: PoisonTable | None = None  # linked by attach_log, for compaction
        self.dirty = BlockSet()  # blocks whose last log record is DIRTY (a stream's loop adds and removes too)
        # (block, sum) arrays of SUM records compiled code logged whose write-backs are
        # not recorded in `sums` yet (a compaction keeps them); set by the device
        self.unrecorded: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None
        self.recovered = {"lost_dirty_blocks": 0, "log_records_replayed": 0}

    def load(self) -> None:
        """The sums saved at the last clean close (SidecarCorrupt if unreadable)."""
        self.sums.set_many(*load_sums(self.path, self.block_size))

    def matches(self, block: int, data) -> bool:
        expected = self.sums.get(block)
        return expected is None or expected == checksum(data)

    def save(self) -> int:
        """Write every sum to `path` (atomically, checksummed); returns how many."""
        if self.path is None:
            return 0
        blocks, sums = self.sums.entries()
        count = blocks.shape[0]
        body = blocks.tobytes() + sums.tobytes()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_SUMS_HEADER.pack(_SUMS_MAGIC, self.block_size, count, checksum(body)) + body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return count

    # ------------------------------------------------------------ the integrity log
    def attach_log(self, log_path: Path, poison: "PoisonTable", *, unclean: bool) -> None:
        """Open the integrity log. After a clean shutdown the saved state is whole: the
        log starts empty. After an unclean one it is replayed over the saved state, and
        every block whose last record is DIRTY is poisoned."""
        self.log = IntegrityLog(log_path)
        self.poison = poison
        if not unclean:
            self.log.truncate()
        else:
            last_dirty: set[int] = set()
            # the sums' changes, applied to the table at the end in two calls (None: dropped)
            changed: dict[int, int | None] = {}
            records = self.log.replay()
            self.recovered["log_records_replayed"] = len(records)
            for kind, block, value in records:
                if kind == SUM:
                    changed[block] = value
                    last_dirty.discard(block)
                elif kind == DIRTY:
                    last_dirty.add(block)
                elif kind == POISON:
                    poison.blocks[block] = value
                    poison.valid.pop(block, None)
                    changed[block] = None  # the SSD's bytes of it are not the ones last written
                elif kind == CLEAR:
                    poison.blocks.pop(block, None)
                    poison.valid.pop(block, None)
                elif kind == REWRITTEN and block in poison.blocks:
                    poison.valid[block] = _merged(poison.valid.get(block, []) + [(value >> 32, value & 0xFFFFFFFF)])
                elif kind == RESET:
                    self.sums.clear()
                    changed.clear()
                    poison.blocks.clear()
                    poison.valid.clear()
                    last_dirty.clear()
            for block in last_dirty:
                changed[block] = None  # whatever the SSD holds is older than what was written
                poison.blocks[block] = LOST_AT_UNCLEAN_SHUTDOWN
                poison.valid.pop(block, None)  # what was rewritten of it was in device DRAM only too
            self.sums.forget_many(np.array([b for b, v in changed.items() if v is None], np.int64))
            kept = [(b, v) for b, v in changed.items() if v is not None]
            self.sums.set_many(np.array([b for b, _ in kept], np.int64), np.array([v for _, v in kept], np.uint64))
            self.recovered["lost_dirty_blocks"] = len(last_dirty)
            self._compact()  # the poison decided here goes into the log: it stands alone from now on
        self.sums.owner = self
        poison.recorder = self

    def note_dirty(self, blocks: Iterable[int]) -> None:
        """Blocks whose newest bytes are in device DRAM only: one DIRTY record each
        (none for blocks already logged dirty), written before the caller goes on."""
        if self.log is not None:
            self.note_dirty_array(np.fromiter(blocks, np.int64))

    def note_dirty_array(self, blocks: np.ndarray) -> None:
        """note_dirty for a numpy array of block numbers (the host write path)."""
        if self.log is None:
            return
        new = self.dirty.add_missing(blocks)
        if new.shape[0]:
            self._append_or_undo(pack_records(DIRTY, new), new)

    def intend(self, blocks, sums, written=()) -> None:
        """Before a write-back is submitted: the SSD is about to hold these sums (block
        and sum sequences or int64 / uint64 arrays). `written`: blocks written since the
        last record - before these write-backs were planned - logged first, as
        note_dirty logs them, in the same write(2) (one frame: a crash keeps all of it
        or none; a block both written and summed here ends on its SUM, which covers
        the write)."""
        if self.log is None:
            return
        # Compact first: once these SUMs are appended the log says more than memory
        # until the writes complete (`pending` keeps what it says meanwhile).
        self._maybe_compact()
        blocks, sums = np.asarray(blocks, np.int64), np.asarray(sums, np.uint64)
        new = self.dirty.add_missing(np.asarray(written, np.int64))
        self._append_or_undo(pack_records(DIRTY, new) + pack_records(SUM, blocks, sums), new)
        self.sums.pending.update(zip(blocks.tolist(), sums.tolist()))
        self.dirty.discard_many(blocks)

    def _append_or_undo(self, payload: bytes, added: np.ndarray) -> None:
        """Append records whose DIRTY blocks `added` joined the dirty set (one compiled
        pass both finds and adds them); if the append fails they leave it again."""
        try:
            self.log.append(payload)
        except BaseException:
            self.dirty.discard_many(added)
            raise

    def logged_elsewhere(self, records: int) -> None:
        """Compiled code appended `records` records to the log itself (IntegrityLog.ctl):
        count them for compaction, and compact if it is due (the caller holds the device
        lock, and `unrecorded` names the write-backs they announce)."""
        if self.log is not None:
            with self.log._lock:
                self.log.records += records
            self._maybe_compact()

    def summed(self, blocks: np.ndarray) -> None:
        """Write-backs of these blocks, whose SUM records compiled code logged, settled:
        the log's last word on them is not DIRTY (no write to a block reaches device DRAM
        while its write-back is out, so none was logged since)."""
        if self.dirty:
            self.dirty.discard_many(blocks)

    def note_poison(self, block: int, reason: str | None) -> None:
        if self.log is not None:
            self.log.append(_poison_record(block, reason) if reason is not None else _REC.pack(CLEAR, block, 0))

    def note_rewritten(self, block: int, lo: int, hi: int) -> None:
        """Bytes [lo, hi) of poisoned block `block` were written by the host."""
        if self.log is not None:
            self.log.append(_REC.pack(REWRITTEN, block, lo << 32 | hi))

    def sync(self) -> None:
        if self.log is not None:
            self.log.sync()

    def freeze(self) -> None:
        """The power is gone: record nothing more."""
        if self.log is not None:
            self.log.freeze()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    def _maybe_compact(self) -> None:
        live = len(self.sums) + len(self.sums.pending) + len(self.dirty) + (len(self.poison.blocks) if self.poison is not None else 0)
        if self.log.records > 4 * live + COMPACT_MIN_RECORDS:
            self._compact()

    def _compact(self) -> None:
        """Rewrite the log as RESET + the live state: replaying it gives what replaying
        the log it replaces gives."""
        sums, pending, dirty = self.sums, self.sums.pending, self.dirty
        parts = [_REC.pack(RESET, 0, 0)]
        if self.poison is not None:  # before the SUMs: a POISON drops its block's sum, and a poisoned
            # block that holds a sum got it from a write-back after it was poisoned
            parts += [_poison_record(b, r) for b, r in self.poison.blocks.items()]
            parts += [_REC.pack(REWRITTEN, b, lo << 32 | hi) for b, ranges in self.poison.valid.items()
                      for lo, hi in ranges]
        parts.append(pack_records(SUM, *sums.entries()))
        parts.append(pack_records(SUM, np.fromiter(pending.keys(), np.int64, len(pending)),  # the log's last word
                                  np.fromiter(pending.values(), np.uint64, len(pending))))
        if self.unrecorded is not None:
            blocks, values = self.unrecorded()
            parts.append(pack_records(SUM, blocks, values))
            dirty.discard_many(blocks)  # their last record is that SUM (see summed())
        parts.append(pack_records(DIRTY, dirty.entries()[0]))
        self.log.rewrite(b"".join(parts))


class PoisonTable:
    """block -> why it is poisoned, and the byte ranges of each poisoned block that were
    written since (a real device's write clears poison at the granularity it writes:
    those bytes are right again, the rest of the block stays lost until written too).
    Changes go to the integrity log once one is attached."""

    def __init__(self, saved: dict | None = None):
        self.blocks: dict[int, str] = {}
        self.valid: dict[int, list[tuple[int, int]]] = {}  # block -> sorted, disjoint [lo, hi) written since
        for key, value in (saved or {}).items():
            if isinstance(value, Mapping):
                self.blocks[int(key)] = str(value.get("reason", ""))
                ranges = [(int(lo), int(hi)) for lo, hi in value.get("valid", ())]
                if ranges:
                    self.valid[int(key)] = ranges
            else:
                self.blocks[int(key)] = str(value)
        self.recorder: BlockChecksums | None = None

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def add(self, block: int, reason: str) -> None:
        self.blocks[block] = reason
        self.valid.pop(block, None)
        if self.recorder is not None:
            self.recorder.note_poison(block, reason)

    def first_poisoned(self, first_block: int, last_block: int) -> int:
        """The first poisoned block in [first_block, last_block], or -1."""
        if last_block - first_block < len(self.blocks):
            return next((b for b in range(first_block, last_block + 1) if b in self.blocks), -1)
        hits = [b for b in self.blocks if first_block <= b <= last_block]
        return min(hits) if hits else -1

    def unreadable(self, hpa: int, n: int, block_size: int) -> int:
        """The first block whose bytes in [hpa, hpa+n) include lost ones, or -1."""
        if n <= 0:
            return -1
        first, last = hpa // block_size, (hpa + n - 1) // block_size
        while (block := self.first_poisoned(first, last)) >= 0:
            base = block * block_size
            lo, hi = max(hpa, base) - base, min(hpa + n, base + block_size) - base
            if not any(a <= lo and hi <= b for a, b in self.valid.get(block, ())):
                return block
            first = block + 1
        return -1

    def written(self, hpa: int, n: int, block_size: int) -> None:
        """[hpa, hpa+n) now holds bytes the host wrote: those of poisoned blocks are
        right again; a block whose every byte was rewritten is clear."""
        if n <= 0 or not self.blocks:
            return
        first, last = hpa // block_size, (hpa + n - 1) // block_size
        while (block := self.first_poisoned(first, last)) >= 0:
            base = block * block_size
            lo, hi = max(hpa, base) - base, min(hpa + n, base + block_size) - base
            ranges = _merged(self.valid.get(block, []) + [(lo, hi)])
            if ranges == [(0, block_size)]:
                self.clear(block)
            else:
                self.valid[block] = ranges
                if self.recorder is not None:
                    self.recorder.note_rewritten(block, lo, hi)
            first = block + 1

    def clear(self, block: int) -> None:
        self.valid.pop(block, None)
        if self.blocks.pop(block, None) is not None and self.recorder is not None:
            self.recorder.note_poison(block, None)

    def describe(self, block: int) -> str:
        ranges = self.valid.get(block)
        written = f" (bytes {', '.join(f'[{a}, {b})' for a, b in ranges)} of it were rewritten since)" if ranges else ""
        return f"{self.blocks.get(block, 'media error')}{written}"

    def to_json(self) -> dict:
        return {str(b): ({"reason": r, "valid": [list(x) for x in self.valid[b]]} if b in self.valid else r)
                for b, r in self.blocks.items()}


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
