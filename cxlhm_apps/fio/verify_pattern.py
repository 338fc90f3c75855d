"""fio's verify_pattern, verify_interval and verify=meta / verify=pattern, as fio 3.33
lays them out (verify.c, lib/pattern.c):

- `verify_pattern` is parsed as fio's parse_and_fill_pattern does: tokens one after
  another, with no separator - `0x` hex bytes (an odd count of digits gets a leading
  0), a decimal integer in [-2^31, 2^31) (little endian, as few bytes as it needs, 4
  when negative; whitespace may come before it, as strtol allows), a double-quoted
  string (its UTF-8 bytes, no escapes), `%o` (8 bytes, little endian: the offset of the
  block being written). At most 512 bytes.
- A written block is filled with the pattern from its first byte, repeated, each `%o`
  holding the block's offset; then, unless verify=pattern (no header), a header is
  written over the start of every `verify_interval` bytes, naming its own offset and
  length (the interval). The interval is fio 3.33's after its fixup (init.c): unset, it
  is the smallest write size where the write sizes differ (one header per block where
  they do not); it is cut to the smallest write (or read) size and to a divisor of the
  smallest and largest write sizes. A block the interval does not divide (a bssplit
  size between the two) gets one header here; fio's would run past the block. With a
  pattern, fio leaves the header's rand_seed 0. Every header carries the job's thread
  number (fio's td->thread_number, counted from 1 over all jobs and clones).
- verify=meta (fio's VERIFY_HDR_ONLY) writes the header with no checksum after it and
  checks only the header (magic, length, rand_seed, offset, numberio, the header's
  crc32c, type), then the pattern after the header where one is given. verify_pattern
  without verify is fio's VERIFY_PATTERN: the same, with type 17 in the header.
- verify=pattern checks every byte of the block against the pattern; a wrong byte is
  reported in fio's words (got/wanted, bad bits, its place in the interval).
- crc32c / md5 / xxhash with a pattern: the pattern is the data under the header, and
  the checksum checks it (fio does not compare it to the pattern then).
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

MAX_PATTERN_BYTES = 512  # fio's MAX_PATTERN_SIZE
META, PATTERN, PATTERN_NO_HDR = 1, 17, 18  # fio 3.33's VERIFY_HDR_ONLY, VERIFY_PATTERN, VERIFY_PATTERN_NO_HDR
ACCEPTED = ("0x hex bytes (0xaa555aa5), a decimal integer from -2147483648 to 2147483647, a string in "
            "double quotes (\"abc\"), %o (the block's offset), one after another with no separator")
_DECIMAL = re.compile(r"\s*([-+]?\d+)")
_HEX = re.compile(r"0[xX]([0-9a-fA-F]+)")


@dataclasses.dataclass(frozen=True)
class Pattern:
    data: bytes  # the pattern, with 8 zero bytes where each %o goes
    offset_at: tuple[int, ...] = ()  # where %o pastes the block's offset

    def for_block(self, offset: int) -> np.ndarray:
        """The pattern as written into the block at `offset`."""
        out = np.frombuffer(self.data, np.uint8).copy()
        word = np.frombuffer(int(offset).to_bytes(8, "little"), np.uint8)
        for at in self.offset_at:
            out[at:at + 8] = word
        return out

    def fill(self, length: int, offset: int) -> np.ndarray:
        """`length` bytes of the pattern from its start (the whole block at `offset`)."""
        return np.resize(self.for_block(offset), length)


def parse_pattern(text: str) -> Pattern:
    """fio's verify_pattern syntax (see the module's docstring); ValueError says where it stops."""
    out, offsets, i = bytearray(), [], 0
    if not text:
        raise ValueError(f"is empty; accepted: {ACCEPTED}")
    while i < len(text):
        if text.startswith("%o", i):
            offsets.append(len(out))
            out += bytes(8)
            i += 2
            continue
        if text[i] == '"':
            end = text.find('"', i + 1)
            if end < 0:
                raise ValueError(f"string at character {i + 1} has no closing quote; accepted: {ACCEPTED}")
            if end == i + 1:
                raise ValueError(f"empty string at character {i + 1}; accepted: {ACCEPTED}")
            out += text[i + 1:end].encode()
            i = end + 1
            continue
        m = _HEX.match(text, i)
        if m:
            digits, end = m.group(1), m.end()
            if digits.endswith("0") and len(digits) > 1 and text[end:end + 1] in ("x", "X"):
                digits, end = digits[:-1], end - 1  # (0xff0x14: the 0 starts the next number, as fio reads it)
            out += bytes.fromhex(digits if len(digits) % 2 == 0 else "0" + digits)
            i = end
            continue
        # fio reads a decimal only up to the next 0x anywhere after it: -120xff is -12, then 0xff
        next_hex = min((k for k in (text.find("0x", i), text.find("0X", i)) if k > i), default=len(text))
        m = _DECIMAL.match(text[:next_hex], i)
        if m and not text.startswith(("0x", "0X"), m.start(1)):
            value = int(m.group(1))
            if not -2**31 <= value < 2**31:
                raise ValueError(f"{m.group(1)} at character {m.start(1) + 1} is out of range "
                                 f"[-2147483648, 2147483647]; accepted: {ACCEPTED}")
            if value < 0:
                out += (value & 0xFFFFFFFF).to_bytes(4, "little")
            else:
                out += value.to_bytes(max(1, (value.bit_length() + 7) // 8), "little")
            i = m.end()
            continue
        raise ValueError(f"cannot parse {text[i:i + 12]!r} at character {i + 1}; accepted: {ACCEPTED}")
    if len(out) > MAX_PATTERN_BYTES:
        raise ValueError(f"is {len(out)} bytes; fio's limit is {MAX_PATTERN_BYTES}")
    return Pattern(bytes(out), tuple(offsets))


def verify_pattern_option(text: str, kb_base: int = 1024) -> str:
    """verify_pattern as the option table keeps it: the text, once it parses (else refused
    with where it stops and what is accepted)."""
    parse_pattern(text)
    return text


def parse_buffer_pattern(text: str, kb_base: int = 1024) -> bytes:
    """buffer_pattern, parsed as fio parses it: verify_pattern's tokens but `%o`."""
    pattern = parse_pattern(text)
    if pattern.offset_at:
        raise ValueError(f"%o (an offset) is not accepted here (fio 3.33 refuses it); accepted: {ACCEPTED}"
                         .replace(", %o (the block's offset)", ""))
    return pattern.data


@dataclasses.dataclass(frozen=True)
class VerifySpec:
    """How a job's verify writes and checks blocks when it sets a pattern, an interval,
    meta or pattern (otherwise the job's verify is the plain type number)."""
    kind: int  # fio's verify type number
    pattern: Pattern | None = None
    interval: int = 0  # a header every `interval` bytes (0: one per block)
    thread: int = 0  # the headers' thread field (fio's thread number)

    @property
    def plain(self) -> bool:
        """A header and checksum per block, nothing more (verify.py's compiled batches)."""
        return self.pattern is None and not self.interval and self.kind not in (META, PATTERN, PATTERN_NO_HDR)

    def step(self, length: int) -> int:
        """The bytes each header covers: the interval where it divides the block (fio 3.33
        writes one header per block otherwise), else the block."""
        return self.interval if self.interval and length % self.interval == 0 else length


def fio_interval(job) -> int:
    """verify_interval as fio 3.33's fixup leaves it (init.c, fixup_options), 0 where
    every read and write is one size and the interval is that size (a header per block)."""
    from cxlhm_apps.fio.pattern import size_choices
    read, write = size_choices(job.values)
    lo, hi = write.min, write.max
    interval = job["verify_interval"] or 0
    if hi != lo and not interval:
        interval = lo
    if interval > lo:
        interval = lo
    elif job["rw"].reads and interval > read.min:
        interval = read.min
    if not interval or lo % interval or hi % interval:
        interval = math.gcd(lo, hi)
    one_size = {read.min, read.max, lo, hi} == {interval}
    return 0 if one_size else interval


def spec_of(job, types: dict[str, int], thread: int = 0):
    """The job's verify: 0 (off) or a VerifySpec (`thread`: fio's thread number of the
    clone, written into every header). verify_pattern without verify is fio's
    VERIFY_PATTERN: a header (type 17) then the pattern, checked as meta is."""
    name, text = job["verify"], job["verify_pattern"]
    if name in ("0", "null"):
        if text is None or "verify" in job.given:
            return 0
        return VerifySpec(PATTERN, parse_pattern(text), fio_interval(job), thread)
    pattern = None if text is None else parse_pattern(text)
    return VerifySpec(types[name], pattern, fio_interval(job), thread)


def _sub_blocks(spec: VerifySpec, starts, sizes, offsets):
    """Each block cut at its headers: (block index, start, size, offset, place in block) of
    every interval, in order."""
    starts, sizes, offsets = (np.asarray(a, np.int64) for a in (starts, sizes, offsets))
    step = np.where(sizes % spec.interval == 0, spec.interval, sizes) if spec.interval else sizes
    count = np.maximum(1, -(-sizes // np.maximum(step, 1)))
    block = np.repeat(np.arange(sizes.shape[0]), count)
    k = np.arange(block.shape[0]) - np.repeat(np.cumsum(count) - count, count)
    at = k * step[block]
    return block, starts[block] + at, np.minimum(step[block], sizes[block] - at), offsets[block] + at, at


def _fill(spec: VerifySpec, data: np.ndarray, starts, sizes, offsets) -> None:
    pattern = spec.pattern
    tile = None if pattern.offset_at or not len(sizes) else pattern.fill(int(np.max(sizes)), 0)
    for start, size, offset in zip(np.asarray(starts).tolist(), np.asarray(sizes).tolist(),
                                   np.asarray(offsets).tolist()):
        data[start:start + size] = tile[:size] if tile is not None else pattern.fill(size, offset)


def stamp_spec(spec: VerifySpec, data: np.ndarray, starts, sizes, offsets, seeds, numberios) -> None:
    """Fill and stamp the blocks (laid out as for verify.stamp_many) as fio writes them."""
    from cxlhm_apps.fio import verify as VF
    if spec.pattern is not None:
        _fill(spec, data, starts, sizes, offsets)
    if spec.kind == PATTERN_NO_HDR:
        return
    block, sub_starts, sub_sizes, sub_offsets, _ = _sub_blocks(spec, starts, sizes, offsets)
    seeds = np.zeros(block.shape[0], np.uint64) if spec.pattern is not None else np.asarray(seeds, np.uint64)[block]
    VF.stamp_many(data, sub_starts, sub_sizes, spec.kind, sub_offsets, seeds, np.asarray(numberios, np.int64)[block],
                  thread=spec.thread)


def _pattern_failure(spec: VerifySpec, data, start, size, offset):
    """The first byte of the block that is not the pattern (headers left out), as fio says it."""
    from cxlhm_apps.fio.verify import HEADER_BYTES, VerifyFailure
    got = data[start:start + size]
    wrong = got != spec.pattern.fill(size, offset)
    step = spec.step(size)
    skip = 0 if spec.kind == PATTERN_NO_HDR else HEADER_BYTES
    if skip:
        wrong = wrong.copy()
        for at in range(0, size, step):
            wrong[at:at + skip] = False
    if not wrong.any():
        return None
    i = int(np.argmax(wrong))
    k = i // step
    have, want = int(got[i]), int(spec.pattern.fill(size, offset)[i])
    lead = (f"fio: got pattern '{have:02x}', wanted '{want:02x}'. Bad bits {bin(have ^ want).count('1')}\n"
            f"fio: bad pattern block offset {i - k * step - skip}\n")
    return VerifyFailure(offset + k * step, min(step, size - k * step), "pattern: verify failed", lead=lead,
                         block=(offset, size))


def check_spec(spec: VerifySpec, data: np.ndarray, starts, sizes, offsets, seeds=None, numberios=None):
    """verify.check_many for a VerifySpec: (block index, failure) for each failing block,
    the first failure of the block, in block order."""
    from cxlhm_apps.fio import verify as VF
    failed: dict[int, VF.VerifyFailure] = {}
    starts, sizes, offsets = (np.asarray(a, np.int64) for a in (starts, sizes, offsets))
    if spec.kind != PATTERN_NO_HDR:
        block, sub_starts, sub_sizes, sub_offsets, _ = _sub_blocks(spec, starts, sizes, offsets)
        sub_seeds = None
        if spec.pattern is not None:
            sub_seeds = np.zeros(block.shape[0], np.uint64)  # (fio leaves rand_seed 0 under a pattern)
        elif seeds is not None:
            sub_seeds = np.asarray(seeds, np.uint64)[block]
        sub_numberios = None if numberios is None else np.asarray(numberios, np.int64)[block]
        for j, failure in VF.check_many(data, sub_starts, sub_sizes, spec.kind, sub_offsets, sub_seeds,
                                        sub_numberios):
            b = int(block[j])
            if b not in failed:
                failed[b] = dataclasses.replace(failure, block=(int(offsets[b]), int(sizes[b])))
    if spec.pattern is not None and spec.kind in (META, PATTERN, PATTERN_NO_HDR):
        for b in range(starts.shape[0]):
            if b not in failed:
                failure = _pattern_failure(spec, data, int(starts[b]), int(sizes[b]), int(offsets[b]))
                if failure:
                    failed[b] = failure
    return sorted(failed.items())
