"""percentage_random as fio 3.33 applies it (io_u.c, should_do_random): an I/O of a random
job due a random offset takes one only when rand_between(1, 100) from its direction's
generator is within the direction's percentage; the others go on from where the
direction's last I/O ended, unmarked in the random map. Real fio writes each job's I/Os
with write_iolog and the generator cxlhm's runner builds for the same job must issue
the same (direction, offset, length) sequence; goldens captured from fio 3.33 and
property tests check the rule without fio."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fio_helpers import iolog_ios
from cxlhm_apps.fio.fiodraw import NOT_DUE, RANDOM, SEQUENTIAL, random_turns
from cxlhm_apps.fio.fiorand import FioSeeds
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.options import parse_rw
from cxlhm_apps.fio.pattern import IoGenerator, SizeChoice
from cxlhm_apps.fio.plan import plan_clones, seed_for
from cxlhm_apps.fio.runner import Worker

K = 1024

# Each job once, with its own file and log; their order gives each its thread_number.
JOBS = """
[global]
ioengine=psync
size=256k

[single]
rw=randrw
bs=4k
percentage_random=30

[per-direction]
rw=randrw
bs=4k
percentage_random=30,70
randseed=42

[all-sequential]
rw=randwrite
bs=4k
percentage_random=0

[reads-sequential]
rw=randrw
bs=4k
percentage_random=0,100

[split-map]
rw=randrw
size=1m
bssplit=4k/40:16k/60,8k/100
percentage_random=60,20

[split-nomap]
rw=randrw
size=1m
bssplit=4k/40:16k/60,8k/100
percentage_random=60,20
norandommap

[range]
rw=randrw
size=1m
bsrange=4k-32k
percentage_random=25
rwmixread=30

[runs-of-four]
rw=randread:4
bs=4k
percentage_random=50

[same-three]
rw=randrw:3
rw_sequencer=identical
bssplit=4k/50:8k/50
percentage_random=40,80

[t64]
rw=randrw
bs=4k
percentage_random=10
random_generator=tausworthe64

[zoned]
rw=randrw
bs=4k
percentage_random=90
random_distribution=zoned:50/5:30/15:20/

[loops]
ioengine=libaio
iodepth=1
rw=randrw
bs=4k
size=64k
percentage_random=50
loops=3

[loops-seeded]
ioengine=libaio
iodepth=1
rw=randrw
bssplit=4k/50:8k/50
size=64k
percentage_random=50
loops=2
randseed=9

[io-size]
rw=randwrite
bs=4k
size=128k
io_size=512k
percentage_random=40

[sequential-ignores-it]
rw=rw
bssplit=4k/50:16k/50
percentage_random=30

[sequential-io-size]
rw=write
bssplit=4k/50:16k/50
io_size=1m
"""
NAMES = re.findall(r"^\[(?!global)([\w-]+)\]$", JOBS, flags=re.M)


def _with_files(text: str, tmp_path, iolog: bool) -> str:
    def add(m: re.Match) -> str:
        name = m.group(1)
        extra = f"filename={tmp_path / (name + '.dat')}\n"
        if iolog:
            extra += f"write_iolog={tmp_path / (name + '.log')}\n"
        return m.group(0) + "\n" + extra
    return re.sub(r"^\[(?!global)([\w-]+)\]$", add, text, flags=re.M)


def _cxlhm_sequences(text: str, limit: int = 100_000) -> dict[str, list[tuple[int, int, int]]]:
    """Each job's I/Os from the generator the runner builds for it, by job name."""
    jobs, _ = build_jobs([read_sections(text, "t.fio")])
    out = {}
    for k, plan in enumerate(plan_clones(jobs)):
        worker = Worker(plan, None, seed_for(plan.job, plan.clone), thread_number=k + 1, threads=1)
        out[plan.job.name] = _drain(worker.gen, limit)
    return out


def _drain(gen: IoGenerator, limit: int = 100_000) -> list[tuple[int, int, int]]:
    ios: list[tuple[int, int, int]] = []
    while len(ios) < limit:
        d, o, s = gen.next_chunk(1024)
        if not d.size:
            break
        ios += zip(d.tolist(), o.tolist(), s.tolist())
    return ios[:limit]


def _need_fio_333():
    if shutil.which("fio") is None:
        pytest.skip("real fio is not installed (apt-get install fio)")
    version = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    if version != "fio-3.33":
        pytest.skip(f"the draws are fio 3.33's; this fio is {version}")


@pytest.fixture(scope="module")
def fio_and_cxlhm(tmp_path_factory):
    _need_fio_333()
    tmp = tmp_path_factory.mktemp("percentage_random")
    job = tmp / "jobs.fio"
    job.write_text(_with_files(JOBS, tmp, iolog=True))
    done = subprocess.run(["fio", "--output-format=terse", str(job)], capture_output=True, text=True,
                          timeout=120, cwd=tmp)
    assert done.returncode == 0, done.stderr
    return tmp, _cxlhm_sequences(_with_files(JOBS, tmp, iolog=False))


@pytest.mark.parametrize("name", NAMES)
def test_the_same_ios_as_fio(fio_and_cxlhm, name):
    tmp, ours = fio_and_cxlhm
    theirs = iolog_ios(tmp / f"{name}.log")
    assert len(theirs) > 10
    assert ours[name] == theirs


# ------------------------------------------------------------------ goldens (fio 3.33)

def _golden(text: str) -> list[tuple[int, int, int]]:
    """'w3 r47:4': direction, offset and (default 1) length in 4k blocks."""
    out = []
    for word in text.split():
        block, _, blocks = word[1:].partition(":")
        out.append((0 if word[0] == "r" else 1, int(block) * 4 * K, int(blocks or 1) * 4 * K))
    return out


# [per-direction]'s 64 I/Os and [split-map]'s first 48 (of 114) in JOBS, from fio 3.33
PER_DIRECTION = _golden("""
r16 w11 w38 w39 w40 w41 r2 w28 w39 w44 w18 w19 w5 w24 w25 w4 r3 r4 r5 r6 r7 w23 w62 r12 r25 w63 r14
r15 w42 w43 w20 r13 r14 w51 w35 w15 w16 w27 r15 r16 w34 w0 w9 r54 r55 w29 w48 r36 w40 w26 w10 r37 r38
w37 r43 w61 r44 r17 r18 w45 w46 w21 w30 r19""")
SPLIT_MAP = _golden("""
w0:2 r0 r22:4 w2:2 r190:4 w4:2 w6:2 r194:4 w8:2 r198 r118 w10:2 w12:2 w14:2 w16:2 w18:2 w20:2 w22:2
w24:2 r119:4 w26:2 w28:2 r29:4 w30:2 w170:2 r33 r34 w172:2 r153 w174:2 r154:4 r158 w176:2 r227:4
r36:4 w178:2 w180:2 w182:2 r248 r202:4 w184:2 w186:2 w212:2 r243:4 r63 r64 r119 w214:2""")


def test_goldens_from_fio(tmp_path):
    ours = _cxlhm_sequences(_with_files(JOBS, tmp_path, iolog=False))
    assert ours["per-direction"] == PER_DIRECTION
    assert len(ours["split-map"]) == 114 and ours["split-map"][:48] == SPLIT_MAP


def test_the_goldens_are_fios(fio_and_cxlhm):
    tmp, _ = fio_and_cxlhm
    assert iolog_ios(tmp / "per-direction.log") == PER_DIRECTION
    assert iolog_ios(tmp / "split-map.log")[:48] == SPLIT_MAP


# A file larger than the region (fio's real_file_size): a sequential I/O that reaches the
# region's end inside the file ends the pass (fio: offset >= io_size) instead of turning
# random. size=256k of a 1m file, rw=randrw, bs=4k, percentage_random=20: fio 3.33 does 42.
LARGER_FILE = _golden("""
r3 r4 r5 w47 r53 r54 w48 w49 w30 r25 w31 r26 w54 r24 r25 r26 w55 w22 r27 r28 w23 w24 w25 w26 r29
w27 r30 w28 w29 w30 w58 r31 r32 w59 r4 w60 w61 r5 r6 w62 w63 r7""")


def _generator(rw: str, reads: SizeChoice, writes: SizeChoice, *, size: int, seeds: FioSeeds,
               randommap: bool = True, file_size: int | None = None, sequencer: str = "sequential",
               budget: int | None = -1) -> IoGenerator:
    return IoGenerator(rw=parse_rw(rw, 1024), sequencer=sequencer, rwmixread=seeds.rwmixread,
                       sizes=(reads, writes), region_start=0, region_len=size, distribution=None,
                       randommap=randommap, seed=seeds.randseed, bytes_budget=size if budget == -1 else budget,
                       ios_budget=None, fio=seeds, file_size=file_size)


def _larger_file_generator() -> IoGenerator:
    bs = SizeChoice(fixed=4 * K)
    return _generator("randrw", bs, bs, size=256 * K, seeds=FioSeeds(percentage_random=(20, 20)),
                      file_size=1024 * K)


def test_a_larger_file_ends_the_pass_where_fio_does():
    assert _drain(_larger_file_generator()) == LARGER_FILE


def test_the_larger_file_golden_is_fios(tmp_path):
    _need_fio_333()
    data, log = tmp_path / "f", tmp_path / "f.log"
    with open(data, "wb") as f:
        f.truncate(1024 * K)
    job = (f"[j]\nfilename={data}\nioengine=psync\nwrite_iolog={log}\nsize=256k\nrw=randrw\nbs=4k\n"
           "percentage_random=20\n")
    subprocess.run(["fio", "--output-format=terse", "-"], input=job, text=True, capture_output=True, check=True,
                   timeout=60)
    assert iolog_ios(log) == LARGER_FILE


def test_a_job_on_a_larger_file_does_fios_ios(tmp_path):
    data = tmp_path / "f"
    with open(data, "wb") as f:
        f.truncate(1024 * K)
    text = f"[j]\nfilename={data}\nioengine=psync\nsize=256k\nrw=randrw\nbs=4k\npercentage_random=20\n"
    assert _cxlhm_sequences(text)["j"] == LARGER_FILE


def test_a_sync_engines_passes_end_where_fios_do(tmp_path):
    _need_fio_333()
    job = (f"[j]\nfilename={tmp_path / 'f'}\nioengine=psync\nsize=64k\nrw=randrw\nbs=4k\n"
           "percentage_random=50\nloops=3\n")
    log = tmp_path / "f.log"
    subprocess.run(["fio", "--output-format=terse", "-"], input=job + f"write_iolog={log}\n", text=True,
                   capture_output=True, check=True, timeout=60)
    assert _cxlhm_sequences(job)["j"] == iolog_ios(log)


# ------------------------------------------------------------------ the rule's own properties

def _kinds(seeds: FioSeeds, direction: np.ndarray, per_offset: int = 1) -> np.ndarray:
    """Which I/O fio makes random, for these directions (the choice alone)."""
    pstate = seeds.seq_rand_states()
    out = np.empty(direction.shape[0], np.int8)
    random_turns(direction, np.array(seeds.percentage_random, np.int64), pstate, np.ones(1, np.int64),
                 per_offset, out)
    return out


def test_the_choice_takes_its_share_and_only_below_100():
    seeds = FioSeeds(percentage_random=(30, 100))
    direction = np.tile(np.array([0, 1], np.int8), 20_000)
    kinds = _kinds(seeds, direction)
    assert abs((kinds[direction == 0] == RANDOM).mean() - 0.30) < 0.01
    assert (kinds[direction == 1] == RANDOM).all()
    assert not (kinds == NOT_DUE).any()


def test_each_direction_draws_from_its_own_generator_seeded_alike():
    # fio 3.33 seeds both directions' generators from the reads' seed: the same choices in turn
    seeds = FioSeeds(percentage_random=(50, 50))
    reads = _kinds(seeds, np.zeros(64, np.int8))
    mixed = _kinds(seeds, np.tile(np.array([0, 1], np.int8), 64))
    assert (mixed[0::2] == reads).all() and (mixed[1::2] == reads).all()


def test_only_ios_due_a_random_offset_draw_the_choice():
    seeds = FioSeeds(percentage_random=(50, 50))
    every = _kinds(seeds, np.zeros(40, np.int8))
    fourth = _kinds(seeds, np.zeros(160, np.int8), per_offset=4)
    assert (fourth[1::4] == NOT_DUE).all() and (fourth[0::4] == every).all()


def test_100_percent_changes_nothing():
    split = SizeChoice(split_sizes=(4 * K, 16 * K), split_p=(0.4, 0.6), split_pc=(40, 60))
    plain = _drain(_generator("randrw", split, split, size=1024 * K, seeds=FioSeeds()))
    given_100 = _drain(_generator("randrw", split, split, size=1024 * K,
                                  seeds=FioSeeds(percentage_random=(100, 100))))
    assert plain == given_100


def test_a_sequential_job_ignores_it():
    split = SizeChoice(split_sizes=(4 * K, 16 * K), split_p=(0.5, 0.5), split_pc=(50, 50))
    for rw in ("write", "rw"):
        plain = _drain(_generator(rw, split, split, size=512 * K, seeds=FioSeeds()))
        zero = _drain(_generator(rw, split, split, size=512 * K, seeds=FioSeeds(percentage_random=(0, 0))))
        assert plain == zero


def _check_sequence(ios, kinds, length: int, bs: int, randommap: bool) -> None:
    """A sequential choice goes on from its direction's last end (unless that is past the
    region's end); with the map, random ones take blocks no random one took before."""
    last = [0, 0]
    taken: set[int] = set()
    for (d, o, s), kind in zip(ios, kinds):
        if kind == SEQUENTIAL and last[d] + s <= length:
            assert o == last[d]
        elif kind == RANDOM and randommap:
            blocks = set(range(o // bs, (o + s) // bs))
            assert not blocks & taken
            taken |= blocks
        last[d] = o + s


@settings(max_examples=25, deadline=None)
@given(read_pct=st.integers(0, 100), write_pct=st.integers(0, 100), randommap=st.booleans(),
       randseed=st.integers(0, 2**32), blocks=st.sampled_from([16, 64, 256]))
def test_fios_draws_follow_the_rule(read_pct, write_pct, randommap, randseed, blocks):
    bs = 4 * K
    seeds = FioSeeds(randseed=randseed, percentage_random=(read_pct, write_pct))
    size = blocks * bs
    ios = _drain(_generator("randrw", SizeChoice(fixed=bs), SizeChoice(fixed=bs), size=size, seeds=seeds,
                            randommap=randommap))
    assert ios and all(0 <= o and o + s <= size for _, o, s in ios)
    kinds = _kinds(seeds, np.array([d for d, _, _ in ios], np.int8))
    _check_sequence(ios, kinds, size, bs, randommap)


@settings(max_examples=25, deadline=None)
@given(read_pct=st.integers(0, 100), write_pct=st.integers(0, 99), randommap=st.booleans(),
       randseed=st.integers(0, 2**32), per_offset=st.sampled_from([1, 3]))
def test_lfsr_takes_fios_choice(read_pct, write_pct, randommap, randseed, per_offset):
    # random_generator=lfsr: the random offsets are cxlhm's own, the choice is fio's
    bs, size = 4 * K, 256 * 4 * K
    seeds = FioSeeds(randseed=randseed, generator="lfsr", percentage_random=(read_pct, write_pct))
    gen = _generator(f"randrw:{per_offset}", SizeChoice(fixed=bs), SizeChoice(fixed=bs), size=size,
                     seeds=seeds, randommap=randommap)
    assert gen.fio_draw is None
    ios = _drain(gen, 512)
    assert ios and all(0 <= o and o + s <= size for _, o, s in ios)
    kinds = _kinds(seeds, np.array([d for d, _, _ in ios], np.int8), per_offset)
    kinds[kinds == NOT_DUE] = SEQUENTIAL  # (rw_sequencer=sequential: the run goes on)
    _check_sequence(ios, kinds, size, bs, randommap)


def test_lfsr_with_identical_repeats_the_last_offset():
    bs = 4 * K
    seeds = FioSeeds(generator="lfsr", percentage_random=(50, 50))
    ios = _drain(_generator("randrw:3", SizeChoice(fixed=bs), SizeChoice(fixed=bs), size=1024 * K,
                            seeds=seeds, sequencer="identical"), 300)
    kinds = _kinds(seeds, np.array([d for d, _, _ in ios], np.int8), 3)
    last = [0, 0]
    for (d, o, s), kind in zip(ios, kinds):
        if kind == NOT_DUE:
            assert o == last[d]
        last[d] = o


def test_a_job_files_percentage_reaches_the_draw(tmp_path):
    text = f"[j]\nfilename={tmp_path / 'f'}\nsize=64k\nrw=randrw\nbs=4k\npercentage_random=30,70\n"
    jobs, _ = build_jobs([read_sections(text, "t.fio")])
    plan = plan_clones(jobs)[0]
    gen = Worker(plan, None, seed_for(plan.job, plan.clone)).gen
    assert gen.fio_draw.perc.tolist() == [30, 70]


def test_a_sequential_job_of_several_sizes_never_turns_random():
    # past the region's end fio's pass ends and the next starts at the region's start
    # ([sequential-io-size] above is the same against fio)
    split = SizeChoice(split_sizes=(4 * K, 16 * K), split_p=(0.5, 0.5), split_pc=(50, 50))
    ios = _drain(_generator("write", split, split, size=256 * K, seeds=FioSeeds(io_size=1024 * K),
                            budget=1024 * K))
    assert sum(s for _, _, s in ios) >= 1024 * K - 16 * K
    end, restarts = 0, 0
    for _, o, s in ios:
        assert o == end or (o == 0 and end + 16 * K > 256 * K)
        restarts += o == 0
        end = o + s
    assert restarts >= 4
