"""The SSD back end's registered memory: I/O inside the device's DRAM goes out on fixed
buffers (the memory registered piece by piece as I/O first lands in it), I/O outside it
or across two pieces as ordinary I/O, and where the kernel refuses to register, as
ordinary I/O too - the same bytes either way."""
from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cxlhm.config import load_config
from cxlhm.device import Device
from cxlhm.media.dram import DeviceDram
from cxlhm.media.ssd import FIXED_MAX_PIECE, FIXED_MIN_PIECE, FIXED_TABLE, SsdBackend, fixed_piece
from host_runtime.driver import DeviceHandle, open_device

MIB = 1 << 20
PAGE = 4096
ARENA = 6 * MIB  # three pieces of 2 MiB
IMAGE = 8 * MIB


@given(nbytes=st.integers(-1, 1 << 44), unit=st.sampled_from([0, 512, 4096, 65536, 3 * 65536, 2 * MIB, 8 * MIB]))
def test_a_piece_is_a_power_of_two_no_slot_straddles_and_the_table_fits(nbytes, unit):
    piece = fixed_piece(nbytes, unit)
    if nbytes <= 0 or unit <= 0:
        assert piece is None
        return
    smallest = max(FIXED_MIN_PIECE, unit, -(-nbytes // FIXED_TABLE))
    if piece is None:  # only when the kernel could not take one piece that large
        assert smallest > FIXED_MAX_PIECE // 2 and 1 << (smallest - 1).bit_length() > FIXED_MAX_PIECE
        return
    assert piece & (piece - 1) == 0 and piece <= FIXED_MAX_PIECE
    assert piece >= smallest and piece < 2 * smallest  # the smallest such power of two
    assert -(-nbytes // piece) <= FIXED_TABLE


def _unless_refused(counts: dict) -> None:
    """Registration pins memory against RLIMIT_MEMLOCK where the process lacks
    CAP_IPC_LOCK: there the kernel may refuse pieces, and the exact counts below do not
    hold (test_a_refused_registration_falls_back_to_ordinary_io covers that case)."""
    if counts["refused"]:
        pytest.skip(f"the kernel refused {counts['refused']} registrations here (RLIMIT_MEMLOCK)")


def _op(buf: int, length: int, offset: int, write: bool) -> np.ndarray:
    return np.array([[buf, length, offset, int(write)]], np.int64)


# one I/O: in the arena or in memory outside it, at a page offset, of a few pages, read or write
_io = st.tuples(st.booleans(), st.integers(0, ARENA // PAGE - 1), st.integers(1, 16),
                st.integers(0, IMAGE // PAGE - 16), st.booleans())


@settings(max_examples=20, deadline=None)
@given(ios=st.lists(_io, min_size=1, max_size=40), seed=st.integers(0, 2**32 - 1))
def test_registered_and_ordinary_io_move_the_same_bytes(tmp_path_factory, ios, seed):
    path = tmp_path_factory.mktemp("fixed") / "img"
    rng = np.random.default_rng(seed)
    ssd = SsdBackend(str(path), IMAGE, 8)
    arena = DeviceDram(ARENA // PAGE, PAGE)
    outside_map = mmap.mmap(-1, ARENA)
    outside = np.frombuffer(outside_map, np.uint8)
    image = np.zeros(IMAGE, np.uint8)  # the reference: what the file holds
    expect = {"fixed": 0, "plain": 0}
    try:
        ssd.register_memory(arena.base_address, arena.nbytes, PAGE)
        memories = {True: arena.slots.reshape(-1), False: outside}
        for in_arena, page, pages, block, write in ios:
            pages = min(pages, ARENA // PAGE - page)
            mem, start, n, offset = memories[in_arena], page * PAGE, pages * PAGE, block * PAGE
            if write:
                mem[start:start + n] = rng.integers(0, 256, n, dtype=np.uint8)
            else:
                mem[start:start + n] = 0
            res = ssd.submit(_op(mem.ctypes.data + start, n, offset, write))
            assert res.tolist() == [n]
            if write:
                image[offset:offset + n] = mem[start:start + n]
            else:
                assert np.array_equal(mem[start:start + n], image[offset:offset + n])
            one_piece = start // FIXED_MIN_PIECE == (start + n - 1) // FIXED_MIN_PIECE
            expect["fixed" if in_arena and one_piece else "plain"] += 1
        counts = ssd.fixed_counts()
        _unless_refused(counts)
        assert {k: counts[k] for k in expect} == expect
        assert counts["pieces"] <= ARENA // FIXED_MIN_PIECE
    finally:
        ssd.close()
        arena.close()
    # what was written reached the file: read it back with no registered memory
    ssd = SsdBackend(str(path), IMAGE, 8)
    back = DeviceDram(IMAGE // PAGE, PAGE)
    try:
        ops = np.array([[back.base_address + b * PAGE, PAGE, b * PAGE, 0] for b in range(IMAGE // PAGE)], np.int64)
        assert (ssd.submit(ops) == PAGE).all()
        assert np.array_equal(back.slots.reshape(-1), image)
        assert ssd.fixed_counts()["fixed"] == 0
    finally:
        ssd.close()
        back.close()


def test_only_the_pieces_in_use_are_registered(tmp_path):
    """Registering pins memory: a large DRAM with one block in use pins one piece, not all."""
    ssd = SsdBackend(str(tmp_path / "img"), IMAGE, 4)
    arena = DeviceDram(1024, MIB)  # 1 GiB, mapped lazily
    try:
        ssd.register_memory(arena.base_address, arena.nbytes, MIB)
        last = arena.base_address + arena.nbytes - MIB
        assert ssd.submit(_op(last, MIB, 0, False)).tolist() == [MIB]
        counts = ssd.fixed_counts()
        _unless_refused(counts)
        assert counts == {"fixed": 1, "plain": 0, "pieces": 1, "refused": 0}
    finally:
        ssd.close()
        arena.close()


def _device_round_trip(path) -> dict:
    """Writes through a small device (evicting, so written back), a reopen, and reads of
    every byte back; returns the back end's counts before the close."""
    cfg = {"capacity": 8 * MIB, "block_size": "64KiB", "dram_bytes": MIB, "backend": {"path": str(path)}}
    data = np.random.default_rng(7).integers(0, 256, 8 * MIB, dtype=np.uint8)
    device = Device(load_config(cfg))  # its back end's counts are read below
    dev = DeviceHandle(device)
    try:
        for hpa in range(0, 8 * MIB, 256 << 10):
            dev.write_from(hpa, data[hpa:hpa + (256 << 10)])
        dev.flush()
        counts = device.ssd.fixed_counts()
    finally:
        dev.close()
    dev = open_device(cfg)
    try:
        out = np.empty(8 * MIB, np.uint8)
        for hpa in range(0, 8 * MIB, MIB):
            dev.read_into(hpa, out[hpa:hpa + MIB])
        assert np.array_equal(out, data)
    finally:
        dev.close()
    return counts


def test_the_device_sends_its_io_on_its_registered_dram(tmp_path):
    counts = _device_round_trip(tmp_path / "img")
    _unless_refused(counts)
    assert counts["fixed"] > 0 and counts["plain"] == 0 and counts["pieces"] >= 1


def test_cxlhm_uring_fixed_0_sends_ordinary_io(tmp_path, monkeypatch):
    monkeypatch.setenv("CXLHM_URING_FIXED", "0")
    counts = _device_round_trip(tmp_path / "img")
    assert counts["fixed"] == 0 and counts["plain"] > 0


_DROP_IPC_LOCK = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--"]


def _can_drop_ipc_lock() -> bool:
    """setpriv and prlimit are there and may drop CAP_IPC_LOCK here (a container's root
    may not hold CAP_SETPCAP)."""
    if shutil.which("setpriv") is None or shutil.which("prlimit") is None:
        return False
    return subprocess.run([*_DROP_IPC_LOCK, "prlimit", "--memlock=1048576", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_drop_ipc_lock(), reason="needs setpriv and prlimit, allowed to drop CAP_IPC_LOCK")
def test_a_refused_registration_falls_back_to_ordinary_io(tmp_path):
    """Without CAP_IPC_LOCK a registered buffer counts against RLIMIT_MEMLOCK: below a
    piece's size the kernel refuses every piece, and the device works as before."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.test_ssd_fixed import _device_round_trip
        counts = _device_round_trip({str(tmp_path / 'img')!r})
        assert counts["refused"] > 0 and counts["fixed"] == 0 and counts["plain"] > 0, counts
        print("ok", counts)
    """)
    run = subprocess.run([*_DROP_IPC_LOCK, "prlimit", "--memlock=1048576", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stdout + run.stderr
