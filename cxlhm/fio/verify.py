"""Data verification like fio's: every written block starts with a header that names
it (magic, offset, length, a write seed) and carries a checksum of the rest of the
block; a block read back is checked against what the job expects there.

Header (64 bytes, little endian):
    0  u32 magic 0x4D48_4C43 ("CLHM")     4  u16 checksum type    6  u16 header version
    8  u32 block length                   12 u32 reserved
    16 u64 block offset in the file       24 u64 write seed (which write this was)
    32 16 bytes checksum of bytes [64, length) (crc32c / xxhash32 use the first 4)
    48 16 bytes reserved (zero)
crc32c and xxhash32 are compiled here (numba) so no extra package is needed; md5 is
hashlib's.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numba
import numpy as np

MAGIC = 0x4D484C43
HEADER_VERSION = 1
HEADER_BYTES = 64
TYPES = {"crc32c": 1, "crc32c-intel": 1, "md5": 2, "xxhash": 3}
NAMES = {1: "crc32c", 2: "md5", 3: "xxhash"}


def _crc32c_table() -> np.ndarray:
    table = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC32C_TABLE = _crc32c_table()


@numba.njit(nogil=True, cache=True)
def _crc32c(data, table):
    crc = np.uint32(0xFFFFFFFF)
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def crc32c(data) -> int:
    return int(_crc32c(np.frombuffer(memoryview(data), np.uint8), _CRC32C_TABLE))


_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393


@numba.njit(nogil=True, cache=True)
def _rotl(x, r):
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


@numba.njit(nogil=True, cache=True)
def _xxh32(data, seed):
    n = data.shape[0]
    i = 0
    mask = 0xFFFFFFFF
    if n >= 16:
        v1 = (seed + _P1 + _P2) & mask
        v2 = (seed + _P2) & mask
        v3 = seed & mask
        v4 = (seed - _P1) & mask
        while i + 16 <= n:
            lanes = data[i:i + 16].view(np.uint32)
            v1 = (_rotl((v1 + np.uint64(lanes[0]) * _P2) & mask, 13) * _P1) & mask
            v2 = (_rotl((v2 + np.uint64(lanes[1]) * _P2) & mask, 13) * _P1) & mask
            v3 = (_rotl((v3 + np.uint64(lanes[2]) * _P2) & mask, 13) * _P1) & mask
            v4 = (_rotl((v4 + np.uint64(lanes[3]) * _P2) & mask, 13) * _P1) & mask
            i += 16
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & mask
    else:
        h = (seed + _P5) & mask
    h = (h + n) & mask
    while i + 4 <= n:
        word = np.uint64(data[i:i + 4].view(np.uint32)[0])
        h = (_rotl((h + word * _P3) & mask, 17) * _P4) & mask
        i += 4
    while i < n:
        h = (_rotl((h + np.uint64(data[i]) * _P5) & mask, 11) * _P1) & mask
        i += 1
    h ^= h >> 15
    h = (h * _P2) & mask
    h ^= h >> 13
    h = (h * _P3) & mask
    h ^= h >> 16
    return h


def xxhash32(data, seed: int = 0) -> int:
    arr = np.frombuffer(memoryview(data), np.uint8)
    if arr.shape[0] % 4 or not arr.flags.aligned:
        arr = arr.copy()  # uint32 views need 4-byte alignment
    return int(_xxh32(arr, np.uint64(seed)))


def checksum(kind: int, data: np.ndarray) -> bytes:
    if kind == 2:
        return hashlib.md5(memoryview(data)).digest()
    value = crc32c(data) if kind == 1 else xxhash32(data)
    return value.to_bytes(4, "little") + bytes(12)


@dataclasses.dataclass(frozen=True)
class VerifyFailure:
    offset: int
    length: int
    what: str

    def message(self, filename: str) -> str:
        return f"verify: {self.what} at file {filename} offset {self.offset}, length {self.length}"


def stamp(block: np.ndarray, kind: int, offset: int, seed: int) -> None:
    """Write the header (and checksum of the payload already in `block`) in place."""
    header = block[:HEADER_BYTES]
    header[:] = 0
    fields = header[:32].view(np.uint32)
    fields[0] = MAGIC
    header[4:6].view(np.uint16)[0] = kind
    header[6:8].view(np.uint16)[0] = HEADER_VERSION
    fields[2] = block.shape[0]
    header[16:32].view(np.uint64)[:] = (offset, seed)
    header[32:48] = np.frombuffer(checksum(kind, block[HEADER_BYTES:]), np.uint8)


def check(block: np.ndarray, kind: int, offset: int, seed: int | None = None) -> VerifyFailure | None:
    """None if `block` is the intact block written at `offset` (by write `seed` if given)."""
    length = block.shape[0]
    fields = block[:32].view(np.uint32)
    if int(fields[0]) != MAGIC:
        return VerifyFailure(offset, length, f"bad magic header {int(fields[0]):#x}, wanted {MAGIC:#x}")
    stored_kind = int(block[4:6].view(np.uint16)[0])
    if stored_kind != kind:
        return VerifyFailure(offset, length, f"checksum type {NAMES.get(stored_kind, stored_kind)}, wanted {NAMES[kind]}")
    if int(fields[2]) != length:
        return VerifyFailure(offset, length, f"bad header length {int(fields[2])}, wanted {length}")
    hdr_offset, hdr_seed = (int(x) for x in block[16:32].view(np.uint64))
    if hdr_offset != offset:
        return VerifyFailure(offset, length, f"bad header offset {hdr_offset}, wanted {offset}")
    if seed is not None and hdr_seed != seed:
        return VerifyFailure(offset, length, f"stale block: write seed {hdr_seed:#x}, wanted {seed:#x}")
    expected = bytes(block[32:48])
    actual = checksum(kind, block[HEADER_BYTES:])
    if expected != actual:
        n = 16 if kind == 2 else 4
        return VerifyFailure(offset, length, f"{NAMES[kind]} checksum mismatch: expected {expected[:n].hex()}, received {actual[:n].hex()}")
    return None
