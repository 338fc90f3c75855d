"""The persistent index: an append-only journal of framed records next to the device
image, the record codecs, and chunk fingerprints (what makes a kept chunk trustworthy
after an unclean shutdown)."""
from __future__ import annotations

import dataclasses
import fcntl
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import xxhash

FRAME = struct.Struct("<II")          # payload length, crc32(payload)
TENANT = struct.Struct("<IB")         # tenant id, name length (+ name, salt length u8, salt[, verifier length u8, verifier])
PUT = struct.Struct("<IQQH")          # tenant id, hpa, nbytes, key length (+ key)
PUTFP = struct.Struct("<IQQQH")       # "Q": a put with its fingerprint: tenant id, hpa, nbytes, fingerprint, key length (+ key)
FP = struct.Struct("<IQH")            # "V": tenant id, fingerprint, key length (+ key): the chunk's durable bytes
DEL = struct.Struct("<IH")            # tenant id, key length (+ key)


class Journal:
    """Append-only index journal: framed records (length, CRC32, payload). A torn or
    corrupt tail (a crash mid-write) ends the replay there; `rewrite` compacts."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.records = 0
        try:  # two stores appending to one journal would corrupt it
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise RuntimeError(f"{path} is in use by another KVStore (close that one first)") from None

    def read_all(self) -> list[bytes]:
        data = self.path.read_bytes()
        out, pos = [], 0
        while pos + FRAME.size <= len(data):
            length, crc = FRAME.unpack_from(data, pos)
            payload = data[pos + FRAME.size: pos + FRAME.size + length]
            if len(payload) != length or zlib.crc32(payload) != crc:
                break
            out.append(payload)
            pos += FRAME.size + length
        self.records = len(out)
        return out

    def append(self, payload: bytes) -> None:
        os.write(self.fd, FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        self.records += 1

    def sync(self) -> None:
        os.fsync(self.fd)

    def rewrite(self, payloads: list[bytes]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(FRAME.pack(len(p), zlib.crc32(p)) + p for p in payloads))
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
        os.replace(tmp, self.path)
        os.close(self.fd)
        self.fd = fd
        self.records = len(payloads)

    def close(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1


def put_record(tid: int, key: bytes, hpa: int, nbytes: int, fp: int | None = None) -> bytes:
    if fp is not None:
        return b"Q" + PUTFP.pack(tid, hpa, nbytes, fp, len(key)) + key
    return b"P" + PUT.pack(tid, hpa, nbytes, len(key)) + key


def fp_record(tid: int, key: bytes, fp: int) -> bytes:
    return b"V" + FP.pack(tid, fp, len(key)) + key


NO_SUM = (1 << 64) - 1  # stands for a block with no checksum (never written back, or lost)


def chunk_fingerprint(sums: list[int | None]) -> int:
    """A chunk's fingerprint: xxh3-64 over the device's checksums of its blocks, in
    order. Equal fingerprints mean the SSD holds, for every block of the chunk, the
    bytes that were there when it was taken (the device verifies each block it reads
    against the same checksums)."""
    return xxhash.xxh3_64_intdigest(np.array([NO_SUM if v is None else v for v in sums], np.uint64).tobytes())


def del_record(tid: int, key: bytes) -> bytes:
    return b"D" + DEL.pack(tid, len(key)) + key


def tenant_record(tid: int, name: str, salt: bytes, verifier: bytes = b"") -> bytes:
    """A tenant: a name-identified one records its salt; a secret-identified one records
    no salt (it is derived from the secret) but a verifier of its secret."""
    raw = name.encode()
    tail = bytes([len(verifier)]) + verifier if verifier else b""
    return b"T" + TENANT.pack(tid, len(raw)) + raw + bytes([len(salt)]) + salt + tail


CLEAN_CLOSE = b"C"  # the last record of a journal whose store closed cleanly
FLUSH = b"F"


@dataclasses.dataclass
class ReplayedIndex:
    """What a journal's records say: tenants (id -> (name, salt, verifier)), live chunks
    ((tenant id, key) -> (hpa, nbytes, record position, fingerprint or None)), the
    position of the last FLUSH mark, and whether the store closed cleanly."""
    tenants: dict[int, tuple[str, bytes, bytes]]
    live: dict[tuple[int, bytes], tuple[int, int, int, int | None]]
    last_flush: int
    closed_cleanly: bool


def _tail(p: bytes, at: int, n: int) -> bytes:
    piece = p[at:at + n]
    if len(piece) != n:
        raise ValueError("a record is shorter than its length fields say")
    return piece


def parse_records(payloads: list[bytes]) -> ReplayedIndex:
    """Decode the records after the meta record. ValueError (or struct.error) for a
    record that passed its CRC but does not decode: a journal written by something else."""
    tenants: dict[int, tuple[str, bytes, bytes]] = {}
    live: dict[tuple[int, bytes], tuple[int, int, int, int | None]] = {}
    last_flush = -1
    for pos, p in enumerate(payloads[1:], start=1):
        kind = p[:1]
        if kind == b"T":
            tid, n = TENANT.unpack_from(p, 1)
            at = 1 + TENANT.size
            name = _tail(p, at, n).decode()
            salt_len = _tail(p, at + n, 1)[0]
            salt = _tail(p, at + n + 1, salt_len)
            at += n + 1 + salt_len
            verifier = _tail(p, at + 1, p[at]) if len(p) > at else b""
            tenants[tid] = (name, salt, verifier)
        elif kind == b"P":
            tid, hpa, nbytes, n = PUT.unpack_from(p, 1)
            live[(tid, _tail(p, 1 + PUT.size, n))] = (hpa, nbytes, pos, None)
        elif kind == b"Q":
            tid, hpa, nbytes, fp, n = PUTFP.unpack_from(p, 1)
            live[(tid, _tail(p, 1 + PUTFP.size, n))] = (hpa, nbytes, pos, fp)
        elif kind == b"V":
            tid, fp, n = FP.unpack_from(p, 1)
            key = (tid, _tail(p, 1 + FP.size, n))
            if key in live:
                live[key] = live[key][:3] + (fp,)
        elif kind == b"D":
            tid, n = DEL.unpack_from(p, 1)
            live.pop((tid, _tail(p, 1 + DEL.size, n)), None)
        elif kind == FLUSH:
            last_flush = pos
        elif kind != CLEAN_CLOSE:
            raise ValueError(f"unknown record kind {kind!r}")
    closed = len(payloads) > 1 and payloads[-1][:1] == CLEAN_CLOSE
    return ReplayedIndex(tenants, live, last_flush, closed)
