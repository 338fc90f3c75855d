"""fio's SPRandom preconditioning (cxlhm_apps/fio/sprandom.py): the write sequence is
fio's, write for write, given fio's order of new blocks (goldens from fio at the
examples' commit), its length and the job's end are fio's, and the option rules are
fio's (or say what is not modelled)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cxlhm_apps.fio import compat, fio_build, fiorand, sprandom
from cxlhm_apps.fio.jobfile import JobFileError, build_jobs, read_sections

# fio at f5344384f7c7 (psync, rw=randwrite, bs=4k, a 1 MiB file, default seeds): the
# written blocks in order (write_lat_log with log_offset=1), for spr_op=0.15 and 10 regions
# (A) and spr_op=0.2, 8 regions, spr_cs=16k (B)
FIO_A = (
    "228 98 33 152 92 62 15 224 96 32 0 16 24 28 30 31 232 100 34 1 144 88 60 14 23 241 172 70 51 214 98 62 30 "
    "232 1 23 70 123 223 235 205 163 196 114 41 154 93 135 248 108 38 3 208 120 44 6 19 210 121 70 223 196 154 "
    "108 38 6 142 87 245 173 187 199 252 110 39 242 105 138 85 133 177 188 78 55 243 206 119 247 38 245 177 206 "
    "255 239 231 254 111 227 204 118 43 213 165 185 190 79 226 97 136 84 58 13 147 194 113 140 86 247 58 147 "
    "194 140 59 215 253 175 229 169 186 77 131 192 112 40 4 18 25 150 91 219 203 201 162 65 128 80 194 215 65 "
    "56 12 22 27 211 202 117 141 179 198 115 222 127 238 103 246 107 221 167 250 109 139 193 160 64 48 65 107 "
    "109 8 20 26 29 151 249 174 71 244 106 37 153 182 75 217 166 67 216 124 46 7 240 104 36 2 17 148 90 61 159 "
    "234 101 137 178 73 130 81 132 82 57 158 95 233 170 69 129 176 72 52 10 21 149 181 189 191 237 171 197 161 "
    "184 76 54 11 209 164 66 49 156 94 63 236 102 35 212 122 45 155 195 200 116 42 5 145 180 164 74 53 157 183 "
    "251 207 230 99 220 126 47 225 168 68 50 9 146 89 134 83 218 125 143")
FIO_B = (
    "228 98 33 152 92 62 15 224 96 32 0 16 24 28 30 31 232 100 34 1 144 88 60 14 23 241 172 70 51 214 123 223 "
    "235 205 163 196 114 41 154 93 135 248 108 38 3 208 120 44 6 19 210 121 142 87 245 173 187 199 252 110 39 "
    "242 105 138 85 98 62 224 0 24 30 232 1 23 70 114 133 177 188 78 55 243 206 119 247 255 239 231 254 111 227 "
    "204 118 43 213 165 185 190 79 226 97 136 84 58 154 108 208 19 210 173 187 85 0 23 13 147 194 113 140 86 59 "
    "215 253 175 229 169 186 77 131 192 112 40 4 18 25 150 91 219 203 201 162 65 128 80 55 255 231 208 210 187 "
    "0 23 56 12 22 27 211 202 117 141 179 198 115 222 127 238 103 246 107 221 167 250 109 139 193 160 64 48 8 "
    "20 26 29 151 249 147 59 175 80 208 210 174 71 244 106 37 153 182 75 217 166 67 216 124 46 7 240 104 36 2 "
    "17 148 90 61 159 234 101 137 178 73 130 81 132 82 57 158 238 221 26 95 233 170 69 129 176 72 52 10 21 149 "
    "181 189 191 237 171 197 161 184 76 54 11 209 164 66 49 156 94 63 236 102 35 212 122 45 155 195 178 200 116 "
    "42 5 145 180 74 53 157 183 251 207 230 99 220 126 47 225 168 68 50 9 146 89 134 83 218 125 143 176 237 156 "
    "45")


def _fio_blocks(text: str) -> list[int]:
    return [int(x) for x in text.split()]


def _first_seen(blocks: list[int]) -> list[int]:
    seen: dict[int, None] = {}
    for b in blocks:
        seen.setdefault(b, None)
    return list(seen)


def _run(seq: sprandom.Sequence, cap: int) -> list[int]:
    out = []
    while len(out) < cap:
        block = seq.next()
        if block is None:
            break
        out.append(block)
    return out


@pytest.mark.parametrize("golden, settings", [(FIO_A, sprandom.Settings(0.15, 10, 0)),
                                              (FIO_B, sprandom.Settings(0.2, 8, 16384))])
def test_fios_new_blocks_give_fios_whole_write_sequence(golden, settings):
    fio = _fio_blocks(golden)
    seq = sprandom.Sequence(settings, 1 << 20, 4096, iter(_first_seen(fio)), sprandom.sprandom_seed(0x89, 1))
    assert _run(seq, seq.physical // 4096) == fio


# fio's write counts (total_ios) for a 4k randwrite sprandom job on a file of `size`
@pytest.mark.parametrize("op, regions, cache, size, fio_writes", [
    (0.3, 20, 0, 8 << 20, 2662),  # ends at io_size (the physical size), before the new blocks run out
    (0.1, 50, 65536, 16 << 20, 4491), (0.15, 100, 0, 4 << 20, 1111), (0.25, 7, 0, 32 << 20, 10232),
    (0.15, 100, 0, 16 << 20, 4703),  # fio's sprandom.fio example with FIO_BS=4096, the harness's 16 MiB
])
def test_the_number_of_writes_is_fios(op, regions, cache, size, fio_writes):
    seq = sprandom.Sequence(sprandom.Settings(op, regions, cache), size, 4096, iter(range(size // 4096)),
                            sprandom.sprandom_seed(0x89, 1))
    assert len(_run(seq, seq.physical // 4096)) == fio_writes


def test_physical_size_and_regions_as_fio_computes_them():
    assert sprandom.physical_size(0.15, 16 << 20, 4096) == 4710 * 4096  # 16 MiB + ceil(15%), whole blocks
    shares = sprandom.invalid_shares(100, 0.15)
    # the least valid region first, down to none invalid; the first one's share is 1 - 1/WA's region's
    assert shares[0] == 2479 and shares[-1] == 0 and shares == sorted(shares, reverse=True)
    assert sprandom.invalid_shares(1, 0.5) == [0]


def test_the_seed_is_the_jobs_seed_at_fios_index():
    # seed k = randseed x G^(4+k) x job + k (fio's setup_random_seeds), k = 22 at that commit
    assert sprandom.sprandom_seed(0x89, 3) == (0x89 * pow(0x9E370001, 26, 1 << 64) * 3 + 22) % (1 << 64)
    assert fiorand.job_seed(0x89, 3, 6) == fiorand.job_seeds(0x89, 3)[6]


@pytest.mark.parametrize("text, option, words", [
    ("rw=randread\nsprandom=1\n", "sprandom", "needs random writes"),
    ("rw=randrw\nsprandom=1\n", "sprandom", "rw=randrw) is not modelled"),
    ("rw=randwrite\nsprandom=1\nrandom_generator=tausworthe\n", "random_generator", "requires random_generator=lfsr"),
    ("rw=randwrite\nsprandom=1\nnorandommap=0\n", "norandommap", "requires norandommap=1"),
    ("rw=randwrite\nsprandom=1\nbsrange=4k-16k\n", "sprandom", "one write block size"),
    ("rw=randwrite\nsprandom=1\nspr_op=1.5\n", "spr_op", "in (0, 1)"),
    ("rw=randwrite\nsprandom=1\nspr_num_regions=0\n", "spr_num_regions", ""),
])
def test_bad_sprandom_jobs_are_refused_with_the_line(text, option, words):
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections(f"[j]\nsize=1m\n{text}", "t.fio")])
    assert f"option '{option}'" in str(err.value) and words in str(err.value)


def test_fio_sets_lfsr_and_norandommap_itself():
    jobs, _ = build_jobs([read_sections("[j]\nsize=1m\nrw=randwrite\nsprandom=1\n", "t.fio")])
    assert jobs[0]["sprandom"] and sprandom.problems(jobs[0]) == []


def _cxlhm_fio(job: Path) -> dict:
    code = "import sys; from cxlhm_apps.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "fio", "--output-format=json", "--eta=never", job.name],
                          cwd=job.parent, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout[proc.stdout.find("{"):])


JOB = "[p]\nfilename=s.dat\nsize=1m\nioengine=psync\nrw=randwrite\nbs=4k\nnorandommap=1\nsprandom=1\n" \
      "spr_op=0.15\nspr_num_regions=10\n"


def test_a_sprandom_job_writes_fios_count_and_ends_there(tmp_path):
    (tmp_path / "s.fio").write_text(JOB)
    write = _cxlhm_fio(tmp_path / "s.fio")["jobs"][0]["write"]
    assert write["total_ios"] == len(_fio_blocks(FIO_A)) and write["io_bytes"] == 4096 * write["total_ios"]


BUILT = fio_build.built(compat.read_manifest().commit)


@pytest.mark.skipif(BUILT is None, reason="fio at the manifest's commit is not built (make fio-newer)")
def test_a_sprandom_job_agrees_with_the_newer_fio(tmp_path):
    (tmp_path / "fio").mkdir()
    (tmp_path / "ours").mkdir()
    for side in ("fio", "ours"):
        (tmp_path / side / "s.fio").write_text(JOB)
    theirs = compat.run_fio(str(BUILT), tmp_path / "fio" / "s.fio", tmp_path / "fio")
    assert theirs.ok, theirs.message
    assert compat.compare(theirs.report, _cxlhm_fio(tmp_path / "ours" / "s.fio"), runtime_cap_s=2) == []


def _interp_linear_scan(x, xs, ys):
    """fio's linear_interp as written: the first interval that holds x."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for i in range(len(xs) - 1):
        if xs[i] <= x <= xs[i + 1]:
            if abs(xs[i + 1] - xs[i]) < 1e-9:
                return ys[i]
            return ys[i] + (ys[i + 1] - ys[i]) * ((x - xs[i]) / (xs[i + 1] - xs[i]))
    return 0.0


@given(steps=st.lists(st.floats(1e-6, 10.0), min_size=1, max_size=30), x=st.floats(-5.0, 400.0),
       ys=st.lists(st.floats(0.0, 1.0), min_size=31, max_size=31))
def test_the_interpolation_takes_fios_interval(steps, x, ys):
    xs, acc = [], 0.0
    for step in steps:
        acc += step
        xs.append(acc)
    for probe in [x] + xs:  # (at a knot the first interval that holds it counts)
        assert sprandom._interp(probe, xs, ys[:len(xs)]) == _interp_linear_scan(probe, xs, ys[:len(xs)])


def test_many_regions_are_computed_and_too_many_refused():
    shares = sprandom.invalid_shares(200_000, 0.15)  # (one pass over the curve, not one per region)
    assert len(shares) == 200_000 and shares[0] == 2479 and shares[-1] == 0
    with pytest.raises(JobFileError) as err:
        build_jobs([read_sections("[j]\nsize=1m\nrw=randwrite\nsprandom=1\nspr_num_regions=20000000\n", "t.fio")])
    assert "option 'spr_num_regions'" in str(err.value) and "from 1 to 16777216" in str(err.value)


# fio at f5344384f7c7, the 4 MiB randwrite sprandom job on each engine and depth: total_ios
# 1111 on every one, io_bytes short of it by the writes in flight when the sequence ran out
FIO_DONE = [("psync", 1, 1111), ("libaio", 8, 1104), ("libaio", 64, 1048), ("io_uring", 16, 1096)]


@pytest.mark.parametrize("engine, depth, done", FIO_DONE)
def test_the_writes_in_flight_at_the_end_count_as_issued_not_done(engine, depth, done, tmp_path):
    (tmp_path / "s.fio").write_text(f"[p]\nfilename=s.dat\nsize=4m\nioengine={engine}\niodepth={depth}\ndirect=1\n"
                                    "rw=randwrite\nbs=4k\nnorandommap=1\nsprandom=1\n")
    write = _cxlhm_fio(tmp_path / "s.fio")["jobs"][0]["write"]
    assert (write["total_ios"], write["io_bytes"]) == (1111, done * 4096)


def test_a_job_that_ends_on_its_io_size_keeps_all_its_bytes():
    import types
    seq = sprandom.Sequence(sprandom.Settings(0.3, 20, 0), 8 << 20, 4096, iter(range(2048)),
                            sprandom.sprandom_seed(0x89, 1))
    gen = types.SimpleNamespace(fio_draw=sprandom.Draw(seq, 4096, 4096))
    stats = types.SimpleNamespace(dirs=(types.SimpleNamespace(ios=0, bytes=0),
                                        types.SimpleNamespace(ios=2662, bytes=2662 * 4096)))
    assert len(_run(seq, seq.physical // 4096)) == 2662 and not seq.done  # (stopped by io_size)
    sprandom.settle(gen, stats, 64)
    assert stats.dirs[1].bytes == 2662 * 4096
    while seq.next() is not None:
        pass
    sprandom.settle(gen, stats, 64)  # ran out: the last 63 were still in flight
    assert stats.dirs[1].bytes == (2662 - 63) * 4096
