"""fio's SPRandom preconditioning (`sprandom`, `spr_op`, `spr_num_regions`, `spr_cs`;
fio's sprandom.c, newer than 3.33): the write offsets that leave a flash drive in the
steady state a random-write workload would reach, in one pass over the drive plus its
over-provisioning.

What fio computes, and this module too:

- the physical size: the logical size (the file's, or io_size if smaller) plus
  ceil(logical x spr_op), cut down to a multiple of the write block size; that is the
  job's io_size (its byte budget);
- a validity per region (`spr_num_regions` equal regions of the physical size): with
  write amplification WA = 0.5 / op + 0.7 and the garbage-collected block's validity
  1 - 1/WA, validities spaced evenly from 1 down to it, each region's relative size
  taken as 1/validity, the curve resampled at evenly spaced cumulative sizes by linear
  interpolation and reversed (the first region is the least valid); its invalid share
  in 1/10000ths, rounded;
- the writes, region by region, region_size / bs writes each: each write is kept for a
  later rewrite ("invalidated") with the region's invalid share as probability, drawn
  from fio's own generator (taus88, seeded from the job's 23rd seed, FIO_RAND_SPRANDOM_OFF);
  the rewrites of a region's kept writes come at the start of the next region (right
  after its first new write), or with `spr_cs` (a device cache to stay clear of) at the
  next region's end; the rest of a region is new blocks. The job ends when the new
  blocks run out (every block written once) or after the last region.

What differs: fio takes the new blocks from its LFSR over the file's blocks; here they
come from cxlhm's generator for `random_generator=lfsr` (every block once, in another
order), so the offsets are not fio's, while the number of writes, which writes are
rewrites and of which earlier write, and when the job ends are. fio sizes its buffer of
kept writes for six standard deviations and aborts past it; here it is unbounded.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import math

import numba
import numpy as np

from cxlhm_apps.fio import fiorand

PCT_PRECISION = 10000
SPRANDOM_SEED_INDEX = 22  # fio.h at the examples' commit: FIO_RAND_SPRANDOM_OFF
OPTIONS = ("sprandom", "spr_op", "spr_num_regions", "spr_cs")


def write_amplification(op: float) -> float:
    return 0.5 / op + 0.7


def physical_size(op: float, logical: int, align: int) -> int:
    size = logical + math.ceil(logical * op)
    return size - size % align


def _linspace(start: float, end: float, n: int) -> list[float]:
    if n == 1:
        return [start]
    step = (end - start) / (n - 1.0)
    return [start + i * step for i in range(n)]


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """fio's linear_interp: in the first interval [xs[i], xs[i+1]] that holds x (xs rise)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_left(xs, x) - 1
    if abs(xs[i + 1] - xs[i]) < 1e-9:
        return ys[i]
    return ys[i] + (ys[i + 1] - ys[i]) * ((x - xs[i]) / (xs[i + 1] - xs[i]))


def validity_distribution(regions: int, op: float) -> list[float]:
    """Each region's expected share of valid data, the least valid first (fio's
    compute_validity_dist)."""
    gc_validity = 1.0 - 1.0 / write_amplification(op)
    validity = _linspace(1.0, gc_validity, regions)
    acc, xs = 0.0, []
    for v in validity:
        acc += 1.0 / v
        xs.append(acc)
    resampled = [_interp(x, xs, validity) for x in _linspace(xs[0], xs[-1], regions)]
    return resampled[::-1]


def invalid_shares(regions: int, op: float) -> list[int]:
    """Each region's invalid share in 1/10000ths (C's round: halves away from zero)."""
    return [int(math.floor((1.0 - v) * PCT_PRECISION + 0.5)) for v in validity_distribution(regions, op)]


def sprandom_seed(randseed: int, thread_number: int) -> int:
    """fio's rand_seeds[FIO_RAND_SPRANDOM_OFF] for the job."""
    return fiorand.job_seed(randseed, thread_number, SPRANDOM_SEED_INDEX)


@numba.njit(nogil=True, cache=True)
def _draws(state, n, out):
    """fio's rand_between(state, 0, 10000) n times (rand32_upto: the 32-bit draw scaled
    to 0..10000)."""
    for i in range(n):
        r = fiorand.taus88_next(state)
        out[i] = np.int64(10001.0 * (np.float64(r) / 4294967296.0))


@dataclasses.dataclass(frozen=True)
class Settings:
    op: float
    regions: int
    cache: int  # spr_cs, bytes (0: none)

    @classmethod
    def of_job(cls, job) -> "Settings | None":
        if not job["sprandom"]:
            return None
        return cls(float(job["spr_op"]), int(job["spr_num_regions"]), int(job["spr_cs"]))


class Sequence:
    """fio's sprandom_info over one file: the next write's block, one at a time, as
    fio's sprandom_get_next_offset gives it (None once it is done)."""

    def __init__(self, settings: Settings, logical: int, bs: int, new_blocks, seed: int):
        self.physical = physical_size(settings.op, logical, bs)
        self.region_bytes = self.physical // settings.regions
        self.region_writes = self.region_bytes // bs
        self.cache = settings.cache
        if self.cache and self.cache > self.region_bytes:
            raise ValueError(f"spr_cs ({self.cache}) must be smaller than a region ({self.region_bytes} bytes: "
                             f"at most {self.physical // self.cache} regions for that cache)")
        self.regions = settings.regions
        self.pct = invalid_shares(settings.regions, settings.op)
        self.new_blocks = new_blocks  # an iterator over the file's blocks, each once
        self.state = fiorand.taus88_state(seed)
        self._draw_buf = np.empty(0, np.int64)
        self._draw_at = 0
        self.kept: collections.deque[int] = collections.deque()  # fio's phase buffer: committed ones first
        self.committed = 0  # how many at the front of `kept` are committed (readable)
        self.count = [0, 0]  # invalid_count per phase
        self.phase = 0
        self.region = 0
        self.remaining = self.region_writes
        self.done = False

    def _draw(self) -> int:
        if self._draw_at == len(self._draw_buf):
            self._draw_buf = np.empty(4096, np.int64)
            _draws(self.state, 4096, self._draw_buf)
            self._draw_at = 0
        self._draw_at += 1
        return int(self._draw_buf[self._draw_at - 1])

    def _keep_maybe(self, block: int, phase: int) -> None:
        if self._draw() <= self.pct[min(self.region, self.regions - 1)]:
            self.kept.append(block)
            self.count[phase] += 1

    def _pop(self) -> int | None:
        if not self.committed:
            return None
        self.committed -= 1
        return self.kept.popleft()

    def next(self) -> int | None:
        if self.done:
            return None
        block = None if self.cache else self._pop()  # rewrites at the start of the region
        if block is None and self.remaining == 0:
            if self.cache:  # rewrites at the end of the region instead (clear of the cache)
                block = self._pop()
            if block is None:
                if self.region >= self.regions:
                    self.done = True
                    return None
                self.count[self.phase] = 0
                self.region += 1
                self.phase ^= 1
                self.remaining = self.region_writes - self.count[self.phase]
                self.committed = len(self.kept)
        if block is None:
            block = next(self.new_blocks, None)
            if block is None:
                block = self._pop() if self.cache else None
                if block is None:
                    self.done = True
                    return None
                return block  # (fio does not draw for this last rewrite)
            if self.remaining > 0:
                self.remaining -= 1
        self._keep_maybe(block, self.phase ^ 1)
        return block


def parse_op(text: str, kb_base: int) -> float:
    """spr_op: an over-provisioning ratio in (0, 1), as fio documents it."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"expected a ratio such as 0.15, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise ValueError(f"the over-provisioning ratio must be in (0, 1), got {text!r}")
    return value


def problems(job) -> list[tuple[str, str]]:
    """(option, why) for a job whose sprandom settings fio refuses, or this module does
    not model (empty: none, or no sprandom)."""
    if not job["sprandom"]:
        return []
    rw, out = job["rw"], []
    if not (rw.writes and rw.random):
        out.append(("sprandom", "needs random writes (fio: sprandom requires random write, random_generator=lfsr, "
                                "norandommap=1)"))
    elif rw.reads:
        out.append(("sprandom", "with reads in the job (rw=randrw) is not modelled; rw=randwrite is"))
    if "random_generator" in job.given and job["random_generator"] != "lfsr":
        out.append(("random_generator", "sprandom requires random_generator=lfsr (fio sets it when not given)"))
    if "norandommap" in job.given and not job["norandommap"]:
        out.append(("norandommap", "sprandom requires norandommap=1 (fio sets it when not given)"))
    if job["percentage_random"][1] < 100:
        out.append(("percentage_random", "with sprandom is not modelled (its writes follow the region plan)"))
    from cxlhm_apps.fio.pattern import size_choices  # (pattern imports options, which imports this)
    writes = size_choices(job.values)[1]
    if writes.min != writes.max:
        out.append(("sprandom", "needs one write block size here (bsrange / bssplit: fio's regions count "
                                "writes of bs)"))
    return out


class Draw:
    """The write offsets of a sprandom job, in place of the generator's random ones
    (IoGenerator's fio_draw: draw / reseed / reset_map). Once the sequence is done, the
    job is: fio sets td->done, under time_based and loops too."""

    wraps = np.zeros(0, np.int64)  # (the sequence never starts again: no time_based restarts)

    def __init__(self, sequence: Sequence, bs: int, align: int):
        self.sequence, self.bs, self.align = sequence, bs, align

    def reseed(self, first: bool = False) -> None:
        pass  # (one sequence per job: fio sets it up once, with the files)

    def reset_map(self) -> None:
        pass

    def draw(self, direction: np.ndarray, cap: int | None) -> tuple[np.ndarray, np.ndarray, int, bool]:
        n = direction.shape[0]
        if cap is not None:
            n = min(n, max(0, -(-cap // self.bs)))
        blocks = []
        for _ in range(n):
            block = self.sequence.next()
            if block is None:
                break
            blocks.append(block)
        offset = np.array(blocks, np.int64) * self.align
        return offset, np.full(len(blocks), self.bs, np.int64), len(blocks), len(blocks) < n or n == 0


def attach(gen, job, region_len: int, seeds: "fiorand.FioSeeds") -> None:
    """Give a sprandom job's I/O generator its sequence and fio's byte budget (the
    physical size: fio's sprandom_init sets io_size to it). Nothing for other jobs."""
    settings = Settings.of_job(job)
    if settings is None:
        return
    from cxlhm_apps.fio.distributions import BlockPermutation
    bs = gen.sizes[1].min
    align = gen.align
    nblocks = max(1, region_len // bs)  # fio's LFSR covers min(file size, io_size) / min bs blocks
    order = BlockPermutation(nblocks, gen.seed + 2)

    def new_blocks():
        for start in range(0, nblocks, 65536):
            yield from order(np.arange(start, min(nblocks, start + 65536), dtype=np.int64)).tolist()

    sequence = Sequence(settings, region_len, bs, new_blocks(), sprandom_seed(seeds.randseed, seeds.thread_number))
    gen.fio_draw, gen.randommap = Draw(sequence, bs, align), False
    if gen.bytes_left is not None:  # (not time_based)
        gen.bytes_left = gen.loop_left = gen.loop_bytes = sequence.physical


def settle(gen, stats, depth: int) -> None:
    """fio's report of a sprandom job whose sequence ran out: fio sets td->done then, and
    with td->done it reaps no more completions (ioengines.c, td_io_getevents), so the
    writes still in flight - depth - 1 of them with a full queue - count as issued
    (total_ios) and not as done (io_bytes). The same here: the job's last depth - 1
    writes leave its write bytes, not its I/O count; their latencies stay in the
    statistics (fio has none for them). A job that ended on its io_size keeps all."""
    draw = getattr(gen, "fio_draw", None)
    if not isinstance(draw, Draw) or not draw.sequence.done:
        return
    writes = stats.dirs[1]
    unreaped = min(max(0, int(depth) - 1), writes.ios)
    writes.bytes -= unreaped * draw.bs
