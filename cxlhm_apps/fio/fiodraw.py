"""fio 3.33's offsets and block sizes for a random job (rw=randread, randwrite, randrw;
random_distribution random, zoned or zoned_abs), drawn as fio draws them (io_u.c), so a
job issues fio's own (offset, length, direction) sequence for the same job file.

For each I/O, after its direction (fiorand.MixedDirections):
- offset (get_next_rand_offset): a block b = last_block x r / 2^32 from the offsets'
  generator, where last_block counts the direction's `blockalign` steps (by default its
  smallest block) that leave room for its smallest block. With the random map, a taken b
  moves to the map's next free cell after it, wrapping (axmap_next_free); none free ends
  the pass (under time_based fio clears the map and draws again). The offset is b steps;
  one at or past the region's end ends the pass too.
- size (get_next_buflen): fixed when the direction has one size; else a draw from the
  direction's own generator, again while the block would cross the region's end: bsrange
  takes min + max x r / 2^32, bssplit walks its entries sorted by percentage (fio sorts
  them; equal ones keep their order) and takes the first whose cumulative share covers
  r and that fits; then down to a multiple of the smallest block, at most the largest.
  A direction whose smallest block does not fit at the offset ends the pass.
- the map (mark_random_map; fio's axmap, fioaxmap.py) has a cell per smallest block of
  all directions, but each direction reads and marks it in its own smallest-block units;
  an I/O marks the cells from its offset until one is taken and is cut to what it marked.
`blockalign` other than a direction's smallest block turns the map off, as in fio.

random_distribution=zoned / zoned_abs first draws a zone (its own generator: a value of
1-100 picks the zone whose access percentages cover it), then a block of the zone's part
of last_block as above (fio keeps no map for them).

rw=randread:N (and randwrite, randrw): the first I/O and every N-th one after it draw as
above, the others go on from where their direction's last one ended (with
rw_sequencer=identical: at the same offset), drawing a random one where that is past the
file's end. fio marks none of them in the map.

percentage_random=R[,W] (io_u.c, should_do_random): an I/O due a random offset (every
one, or every N-th under rw=randread:N) below 100% first draws v = rand_between(1, 100)
from its direction's generator (seq_rand_state: fio 3.33 seeds both from the reads'
seed, FIO_RAND_SEQ_RAND_READ_OFF, again each pass under randrepeat) and is random only if
v <= its percentage; 100% draws nothing. The others go on from their direction's last
end as above (never `identical`), are not marked in the map and draw a random offset
where that is past the file's end: at 0% each direction runs from the region's start
and turns random only there. fio keeps the random map for such a job (init.c changes
nothing for it).

A position past the region's end but inside a larger file (fio's real_file_size, given
as file_end) ends the pass instead, as does any position past the end for a sequential
job (rw=read with several block sizes), which never turns random.

What stays cxlhm's own: `random_generator=lfsr` (every block once per pass, cxlhm's
order), and zipf, pareto and normal (see distributions.py): their
offsets and sizes follow fio's laws, not its sequence; percentage_random's choice of
the I/O that go on sequentially is fio's for them too (random_turns, place_turns).
"""
from __future__ import annotations

import numba
import numpy as np

from cxlhm_apps.fio.fioaxmap import is_set, new_map, next_free, set_run
from cxlhm_apps.fio.fiorand import FioSeeds, rand_between, rand_state, taus88_next, taus258_next
from cxlhm_apps.fio.options import READ, WRITE

# per_offset of a sequential job: its offsets are never random (the draw gives only sizes)
NEVER_RANDOM = 1 << 62
_MAX_REDRAWS = 1 << 20  # a size that never fits ends the pass instead of hanging


@numba.njit(nogil=True, cache=True, inline="always")
def _rand(state, use64):
    if use64:
        return taus258_next(state)
    return taus88_next(state)


@numba.njit(nogil=True, cache=True, inline="always")
def _unit(r, use64):
    """r / (rand_max + 1.0), as fio's double."""
    if use64:
        return np.float64(r) / 18446744073709551616.0
    return np.float64(r) / 4294967296.0


@numba.njit(nogil=True, cache=True)
def _block(d, rstate, r64, lastb, ba, zmode, zstate, ztab, words, level_at, nr_bits, use_map):
    """get_next_rand_offset: direction d's next block (in its blockalign steps), or -1."""
    lb = lastb[d]
    if lb <= 0:
        return -1
    base = 0
    if zmode[d] != 0:  # a zone by rand_between(1, 100), then a block inside it
        v = np.int64(100.0 * _unit(taus88_next(zstate), False))
        z0, z1 = ztab[d, v, 0], ztab[d, v, 1]
        if zmode[d] == 1:  # zoned: percentages of last_block
            base = z0 * lb // 100
            lb = lb * (z1 - z0) // 100
        else:  # zoned_abs: bytes, in blockalign steps
            base = z0 // ba[d]
            if z1 // ba[d] > lb:
                return -1
            lb = z1 // ba[d] - base
    b = np.int64(np.float64(lb) * _unit(_rand(rstate, r64), r64))
    if use_map and is_set(words, level_at, nr_bits, b):
        b = next_free(words, level_at, nr_bits, b)
        if b < 0:
            return -1
    return b + base


@numba.njit(nogil=True, cache=True, inline="always")
def _random_turn(d, pct, pstate):
    """fio's should_do_random: whether direction d's I/O takes a random offset. Below 100%
    it is rand_between(1, 100) <= the percentage, from the direction's own generator."""
    if pct[d] >= 100:
        return True
    return rand_between(pstate[d], 1, 100, False) <= pct[d]


@numba.njit(nogil=True, cache=True)
def _draw(dirs, off, size, rstate, r64, bstate, b64, minbs, maxbs, ba, lastb, split_bs, split_pc, nsplit,
          zmode, zstate, ztab, seq, seq_nr, identical, pct, pstate, length, file_end, words, level_at, nr_bits,
          use_map, cap, reset_full, wraps):
    """fio's offset and size for each direction in dirs (see the module's text), into off
    (relative to the region) and size. Stops before an I/O once `cap` bytes went out
    (cap < 0: no cap). rw=randread:N: every seq_nr-th I/O may take a random offset, the
    others the next one of their direction (or, `identical`, the same again) and are not
    marked in the map; seq holds fio's count to the next random one, then each
    direction's next and last offset. percentage_random: such an I/O is random only when
    _random_turn says so (pct, pstate: each direction's percentage and generator), else
    it goes on from its direction's last one, unmarked. Where a time_based pass starts
    again (a direction back at the start, a full map cleared: where fio drops a buffered
    file's cached pages) the I/O's index goes to wraps[1 + wraps[0]], wraps[0] counting
    them. Returns (I/Os drawn, 1 if the pass ended on an I/O fio could not place)."""
    issued = 0
    for i in range(dirs.shape[0]):
        if cap >= 0 and issued >= cap:
            return i, 0
        d = dirs[i]
        seq[0] -= 1
        o = -1
        hit = seq[0] == 0
        if hit:
            seq[0] = seq_nr
        # (fio draws the choice only for an I/O due a random offset)
        rand = hit and _random_turn(d, pct, pstate)
        if not rand:
            if identical and not hit:  # (a hit gone sequential continues: get_next_seq_offset)
                o = seq[3 + d] if seq[3 + d] >= 0 else 0
            elif reset_full and seq[1 + d] >= length:
                seq[1 + d] = 0  # time_based: back to the start
                o = 0
                wraps[0] += 1
                wraps[wraps[0]] = i
            elif seq[1 + d] < file_end:  # (fio: a position inside the file goes on; one
                o = seq[1 + d]            # past the region's end then ends the pass)
        if o < 0:  # a random offset (also for a direction past the end)
            if seq_nr >= NEVER_RANDOM:  # a sequential job's pass ends there instead
                return i, 1
            b = -1
            for _attempt in range(2):
                b = _block(d, rstate, r64, lastb, ba, zmode, zstate, ztab, words, level_at, nr_bits, use_map)
                if b >= 0 or not reset_full:
                    break
                words[:] = 0  # time_based: fio clears the map and draws again
                seq[1], seq[2], seq[3], seq[4] = 0, 0, -1, -1
                wraps[0] += 1
                wraps[wraps[0]] = i
            if b < 0:
                return i, 1
            o = b * ba[d]
        if o >= length:
            return i, 1
        lo, hi = minbs[d], maxbs[d]
        s = lo
        if lo != hi:
            if o + lo > length:
                return i, 1
            rmax = np.uint64(0xFFFFFFFFFFFFFFFF) if b64 else np.uint64(0xFFFFFFFF)
            tries = 0
            while True:
                r = _rand(bstate[d], b64)
                if nsplit[d] == 0:
                    s = lo + np.int64(np.float64(hi) * _unit(r, b64))
                else:
                    perc = np.uint64(0)
                    for k in range(nsplit[d]):
                        if split_pc[d, k] == 0:
                            continue
                        s = split_bs[d, k]
                        perc += np.uint64(split_pc[d, k])
                        if r // perc <= rmax // np.uint64(100) and o + s <= length:
                            break
                if lo & (lo - 1) == 0:
                    s &= ~(lo - 1)
                else:
                    s -= s % lo
                if s > hi:
                    s = hi
                if o + s <= length:
                    break
                tries += 1
                if tries > _MAX_REDRAWS:
                    return i, 1
        if o + s > file_end:  # (fio checks a block of fixed size against the file's end only)
            return i, 1
        if use_map and rand:  # (fio's IO_U_F_BUSY_OK: a sequential I/O marks nothing)
            got = set_run(words, level_at, nr_bits, o // lo, (s + lo - 1) // lo)
            if got > 0 and got * lo < s:
                s = got * lo
        off[i] = o
        size[i] = s
        seq[1 + d], seq[3 + d] = o + s, o
        issued += s
    return dirs.shape[0], 0


# random_turns' kinds of I/O: not due a random offset, due one but sequential, random
NOT_DUE, SEQUENTIAL, RANDOM = 0, 1, 2


@numba.njit(nogil=True, cache=True)
def random_turns(dirs, pct, pstate, due, seq_nr, out):
    """For offsets that are not fio's draws (random_generator=lfsr; zipf, pareto, normal):
    fio's choice of which I/O take a random offset, as _draw makes it. due[0] is fio's
    count to the next I/O due a random offset (rw=randread:N); out gets each I/O's kind."""
    for i in range(dirs.shape[0]):
        due[0] -= 1
        if due[0] != 0:
            out[i] = NOT_DUE
            continue
        due[0] = seq_nr
        out[i] = RANDOM if _random_turn(dirs[i], pct, pstate) else SEQUENTIAL


@numba.njit(nogil=True, cache=True)
def place_turns(kind, dirs, size, pool, at, last, length, align, identical, restart, off, i0, resumed):
    """Offsets (relative to the region) for random_turns' kinds, from I/O i0 on: a RANDOM
    one takes pool[at] (moved back to fit the region), the others go on from their
    direction's last end (NOT_DUE with `identical`: its last start again), as fio's
    get_next_seq_offset; last holds each direction's end, then start. A sequential I/O
    past the region's end goes back to the start when `restart` (time_based), else it
    needs a random offset: placement stops there, returning (its index, at), to be
    resumed from it with `resumed` once pool[at] is one drawn for it. Returns
    (len(kind), at) once all are placed."""
    for i in range(i0, kind.shape[0]):
        d, s = dirs[i], size[i]
        o = -1
        if kind[i] == NOT_DUE and identical:
            o = last[2 + d] if last[2 + d] >= 0 else 0
        elif kind[i] != RANDOM:
            o = last[d]
            if o + s > length:
                if restart:
                    o = 0
                elif not (resumed and i == i0):
                    return i, at
                else:
                    o = -1
        if o < 0:
            o = pool[at]
            at += 1
            if o + s > length:
                o = max(0, length - s)
                o -= o % align
        off[i] = o
        last[d], last[2 + d] = o + s, o
    return kind.shape[0], at


class FioDraw:
    """One job clone's offsets and sizes as fio draws them (see the module's text).

    sizes: the two directions' SizeChoice; length: the region's bytes (fio's io_size);
    blockalign: the job's, or None; time_based: a full map is cleared, not the pass's end;
    distribution: None (uniform) or a zoned / zoned_abs DistSpec; file_end: the bytes from
    the region's start to the file's end (fio's real_file_size; None: the region's end).
    seeds.percentage_random gives each direction's share of random offsets."""

    def __init__(self, seeds: FioSeeds, sizes, length: int, blockalign: int | None, randommap: bool,
                 time_based: bool, distribution=None, per_offset: int = 1, identical: bool = False,
                 file_end: int | None = None):
        self.seeds = seeds
        self.length = int(length)
        # a sequential I/O goes on while its position is inside the file: past the region's
        # end but inside a larger file it ends the pass, past the file's end it turns random
        self.file_end = max(self.length, int(file_end)) if file_end is not None else self.length
        self.time_based = time_based
        self.minbs = np.array([sizes[d].min for d in (READ, WRITE)], np.int64)
        self.maxbs = np.array([sizes[d].max for d in (READ, WRITE)], np.int64)
        self.ba = np.array([blockalign or sizes[d].min for d in (READ, WRITE)], np.int64)
        # last_block: the steps of blockalign that leave room for the smallest block
        self.lastb = np.array([max(0, self.length - max(0, int(m - a))) // int(a)
                               for m, a in zip(self.minbs, self.ba)], np.int64)
        width = max(1, max(len(sizes[d].split_sizes) for d in (READ, WRITE)))
        self.split_bs = np.zeros((2, width), np.int64)
        self.split_pc = np.zeros((2, width), np.int64)
        self.nsplit = np.zeros(2, np.int64)
        for d in (READ, WRITE):
            entries = split_table(sizes[d])
            self.nsplit[d] = len(entries)
            for k, (bs, pc) in enumerate(entries):
                self.split_bs[d, k], self.split_pc[d, k] = bs, pc
        self.zmode = np.zeros(2, np.int64)
        self.ztab = np.zeros((2, 100, 2), np.int64)
        kind = distribution.kind if distribution is not None else "random"
        if kind in ("zoned", "zoned_abs"):
            for d in (READ, WRITE):
                self.zmode[d] = 1 if kind == "zoned" else 2
                self.ztab[d] = zone_table(distribution.zones[d])
        # fio keeps no map for a skewed distribution, nor with blockalign off a smallest block
        self.use_map = (randommap and kind == "random"
                        and (blockalign is None or bool((self.ba == self.minbs).all())))
        self.nr_bits = self.length // int(self.minbs.min())
        self.words, self.level_at = new_map(self.nr_bits)
        self.seq_nr, self.identical = max(1, int(per_offset)), bool(identical)
        # fio's count to the next random offset (from 1: the first is random; a sequential
        # job's never comes: NEVER_RANDOM), each direction's next offset and last one
        self.seq = np.array([1 if self.seq_nr < NEVER_RANDOM else self.seq_nr, 0, 0, -1, -1], np.int64)
        self.wraps = np.zeros(0, np.int64)  # the last draw's time_based restarts (draw())
        # percentage_random per direction (100: every due I/O random, no choice drawn)
        self.perc = np.array(seeds.percentage_random[:2], np.int64)
        self.use64 = seeds.generator == "tausworthe64"
        # fio switches a tausworthe job to tausworthe64 when the map has more cells than 32
        # bits count, after it seeded the first pass: that pass stays 32-bit
        self._switch64 = seeds.generator == "tausworthe" and self.nr_bits > 0xFFFFFFFF
        self.reseed(first=True)

    def reseed(self, first: bool = False) -> None:
        """fio's td_fill_rand_seeds: the offsets' and sizes' generators from their seeds."""
        if self._switch64 and not first:
            self.use64 = True
        self.rstate = rand_state(self.seeds.offset_seed(), self.use64)
        self.bstate = np.stack([rand_state(s, self.use64) for s in self.seeds.size_seeds()])
        self.zstate = rand_state(self.seeds.zone_seed(), False)  # (fio's zone generator is 32-bit)
        # percentage_random's choice: a 32-bit generator per direction, both from one seed
        self.pstate = self.seeds.seq_rand_states()

    def reset_map(self) -> None:
        """A new pass: fio opens the file again, with a clear map, at its start."""
        self.words[:] = 0
        self.seq[1:] = 0, 0, -1, -1

    def draw(self, direction: np.ndarray, cap: int | None) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """Offsets (relative to the region) and sizes for the directions, stopping before an
        I/O once `cap` bytes went out. Returns (offset, size, I/Os drawn, whether the pass
        ended on an I/O fio could not place); `wraps` then holds the indices of the I/Os a
        time_based pass started again at."""
        n = direction.shape[0]
        off = np.empty(n, np.int64)
        size = np.empty(n, np.int64)
        wraps = np.zeros(n + 1, np.int64)
        got, failed = _draw(direction.astype(np.int64), off, size, self.rstate, self.use64, self.bstate,
                            self.use64, self.minbs, self.maxbs, self.ba, self.lastb, self.split_bs,
                            self.split_pc, self.nsplit, self.zmode, self.zstate, self.ztab, self.seq,
                            self.seq_nr, self.identical, self.perc, self.pstate, self.length, self.file_end,
                            self.words, self.level_at,
                            self.nr_bits, self.use_map,
                            -1 if cap is None else int(cap), self.time_based, wraps)
        self.wraps = wraps[1:1 + wraps[0]]
        return off[:got], size[:got], int(got), bool(failed)


def zone_table(zones) -> np.ndarray:
    """fio's zone_state_index for one direction: for each of the 100 values of
    rand_between(1, 100), the zone's start and end (percentages for zoned, bytes for
    zoned_abs), each zone taking as many values as its access percentage (whole numbers)."""
    table = np.zeros((100, 2), np.int64)
    j, start = 0, 0
    for access, size in zones:
        end = start + int(size)
        for _ in range(int(access)):
            if j < 100:
                table[j] = start, end
                j += 1
        start = end
    return table


def split_table(choice) -> list[tuple[int, int]]:
    """A direction's bssplit as fio keeps it: whole percentages (fio reads them with atoi),
    sorted by percentage, equal ones in the order given; [] without bssplit."""
    if not choice.split_sizes:
        return []
    pcs = choice.split_pc or tuple(int(p * 100 + 1e-6) for p in choice.split_p)
    return sorted(zip(choice.split_sizes, pcs), key=lambda e: e[1])


def warm_up() -> None:
    """Compile the draw now (seconds with a cold cache), not in a job's run time."""
    from cxlhm_apps.fio.pattern import SizeChoice
    sizes = (SizeChoice(split_sizes=(4096, 8192), split_p=(0.5, 0.5), split_pc=(50, 50)), SizeChoice(fixed=4096))
    FioDraw(FioSeeds(), sizes, 1 << 20, None, True, False).draw(np.zeros(4, np.int8), None)
