"""The compatibility table's reasons are whole: a long reason is cut at a word with an
ellipsis, a long list of problems keeps whole lines and says how many it left out."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cxlhm_apps.fio.compat import clip, clip_lines, summarize

WORDS = st.lists(st.text("abcdefghij()'/,", min_size=1, max_size=12), min_size=1, max_size=40).map(" ".join)


@given(WORDS, st.integers(10, 200))
def test_a_clipped_reason_fits_and_ends_at_a_word_or_is_whole(text, limit):
    out = clip(text, limit)
    assert len(out) <= limit
    if out != text:
        assert out.endswith("\u2026")
        kept = out[:-1]
        assert text.startswith(kept)
        rest = text[len(kept):]
        assert rest[:1] in (" ", ",", ";", ":", "(") or " " not in text[:limit - 1]  # cut where a word ends


@given(st.lists(WORDS, min_size=1, max_size=30), st.integers(50, 400))
def test_clipped_lines_are_whole_lines_and_count_the_rest(lines, limit):
    parts = clip_lines(lines, limit).split(" | ")
    if "more problems" in parts[-1]:  # (the generated lines have no m, o, r, p: never that text)
        shown = parts[:-1]
        assert parts[-1].startswith(f"and {len(lines) - len(shown)} more problems")
    else:
        shown = parts
    for mine, theirs in zip(shown[1:], lines[1:]):
        assert mine == theirs  # (only a first line longer than the limit is cut, at a word)


def test_the_cmdprio_bssplit_refusal_is_summed_up_whole():
    """Before, the table showed "... (an ioprio per I/O on l)": the problems were joined
    and cut at 2000 characters mid-word."""
    reason = ("'1M/10/2/0/1': a fifth field is a priority hint (Command Duration Limits), which needs a drive that "
              "supports CDL; give BS/PERCENT or BS/PERCENT/CLASS/LEVEL")
    lines = [f"cmdprio-bssplit.fio:{n}: option 'opt{n}': {reason}" for n in range(30)]
    text = summarize(clip_lines(lines, 2000).split(" | "))
    assert text.count(reason) == 1 and "more problems" in text
