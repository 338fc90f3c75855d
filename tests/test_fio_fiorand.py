"""A mixed job's directions as fio 3.33 draws them (cxlhm_apps/fio/fiorand.py): its seeds,
its taus88 generator, its rwmix rule and its `loops` passes. Golden counts are real fio
3.33's JSON on this machine for the same jobs; where fio is installed the test also runs
it (each job takes well under a second)."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio import fiorand, report
from cxlhm_apps.fio.jobfile import build_jobs, read_sections
from cxlhm_apps.fio.runner import run_jobs

_M32 = 0xFFFFFFFF


def _reference(randseed: int, thread_number: int, rwmixread: int, per_pass: list[int], reseed: bool) -> list[int]:
    """fio's get_rw_ddir written out plainly (io_u.c), one pass after another."""
    seed = fiorand.job_seeds(randseed, thread_number)[fiorand.RAND_MIX_OFF]
    issues, ddir, rwmix_issues = [0, 0], 0, 0
    mix = (rwmixread, 100 - rwmixread)
    state = [int(x) for x in fiorand.taus88_state(seed)]
    out = []
    for k, n in enumerate(per_pass):
        if k:
            rwmix_issues = 0
            if reseed:
                state = [int(x) for x in fiorand.taus88_state(seed)]
        for _ in range(n):
            if issues[ddir] >= rwmix_issues:
                s1, s2, s3 = state
                s1 = (((s1 & 4294967294) << 12) & _M32) ^ ((((s1 << 13) & _M32) ^ s1) >> 19)
                s2 = (((s2 & 4294967288) << 4) & _M32) ^ ((((s2 << 2) & _M32) ^ s2) >> 25)
                s3 = (((s3 & 4294967280) << 17) & _M32) ^ ((((s3 << 3) & _M32) ^ s3) >> 11)
                state = [s1, s2, s3]
                v = 1 + int(100.0 * ((s1 ^ s2 ^ s3) / 4294967296.0))
                new = 0 if v <= mix[0] else 1
                if new != ddir:
                    rwmix_issues = issues[ddir] * mix[ddir ^ 1] // 100
                ddir = new
            issues[ddir] += 1
            out.append(ddir)
    return out


@settings(max_examples=60, deadline=None)
@given(randseed=st.integers(0, 2**64 - 1), thread_number=st.integers(1, 64), rwmixread=st.integers(0, 100),
       per_pass=st.lists(st.integers(0, 300), min_size=1, max_size=5), reseed=st.booleans())
def test_compiled_rule_matches_fios_rule_written_out(randseed, thread_number, rwmixread, per_pass, reseed):
    mixed = fiorand.MixedDirections(randseed, thread_number, rwmixread)
    got = []
    for k, n in enumerate(per_pass):
        if k:
            mixed.new_pass(reseed)
        got += mixed.draw(n).tolist()
    assert got == _reference(randseed, thread_number, rwmixread, per_pass, reseed)


def test_a_restored_snapshot_draws_the_same_directions_again():
    mixed = fiorand.MixedDirections(0x89, 1, 50)
    mixed.draw(10)
    snap = mixed.snapshot()
    first = mixed.draw(40)
    mixed.restore(snap)
    assert np.array_equal(mixed.draw(40), first)


def test_fios_fsx_example_reads_45_percent():
    # fio's fsx.fio: 64 I/Os per pass, libaio: every pass the same draws; fio reads 45.3%
    mixed = fiorand.MixedDirections(0x89, 1, 50)
    reads = 0
    for k in range(100):
        if k:
            mixed.new_pass(True)
        reads += int((mixed.draw(64) == 0).sum())
    assert reads == 2900  # 29 of every 64


# (job lines, [(read I/Os, write I/Os) per clone]) from fio 3.33's JSON for the same job
GOLDEN = [
    ("ioengine=psync\nsize=64k\nloops=10\n", [(78, 82)]),  # a sync engine: one pass, no reseeding
    ("ioengine=libaio\nsize=64k\nloops=10\n", [(100, 60)]),  # queued: 10 passes of the same 16 draws
    ("ioengine=psync\nsize=1m\nloops=3\nnumjobs=2\n", [(370, 398), (359, 409)]),
    ("ioengine=libaio\nsize=1m\nloops=3\nnumjobs=2\n", [(396, 372), (344, 424)]),
    ("ioengine=psync\nsize=4m\nrwmixread=70\n", [(707, 317)]),
    ("ioengine=psync\nsize=1m\nrwmixread=30\nnumjobs=3\n", [(83, 173), (69, 187), (74, 182)]),
    ("ioengine=psync\nsize=64k\nloops=10\nrandrepeat=0\nrandseed=1234\n", [(90, 70)]),
    ("ioengine=psync\nsize=1m\nrandseed=7\n", [(131, 125)]),
]


def _job(path, lines: str) -> str:
    return f"[j]\nfilename={path}\nrw=randrw\nbs=4k\nnorandommap\n{lines}"


def _counts(out: dict) -> list[tuple[int, int]]:
    return [(j["read"]["total_ios"], j["write"]["total_ios"]) for j in out["jobs"]]


@pytest.mark.parametrize("lines,want", GOLDEN)
def test_mixed_jobs_issue_fios_reads_and_writes(tmp_path, lines, want):
    jobs, globals_ = build_jobs([read_sections(_job(tmp_path / "f.dat", lines), "t.fio")])
    out = report.to_json(run_jobs(jobs, log=lambda _: None), globals_)
    assert _counts(out) == want


@pytest.mark.skipif(shutil.which("fio") is None, reason="real fio is not installed (apt-get install fio)")
@pytest.mark.parametrize("lines,want", GOLDEN[:4])
def test_the_golden_counts_are_real_fios(tmp_path, lines, want):
    job = tmp_path / "t.fio"
    job.write_text(_job(tmp_path / "f.dat", lines))
    done = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert _counts(json.loads(done.stdout[done.stdout.index("{"):])) == want
