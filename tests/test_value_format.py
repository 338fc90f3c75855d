"""Value formats: a conversion is the exact permutation (and byte swap) numpy computes
independently, round trips are the identity, and anything but a permutation of the same
elements is refused."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_runtime.shim.value_format import Part, ValueFormat, raw_format

AXES = ("kv", "layer", "token", "head", "dim")


@st.composite
def format_pairs(draw):
    n = draw(st.integers(1, 5))
    names = draw(st.permutations(AXES))[:n]
    sizes = {a: draw(st.integers(1, 4)) for a in names}
    itemsize = draw(st.sampled_from([1, 2, 4]))
    orders = [tuple(draw(st.permutations(names))) for _ in range(2)]
    byte_orders = [draw(st.sampled_from(["little", "big"])) for _ in range(2)]
    fmts = [ValueFormat("t", (Part("kv", f"x{itemsize}", itemsize, tuple((a, sizes[a]) for a in order)),),
                        page_tokens=4, byte_order=bo) for order, bo in zip(orders, byte_orders)]
    return fmts[0], fmts[1], sizes, itemsize


@settings(max_examples=150, deadline=None)
@given(format_pairs(), st.randoms(use_true_random=False))
def test_conversion_matches_numpys_transpose_and_round_trips(pair, rnd):
    src, dst, sizes, itemsize = pair
    data = np.frombuffer(rnd.randbytes(src.nbytes), np.uint8).copy()
    out = dst.convert(data, src)
    src_axes, dst_axes = [a for a, _ in src.parts[0].axes], [a for a, _ in dst.parts[0].axes]
    want = data.reshape(*[sizes[a] for a in src_axes], itemsize).transpose(*[src_axes.index(a) for a in dst_axes], len(src_axes))
    if src.byte_order != dst.byte_order:
        want = want[..., ::-1]
    assert np.array_equal(out, want.reshape(-1))
    assert np.array_equal(src.convert(out, dst), data)  # and back
    assert (src.key("k") == dst.key("k")) == (src == dst)  # one key per format


def test_what_is_not_a_permutation_of_the_same_elements_is_refused():
    base = ValueFormat("t", (Part("kv", "bfloat16", 2, (("kv", 2), ("token", 4))),), page_tokens=4)
    others = [
        ValueFormat("t", (Part("kv", "float16", 2, (("kv", 2), ("token", 4))),), page_tokens=4),  # dtype
        ValueFormat("t", (Part("kv", "bfloat16", 2, (("kv", 2), ("token", 8))),), page_tokens=4),  # a size
        ValueFormat("t", (Part("kv", "bfloat16", 2, (("kv", 2), ("token", 4))),), page_tokens=8),  # page size
        ValueFormat("u", (Part("kv", "bfloat16", 2, (("kv", 2), ("token", 4))),), page_tokens=4),  # family
        ValueFormat("t", (Part("kv", "bfloat16", 2, (("kv", 2), ("tok", 4))),), page_tokens=4),  # axis names
        ValueFormat("t", (Part("kv", "bfloat16", 2, (("kv", 2), ("token", 4))),), page_tokens=4, attrs=(("m", "x"),)),
        raw_format("t", base.nbytes),
    ]
    for other in others:
        assert not base.convertible_from(other) and not other.convertible_from(base)
        with pytest.raises(ValueError, match="exactly"):
            base.convert(np.zeros(other.nbytes, np.uint8), other)
    with pytest.raises(ValueError, match="bytes"):
        base.convert(np.zeros(base.nbytes + 1, np.uint8), base)


def test_multi_part_values_convert_part_by_part():
    a = ValueFormat("m", (Part("temporal", "float32", 4, (("x", 2), ("y", 3))), Part("conv", "bfloat16", 2, (("z", 5),))))
    b = ValueFormat("m", (Part("conv", "bfloat16", 2, (("z", 5),)), Part("temporal", "float32", 4, (("y", 3), ("x", 2)))))
    temporal, conv = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(5, dtype=np.uint16)
    data = np.concatenate([temporal.view(np.uint8).reshape(-1), conv.view(np.uint8)])
    out = b.convert(data, a)
    assert np.array_equal(out[:10].view(np.uint16), conv)
    assert np.array_equal(out[10:].view(np.float32).reshape(3, 2), temporal.T)
