"""Data verification as fio 3.33 does it: every written block starts with fio's header,
which names the block (offset, length), the write (its random seed and its number among
the job's writes) and checks itself (crc32c of the header); a checksum of the rest of
the block follows. A block read back is checked field by field in fio's order, and a
failure is described in fio's words.

Header (fio's struct verify_header, 40 bytes, little endian):
    0  u16 magic 0xacca    2  u16 verify type (fio's numbering)    4  u32 block length
    8  u64 rand_seed       16 u64 offset                           24 u32 time_sec
    28 u32 time_nsec       32 u16 thread                           34 u16 numberio
    36 u32 crc32c of bytes [0, 36) (fio's: without CRC-32C's final inversion)
then the checksum (crc32c: 4 bytes, xxhash: 4 bytes - XXH32 with seed 1, md5: 16 bytes)
of bytes [40 + checksum size, length). crc32c and xxhash32 are compiled here (numba) so
no extra package is needed; md5 is hashlib's.

What the job expects of a block (its seed, its write number) is the runner's business
(VerifyLog below keeps fio's write history); `check` compares.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from cxlhm_apps.fio import verify_pattern as VP

MAGIC = 0xACCA
HEADER_BYTES = 40  # fio's struct verify_header
CRC_AT = 36  # the header's own crc32c covers [0, CRC_AT)
# fio 3.33's verify type numbers (verify.h)
TYPES = {"crc32c": 5, "crc32c-intel": 5, "md5": 2, "xxhash": 15, "meta": VP.META, "pattern": VP.PATTERN_NO_HDR}
NAMES = {5: "crc32c", 2: "md5", 15: "xxhash", VP.META: "meta", VP.PATTERN: "pattern", VP.PATTERN_NO_HDR: "pattern"}
SUM_BYTES = {5: 4, 2: 16, 15: 4, VP.META: 0, VP.PATTERN: 0, VP.PATTERN_NO_HDR: 0}  # (meta, pattern: the header alone)


def header_bytes(kind: int) -> int:
    """Bytes before the checksummed payload: fio's header and the checksum."""
    return HEADER_BYTES + SUM_BYTES[kind]


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


def _has_sse42() -> bool:
    """Whether this CPU has SSE 4.2's crc32 instruction (x86-64 Linux's cpuinfo says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return "sse4_2" in line.split()
    except OSError:
        pass
    return False


# fio computes crc32c with the CPU's crc32 instruction where it has one; so does this
# module's batch path (8 bytes per instruction), else a table lookup per byte.
HW_CRC32C = _has_sse42()


@intrinsic
def _crc32c_u64(typingctx, crc, word):
    """SSE 4.2's crc32 of a 64-bit word (LLVM's x86 intrinsic), compiled in only where
    HW_CRC32C says the CPU has it."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(64)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse42.crc32.64.64")
        return builder.call(fn, args)
    return types.uint64(types.uint64, types.uint64), codegen


@numba.njit(nogil=True, cache=True, inline="always")
def _crc32c_at(data, words, start, end, table, hw):
    """crc32c of data[start:end] (`words`: the same memory as uint64, for the aligned
    middle where `hw`)."""
    crc = np.uint64(0xFFFFFFFF)
    i = start
    if hw:
        while i < end and i & 7:
            crc = np.uint64(table[(crc ^ data[i]) & 0xFF]) ^ (crc >> np.uint64(8))
            i += 1
        while i + 8 <= end:
            crc = _crc32c_u64(crc, words[i >> 3])
            i += 8
    while i < end:
        crc = np.uint64(table[(crc ^ data[i]) & 0xFF]) ^ (crc >> np.uint64(8))
        i += 1
    return crc ^ np.uint64(0xFFFFFFFF)


_NO_WORDS = np.zeros(0, np.uint64)


def crc32c(data) -> int:
    arr = np.frombuffer(memoryview(data), np.uint8)
    if HW_CRC32C and arr.shape[0] >= 64 and arr.ctypes.data % 8 == 0:
        words = arr[:arr.shape[0] - arr.shape[0] % 8].view(np.uint64)
        return int(_crc32c_at(arr, words, 0, arr.shape[0], _CRC32C_TABLE, True))
    return int(_crc32c(arr, _CRC32C_TABLE))


def fio_crc32c(data) -> int:
    """crc32c as fio stores it (its crc32c_sw / crc32c_intel leave out CRC-32C's final
    inversion): the bitwise complement of crc32c()."""
    return crc32c(data) ^ 0xFFFFFFFF


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


@numba.njit(nogil=True, cache=True, inline="always")
def _rotl32(x, r):
    return ((x << np.uint64(r)) | (x >> np.uint64(32 - r))) & np.uint64(0xFFFFFFFF)


@numba.njit(nogil=True, cache=True, inline="always")
def _round32(v, lane):
    v = (v + lane * np.uint64(_P2)) & np.uint64(0xFFFFFFFF)
    v = ((v << np.uint64(13)) | (v >> np.uint64(19))) & np.uint64(0xFFFFFFFF)
    return (v * np.uint64(_P1)) & np.uint64(0xFFFFFFFF)


@numba.njit(nogil=True, cache=True)
def _xxh32_at(data, start, end, seed):
    """XXH32 of data[start:end] (`start` 4-byte aligned in memory), on uint64 arithmetic
    kept to 32 bits: the same value as _xxh32, without its per-lane array views."""
    mask = np.uint64(0xFFFFFFFF)
    n = end - start
    i = start
    words = data[start:start + (n // 4) * 4].view(np.uint32)
    w = 0
    if n >= 16:
        v1 = (seed + np.uint64(_P1) + np.uint64(_P2)) & mask
        v2 = (seed + np.uint64(_P2)) & mask
        v3 = seed & mask
        v4 = (seed - np.uint64(_P1)) & mask
        while i + 16 <= end:
            v1 = _round32(v1, np.uint64(words[w]))
            v2 = _round32(v2, np.uint64(words[w + 1]))
            v3 = _round32(v3, np.uint64(words[w + 2]))
            v4 = _round32(v4, np.uint64(words[w + 3]))
            w += 4
            i += 16
        h = (_rotl32(v1, 1) + _rotl32(v2, 7) + _rotl32(v3, 12) + _rotl32(v4, 18)) & mask
    else:
        h = (seed + np.uint64(_P5)) & mask
    h = (h + np.uint64(n)) & mask
    while i + 4 <= end:
        h = (_rotl32((h + np.uint64(words[w]) * np.uint64(_P3)) & mask, 17) * np.uint64(_P4)) & mask
        w += 1
        i += 4
    while i < end:
        h = (_rotl32((h + np.uint64(data[i]) * np.uint64(_P5)) & mask, 11) * np.uint64(_P1)) & mask
        i += 1
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(_P2)) & mask
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(_P3)) & mask
    h ^= h >> np.uint64(16)
    return h


def xxhash32(data, seed: int = 0) -> int:
    arr = np.frombuffer(memoryview(data), np.uint8)
    if arr.shape[0] % 4 or not arr.flags.aligned:
        arr = arr.copy()  # uint32 views need 4-byte alignment
    return int(_xxh32(arr, np.uint64(seed)))


def checksum(kind: int, data: np.ndarray) -> bytes:
    """The payload checksum as fio stores it after the header (none for meta)."""
    if not SUM_BYTES[kind]:
        return b""
    if kind == 2:
        return hashlib.md5(memoryview(data)).digest()
    value = fio_crc32c(data) if kind == 5 else xxhash32(data, 1)  # fio's XXH32_init(1)
    return value.to_bytes(4, "little")


def seeds_of(job_seed: int, ns: np.ndarray) -> np.ndarray:
    """seed_of for many write numbers at once (uint64)."""
    with np.errstate(over="ignore"):
        z = np.uint64(job_seed & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15) + ns.astype(np.uint64) + np.uint64(1)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def seed_of(job_seed: int, n: int) -> int:
    """The rand_seed of the job's n-th write (fio draws them from its verify_state in
    write order; the verify phase draws the same sequence again, in its own order)."""
    z = (job_seed * 0x9E3779B97F4A7C15 + n + 1) & 0xFFFFFFFFFFFFFFFF  # splitmix64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


@dataclasses.dataclass(frozen=True)
class VerifyFailure:
    offset: int
    length: int
    what: str
    lead: str = "verify: "  # fio's lines before the failure's own (verify_pattern's got/wanted)
    block: tuple[int, int] | None = None  # the I/O's (offset, length) where a header covers part of it

    def message(self, filename: str) -> str:
        offset, length = self.block or (self.offset, self.length)
        return (f"{self.lead}{self.what} at file {filename} offset {self.offset}, length {self.length} "
                f"(requested block: offset={offset}, length={length})")


def spec_of(job, thread: int = 0):
    """The job's verify as stamp_many / check_many take it: 0 (off) or a
    verify_pattern.VerifySpec (its type, pattern, interval and the clone's thread number)."""
    return VP.spec_of(job, TYPES, thread)


def verifies_each_pass(job) -> bool:
    """Whether fio's do_verify follows each do_io of the job (a pass, or a time_based
    verify cycle): it writes, has a verify, and do_verify is on."""
    return bool(spec_of(job)) and bool(job["do_verify"]) and job["rw"].writes


def stamp(block: np.ndarray, kind: int, offset: int, seed: int, numberio: int, thread: int = 0) -> None:
    """Write fio's header and the checksum of the payload already in `block`, in place."""
    header = block[:HEADER_BYTES]
    header[:] = 0
    header[0:2].view(np.uint16)[0] = MAGIC
    header[2:4].view(np.uint16)[0] = kind
    header[4:8].view(np.uint32)[0] = block.shape[0]
    header[8:24].view(np.uint64)[:] = (seed, offset)
    header[32:36].view(np.uint16)[:] = (thread & 0xFFFF, numberio & 0xFFFF)
    header[36:40].view(np.uint32)[0] = fio_crc32c(header[:CRC_AT])
    start = header_bytes(kind)
    block[HEADER_BYTES:start] = np.frombuffer(checksum(kind, block[start:]), np.uint8)


# What check_many found wrong with a block, in fio's order of checks (0: nothing)
_OK, _SHORT, _MAGIC, _LENGTH, _SEED, _OFFSET, _NUMBERIO, _HEADER_CRC, _TYPE, _SUM = range(10)


@numba.njit(nogil=True, cache=True, inline="always")
def _put(data, at, value, nbytes):
    v = np.uint64(value)
    for j in range(nbytes):
        data[at + j] = np.uint8(v & np.uint64(0xFF))
        v >>= np.uint64(8)


@numba.njit(nogil=True, cache=True, inline="always")
def _get(data, at, nbytes):
    v = np.uint64(0)
    for j in range(nbytes - 1, -1, -1):
        v = (v << np.uint64(8)) | np.uint64(data[at + j])
    return v


@numba.njit(nogil=True, cache=True, inline="always")
def _payload_sum(data, words, at, length, kind, table, hw):
    """fio's checksum of a block's payload (crc32c, or xxhash32 seeded 1)."""
    start = at + HEADER_BYTES + 4
    if kind == 5:
        return _crc32c_at(data, words, start, at + length, table, hw) ^ np.uint64(0xFFFFFFFF)  # (fio's)
    return _xxh32_at(data, start, at + length, np.uint64(1))


@numba.njit(nogil=True, cache=True)
def _stamp_many(data, words, starts, sizes, kind, offsets, seeds, numberios, thread, table, hw, with_sum):
    for b in range(starts.shape[0]):
        at, length = starts[b], sizes[b]
        for j in range(HEADER_BYTES):
            data[at + j] = 0
        _put(data, at, MAGIC, 2)
        _put(data, at + 2, kind, 2)
        _put(data, at + 4, length, 4)
        _put(data, at + 8, seeds[b], 8)
        _put(data, at + 16, offsets[b], 8)
        _put(data, at + 32, thread & 0xFFFF, 2)
        _put(data, at + 34, numberios[b] & 0xFFFF, 2)
        _put(data, at + CRC_AT, _crc32c_at(data, words, at, at + CRC_AT, table, hw) ^ np.uint64(0xFFFFFFFF), 4)
        if with_sum:
            _put(data, at + HEADER_BYTES, _payload_sum(data, words, at, length, kind, table, hw), 4)


@numba.njit(nogil=True, cache=True)
def _check_many(data, words, starts, sizes, kind, offsets, seeds, numberios, table, hw, out):
    """out[b]: what is wrong with block b (_OK: nothing), checked in check()'s order.
    `seeds` / `numberios` empty: not checked."""
    bad = 0
    for b in range(starts.shape[0]):
        at, length = starts[b], sizes[b]
        code = _OK
        if length < HEADER_BYTES + 4:
            code = _SHORT
        elif _get(data, at, 2) != MAGIC:
            code = _MAGIC
        elif _get(data, at + 4, 4) != length:
            code = _LENGTH
        elif seeds.shape[0] and _get(data, at + 8, 8) != seeds[b]:
            code = _SEED
        elif _get(data, at + 16, 8) != offsets[b]:
            code = _OFFSET
        elif numberios.shape[0] and _get(data, at + 34, 2) != (numberios[b] & 0xFFFF):
            code = _NUMBERIO
        elif _get(data, at + CRC_AT, 4) != _crc32c_at(data, words, at, at + CRC_AT, table, hw) ^ np.uint64(0xFFFFFFFF):
            code = _HEADER_CRC
        elif _get(data, at + 2, 2) != kind:
            code = _TYPE
        elif _get(data, at + HEADER_BYTES, 4) != _payload_sum(data, words, at, length, kind, table, hw):
            code = _SUM
        out[b] = code
        bad += code != _OK
    return bad


def _batch_args(data: np.ndarray, starts, sizes, offsets):
    words = data[:data.shape[0] - data.shape[0] % 8].view(np.uint64) if data.ctypes.data % 8 == 0 else _NO_WORDS
    return (words, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(sizes, np.int64),
            np.ascontiguousarray(offsets, np.uint64), HW_CRC32C and words.shape[0] > 0)


def stamp_many(data: np.ndarray, starts, sizes, kind, offsets, seeds: np.ndarray, numberios,
               thread: int = 0) -> None:
    """stamp() for many blocks of `data` (a flat uint8 array: block b is
    data[starts[b]:starts[b] + sizes[b]]), compiled for crc32c and xxhash; `seeds` uint64.
    `kind`: fio's type number (the headers' thread field `thread`), or a VerifySpec
    (verify_pattern.py lays out all but the plain ones)."""
    if isinstance(kind, VP.VerifySpec):
        if not kind.plain:
            VP.stamp_spec(kind, data, starts, sizes, offsets, seeds, numberios)
            return
        kind, thread = kind.kind, kind.thread
    words, starts, sizes, offsets, hw = _batch_args(data, starts, sizes, offsets)
    compiled_sum = kind in (5, 15)
    _stamp_many(data, words, starts, sizes, kind, offsets, np.ascontiguousarray(seeds, np.uint64),
                np.ascontiguousarray(numberios, np.int64), thread, _CRC32C_TABLE, hw, compiled_sum)
    if not compiled_sum and SUM_BYTES[kind]:  # md5: hashlib's, over each payload after its header
        after = header_bytes(kind)
        for at, length in zip(starts.tolist(), sizes.tolist()):
            data[at + HEADER_BYTES:at + after] = np.frombuffer(checksum(kind, data[at + after:at + length]), np.uint8)


def check_many(data: np.ndarray, starts, sizes, kind, offsets, seeds: np.ndarray | None = None,
               numberios: np.ndarray | None = None) -> list[tuple[int, VerifyFailure]]:
    """check() for many blocks of `data` (laid out as for stamp_many): the failures, as
    (block index, failure), in block order. `seeds` / `numberios` None: not checked."""
    if isinstance(kind, VP.VerifySpec):
        if not kind.plain:
            return VP.check_spec(kind, data, starts, sizes, offsets, seeds, numberios)
        kind = kind.kind
    if kind not in (5, 15):
        found = []
        for b in range(len(starts)):
            failure = check(data[int(starts[b]):int(starts[b]) + int(sizes[b])], kind, int(offsets[b]),
                            None if seeds is None else int(seeds[b]), None if numberios is None else int(numberios[b]))
            if failure:
                found.append((b, failure))
        return found
    words, starts_, sizes_, offsets_, hw = _batch_args(data, starts, sizes, offsets)
    out = np.zeros(starts_.shape[0], np.int8)
    no = np.zeros(0, np.uint64)
    bad = _check_many(data, words, starts_, sizes_, kind, offsets_,
                      no if seeds is None else np.ascontiguousarray(seeds, np.uint64),
                      no.view(np.int64) if numberios is None else np.ascontiguousarray(numberios, np.int64),
                      _CRC32C_TABLE, hw, out)
    if not bad:
        return []
    found = []
    for b in np.flatnonzero(out).tolist():  # fio's words for each: the block checked again, one field at a time
        at, length = int(starts_[b]), int(sizes_[b])
        failure = check(data[at:at + length], kind, int(offsets_[b]), None if seeds is None else int(seeds[b]),
                        None if numberios is None else int(numberios[b]))
        found.append((b, failure or VerifyFailure(int(offsets_[b]), length, "verify failed")))
    return found


def warm_up(kind: int) -> None:
    """Compile (or load from numba's cache) the batch kernels of verify `kind` on two
    small blocks, so a job's runtime is not spent compiling them."""
    if kind not in (5, 15):
        return
    data = np.zeros(2 * 512, np.uint8)
    starts, sizes, offsets = np.array([0, 512]), np.array([512, 512]), np.array([0, 512], np.uint64)
    seeds, numberios = np.zeros(2, np.uint64), np.zeros(2, np.int64)
    stamp_many(data, starts, sizes, kind, offsets, seeds, numberios)
    check_many(data, starts, sizes, kind, offsets, seeds, numberios)
    check_many(data, starts, sizes, kind, offsets)


def header_seed(block: np.ndarray) -> int:
    return int(block[8:16].view(np.uint64)[0])


def check(block: np.ndarray, kind: int, offset: int, seed: int | None = None,
          numberio: int | None = None) -> VerifyFailure | None:
    """None if `block` is intact and is the block fio would expect at `offset`: written
    with rand_seed `seed` and as write number `numberio` where those are given (fio checks
    them only for some jobs). Fields are checked in fio's order; the first wrong one is
    the failure."""
    length = block.shape[0]
    if length < header_bytes(kind):
        return VerifyFailure(offset, length, f"block of {length} bytes is shorter than the verify header")
    magic = int(block[0:2].view(np.uint16)[0])
    if magic != MAGIC:
        return VerifyFailure(offset, length, f"bad magic header {magic:x}, wanted {MAGIC:x}")
    hdr_len = int(block[4:8].view(np.uint32)[0])
    if hdr_len != length:
        return VerifyFailure(offset, length, f"bad header length {hdr_len}, wanted {length}")
    hdr_seed, hdr_offset = (int(x) for x in block[8:24].view(np.uint64))
    if seed is not None and hdr_seed != seed:
        return VerifyFailure(offset, length, f"bad header rand_seed {hdr_seed}, wanted {seed}")
    if hdr_offset != offset:
        return VerifyFailure(offset, length, f"bad header offset {hdr_offset}, wanted {offset}")
    hdr_numberio = int(block[34:36].view(np.uint16)[0])
    if numberio is not None and hdr_numberio != numberio & 0xFFFF:
        return VerifyFailure(offset, length, f"bad header numberio {hdr_numberio}, wanted {numberio & 0xFFFF}")
    stored_crc, actual_crc = int(block[36:40].view(np.uint32)[0]), fio_crc32c(block[:CRC_AT])
    if stored_crc != actual_crc:
        return VerifyFailure(offset, length, f"bad header crc {stored_crc:x}, calculated {actual_crc:x}")
    stored_kind = int(block[2:4].view(np.uint16)[0])
    if stored_kind != kind:
        return VerifyFailure(offset, length, f"verify type {NAMES.get(stored_kind, stored_kind)}, wanted {NAMES[kind]}")
    start = header_bytes(kind)
    expected = bytes(block[HEADER_BYTES:start])
    actual = checksum(kind, block[start:])
    if expected != actual:  # (meta: both empty)
        return VerifyFailure(offset, length, f"{NAMES[kind]}: verify failed: expected {expected.hex()}, "
                                             f"received {actual.hex()}")
    return None


@dataclasses.dataclass
class Written:
    offset: int
    size: int
    seed: int
    numberio: int
    alive: bool = True


class VerifyLog:
    """fio's history of a job's writes, which its verify phase reads back.

    fio keeps a plain list, in write order, where every block is written once per pass
    (a random job with fio's random map); otherwise (sequential jobs, norandommap, and
    every non-uniform random_distribution, which turns the map off) a tree sorted by
    offset in which a write drops every earlier entry it overlaps. The verify phase
    draws the writes' seeds again from the start of the same sequence, one per block in
    the history's order, so when it checks the seed (mixed read/write jobs without
    verify_backlog) a block passes only where its write's place in the write order is
    its place in the history: a list with overwritten blocks, or a tree that is not in
    write order, fails with "bad header rand_seed".

    In the list, a write drops earlier entries it overlaps only partly or with another
    size: fio's random map (kept per smallest block) never lets a pass do that, while
    the map here, kept in cells of the largest size, can when sizes are mixed."""

    def __init__(self, *, ordered_by_offset: bool, max_bs: int, align: int):
        self.sorted = ordered_by_offset
        self.max_bs, self.align = max_bs, align
        self.entries: collections.deque[Written] = collections.deque()  # list mode, write order
        self.by_offset: dict[int, list[Written]] = {}  # live entries by offset (a list: list mode repeats)
        # the offsets of by_offset, sorted, per max_bs-wide cell: a write finds what it overlaps
        # by bisection in the cells its reach spans, not by probing every aligned offset
        self.cells: dict[int, list[int]] = {}
        self.live = 0

    def __len__(self) -> int:
        return self.live

    def _starts_within(self, lo: int, hi: int) -> list[int]:
        """The offsets of live entries in [lo, hi), ascending."""
        found: list[int] = []
        for cell in range(lo // self.max_bs, (hi - 1) // self.max_bs + 1):
            starts = self.cells.get(cell)
            if starts:
                found += starts[bisect.bisect_left(starts, lo):bisect.bisect_left(starts, hi)]
        return found

    def _forget(self, start: int) -> None:
        del self.by_offset[start]
        cell = self.cells[start // self.max_bs]
        del cell[bisect.bisect_left(cell, start)]
        if not cell:
            del self.cells[start // self.max_bs]

    def add(self, entry: Written) -> None:
        offset, size, index = entry.offset, entry.size, self.by_offset
        # live entries never overlap one another (an exact repeat aside), so of those that
        # start before this write only the last one can reach into it
        below = self._starts_within(max(0, offset - self.max_bs + self.align), offset)[-1:]
        for start in below + self._starts_within(offset, offset + size):
            known = index[start]
            keep = [e for e in known if not self.sorted and e.offset == offset and e.size == size]
            if len(keep) == len(known):
                continue
            for e in known:
                if e not in keep and start + e.size > offset:
                    e.alive = False
                    self.live -= 1
            kept = keep + [e for e in known if e.alive and e not in keep]
            if kept:
                index[start] = kept
            else:
                self._forget(start)
        if offset not in index:
            index[offset] = []
            bisect.insort(self.cells.setdefault(offset // self.max_bs, []), offset)
        index[offset].append(entry)
        self.live += 1
        if not self.sorted:
            self.entries.append(entry)

    def take(self, most: int | None = None) -> list[Written]:
        """The next live entries in the verify phase's order, removed from the history."""
        limit = self.live if most is None else min(most, self.live)
        out: list[Written] = []
        if self.sorted:
            for key in sorted(self.by_offset)[:limit]:
                out.extend(self.by_offset[key])
                self._forget(key)
        else:
            while len(out) < limit:
                e = self.entries.popleft()
                if e.alive:
                    out.append(e)
                    rest = [x for x in self.by_offset[e.offset] if x is not e]
                    if rest:
                        self.by_offset[e.offset] = rest
                    else:
                        self._forget(e.offset)
        self.live -= len(out)
        return out
