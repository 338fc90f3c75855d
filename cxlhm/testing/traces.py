"""The trace-format conformance suite: what every reader of a trace format promises the
commands that take traces (`cxlhm mrc`, `cxlhm trace export`), shipped so an outside
package can run it on the format it registers (entry-point group cxlhm.trace_formats):

    from cxlhm.testing.traces import TraceFormatConformance

    class TestMsr(TraceFormatConformance):
        name = "msr"

        def write_sample(self, path, blocks, writes):
            ...   # write these accesses in the format; return what a reader gives back

The checks: the format is registered and listed; what `write_sample` wrote reads back
as the accesses it says (int64 block ids, a bool write flag each; hypothesis draws the
accesses); `limit` keeps a prefix; a block size given is the trace's; and any bytes at
all - random, or a good file cut short - either read as a trace or raise `TraceError`
naming the file, never another exception. Accesses are 4 KiB blocks (`BLOCK`) and the
suite reads with that block size. It needs pytest and hypothesis.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm.traces import TraceError
from cxlhm.traces.blocktrace import BlockTrace
from cxlhm.traces.formats import FORMATS, TraceFormat, format_names, load_trace

__all__ = ["BLOCK", "TraceFormatConformance"]

BLOCK = 4096
MAX_SAMPLE_BLOCK = (1 << 40) - 1  # ids every format's reader keeps as they are

accesses = st.lists(st.tuples(st.integers(0, MAX_SAMPLE_BLOCK), st.booleans()), max_size=40)
_SETTINGS = settings(max_examples=40, deadline=None)


class TraceFormatConformance:
    """Subclass it in a test module (its name starting with ``Test``) and set:

    name          the format's registered name
    suffix        the sample files' name ending (default ".trace")
    csv_spec      passed to the reader (the `csv` format's column spec)
    write_sample  writes accesses in the format and returns the (blocks, writes) a reader
                  must give back for them (a format that records no writes: all False)
    """
    name: str
    suffix = ".trace"
    csv_spec: str | None = None

    def write_sample(self, path: Path, blocks: np.ndarray, writes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError("write_sample(path, blocks, writes) -> (blocks, writes) read back")

    def load(self, path: Path, **options) -> BlockTrace:
        return load_trace(path, self.name, csv_spec=self.csv_spec, **options)

    def _sample(self, folder: Path, pairs) -> tuple[Path, np.ndarray, np.ndarray]:
        path = folder / f"sample{self.suffix}"
        blocks = np.array([b for b, _ in pairs], np.int64)
        writes = np.array([w for _, w in pairs], bool)
        want_blocks, want_writes = self.write_sample(path, blocks, writes)
        return path, np.asarray(want_blocks, np.int64), np.asarray(want_writes, bool)

    def test_registered_and_listed(self):
        assert self.name in format_names()
        assert isinstance(FORMATS.get(self.name), TraceFormat)

    def test_reads_back_what_was_written(self, tmp_path_factory):
        @_SETTINGS
        @given(pairs=accesses)
        def check(pairs):
            path, blocks, writes = self._sample(tmp_path_factory.mktemp("trace"), pairs)
            trace = self.load(path, block_size=BLOCK)
            assert isinstance(trace, BlockTrace) and trace.block_size == BLOCK
            assert trace.blocks.dtype == np.int64 and trace.writes.dtype == np.bool_
            assert trace.blocks.tolist() == blocks.tolist() and trace.writes.tolist() == writes.tolist()
            if trace.timestamps_ns is not None:
                assert trace.timestamps_ns.shape == trace.blocks.shape
        check()

    def test_limit_keeps_a_prefix(self, tmp_path_factory):
        @_SETTINGS
        @given(pairs=accesses.filter(bool), cut=st.integers(1, 40))
        def check(pairs, cut):
            path, blocks, writes = self._sample(tmp_path_factory.mktemp("trace"), pairs)
            cut = min(cut, len(blocks))
            trace = self.load(path, block_size=BLOCK, limit=cut)
            assert trace.blocks.tolist() == blocks[:cut].tolist() and trace.writes.tolist() == writes[:cut].tolist()
        check()

    @pytest.mark.parametrize("block_size", [512, 65536])
    def test_a_block_size_given_is_the_traces(self, tmp_path, block_size):
        path, _, _ = self._sample(tmp_path, [(0, True), (1, False)])
        assert self.load(path, block_size=block_size).block_size == block_size

    def test_a_missing_file_is_a_trace_error(self, tmp_path):
        with pytest.raises(TraceError, match="missing"):
            self.load(tmp_path / f"missing{self.suffix}")

    def test_any_bytes_read_as_a_trace_or_raise_trace_error(self, tmp_path_factory):
        @_SETTINGS
        @given(data=st.binary(max_size=300))
        def check(data):
            path = tmp_path_factory.mktemp("garbage") / f"garbage{self.suffix}"
            path.write_bytes(data)
            self._loads_or_names_the_file(path)
        check()

    def test_a_file_cut_short_reads_or_raises_trace_error(self, tmp_path_factory):
        @_SETTINGS
        @given(pairs=accesses.filter(bool), fraction=st.floats(0, 1))
        def check(pairs, fraction):
            path, _, _ = self._sample(tmp_path_factory.mktemp("cut"), pairs)
            data = path.read_bytes()
            path.write_bytes(data[:int(len(data) * fraction)])
            self._loads_or_names_the_file(path)
        check()

    def _loads_or_names_the_file(self, path: Path) -> None:
        try:
            trace = self.load(path, block_size=BLOCK)
        except TraceError as exc:
            assert str(exc).startswith(str(path)), f"the error does not name the file: {exc}"
            return
        assert isinstance(trace, BlockTrace) and trace.blocks.shape == trace.writes.shape
        assert (trace.blocks >= 0).all()
