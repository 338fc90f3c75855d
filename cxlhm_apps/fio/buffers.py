"""What a job writes, where the job asks for it: fio's dedupe and compression options
(`dedupe_percentage`, `dedupe_mode=repeat|working_set`, `dedupe_working_set_percentage`,
`dedupe_global`, `buffer_compress_percentage`, `buffer_compress_chunk`), as fio 3.33's
fill_io_buffer / get_buf_state / init_dedupe_working_set_seeds shape them:

- every written block is either a new unique block or, with probability
  `dedupe_percentage`, a copy: of the job's last unique block (`repeat`), or of a page of
  its working set (`working_set`: the job's first `size * dedupe_working_set_percentage /
  100 / bs` unique blocks; with `dedupe_global` the set is spread over every job with
  it, page i of job t being job (t + i // per_job) mod N's unique block i mod per_job, so
  jobs write copies of each other's blocks);
- each `buffer_compress_chunk` bytes (512) of a block are random for their first
  (100 - `buffer_compress_percentage`)% and zero for the rest (100%: all zero).

A block's bytes are a function of its key (job, unique index): words of a 64-bit mix of
the key and the word's place, so a copy is byte for byte the block it copies. What
differs from fio: the random bytes and the sequence of draws are cxlhm's (the shares are
fio's: checked against files fio writes in tests/test_fio_buffers.py).

Without those options (PlainBuffers) a write carries what fio 3.33's io_u.c puts there:
its buffer as it was (random bytes, or `zero_buffers`' zeros, or `buffer_pattern`
repeated), refilled before every write with `refill_buffers`, and by default
(`scramble_buffers=1`) scrambled a little before each write (small_content_scramble):
in every 512 bytes, the write's file offset (8 bytes) at one of the eight 64-byte lines
(picked by the issue time and the offset) and the issue time (seconds, nanoseconds) at
bytes 48-63. So no two written 512-byte pieces are alike, as in fio's files; the
clock is the moment cxlhm fills the buffer (fio's: the I/O's start time).
"""
from __future__ import annotations

import time

import numba
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
ARENA_BYTES = 64 << 20  # buffers for a chunk of writes whose contents are made for them
# plain writes: enough buffers for two chunks of 16 x iodepth blocks (the engine's queue
# drains at the end of each chunk: large blocks need more than verify's), at most this much
PLAIN_ARENA_MAX = 256 << 20


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class JobBuffers:
    """The write contents of one job clone (None from of_job where the job sets none)."""

    ahead = True  # (filling is costly: the runner fills the next chunk while the engine runs this one)

    def __init__(self, *, thread_index: int, threads: int, seed: int, dedupe_pct: int, mode: str,
                 working_set_pages: int, global_set: bool, compress_pct: int, compress_chunk: int):
        self.t, self.threads = thread_index, max(1, threads)
        self.dedupe_pct, self.mode = dedupe_pct, mode
        self.pages = max(1, working_set_pages)
        self.global_set = global_set
        self.compress_pct, self.chunk = compress_pct, max(1, compress_chunk)
        self.rng = np.random.default_rng(seed)
        self.unique = 0  # unique blocks made so far
        self.last_key = None  # (job, index) of the last unique block

    @staticmethod
    def arena_bytes(iodepth: int, max_bs: int) -> int:
        """The buffers the runner gives the job: each written block of a chunk its own."""
        return ARENA_BYTES

    @classmethod
    def of_job(cls, job, *, thread_index: int, threads: int, region_len: int, min_write_bs: int,
               seed: int) -> "JobBuffers | None":
        if not (job["dedupe_percentage"] or job["buffer_compress_percentage"]):
            return PlainBuffers.of_job(job, seed=seed)
        pages = region_len * job["dedupe_working_set_percentage"] // 100 // max(1, min_write_bs)
        return cls(thread_index=thread_index, threads=threads, seed=seed, dedupe_pct=job["dedupe_percentage"],
                   mode=job["dedupe_mode"], working_set_pages=pages, global_set=bool(job["dedupe_global"]),
                   compress_pct=job["buffer_compress_percentage"], compress_chunk=job["buffer_compress_chunk"])

    def _page_key(self, page: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.global_set:
            return np.full(page.shape, self.t, np.int64), page
        per_job = max(self.pages // self.threads, 1)
        return (self.t + page // per_job) % self.threads, page % per_job

    def keys(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The (job, unique index) key of each of the next n written blocks."""
        job = np.full(n, self.t, np.int64)
        index = np.empty(n, np.int64)
        if self.dedupe_pct >= 100:
            index[:] = 0 if self.last_key is None else self.last_key[1]
            if self.last_key is None:
                self.unique, self.last_key = 1, (self.t, 0)
            return job, index
        copy = self.rng.integers(1, 101, n) <= self.dedupe_pct
        fresh = ~copy
        # unique blocks take the next indexes in write order
        fresh_idx = np.flatnonzero(fresh)
        index[fresh_idx] = self.unique + np.arange(fresh_idx.shape[0])
        if self.mode == "working_set":
            page = self.rng.integers(0, self.pages, int(copy.sum()))
            job[copy], index[copy] = self._page_key(page)
        else:  # repeat: the last unique block before each copy (the job's first one if none yet)
            before = np.maximum.accumulate(np.where(fresh, np.arange(n), -1))
            prev = self.unique - 1 if self.unique else 0
            index[copy] = np.where(before[copy] >= 0, index[np.maximum(before[copy], 0)], prev)
        self.unique += fresh_idx.shape[0]
        return job, index

    def fill(self, data: np.ndarray, starts: np.ndarray, sizes: np.ndarray, offsets=None) -> None:
        """Write the next len(starts) written blocks' bytes into `data` (a byte buffer)
        at `starts` (each block `sizes` bytes, a multiple of 8; `offsets`, their places in
        the file, do not change them)."""
        n = starts.shape[0]
        if not n:
            return
        job, index = self.keys(n)
        keys = _mix(job.astype(np.uint64) * _GOLDEN + index.astype(np.uint64))
        for size in np.unique(sizes).tolist():
            sel = np.flatnonzero(sizes == size)
            words = size // 8
            with np.errstate(over="ignore"):
                block = _mix(keys[sel, None] + (np.arange(words, dtype=np.uint64) + np.uint64(1))[None, :] * _GOLDEN)
            raw = block.view(np.uint8).reshape(sel.shape[0], size)
            if self.compress_pct:
                place = np.arange(size) % self.chunk
                random_len = self.chunk * (100 - self.compress_pct) // 100
                raw[:, place >= random_len] = 0
            for row, start in zip(raw, starts[sel].tolist()):
                data[start:start + size] = row


@numba.njit(nogil=True, cache=True, inline="always")
def _put8(data, at, value):
    v = np.uint64(value)
    for j in range(8):
        data[at + j] = np.uint8(v & np.uint64(0xFF))
        v >>= np.uint64(8)


@numba.njit(nogil=True, cache=True)
def _scramble(data, words, starts, sizes, offsets, clock_ns):
    """fio's small_content_scramble on each block: per 512 bytes, the offset at line
    (nsec ^ offset) & 7 and the time at bytes 48-63 (each block a nanosecond later).
    `words`: `data` as uint64 where every block starts 8-aligned (else empty)."""
    aligned = words.shape[0] > 0
    for b in range(starts.shape[0]):
        now = clock_ns + b
        sec, nsec = now // 1_000_000_000, now % 1_000_000_000
        at, place = starts[b], offsets[b]
        line = ((nsec ^ place) & 7) << 6
        for _ in range(sizes[b] >> 9):
            if aligned:  # (little endian, as _put8 writes it)
                words[(at + line) >> 3] = np.uint64(place)
                words[(at + 48) >> 3] = np.uint64(sec)
                words[(at + 56) >> 3] = np.uint64(nsec)
            else:
                _put8(data, at + line, place)
                _put8(data, at + 48, sec)
                _put8(data, at + 56, nsec)
            at += 512
            place += 512


@numba.njit(nogil=True, cache=True)
def _refill_random(data, starts, sizes, state):
    """Fresh random bytes over each block (xorshift64*, its state carried in state[0])."""
    x = state[0]
    for b in range(starts.shape[0]):
        at = starts[b]
        for w in range(sizes[b] >> 3):
            x ^= x >> np.uint64(12)
            x ^= x << np.uint64(25)
            x ^= x >> np.uint64(27)
            _put8(data, at + 8 * w, x * np.uint64(0x2545F4914F6CDD1D))
    state[0] = x


_NO_WORDS = np.zeros(0, np.uint64)


def warm_up() -> None:
    """Load (or compile) the fill kernels now, not in a job's run time (5-10 ms each
    from numba's cache; a 256-write job runs in about 1 ms)."""
    data, one = np.zeros(512, np.uint8), np.zeros(1, np.int64)
    size = np.full(1, 512, np.int64)
    _scramble(data, data.view(np.uint64), one, size, one, 0)
    _refill_random(data, one, size, np.ones(1, np.uint64))


class PlainBuffers:
    """fio's write contents for a job with no dedupe or compression (None from of_job
    where they are the arena's random buffers as they are: no refill, no scramble)."""

    ahead = True  # (the next chunk is filled on the side while the engine runs this one)

    def __init__(self, *, base: np.ndarray | None, refill: bool, scramble: bool, seed: int):
        self.base = base  # zero_buffers' zeros or buffer_pattern's bytes (None: random)
        self.refill, self.scramble = refill, scramble
        self.state = np.array([_mix(np.array([seed], np.uint64))[0] | np.uint64(1)], np.uint64)

    @classmethod
    def of_job(cls, job, *, seed: int) -> "PlainBuffers | None":
        rw = job["rw"]
        if not rw.writes or job["verify"] not in ("0", "null") or job["verify_pattern"] is not None:
            return None  # (verify writes its own contents)
        given = job.given
        zero, refill, pattern = job["zero_buffers"], job["refill_buffers"], job["buffer_pattern"]
        # fio's fixup: scramble unless zero_buffers was asked for (and scramble_buffers was not)
        scramble = job["scramble_buffers"] and ("scramble_buffers" in given or not ("zero_buffers" in given and zero))
        if "dedupe_percentage" in given or "buffer_compress_percentage" in given:  # fio's TD_F_COMPRESS, set at 0
            scramble, refill = False, refill or "dedupe_percentage" in given
        base = None
        if pattern is not None:  # fio: no scramble, no zeros, refill where the job reads (reads overwrite)
            base = np.frombuffer(pattern, np.uint8)
            refill = refill if "refill_buffers" in given else rw.reads
            scramble = job["scramble_buffers"] and "scramble_buffers" in given
        elif zero:
            base = np.zeros(1, np.uint8)
        if base is None and not (refill or scramble):
            return None
        return cls(base=base, refill=refill, scramble=scramble, seed=seed)

    @staticmethod
    def arena_bytes(iodepth: int, max_bs: int) -> int:
        return min(PLAIN_ARENA_MAX, max(ARENA_BYTES, 32 * iodepth * max_bs))

    def fill(self, data: np.ndarray, starts: np.ndarray, sizes: np.ndarray, offsets: np.ndarray) -> None:
        """Make the next written blocks' bytes in `data` at `starts` (`sizes` bytes each,
        `offsets` their places in the file)."""
        if not starts.shape[0]:
            return
        starts, sizes = np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(sizes, np.int64)
        if self.base is not None:  # written every time (after a read fio would write the read's bytes)
            tile = np.resize(self.base, int(sizes.max()))
            for start, size in zip(starts.tolist(), sizes.tolist()):
                data[start:start + size] = tile[:size]
        elif self.refill:
            _refill_random(data, starts, sizes, self.state)
        if self.scramble:
            aligned = data.ctypes.data % 8 == 0 and data.shape[0] % 8 == 0 and not (starts % 8).any()
            words = data.view(np.uint64) if aligned else _NO_WORDS
            _scramble(data, words, starts, sizes, np.ascontiguousarray(offsets, np.int64), time.monotonic_ns())
