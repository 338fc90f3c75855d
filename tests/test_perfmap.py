"""bench/perfmap.py names compiled code for perf: a function compiled in this process
appears in the map at the address numba runs it from."""
from __future__ import annotations

import sys
from pathlib import Path

import numba

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from perfmap import compiled_functions, write_perf_map  # noqa: E402


@numba.njit
def _sum_of_squares(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def test_a_function_compiled_here_is_in_the_map(tmp_path):
    assert _sum_of_squares(10) == 285
    functions = compiled_functions()
    ours = {address: name for address, name in functions.items() if "_sum_of_squares" in name}
    assert ours, "the function compiled in this test is not in the map"
    entry = _sum_of_squares.overloads[_sum_of_squares.signatures[0]].library.get_pointer_to_function(
        next(iter(ours.values())))
    assert entry in ours
    path = tmp_path / "perf.map"
    assert write_perf_map(path) == len(functions)
    lines = path.read_text().splitlines()
    assert len(lines) == len(functions)
    rows = [line.split(" ", 2) for line in lines]
    starts = [int(start, 16) for start, _, _ in rows]
    assert starts == sorted(starts) and all(int(size, 16) > 0 for _, size, _ in rows)
    assert any(int(start, 16) == entry and "_sum_of_squares" in name for start, _, name in rows)
