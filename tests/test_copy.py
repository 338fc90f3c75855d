"""The compiled copy between a host buffer and device-DRAM slots (firmware.copy_extents)
against a byte-by-byte numpy model. They merge blocks that sit
in consecutive slots into one memcpy, so the cases mix consecutive runs, gaps, reversed
slots and extents that start and end inside a block."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm.device.stream import copyengine as ce
from cxlhm import firmware as fw

BLOCK = 64
N_SLOTS = 24


def _slot_order(draw, n_blocks):
    """Slots for n_blocks blocks: runs of consecutive slots, in a random order."""
    order = draw(st.permutations(range(N_SLOTS)))
    slots, i = [], 0
    while len(slots) < n_blocks:
        run = draw(st.integers(1, 6))
        start = order[i % N_SLOTS]
        slots.extend(s for s in range(start, min(start + run, N_SLOTS)) if s not in slots)
        i += 1
        if i > 4 * N_SLOTS:  # fill up with whatever is left
            slots.extend(s for s in range(N_SLOTS) if s not in slots)
    return slots[:n_blocks]


@st.composite
def _case(draw):
    n_ext = draw(st.integers(1, 4))
    hpas, lens, n_blocks = [], [], 0
    for _ in range(n_ext):
        hpa = draw(st.integers(0, 40 * BLOCK))
        n = draw(st.integers(1, 5 * BLOCK))
        blocks = (hpa + n - 1) // BLOCK - hpa // BLOCK + 1
        if n_blocks + blocks > N_SLOTS:
            break
        hpas.append(hpa)
        lens.append(n)
        n_blocks += blocks
    if not hpas:
        hpas, lens, n_blocks = [3], [5], 1
    return (np.array(hpas, np.int64), np.array(lens, np.int64), np.array(_slot_order(draw, n_blocks), np.int64),
            draw(st.booleans()))


def _model(arena, user, slots, hpas, lens, to_user):
    """The copy, one byte at a time."""
    k = pos = 0
    for hpa, n in zip(hpas.tolist(), lens.tolist()):
        for b in range(hpa, hpa + n):
            if b != hpa and b % BLOCK == 0:
                k += 1
            slot_byte = slots[k] * BLOCK + b % BLOCK
            if to_user:
                user[pos] = arena[slot_byte]
            else:
                arena[slot_byte] = user[pos]
            pos += 1
        k += 1


def _copy_checked(case, copy) -> None:
    """Run copy(arena address, user address) on random bytes and compare both buffers with
    the byte model's (the user buffer has 8 bytes past the end that must stay untouched)."""
    hpas, lens, slots, to_user = case
    rng = np.random.default_rng(int(slots.sum()) + int(hpas.sum()))
    arena = rng.integers(0, 256, N_SLOTS * BLOCK, dtype=np.uint8)
    user = rng.integers(0, 256, int(lens.sum()) + 8, dtype=np.uint8)
    want_arena, want_user = arena.copy(), user.copy()
    _model(want_arena, want_user, slots.tolist(), hpas, lens, to_user)
    copy(arena.ctypes.data, user.ctypes.data)
    assert np.array_equal(arena, want_arena)
    assert np.array_equal(user, want_user)


@settings(max_examples=200, deadline=None)
@given(_case())
def test_copy_extents_matches_a_byte_model(case):
    hpas, lens, slots, to_user = case
    _copy_checked(case, lambda arena, user: fw.copy_extents(arena, BLOCK, slots, hpas, lens, user, to_user))


@settings(max_examples=200, deadline=None)
@given(_case(), st.integers(1, 3 * BLOCK))
def test_the_copy_engines_jobs_make_the_same_copy(case, run_bytes):
    """copyengine.extent_jobs cuts the same copy into jobs (runs of consecutive slots, cut
    in pieces of at most `run_bytes`, inside a block too): run on the engine, the bytes
    match the byte model."""
    hpas, lens, slots, to_user = case

    def copy(arena, user):
        total = int(lens.sum())
        jobs = ce.new_jobs(ce.job_rows(slots.shape[0], total, run_bytes))
        n = ce.extent_jobs(arena, BLOCK, slots, hpas, lens, user, to_user, jobs, run_bytes)
        assert 1 <= n <= jobs.shape[0] and int(jobs[:n, ce.LEN].sum()) == total
        assert int(jobs[:n, ce.LEN].max()) <= run_bytes
        ce.copy_many(jobs[:n])

    _copy_checked(case, copy)
