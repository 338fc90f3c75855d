"""fio 3.33's random generators and seeds, and the one draw whose rule is its own: the
direction of each I/O of a mixed job (rw=randrw/rw, rwmixread).

fio seeds each job's generators from `randseed` (default 0x89) and the job's number
(`thread_number`: jobs and clones counted from 1 in the order of the job file): 21 seeds
(rand_seeds[]), one per generator, each a 32-bit Tausworthe generator (taus88), or the
64-bit one (taus258) under `random_generator=tausworthe64`. With `randrepeat=1` (the
default) the offsets' generator takes 0xb1899bed times the job's number instead of its
rand_seeds entry, so `randseed` does not move those offsets (only sizes and directions),
and fio seeds every generator again at the start of each `loops` pass - unless the job
sets `randseed`, which turns randrepeat off only after the first seeding.

A mixed job's directions come from a taus88 of their own. fio's rule (io_u.c, get_rw_ddir)
is not one draw per I/O: the direction is drawn again only once the current one has issued
`rwmix_issues` I/Os, which a change of direction sets to the I/Os the direction left behind
has issued so far times the new one's share; a new pass sets it to 0. A job whose passes
are short thus repeats the same few dozen draws: fio's fsx example (64 I/Os per pass,
50/50) reads 45.3% of its I/Os in every run. The offsets and block sizes are drawn in
fiodraw.py from the seeds given here.
"""
from __future__ import annotations

import dataclasses

import numba
import numpy as np

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E370001  # fio's seed multiplier (init.c, setup_random_seeds)
RAND_BS_OFF, RAND_BS1_OFF = 0, 1  # fio.h: the block-size generators' seeds (reads, writes)
RAND_MIX_OFF = 4  # fio.h: FIO_RAND_MIX_OFF, the index of the direction generator's seed
RAND_BLOCK_OFF = 6  # fio.h: FIO_RAND_BLOCK_OFF, the offsets' generator
RAND_SEQ_RAND_READ_OFF = 10  # fio.h: FIO_RAND_SEQ_RAND_READ_OFF, percentage_random's choice
RAND_START_DELAY_OFF = 13  # fio.h: FIO_RAND_START_DELAY, a startdelay range's draw
RAND_ZONE_OFF = 16  # fio.h: FIO_RAND_ZONE_OFF, the zoned distributions' zone generator
FIO_RANDSEED = 0xB1899BED  # init.c: the offsets' seed per job number under randrepeat
_NR_OFFS = 21  # fio.h: FIO_RAND_NR_OFFS in 3.33


def job_seed(randseed: int, thread_number: int, index: int) -> int:
    """fio's rand_seeds[index] for any index (3.33 has 21; newer fios add more, e.g.
    SPRandom's): randseed x 0x9e370001^(4 + index) x the job's number + index."""
    scaled = (randseed * pow(_GOLDEN, 4 + index, 1 << 64)) & _M64
    return (scaled * thread_number + index) & _M64


def job_seeds(randseed: int, thread_number: int) -> list[int]:
    """fio's per-job seeds (rand_seeds[]) for `randseed` and the job's number (from 1)."""
    seed = randseed & _M64
    for _ in range(4):
        seed = (seed * _GOLDEN) & _M64
    out = []
    for i in range(_NR_OFFS):
        out.append((seed * thread_number + i) & _M64)
        seed = (seed * _GOLDEN) & _M64
    return out


@numba.njit(nogil=True, cache=True, inline="always")
def taus88_next(state):
    """fio's __rand32 (taus88) on state[0:3]: the next 32-bit value."""
    s1, s2, s3 = state[0], state[1], state[2]
    m = np.uint64(0xFFFFFFFF)
    s1 = (((s1 & np.uint64(4294967294)) << np.uint64(12)) & m) ^ ((((s1 << np.uint64(13)) & m) ^ s1) >> np.uint64(19))
    s2 = (((s2 & np.uint64(4294967288)) << np.uint64(4)) & m) ^ ((((s2 << np.uint64(2)) & m) ^ s2) >> np.uint64(25))
    s3 = (((s3 & np.uint64(4294967280)) << np.uint64(17)) & m) ^ ((((s3 << np.uint64(3)) & m) ^ s3) >> np.uint64(11))
    state[0], state[1], state[2] = s1, s2, s3
    return s1 ^ s2 ^ s3


def taus88_state(seed: int) -> np.ndarray:
    """fio's __init_rand32: the generator's three words for a seed (cut to 32 bits, as
    fio's `(unsigned int) seed`), after its six warm-up steps."""
    seed &= _M32

    def at_least(x: int, m: int) -> int:
        return x + m if x < m else x

    s1 = at_least(((53 * 69069) & _M32) ^ seed, 1) & _M32  # fio's LCG((2^31) + (2^17) + (2^7)): ^ is xor, 53
    s2 = at_least(((s1 * 69069) & _M32) ^ seed, 7) & _M32
    s3 = at_least(((s2 * 69069) & _M32) ^ seed, 15) & _M32
    state = np.array([s1, s2, s3], np.uint64)
    for _ in range(6):
        taus88_next(state)
    return state


@numba.njit(nogil=True, cache=True, inline="always")
def taus258_next(state):
    """fio's __rand64 (a five-word Tausworthe generator) on state[0:5]."""
    s1, s2, s3, s4, s5 = state[0], state[1], state[2], state[3], state[4]
    s1 = ((s1 & np.uint64(18446744073709551614)) << np.uint64(10)) ^ (((s1 << np.uint64(1)) ^ s1) >> np.uint64(53))
    s2 = ((s2 & np.uint64(18446744073709551104)) << np.uint64(5)) ^ (((s2 << np.uint64(24)) ^ s2) >> np.uint64(50))
    s3 = ((s3 & np.uint64(18446744073709547520)) << np.uint64(29)) ^ (((s3 << np.uint64(3)) ^ s3) >> np.uint64(23))
    s4 = ((s4 & np.uint64(18446744073709420544)) << np.uint64(23)) ^ (((s4 << np.uint64(5)) ^ s4) >> np.uint64(24))
    s5 = ((s5 & np.uint64(18446744073701163008)) << np.uint64(8)) ^ (((s5 << np.uint64(3)) ^ s5) >> np.uint64(33))
    state[0], state[1], state[2], state[3], state[4] = s1, s2, s3, s4, s5
    return s1 ^ s2 ^ s3 ^ s4 ^ s5


@numba.njit(nogil=True, cache=True, inline="always")
def rand_between(state, low, high, use64):
    """fio's rand_between(state, low, high): low + (high - low + 1) x r / 2^32 (2^64 for
    the 64-bit generator), r the generator's next value, in fio's double arithmetic."""
    if use64:
        return low + np.int64(np.float64(high - low + 1) * (np.float64(taus258_next(state)) / 18446744073709551616.0))
    return low + np.int64(np.float64(high - low + 1) * (np.float64(taus88_next(state)) / 4294967296.0))


def rand_state(seed: int, use64: bool) -> np.ndarray:
    """fio's init_rand_seed: five words (taus88 uses the first three)."""
    if not use64:
        return np.concatenate((taus88_state(seed), np.zeros(2, np.uint64)))
    seed &= _M64

    def at_least(x: int, m: int) -> int:
        return x + m if x < m else x

    words, x = [], 53  # fio's LCG64((2^31) + (2^17) + (2^7), seed): ^ is xor there, 53
    for m in (1, 7, 15, 33, 49):
        x = at_least(((x * 6906969069) & _M64) ^ seed, m)
        words.append(x)
    state = np.array(words, np.uint64)
    for _ in range(6):
        taus258_next(state)
    return state


@dataclasses.dataclass(frozen=True)
class FioSeeds:
    """What fio seeds a job clone's generators from, and how many passes it runs them."""
    randseed: int = 0x89
    thread_number: int = 1  # the clone's number in the job file, from 1
    randrepeat: bool = True  # the offsets' seed from the job's number
    reseed_passes: bool = True  # seed again every `loops` pass
    rwmixread: int = 50
    verify: bool = False  # fio then draws the writes' sizes from the reads' seed
    generator: str = "tausworthe"  # random_generator: tausworthe, tausworthe64 or lfsr
    loops: int = 1
    io_size: int = 0  # the job's io_size (0: none)
    percentage_random: tuple[int, int] = (100, 100)  # per direction: the share of random offsets

    @classmethod
    def of_job(cls, job, thread_number: int, seed: int) -> "FioSeeds":
        """A job's seeds; `seed` stands for fio's random ones when nothing makes them repeatable."""
        repeatable = job["randrepeat"] or "randseed" in job.given
        # fio seeds a job before it turns randrepeat off for a job that sets randseed: the
        # offsets' seed follows randrepeat, but no pass is seeded again
        return cls(randseed=job["randseed"] if repeatable else seed, thread_number=thread_number,
                   randrepeat=bool(job["randrepeat"]),
                   reseed_passes=bool(job["randrepeat"]) and "randseed" not in job.given, rwmixread=job["rwmixread"],
                   verify=job["verify"] not in ("0", "null"), generator=job["random_generator"],
                   loops=max(1, int(job["loops"])), io_size=int(job["io_size"] or 0),
                   percentage_random=tuple(job["percentage_random"]))

    def offset_seed(self) -> int:
        if self.randrepeat:
            return (FIO_RANDSEED * self.thread_number) & _M64
        return job_seeds(self.randseed, self.thread_number)[RAND_BLOCK_OFF]

    def size_seeds(self) -> tuple[int, int]:
        seeds = job_seeds(self.randseed, self.thread_number)
        read = seeds[RAND_BS_OFF]
        return read, read if self.verify else seeds[RAND_BS1_OFF]

    def zone_seed(self) -> int:
        return job_seeds(self.randseed, self.thread_number)[RAND_ZONE_OFF]

    def seq_rand_states(self) -> np.ndarray:
        """percentage_random's generators, one per direction (32-bit): fio 3.33 seeds
        every direction's (seq_rand_state[]) from the reads' entry, so they start out
        equal and then advance each with its own direction's I/Os."""
        seed = job_seeds(self.randseed, self.thread_number)[RAND_SEQ_RAND_READ_OFF]
        return np.stack([rand_state(seed, False) for _ in range(2)])

    def directions(self) -> "MixedDirections":
        return MixedDirections(self.randseed, self.thread_number, self.rwmixread)


@numba.njit(nogil=True, cache=True)
def _mixed_directions(state, counters, rwmixread, out):
    """fio's get_rw_ddir for len(out) I/Os. counters: io_issues[read], io_issues[write],
    rwmix_issues, rwmix_ddir (all updated)."""
    mix0 = rwmixread
    mix1 = 100 - rwmixread
    for i in range(out.shape[0]):
        cur = counters[3]
        if counters[cur] >= counters[2]:
            r = taus88_next(state)
            v = 1 + np.int64(100.0 * (np.float64(r) / 4294967296.0))  # rand_between(1, 100)
            d = 0 if v <= mix0 else 1
            if d != cur:
                counters[2] = counters[cur] * (mix1 if cur == 0 else mix0) // 100
            counters[3] = d
        d = counters[3]
        out[i] = d
        counters[d] += 1


def warm_up() -> None:
    """Compile the rule and fio's offset and size draws now (seconds with a cold cache),
    not in a job's run time."""
    MixedDirections(0x89, 1, 50).draw(1)
    from cxlhm_apps.fio import fiodraw  # (it draws from this module's generators)
    fiodraw.warm_up()


class MixedDirections:
    """A mixed job's directions as fio draws them (see the module's text)."""

    def __init__(self, randseed: int, thread_number: int, rwmixread: int):
        self.seed = job_seeds(randseed, thread_number)[RAND_MIX_OFF]
        self.rwmixread = int(rwmixread)
        self.state = taus88_state(self.seed)
        self.counters = np.zeros(4, np.int64)  # io_issues[2], rwmix_issues, rwmix_ddir

    def new_pass(self, reseed: bool) -> None:
        """A new `loops` pass: fio sets rwmix_issues to 0, and seeds again under randrepeat."""
        self.counters[2] = 0
        if reseed:
            self.state = taus88_state(self.seed)

    def draw(self, n: int) -> np.ndarray:
        out = np.empty(n, np.int8)
        _mixed_directions(self.state, self.counters, self.rwmixread, out)
        return out

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        return self.state.copy(), self.counters.copy()

    def restore(self, snap: tuple[np.ndarray, np.ndarray]) -> None:
        self.state, self.counters = snap[0].copy(), snap[1].copy()

    def draw_unissued(self) -> int:
        """The direction fio draws for an I/O it then cannot place (the pass ends there):
        the rule moves on, but the I/O never counts as issued."""
        d = int(self.draw(1)[0])
        self.counters[d] -= 1
        return d
