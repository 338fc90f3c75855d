"""The trace-format example of docs/extending.md (examples/extending/trace_format.py)
through the shipped trace-format conformance suite (cxlhm.testing.traces), registered
the way a test registers a format it does not install, and its own rules: a request is
every block it touches, with its time, and bad input is named by its line."""
import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm.testing.traces import TraceFormatConformance
from cxlhm.traces import TraceError
from cxlhm.traces.formats import FORMATS, load_trace
from example_loader import example

BLOCK = 4096


@pytest.fixture(scope="module", autouse=True)
def msr_registered():
    example("trace_format")  # the checkout's root on sys.path, so the registry can import it by name
    FORMATS.register("msr", "examples.extending.trace_format")
    yield
    FORMATS.unregister("msr")


def _line(t, kind, offset, size):
    return f"{t},hm,1,{kind},{offset},{size},1000\n"


class TestMsr(TraceFormatConformance):
    name, suffix = "msr", ".csv"

    def write_sample(self, path, blocks, writes):
        path.write_text("".join(_line(128166372003061629 + i, "Write" if w else "Read", b * BLOCK, BLOCK)
                                for i, (b, w) in enumerate(zip(blocks.tolist(), writes.tolist()))))
        return blocks, writes


requests = st.lists(st.tuples(st.integers(0, 10**9), st.sampled_from(["Read", "Write"]),
                              st.integers(0, 1 << 40), st.integers(0, 5 * BLOCK)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(requests=requests)
def test_each_request_is_its_blocks_in_order(tmp_path_factory, requests):
    requests = sorted(requests)  # a trace is in time order
    path = tmp_path_factory.mktemp("msr") / "hm_1.csv"
    path.write_text("".join(_line(*r) for r in requests))
    trace = load_trace(path, "msr")
    kept = [r for r in requests if r[3]]  # size 0 touches no block
    want = [(b, kind == "Write", (t - kept[0][0]) * 100)
            for t, kind, offset, size in kept
            for b in range(offset // BLOCK, (offset + size - 1) // BLOCK + 1)]
    assert list(zip(trace.blocks.tolist(), trace.writes.tolist(), trace.timestamps_ns.tolist())) == want
    assert trace.block_size == BLOCK


def test_a_compressed_file_is_read_and_limit_counts_blocks(tmp_path):
    path = tmp_path / "hm_1.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(_line(10, "Write", 0, 3 * BLOCK) + _line(20, "Read", 8192, 100))
    trace = load_trace(path, "msr", limit=2, block_size=8192)
    assert trace.blocks.tolist() == [0, 1] and trace.writes.tolist() == [True, True]
    assert load_trace(path, "msr").blocks.tolist() == [0, 1, 2, 2]


@pytest.mark.parametrize("line,says", [
    ("1,hm,1,Read,0\n", ":1: expected 7 comma-separated fields"),
    ("1,hm,1,Trim,0,4096,5\n", ":1: Type must be Read or Write, got 'Trim'"),
    ("1,hm,1,Read,-4096,4096,5\n", ":1: Offset must be a non-negative integer, got '-4096'"),
    ("x,hm,1,Read,0,4096,5\n", ":1: Timestamp must be"),
    (f"1,hm,1,Read,{1 << 80},4096,5\n", ":1: Offset \\+ Size reaches block"),
])
def test_bad_input_is_named_by_line(tmp_path, line, says):
    path = tmp_path / "bad.csv"
    path.write_text(_line(0, "Read", 0, BLOCK) + line)  # the bad line is the second
    with pytest.raises(TraceError, match=says.replace(":1:", ":2:")):
        load_trace(path, "msr")
    path.write_bytes(b"\xff\n")
    with pytest.raises(TraceError, match=":1: not UTF-8"):
        load_trace(path, "msr")
