"""fio's random map (cxlhm_apps/fio/fioaxmap.py) against its rules written out on a plain
list of cells: marking runs, the next free cell after a taken one (wrapping), and the
spare cells of the last word, over maps of one to three levels."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm_apps.fio import fioaxmap


class PlainMap:
    """fio's axmap rules on a list: cells padded to whole words of 64."""

    def __init__(self, nr_bits: int):
        self.nr_bits = nr_bits
        self.cells = [False] * (max(1, -(-nr_bits // 64)) * 64)

    def is_set(self, b: int) -> bool:
        return b <= self.nr_bits and b < len(self.cells) and self.cells[b]

    def set_run(self, block: int, nr: int) -> int:
        done, k = 0, block
        while done < nr:
            if (done == 0 or k % 64 == 0) and (k > self.nr_bits or k >= len(self.cells)):
                break  # fio starts no word past its last cell
            if self.cells[k]:
                break
            self.cells[k] = True
            done += 1
            k += 1
        return done

    def next_free(self, b: int) -> int:
        if b >= self.nr_bits:
            return -1
        start = 0 if b + 1 == self.nr_bits else b + 1
        for k in list(range(start, self.nr_bits)) + list(range(0, self.nr_bits)):
            if not self.cells[k]:
                return k
        return -1


@settings(max_examples=150, deadline=None)
@given(nr_bits=st.one_of(st.integers(1, 200), st.integers(4000, 4200), st.sampled_from([64, 4096, 4160, 262144])),
       ops=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 80)), min_size=1, max_size=300),
       fill=st.floats(0, 1))
def test_the_map_follows_fios_rules(nr_bits, ops, fill):
    words, level_at = fioaxmap.new_map(nr_bits)
    plain = PlainMap(nr_bits)
    # a share of the map taken in long runs first, so searches cross full words and levels
    k = 0
    while k < nr_bits * fill:
        assert fioaxmap.set_run(words, level_at, nr_bits, k, 64) == plain.set_run(k, 64)
        k += 64 + (k // 64) % 3 * 64
    for u, nr in ops:
        b = int(u * (nr_bits + 2))
        assert fioaxmap.is_set(words, level_at, nr_bits, b) == plain.is_set(b)
        assert fioaxmap.next_free(words, level_at, nr_bits, b) == plain.next_free(b)
        assert fioaxmap.set_run(words, level_at, nr_bits, b, nr) == plain.set_run(b, nr)


def test_a_full_map_has_no_free_cell_and_a_cleared_one_starts_over():
    nr_bits = 64 * 64 + 5  # two levels, a last word with spare cells
    words, level_at = fioaxmap.new_map(nr_bits)
    assert len(level_at) == 4  # 65 words, 2 above them, 1 on top
    for b in range(0, nr_bits, 16):
        fioaxmap.set_run(words, level_at, nr_bits, b, 16)
    assert all(fioaxmap.next_free(words, level_at, nr_bits, b) == -1 for b in (0, 100, nr_bits - 1))
    words[:] = 0
    assert fioaxmap.next_free(words, level_at, nr_bits, 0) == 1
    assert fioaxmap.next_free(words, level_at, nr_bits, nr_bits - 1) == 0
