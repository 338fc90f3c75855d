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
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class JobBuffers:
    """The write contents of one job clone (None from of_job where the job sets none)."""

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

    @classmethod
    def of_job(cls, job, *, thread_index: int, threads: int, region_len: int, min_write_bs: int,
               seed: int) -> "JobBuffers | None":
        if not (job["dedupe_percentage"] or job["buffer_compress_percentage"]):
            return None
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

    def fill(self, data: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> None:
        """Write the next len(starts) written blocks' bytes into `data` (a byte buffer)
        at `starts` (each block `sizes` bytes, a multiple of 8)."""
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
