"""What a job clone does next: directions, block sizes and offsets, generated a chunk
of I/Os at a time with numpy (never one Python call per I/O on the hot path).

Semantics follow fio:
- rwmixread picks each mixed I/O's direction, with fio's generator and rule where the
  runner gives one (fiorand.MixedDirections); sequential directions keep their own
  position (fio's per-direction last_pos) and wrap at the end of the region.
- bs / bsrange / bssplit per direction; bsrange sizes are multiples of the low end.
- random jobs (random_distribution random, zoned or zoned_abs; random_generator
  tausworthe or tausworthe64; rw=randread:N included) take their offsets and block sizes
  from fio's own generators, seeds and random map (fiodraw.py): the same job file
  issues fio's (offset, length, direction) sequence. The rest draw with numpy: random
  offsets aligned to the smallest block size of the job (or blockalign), every block
  once per pass with the map (lfsr), zipf, pareto and normal never use the map (as in
  fio); sequential jobs' sizes.
- `loops`: each pass of loop_bytes starts the direction rule's count again and, with
  randrepeat (fio seeds every generator again per pass), the same offsets, sizes and
  directions as the first pass.
- zonemode=strided (sequential jobs): I/O goes on from the zone's start for zonesize
  bytes (counted over both directions), then the zone moves zonerange + zoneskip on,
  back to the region's start once past the file's end (the file's, not the region's:
  like fio, the zones may reach past `size`); a position past the zone's range, and
  both directions after each zonerange bytes of I/O, start the zone again (fio's
  setup_strided_zone_mode).
- rw=randread:N issues N I/Os per random offset (rw_sequencer: sequential or
  identical); rw=read:SIZE skips SIZE after each sequential I/O.
- percentage_random=R[,W] (random jobs; sequential ones ignore it, as fio): only that
  share of each direction's I/O due a random offset takes one, chosen with fio's
  generator and seed; the rest go on from where the direction's last I/O ended. With
  fio's draws the whole sequence is fio's (fiodraw.py); with lfsr, zipf, pareto and
  normal the choice is fio's and the random offsets cxlhm's own (_turn_offsets).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cxlhm_apps.fio.distributions import BlockPermutation, BlockSampler, DistSpec
from cxlhm_apps.fio.fiodraw import NEVER_RANDOM, RANDOM, FioDraw, place_turns, random_turns
from cxlhm_apps.fio.fiorand import FioSeeds, MixedDirections
from cxlhm_apps.fio.options import READ, WRITE, RwMode


@dataclasses.dataclass(frozen=True)
class SizeChoice:
    """How one direction picks block sizes."""
    fixed: int | None = None
    low: int = 0
    high: int = 0
    split_sizes: tuple[int, ...] = ()
    split_p: tuple[float, ...] = ()
    split_pc: tuple[int, ...] = ()  # the percentages as fio keeps them (whole numbers)

    @property
    def min(self) -> int:
        return self.fixed or (self.low if self.low else min(self.split_sizes))

    @property
    def max(self) -> int:
        return self.fixed or (self.high if self.high else max(self.split_sizes))

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.fixed:
            return np.full(n, self.fixed, np.int64)
        if self.split_sizes:
            return np.asarray(self.split_sizes, np.int64)[rng.choice(len(self.split_sizes), size=n, p=self.split_p)]
        steps = self.high // self.low  # sizes low, 2*low, ..., <= high
        return self.low * rng.integers(1, steps + 1, size=n, dtype=np.int64)


def size_choices(values: dict) -> tuple[SizeChoice, SizeChoice]:
    """Per-direction size choice from bs/bsrange/bssplit (bssplit wins, then bsrange, as in fio)."""
    out = []
    for d in (READ, WRITE):
        split, rng_, bs = values["bssplit"][d], values["bsrange"][d], values["bs"][d]
        if split is not None:
            sizes = tuple(s for s, p in split if p > 0) or (split[0][0],)
            probs = np.array([p for s, p in split if p > 0] or [100.0])
            out.append(SizeChoice(split_sizes=sizes, split_p=tuple(probs / probs.sum()),
                                  split_pc=tuple(int(p) for s, p in split if p > 0) or (100,)))
        elif rng_ is not None and rng_[0] != rng_[1]:
            out.append(SizeChoice(low=rng_[0], high=rng_[1]))
        else:
            out.append(SizeChoice(fixed=rng_[0] if rng_ is not None else (bs or 4096)))
    return out[0], out[1]


@dataclasses.dataclass
class Chunk:
    direction: np.ndarray  # int8: 0 read, 1 write
    offset: np.ndarray  # int64 bytes in the file
    size: np.ndarray  # int64 bytes
    slot: np.ndarray  # int64 arena slot holding the I/O's buffer
    serial: np.ndarray | None = None  # int64 per write: its number among the job's writes (verify)

    def __len__(self) -> int:
        return self.offset.shape[0]

    def take(self, start: int, stop: int | None = None) -> "Chunk":
        s = slice(start, stop)
        return Chunk(self.direction[s], self.offset[s], self.size[s], self.slot[s],
                     None if self.serial is None else self.serial[s])


class IoGenerator:
    def __init__(self, *, rw: RwMode, sequencer: str, rwmixread: int, sizes: tuple[SizeChoice, SizeChoice],
                 region_start: int, region_len: int, distribution: DistSpec | None, randommap: bool,
                 seed: int, bytes_budget: int | None, ios_budget: int | None, blockalign: int | None = None,
                 directions: MixedDirections | None = None, loop_bytes: int | None = None,
                 reseed_loops: bool = False, zones: tuple[int, int, int, int] | None = None,
                 fio: FioSeeds | None = None, file_size: int | None = None):
        self.rw, self.sequencer, self.rwmixread = rw, sequencer, rwmixread
        if directions is None and fio is not None and rw.mixed:
            directions = fio.directions()
        self.directions = directions if rw.mixed else None
        self.distribution = distribution
        self.loop_bytes, self.reseed_loops = loop_bytes, reseed_loops
        self.loop_left = loop_bytes  # bytes of this pass still to issue (None: one pass)
        # zonemode=strided: (zonesize, zonerange, zoneskip, file size); the zone's start, the
        # bytes done in it and each direction's next position, all relative to the region
        self.zones = zones
        self._zone_start, self._zone_bytes, self._zone_pos = 0, 0, [0, 0]
        self.sizes = sizes
        active = [sizes[d] for d in (READ, WRITE) if (rw.reads, rw.writes)[d]]
        self.align = blockalign or min(c.min for c in active)
        self.max_bs = max(c.max for c in active)
        self.start = region_start
        self.length = region_len - region_len % self.align
        self.seed = seed
        self.uniform = distribution is None or distribution.kind == "random"
        self.randommap = randommap and self.uniform
        self.unit = self.align
        self.nblocks = max(1, self.length // self.unit)
        # fio's own offsets and sizes (fiodraw.py); a generator made without the job's
        # seeds takes fio's defaults for its randseed
        fio = fio or FioSeeds(randseed=seed, rwmixread=rwmixread)
        self.fio_draw = None
        fio_kinds = ("random", "zoned", "zoned_abs")
        # a forward sequential job of several sizes takes fio's size draws too (an offset
        # of fio's draw that is never random: rw=read:N with N past any job's I/Os)
        sequential_sizes = (not rw.random and rw.modifier == 0 and zones is None and distribution is None
                            and any(not c.fixed for c in active))
        if sequential_sizes or (rw.random and fio.generator != "lfsr"
                                and (distribution is None or distribution.kind in fio_kinds)):
            self.fio_draw = FioDraw(fio, sizes, region_len, blockalign, randommap, time_based=bytes_budget is None,
                                    distribution=distribution,
                                    per_offset=NEVER_RANDOM if sequential_sizes else max(1, rw.modifier),
                                    identical=sequencer == "identical",
                                    file_end=None if file_size is None else file_size - region_start)
            self.randommap = False  # (the draw keeps fio's map)
        # percentage_random on random offsets that are not fio's draws: fio's choice of the
        # I/O that go on sequentially, made here (random_turns); fio's draws make it themselves
        shares = [fio.percentage_random[d] for d in (READ, WRITE) if (rw.reads, rw.writes)[d]]
        self._turns = rw.random and self.fio_draw is None and min(shares) < 100
        self._pct = np.array(fio.percentage_random[:2], np.int64)
        self._due = np.ones(1, np.int64)  # fio's count to the next I/O due a random offset
        self._last = np.array([0, 0, -1, -1], np.int64)  # each direction's last end, then start
        self._restart = self._dead = False  # the pass ended where fio could not go on; nothing can issue
        # what fio's keep_running weighs before another pass of fio's draws
        self._fio, self._region_len = fio, region_len
        self._passes, self._short, self._bytes_done = 0, False, 0
        self._seed_generators()
        self.seq_pos = [0, 0]  # per-direction sequential position (relative to the region)
        self._seq_started = [False, False]  # whether a direction's first sequential I/O was placed
        self.bytes_left = bytes_budget
        self.ios_left = ios_budget
        self.issued = 0
        self.pass_starts: list[int] = []  # the I/O (its number among those issued) each later pass began at
        # where fio drops a file's cached pages among the I/Os (as pass_starts), when the runner
        # asks: at each later pass (fio opens the file again), at each time_based restart
        # (buffered I/O: fio's loop_cache_invalidate)
        self.drop_at_passes = self.drop_at_restarts = False
        self.cache_drops: list[int] = []

    def _seed_generators(self) -> None:
        seed = self.seed
        self.rng = np.random.default_rng(seed)
        self.sampler = BlockSampler(self.distribution, self.nblocks, seed + 1, block_bytes=self.align)
        self.permutation = BlockPermutation(self.nblocks, seed + 2) if self.randommap else None
        self._pass, self._drawn = 0, 0  # random-map pass and position in it
        if self.fio_draw is not None:
            self.fio_draw.reseed()
        # percentage_random's choice (fio seeds both directions' generators alike)
        self._pstate = self._fio.seq_rand_states()

    def _new_loop(self) -> None:
        """The next `loops` pass (fio's clear_io_state): under randrepeat every generator
        starts again from its seed, so the pass repeats the first one's I/Os."""
        self.loop_left = self.loop_bytes
        self._restart = False
        self.pass_starts.append(self.issued)
        if self.drop_at_passes:
            self.cache_drops.append(self.issued)
        self.seq_pos = [0, 0]  # (fio's clear_io_state: each pass starts at the region's start)
        self._last[:] = 0, 0, -1, -1
        if self.fio_draw is not None:  # fio opens the file again each pass, with a clear map
            self.fio_draw.reset_map()
        if self.reseed_loops:
            self._seed_generators()
        if self.directions is not None:
            self.directions.new_pass(self.reseed_loops)

    def _bytes_cap(self) -> int | None:
        """Bytes that may still go out: the job's budget, and this pass's."""
        caps = [c for c in (self.bytes_left, self.loop_left) if c is not None]
        return min(caps) if caps else None

    @property
    def exhausted(self) -> bool:
        return (self._dead or (self.bytes_left is not None and self.bytes_left <= 0)
                or (self.ios_left is not None and self.ios_left <= 0))

    def next_chunk(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Up to `n` I/Os: (direction, offset, size). Empty when the budget is spent, or
        when a fresh pass cannot place a single I/O."""
        for _ in range(2):  # the second time: a new pass, after one that could not go on
            if self.exhausted or n <= 0:
                break
            if self._restart or (self.loop_left is not None and self.loop_left <= 0):
                if not self._keep_running():
                    self._dead = True
                    break
                self._new_loop()
            out = self._chunk(n)
            if out[0].size:
                return out
        else:
            self._dead = True  # a fresh pass could not place a single I/O
        empty = np.zeros(0, np.int64)
        return empty.astype(np.int8), empty, empty

    def _end_pass(self) -> None:
        """fio could not place the next I/O: the pass ends short of its bytes (under
        time_based, or while io_size leaves a block or more to do, the job goes on with a
        new pass)."""
        self._short = True
        if self.loop_left is not None:
            self.loop_left = 0
        else:
            self._restart = True

    def _keep_running(self) -> bool:
        """fio's keep_running, for a job of fio's draws whose pass just ended: `loops`
        passes, then more while the bytes done fall short of io_size (else size) by a
        block or more - and, without io_size, not after a pass that ended short."""
        if self.bytes_left is None:
            return True  # (time_based)
        self._passes += 1
        short, self._short = self._short, False
        if self.fio_draw is None and not short:
            return True  # (a whole pass: the budgets of the others count whole passes)
        if self._passes < self._fio.loops:
            return True
        limit = self._fio.io_size or self._region_len
        left = limit - self._bytes_done
        return left >= self.max_bs and (bool(self._fio.io_size) or not short)

    def _chunk(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.ios_left is not None:
            n = min(n, self.ios_left)
        drawn_from, drawn, failed = None, n, False
        if self.directions is not None:
            drawn_from = self.directions.snapshot()
            direction = self.directions.draw(n)
        elif self.rw.mixed:
            direction = (self.rng.random(n) * 100.0 >= self.rwmixread).astype(np.int8)
        else:
            direction = np.full(n, WRITE if self.rw.writes else READ, np.int8)
        if self.fio_draw is not None:  # fio's offsets and sizes (stopping at the budget)
            offset, size, n, failed = self.fio_draw.draw(direction, self._bytes_cap())
            if self.drop_at_restarts and self.fio_draw.wraps.shape[0]:
                self.cache_drops.extend((self.issued + self.fio_draw.wraps).tolist())
            offset += self.start
            direction = direction[:n]
            if failed:
                self._end_pass()
        else:
            size = np.empty(n, np.int64)
            for d in (READ, WRITE):
                mask = direction == d
                if mask.any():
                    size[mask] = self.sizes[d].draw(int(mask.sum()), self.rng)
            cap = self._bytes_cap()
            if cap is not None:  # fio issues while fewer bytes than the budget went out:
                # the I/O that reaches it is the last, whole (random sizes may overshoot)
                n = min(n, int(np.searchsorted(np.cumsum(size), cap, side="left")) + 1)
                direction, size = direction[:n], size[:n]
            if self._turns:
                offset = self._turn_offsets(size, direction)
            elif self.rw.random:
                offset = self._random_offsets(size, direction)
            elif self.zones is not None:
                offset = self._strided_offsets(size, direction)
            else:  # (sized: fio's pass ends at the first I/O that does not fit before the region's end)
                offset, fits = self._sequential_offsets(size, direction, stop_at_end=self.bytes_left is not None)
                if fits < n:
                    n, direction, size, offset = fits, direction[:fits], size[:fits], offset[:fits]
                    self._end_pass()
        if drawn_from is not None and n < drawn:  # fio drew only for the I/Os it issued
            self.directions.restore(drawn_from)
            self.directions.draw(n)
            if failed:  # (and for the one it could not place)
                self.directions.draw_unissued()
        self._bytes_done += int(size.sum())
        if self.bytes_left is not None:
            self.bytes_left -= int(size.sum())
        if self.loop_left is not None:
            self.loop_left -= int(size.sum())
        if self.ios_left is not None:
            self.ios_left -= n
        self.issued += n
        return direction, offset, size

    # ------------------------------------------------------------ offsets
    def _sequential_offsets(self, size: np.ndarray, direction: np.ndarray, *,
                            stop_at_end: bool = False) -> tuple[np.ndarray, int]:
        """Offsets of the I/Os, and how many of them fit: all, unless `stop_at_end` (a
        job with a size, not time_based), where an I/O that would cross the region's end
        is the first that does not (fio does not wrap it to the start: the pass ends, and
        the bytes short of a block at the end are never done)."""
        hole = self.rw.modifier
        if stop_at_end and hole >= 0:
            return self._sequential_until_end(size, direction)
        offset = np.empty(size.shape[0], np.int64)
        for d in (READ, WRITE):
            idx = np.flatnonzero(direction == d)
            if not idx.size:
                continue
            sz = size[idx]
            if hole < 0:
                offset[idx] = self.start + self._backwards(d, sz, hole)
                continue
            step = sz + hole
            uniform = bool((sz == sz[0]).all()) and self.length % int(step[0]) == 0
            if uniform:  # the common case: wrap by modulo
                rel = (self.seq_pos[d] + np.arange(idx.size, dtype=np.int64) * int(step[0])) % self.length
                self.seq_pos[d] = int((rel[-1] + step[0]) % self.length)
            else:  # mixed sizes or holes: an I/O that would cross the end restarts at the start
                rel = np.empty(idx.size, np.int64)
                pos = self.seq_pos[d]
                for i, (s, st) in enumerate(zip(sz.tolist(), step.tolist())):
                    if pos + s > self.length:
                        pos = 0
                    rel[i] = pos
                    pos += st
                    if pos >= self.length:
                        pos = 0
                self.seq_pos[d] = pos
            offset[idx] = self.start + rel
            restarts = idx[rel == 0]  # (back at the start: a time_based restart, but for the first I/O)
            if not self._seq_started[d]:
                self._seq_started[d] = True
                restarts = restarts[restarts != idx[0]]
            if self.drop_at_restarts and restarts.shape[0]:
                self.cache_drops.extend((self.issued + restarts).tolist())
        return offset, size.shape[0]

    def _sequential_until_end(self, size: np.ndarray, direction: np.ndarray) -> tuple[np.ndarray, int]:
        offset = np.empty(size.shape[0], np.int64)
        fits = size.shape[0]
        rel, step = [None, None], [None, None]
        for d in (READ, WRITE):
            idx = np.flatnonzero(direction == d)
            if idx.size:
                step[d] = size[idx] + self.rw.modifier
                rel[d] = self.seq_pos[d] + np.cumsum(step[d]) - step[d]
                over = np.flatnonzero(rel[d] + size[idx] > self.length)
                if over.size:
                    fits = min(fits, int(idx[over[0]]))
        for d in (READ, WRITE):
            idx = np.flatnonzero(direction[:fits] == d)
            if idx.size:
                offset[idx] = self.start + rel[d][:idx.size]
                pos = int(rel[d][idx.size - 1] + step[d][idx.size - 1])
                self.seq_pos[d] = 0 if pos >= self.length else pos
        return offset, fits

    def _strided_offsets(self, size: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """fio's strided zones, one I/O at a time (see the module's text)."""
        zone_size, zone_range, zone_skip, file_size = self.zones
        zone_range = zone_range or zone_size
        file_end = max(file_size - self.start, self.length)  # (positions are relative to the region)
        offset = np.empty(size.shape[0], np.int64)
        pos = self._zone_pos
        for i, (s, d) in enumerate(zip(size.tolist(), direction.tolist())):
            if self._zone_bytes >= zone_size:
                self._zone_bytes = 0
                self._zone_start += zone_range + zone_skip
                if self._zone_start >= file_end:
                    self._zone_start = 0
                pos[d] = self._zone_start
            if pos[d] >= self._zone_start + zone_range or pos[d] + s > file_end:
                pos[d] = self._zone_start if self._zone_start + s <= file_end else 0
            if self._zone_bytes % zone_range == 0:  # fio resets the file (both directions) each zonerange
                pos[0] = pos[1] = self._zone_start
            offset[i] = self.start + pos[d]
            pos[d] += s
            self._zone_bytes += s
        return offset

    def _backwards(self, d: int, sz: np.ndarray, hole: int) -> np.ndarray:
        """rw=read:-SIZE, fio's way: the first I/O at the region's start, each next one
        SIZE before the end of the one before, and one that would start before the region
        SIZE before the region's end (fio 3.33: 0, then the blocks from the end down)."""
        rel = np.empty(sz.shape[0], np.int64)
        prev_end = self.seq_pos[d] if self.issued else None
        for i, s in enumerate(sz.tolist()):
            pos = 0 if prev_end is None else prev_end + hole
            if pos < 0:
                pos = self.length + hole
            pos = max(0, min(pos, self.length - s))
            rel[i] = pos
            prev_end = pos + s
        self.seq_pos[d] = prev_end
        return rel

    def _random_blocks(self, count: int, direction: np.ndarray) -> np.ndarray:
        if self.randommap:
            blocks = np.empty(count, np.int64)
            done = 0
            while done < count:  # a new pass (new order) each time the map is covered
                take = min(count - done, self.nblocks - self._drawn)
                positions = np.arange(self._drawn, self._drawn + take, dtype=np.int64)
                blocks[done:done + take] = self.permutation(positions)
                done += take
                self._drawn += take
                if self._drawn == self.nblocks:
                    self._pass += 1
                    self._drawn = 0
                    self.permutation = BlockPermutation(self.nblocks, self.seed * 1_000_003 + self._pass)
            return blocks
        if self.sampler.spec.kind in ("zoned", "zoned_abs") and self.rw.mixed:
            blocks = np.empty(count, np.int64)
            for d in (READ, WRITE):
                mask = direction == d
                if mask.any():
                    blocks[mask] = self.sampler.sample(int(mask.sum()), d)
            return blocks
        return self.sampler.sample(count, int(direction[0]) if count else 0)

    def _turn_offsets(self, size: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """percentage_random (or rw=randread:N with it) where the random offsets are the
        ones drawn here: fio's choice of which I/O are random (fiodraw.random_turns), the
        others going on from their direction's last I/O as fio's do (fiodraw.place_turns).
        Blocks are drawn only for I/O that take one, so the map's pass stays whole."""
        n = size.shape[0]
        kind = np.empty(n, np.int8)
        random_turns(direction, self._pct, self._pstate, self._due, max(1, self.rw.modifier), kind)
        pool = self._random_blocks(int((kind == RANDOM).sum()), direction[kind == RANDOM]) * self.unit
        offset = np.empty(n, np.int64)
        i, at, resumed = 0, 0, False
        while i < n:
            i, at = place_turns(kind, direction, size, pool, at, self._last, self.length, self.align,
                                self.sequencer == "identical", self.bytes_left is None, offset, i, resumed)
            if i < n:  # a direction past the region's end: fio draws it a random offset
                pool = np.insert(pool, at, self._random_blocks(1, direction[i:i + 1]) * self.unit)
                resumed = True
        return self.start + offset

    def _random_offsets(self, size: np.ndarray, direction: np.ndarray) -> np.ndarray:
        n = size.shape[0]
        per_offset = max(1, self.rw.modifier)
        groups = -(-n // per_offset)
        bases = self.start + self._random_blocks(groups, direction[::per_offset]) * self.unit
        offset = np.repeat(bases, per_offset)[:n]
        if per_offset > 1 and self.sequencer == "sequential":
            # within a group, each I/O follows the previous one
            within = np.arange(n) % per_offset
            prev = np.concatenate(([0], size[:-1]))
            prev[within == 0] = 0
            run = np.cumsum(prev)
            group_start = np.repeat(run[::per_offset], per_offset)[:n]
            # the run continues sequentially, wrapping at the end of the region like fio
            offset = self.start + (offset - self.start + (run - group_start)) % self.length
        end = self.start + self.length
        over = offset + size > end  # keep every I/O inside the region
        if over.any():
            offset[over] = self.start if per_offset > 1 and self.sequencer == "sequential" else end - size[over]
            offset[over] -= (offset[over] - self.start) % self.align
        return np.maximum(offset, self.start)
