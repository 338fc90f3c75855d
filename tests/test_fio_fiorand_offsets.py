"""A uniform random job's offsets and block sizes as fio 3.33 draws them
(cxlhm_apps/fio/fiodraw.py): real fio writes each job's I/Os with write_iolog, and the
generator cxlhm's runner builds for the same job file must issue the same
(direction, offset, length) sequence. Property tests check the draw's own rules."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fio_helpers import iolog_ios
from cxlhm_apps.fio import fiodraw
from cxlhm_apps.fio.fiorand import FioSeeds, taus258_next, rand_state
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.options import READ, WRITE, parse_rw
from cxlhm_apps.fio.pattern import IoGenerator, SizeChoice
from cxlhm_apps.fio.plan import plan_clones, seed_for
from cxlhm_apps.fio.runner import Worker

K, M = 1024, 1024 * 1024

# Each job shape once; their order gives each its thread_number (offset-two's clones: 7 and 8).
JOBS = """
[global]
ioengine=psync
size=1m

[rr4k]
rw=randread
bs=4k

[rw-range]
rw=randwrite
bsrange=4k-16k

[rw-split]
rw=randrw
bssplit=4k/40:16k/60,8k/100

[rw-split-nomap]
rw=randrw
bssplit=4k/40:16k/60,8k/100
norandommap

[rr-range-seed]
rw=randread
bsrange=512-8k
norandommap
randseed=7

[big-split]
rw=randrw
rwmixread=70
size=16m
bssplit=64k/40:1m/60,1m/100

[offset-two]
rw=randwrite
bs=4k
offset=64k
size=512k
numjobs=2

[aligned]
rw=randread
bs=4k
blockalign=8k

[t64]
rw=randrw
bssplit=2k/30:4k/30:8k/40
random_generator=tausworthe64

[loops-norepeat]
ioengine=libaio
iodepth=1
rw=randrw
bssplit=4k/50:8k/50
size=256k
loops=3
randrepeat=0
randseed=5

[loops-repeat]
ioengine=libaio
iodepth=1
rw=randread
bsrange=4k-12k
size=128k
loops=2

[timed]
rw=randread
bs=4k
size=64k
time_based
runtime=1s

[verify-range]
rw=randwrite
bsrange=4k-16k
verify=crc32c

[loops-seed]
ioengine=libaio
iodepth=1
rw=randrw
bssplit=4k/50:8k/50
size=64k
loops=3
randseed=7

[zoned-pct]
rw=randread
bs=4k
random_distribution=zoned:50/5:30/15:20/

[zoned-abs-rw]
rw=randrw
bssplit=4k/50:16k/50
random_distribution=zoned_abs:60/256k:40/768k

[runs-of-four]
rw=randread:4
bs=4k

[same-three]
rw=randrw:3
rw_sequencer=identical
bssplit=4k/50:8k/50

[io-size-over]
rw=randread
bs=4k
size=64k
io_size=256k

[io-size-short]
rw=randrw
bssplit=4k/50:16k/50
size=128k
io_size=512k

[short-passes-seeded]
ioengine=libaio
iodepth=1
rw=randrw
bssplit=64k/40:1m/60,1m/100
size=8m
loops=12
randseed=3
"""
# time_based: fio's I/O count depends on the clock (thousands in its 1 s here, hundreds on a
# loaded machine); its first I/Os do not
TIMED_PREFIX = 200


CLONED = {"offset-two"}


def _with_files(text: str, tmp_path, iolog: bool) -> str:
    """Each job its own file (and, for fio, its own I/O log)."""
    def add(m: re.Match) -> str:
        name = m.group(1)
        extra = f"filename={tmp_path / (name + '.dat')}\n"
        if iolog and name in CLONED:  # clones would share one I/O log (and race on it): per-clone logs
            extra += f"write_lat_log={tmp_path / name}\nlog_offset=1\n"
        elif iolog:
            extra += f"write_iolog={tmp_path / (name + '.log')}\n"
        return m.group(0) + "\n" + extra
    return re.sub(r"^\[(?!global)([\w-]+)\]$", add, text, flags=re.M)


def _cxlhm_sequences(text: str, limit: int = 100_000) -> dict[str, list[list[tuple[int, int, int]]]]:
    """Each clone's I/Os from the generator the runner builds for it, by job name."""
    jobs, _ = build_jobs([read_sections(text, "t.fio")])
    plans = plan_clones(jobs)
    out: dict[str, list] = {}
    for k, plan in enumerate(plans):
        worker = Worker(plan, None, seed_for(plan.job, plan.clone), thread_number=k + 1, threads=len(plans))
        ios: list[tuple[int, int, int]] = []
        while len(ios) < limit:
            d, o, s = worker.gen.next_chunk(1024)
            if not d.size:
                break
            ios += zip(d.tolist(), o.tolist(), s.tolist())
        out.setdefault(plan.job.name, []).append(ios[:limit])
    return out


@pytest.fixture(scope="module")
def fio_and_cxlhm(tmp_path_factory):
    if shutil.which("fio") is None:
        pytest.skip("real fio is not installed (apt-get install fio)")
    tmp = tmp_path_factory.mktemp("fiodraw")
    job = tmp / "jobs.fio"
    job.write_text(_with_files(JOBS, tmp, iolog=True))
    done = subprocess.run(["fio", "--output-format=terse", str(job)], capture_output=True, text=True,
                          timeout=120, cwd=tmp)
    assert done.returncode == 0, done.stderr
    version = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    if version != "fio-3.33":
        pytest.skip(f"the draws are fio 3.33's; this fio is {version}")
    return tmp, _cxlhm_sequences(_with_files(JOBS, tmp, iolog=False), limit=TIMED_PREFIX * 50)


NAMES = ["rr4k", "rw-range", "rw-split", "rw-split-nomap", "rr-range-seed", "big-split", "aligned", "t64",
         "loops-norepeat", "loops-repeat", "loops-seed",  # (randseed: fio seeds no pass again)
         "zoned-pct", "zoned-abs-rw", "runs-of-four", "same-three",
         "io-size-over", "io-size-short",  # (io_size: passes on past short ones)
         "short-passes-seeded"]  # (fio drew the direction of the I/O that ended each pass)


@pytest.mark.parametrize("name", NAMES)
def test_the_same_ios_as_fio(fio_and_cxlhm, name):
    tmp, ours = fio_and_cxlhm
    theirs = iolog_ios(tmp / f"{name}.log")
    assert len(theirs) > 10
    assert ours[name] == [theirs]


def _clone_log(path) -> list[tuple[int, int, int]]:
    """A sync job's per-I/O completion log with log_offset: its I/Os in issue order."""
    rows = [line.split(", ") for line in path.read_text().splitlines()]
    return [(int(r[2]), int(r[4]), int(r[3])) for r in rows]


def test_clones_count_as_their_own_jobs(fio_and_cxlhm):
    # numjobs=2: each clone draws from its own seeds (its own thread number)
    tmp, ours = fio_and_cxlhm
    first, second = ours["offset-two"]
    assert first == _clone_log(tmp / "offset-two_clat.7.log")  # logs named by thread number
    assert second == _clone_log(tmp / "offset-two_clat.8.log")
    assert first != second and all(64 * K <= o < 64 * K + 512 * K for _, o, _ in first + second)


def test_time_based_clears_the_full_map_as_fio(fio_and_cxlhm):
    tmp, ours = fio_and_cxlhm
    theirs = iolog_ios(tmp / "timed.log")
    assert len(theirs) > TIMED_PREFIX > 64 // 4  # several passes over the 16 blocks
    assert ours["timed"][0][:TIMED_PREFIX] == theirs[:TIMED_PREFIX]


def test_verify_draws_writes_sizes_from_the_reads_seed(fio_and_cxlhm):
    tmp, ours = fio_and_cxlhm
    writes = [io for io in iolog_ios(tmp / "verify-range.log") if io[0] == WRITE]
    assert ours["verify-range"] == [writes]


# ------------------------------------------------------------------ the draw's own rules

def _generator(reads: SizeChoice, writes: SizeChoice, *, size: int, randommap: bool, rw: str = "randrw",
               seed: int = 0x89, thread: int = 1, blockalign: int | None = None, budget: int | None = -1,
               start: int = 0) -> IoGenerator:
    return IoGenerator(rw=parse_rw(rw, 1024), sequencer="sequential", rwmixread=50, sizes=(reads, writes),
                       region_start=start, region_len=size, distribution=None, randommap=randommap, seed=seed,
                       bytes_budget=size if budget == -1 else budget, ios_budget=None, blockalign=blockalign,
                       fio=FioSeeds(randseed=seed, thread_number=thread))


def _drain(gen: IoGenerator, most: int = 1 << 16):
    parts = []
    total = 0
    while total < most:
        d, o, s = gen.next_chunk(257)
        if not d.size:
            break
        parts.append((d, o, s))
        total += d.size
    return tuple(np.concatenate(x) for x in zip(*parts))


_sizes = st.sampled_from([512, 4 * K, 8 * K, 64 * K])


@st.composite
def _choice(draw):
    kind = draw(st.sampled_from(["fixed", "range", "split"]))
    lo = draw(_sizes)
    if kind == "fixed":
        return SizeChoice(fixed=lo)
    if kind == "range":
        return SizeChoice(low=lo, high=lo * draw(st.sampled_from([2, 3, 8])))
    mults = draw(st.lists(st.sampled_from([1, 2, 4, 16]), min_size=1, max_size=4, unique=True))
    pcs = draw(st.lists(st.integers(1, 100), min_size=len(mults), max_size=len(mults)))
    total = sum(pcs)
    pcs = [p * 100 // total for p in pcs]
    pcs[-1] += 100 - sum(pcs)
    return SizeChoice(split_sizes=tuple(lo * m for m in mults), split_p=tuple(p / 100 for p in pcs),
                      split_pc=tuple(pcs))


@settings(max_examples=60, deadline=None)
@given(reads=_choice(), writes=_choice(), mb=st.integers(1, 8), randommap=st.booleans(),
       rw=st.sampled_from(["randrw", "randread", "randwrite"]), seed=st.integers(0, 2**32),
       thread=st.integers(1, 16), start=st.sampled_from([0, 64 * K]))
def test_every_io_inside_its_region_aligned_and_within_its_sizes(reads, writes, mb, randommap, rw, seed, thread,
                                                                 start):
    size = mb * M
    gen = _generator(reads, writes, size=size, randommap=randommap, rw=rw, seed=seed, thread=thread, start=start)
    drained = _drain(gen)
    if not drained:
        return
    d, o, s = drained
    for di, choice in ((READ, reads), (WRITE, writes)):
        mask = d == di
        rel, sz = o[mask] - start, s[mask]
        assert (rel >= 0).all() and (rel + sz <= size).all()
        assert (rel % choice.min == 0).all()
        assert (sz <= choice.max).all() and (sz > 0).all()
        if not randommap:  # (the map may cut an I/O to the free cells at its offset)
            assert (sz >= choice.min).all() and (sz % choice.min == 0).all()
    if randommap:  # fio's rule: no cell, counted in each direction's own units, issued twice in a pass
        cell = min(reads.min, writes.min)
        used = np.zeros(size // cell + 64, int)
        for di, off, sz in zip(d.tolist(), (o - start).tolist(), s.tolist()):
            unit = (reads, writes)[di].min
            block, n = off // unit, -(-sz // unit)
            used[block:block + n] += 1
        assert used.max(initial=0) <= 1


@settings(max_examples=40, deadline=None)
@given(bs=_sizes, mb=st.integers(1, 4), seed=st.integers(0, 2**32), thread=st.integers(1, 64))
def test_a_fixed_size_pass_covers_every_block_once(bs, mb, seed, thread):
    size = mb * M
    d, o, s = _drain(_generator(SizeChoice(fixed=bs), SizeChoice(fixed=bs), size=size, randommap=True,
                                seed=seed, thread=thread))
    assert sorted(o.tolist()) == list(range(0, size, bs)) and (s == bs).all()


@settings(max_examples=30, deadline=None)
@given(mb=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_time_based_passes_each_cover_the_region_once(mb, seed):
    size = mb * M
    n = size // (4 * K)
    gen = _generator(SizeChoice(fixed=4 * K), SizeChoice(fixed=4 * K), size=size, randommap=True, rw="randread",
                     seed=seed, budget=None)
    d, o, s = _drain(gen, most=3 * n)
    for k in range(3):
        assert sorted(o[k * n:(k + 1) * n].tolist()) == list(range(0, size, 4 * K))


def test_bssplit_is_walked_sorted_by_percentage():
    # fio sorts bssplit by percentage: 8k/70:4k/30 draws 4k for r below 30% of the range
    choice = SizeChoice(split_sizes=(8 * K, 4 * K), split_p=(0.7, 0.3), split_pc=(70, 30))
    assert fiodraw.split_table(choice) == [(4 * K, 30), (8 * K, 70)]
    equal = SizeChoice(split_sizes=(16 * K, 4 * K, 8 * K), split_p=(0.25, 0.25, 0.5), split_pc=(25, 25, 50))
    assert fiodraw.split_table(equal) == [(16 * K, 25), (4 * K, 25), (8 * K, 50)]  # equal ones keep their order
    d, o, s = _drain(_generator(choice, choice, size=64 * M, randommap=False, rw="randread", budget=64 * M))
    assert abs((s == 4 * K).mean() - 0.30) < 0.02


def test_randrepeat_offsets_do_not_depend_on_randseed():
    # fio 3.33: under randrepeat the offsets' seed is 0xb1899bed x the job's number
    a = _drain(_generator(SizeChoice(fixed=4 * K), SizeChoice(fixed=4 * K), size=M, randommap=True, seed=1))
    b = _drain(_generator(SizeChoice(fixed=4 * K), SizeChoice(fixed=4 * K), size=M, randommap=True, seed=2))
    c = _drain(_generator(SizeChoice(fixed=4 * K), SizeChoice(fixed=4 * K), size=M, randommap=True, seed=1,
                          thread=2))
    assert (a[1] == b[1]).all() and not (a[1] == c[1]).all()


def _taus258_written_out(state: list[int]) -> tuple[list[int], int]:
    m = (1 << 64) - 1
    consts = ((18446744073709551614, 10, 1, 53), (18446744073709551104, 5, 24, 50),
              (18446744073709547520, 29, 3, 23), (18446744073709420544, 23, 5, 24),
              (18446744073701163008, 8, 3, 33))
    out = []
    for s, (mask, a, b, c) in zip(state, consts):
        out.append((((s & mask) << a) & m) ^ ((((s << b) & m) ^ s) >> c))
    return out, out[0] ^ out[1] ^ out[2] ^ out[3] ^ out[4]


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**64 - 1))
def test_tausworthe64_matches_its_definition(seed):
    state = rand_state(seed, True)
    ref = [int(x) for x in state]
    for _ in range(20):
        ref, want = _taus258_written_out(ref)
        assert int(taus258_next(state)) == want


# fio 3.33, rw=randrw bssplit=64k/40:1024k/60,1024k/100 size=256m ioengine=psync on a file,
# `fio --output-format=json [--randseed=N]`: (read bytes, read I/Os, write bytes, write I/Os);
# the pass ends where the map has no room left for the next I/O, at a different point per seed
FIO_256M_BSSPLIT = {
    0x89: (74252288, 141, 140509184, 134),  # randseed left at its default
    1: (93978624, 170, 175112192, 167),
    2: (8781824, 14, 15728640, 15),
    3: (46727168, 76, 85983232, 82),
    4: (46268416, 79, 82837504, 79),
}


@pytest.mark.parametrize("randseed", sorted(FIO_256M_BSSPLIT))
def test_a_pass_ends_where_fios_ends(randseed):
    reads = SizeChoice(split_sizes=(64 * K, M), split_p=(0.4, 0.6), split_pc=(40, 60))
    d, o, s = _drain(_generator(reads, SizeChoice(fixed=M), size=256 * M, randommap=True, seed=randseed))
    got = (int(s[d == READ].sum()), int((d == READ).sum()), int(s[d == WRITE].sum()), int((d == WRITE).sum()))
    assert got == FIO_256M_BSSPLIT[randseed]


def test_only_lfsr_is_said_to_be_cxlhms_own():
    from cxlhm_apps.fio.notes import notes
    for generator, said in (("tausworthe64", False), ("lfsr", True)):
        jobs, _ = build_jobs([read_sections(f"[j]\nfilename=f\nsize=64k\nrw=randread\nrandom_generator={generator}\n",
                                            "t.fio")])
        assert any("random_generator" in line for line in notes(jobs)) == said


@settings(max_examples=30, deadline=None)
@given(randseed=st.integers(0, 2**64 - 1), thread=st.integers(1, 4096))
def test_one_seed_is_the_seeds_entry(randseed, thread):
    from cxlhm_apps.fio.fiorand import job_seed, job_seeds
    assert [job_seed(randseed, thread, k) for k in range(21)] == job_seeds(randseed, thread)


@settings(max_examples=40, deadline=None)
@given(per=st.integers(2, 6), identical=st.booleans(), mb=st.integers(1, 4), seed=st.integers(0, 2**32),
       rw=st.sampled_from(["randread", "randwrite"]))
def test_runs_of_n_go_on_from_their_last_io_or_repeat_it(per, identical, mb, seed, rw):
    size = mb * M
    gen = IoGenerator(rw=parse_rw(f"{rw}:{per}", 1024), sequencer="identical" if identical else "sequential",
                      rwmixread=50, sizes=(SizeChoice(fixed=4 * K), SizeChoice(fixed=4 * K)), region_start=0,
                      region_len=size, distribution=None, randommap=True, seed=seed, bytes_budget=size,
                      ios_budget=None, fio=FioSeeds(randseed=seed))
    d, o, s = _drain(gen)
    assert (o % (4 * K) == 0).all() and (o + s <= size).all()
    for k in range(1, o.shape[0]):
        if k % per == 0:
            continue  # (a random one)
        want = o[k - 1] if identical else o[k - 1] + s[k - 1]
        assert o[k] == want or (not identical and want >= size)
