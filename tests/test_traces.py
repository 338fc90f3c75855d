"""Trace readers and writers: round trips, interop with libCacheSim's readers, and
errors that name the file and the line or record."""
import json

import libcachesim as lcs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlhm.traces import TraceError
from cxlhm.traces.blocktrace import MAX_BLOCK, BlockTrace, next_use, read_block_trace, write_block_trace
from cxlhm.traces.formats import guess_format, load_trace
from cxlhm.traces.lcs_csv import parse_csv_spec, read_csv
from cxlhm.traces.mooncake_blocks import mooncake_block_trace
from cxlhm.traces.oracle_general import RECORD, read_oracle_general, write_oracle_general
from firmware_policies.base import NO_NEXT_USE

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
accesses = st.lists(st.tuples(st.integers(0, MAX_BLOCK), st.booleans()), max_size=60)


def trace_of(pairs, block_size=4096, timestamps=None):
    blocks = np.array([b for b, _ in pairs], np.int64)
    writes = np.array([w for _, w in pairs], np.bool_)
    return BlockTrace(blocks=blocks, writes=writes, block_size=block_size, timestamps_ns=timestamps)


# ---------------------------------------------------------------- next_use

@given(st.lists(st.integers(0, 5), max_size=80))
def test_next_use_is_the_next_index_of_the_same_block(ids):
    got = next_use(np.array(ids, np.int64))
    for t, block in enumerate(ids):
        later = [u for u in range(t + 1, len(ids)) if ids[u] == block]
        assert got[t] == (later[0] if later else NO_NEXT_USE)


# ---------------------------------------------------------------- cxlhm block traces

@FAST
@given(pairs=accesses, block_size=st.sampled_from([4096, 65536, 1 << 21]), with_time=st.booleans())
def test_block_trace_round_trip(tmp_path, pairs, block_size, with_time):
    stamps = np.arange(len(pairs), dtype=np.int64) * 1000 if with_time else None
    path = tmp_path / "t.cbt"
    write_block_trace(path, trace_of(pairs, block_size, stamps))
    back = read_block_trace(path)
    assert back.blocks.tolist() == [b for b, _ in pairs]
    assert back.writes.tolist() == [w for _, w in pairs]
    assert back.block_size == block_size
    assert (back.timestamps_ns is None) == (not with_time)
    if with_time:
        assert back.timestamps_ns.tolist() == stamps.tolist()


@FAST
@given(pairs=st.lists(st.tuples(st.integers(0, 1000), st.booleans()), min_size=1, max_size=20), data=st.data())
def test_truncated_block_trace_names_the_record(tmp_path, pairs, data):
    path = tmp_path / "t.cbt"
    write_block_trace(path, trace_of(pairs))
    raw = path.read_bytes()
    cut = data.draw(st.integers(0, len(raw) - 1))
    path.write_bytes(raw[:cut])
    with pytest.raises(TraceError) as err:
        read_block_trace(path)
    where = "header" if cut < 32 else f"record {(cut - 32) // 8 + 1}"
    assert str(err.value).startswith(f"{path}:{where}:")


@pytest.mark.parametrize("patch,message", [
    (lambda b: b"NOTATRCE" + b[8:], "not a cxlhm block trace"),
    (lambda b: b[:8] + (9).to_bytes(4, "little") + b[12:], "unsupported version 9"),
    (lambda b: b[:12] + (6).to_bytes(4, "little") + b[16:], "unknown flag bits"),
    (lambda b: b[:16] + (0).to_bytes(8, "little") + b[24:], "block size must be positive"),
    (lambda b: b + b"\0" * 8, "trailing data"),
])
def test_corrupt_block_trace_headers_are_named(tmp_path, patch, message):
    path = tmp_path / "t.cbt"
    write_block_trace(path, trace_of([(1, False), (2, True)]))
    path.write_bytes(patch(path.read_bytes()))
    with pytest.raises(TraceError, match=message):
        read_block_trace(path)


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot open"):
        read_block_trace(tmp_path / "absent.cbt")


# ---------------------------------------------------------------- oracleGeneral

@FAST
@given(pairs=st.lists(st.tuples(st.integers(0, 50), st.booleans()), max_size=60))
def test_oracle_general_round_trip_and_libcachesim_reads_the_same_requests(tmp_path, pairs):
    trace = trace_of(pairs)
    path = tmp_path / "t.oracleGeneral.bin"
    write_oracle_general(path, trace)
    back = read_oracle_general(path)
    assert back.blocks.tolist() == trace.blocks.tolist()
    records = np.fromfile(path, RECORD)
    nxt = next_use(trace.blocks)
    assert records["next_access_vtime"].tolist() == np.where(nxt == NO_NEXT_USE, -1, nxt).tolist()
    if pairs:
        ids = [req.obj_id for req in lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)]
        assert ids == trace.blocks.tolist()


@FAST
@given(ids=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40))
def test_oracle_general_keeps_the_identity_of_any_64_bit_id(tmp_path, ids):
    records = np.zeros(len(ids), RECORD)
    records["obj_id"], records["obj_size"] = np.array(ids, np.uint64), 1
    path = tmp_path / "ids.bin"
    records.tofile(path)
    blocks = read_oracle_general(path).blocks
    assert blocks.min() >= 0 and blocks.max() <= MAX_BLOCK
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (blocks[i] == blocks[j]) == (ids[i] == ids[j])


def test_oracle_general_skips_zero_size_requests_like_libcachesim(tmp_path):
    records = np.zeros(4, RECORD)
    records["obj_id"], records["obj_size"] = [1, 2, 3, 4], [1, 0, 1, 0]
    path = tmp_path / "z.bin"
    records.tofile(path)
    assert read_oracle_general(path).blocks.tolist() == [1, 3]


def test_compressed_oracle_general_says_to_decompress(tmp_path):
    path = tmp_path / "w.oracleGeneral.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(40))
    with pytest.raises(TraceError, match="decompress"):
        read_oracle_general(path)


@FAST
@given(n=st.integers(1, 20), extra=st.integers(1, 23))
def test_truncated_oracle_general_names_the_record(tmp_path, n, extra):
    path = tmp_path / "t.bin"
    write_oracle_general(path, trace_of([(i, False) for i in range(n)]))
    path.write_bytes(path.read_bytes() + b"\1" * extra)
    with pytest.raises(TraceError, match=rf"t\.bin:record {n + 1}: truncated"):
        read_oracle_general(path)


@FAST
@given(n=st.integers(1, 20), data=st.data())
def test_bad_next_access_is_named_by_record(tmp_path, n, data):
    bad = data.draw(st.integers(0, n - 1))
    records = np.zeros(n, RECORD)
    records["obj_size"], records["next_access_vtime"] = 1, -1
    records["next_access_vtime"][bad] = data.draw(st.integers(-2**63, -2))
    path = tmp_path / "n.bin"
    records.tofile(path)
    with pytest.raises(TraceError, match=rf"n\.bin:record {bad + 1}: next_access_vtime"):
        read_oracle_general(path)


# ---------------------------------------------------------------- CSV

csv_rows = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2**64 - 1), st.integers(1, 10**6),
                              st.sampled_from(["get", "set", "read", "write", "GET", "Put"])), max_size=40)


@FAST
@given(rows=csv_rows, delimiter=st.sampled_from([",", "\t", ";", " "]), header=st.booleans())
def test_csv_reads_what_was_written(tmp_path, rows, delimiter, header):
    lines = ([delimiter.join(["time", "id", "size", "op"])] if header else []) + [
        delimiter.join(map(str, row)) for row in rows]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    name = {"\t": "tab", " ": "space"}.get(delimiter, delimiter)
    trace = read_csv(path, f"time-col=1, obj-id-col=2, obj-size-col=3, op-col=4, delimiter={name}")
    ids = [row[1] for row in rows]
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (trace.blocks[i] == trace.blocks[j]) == (ids[i] == ids[j])
    assert trace.writes.tolist() == [row[3].lower() in ("set", "write", "put") for row in rows]
    assert trace.timestamps_ns.tolist() == [row[0] * 10**9 for row in rows]


def test_csv_matches_libcachesims_csv_reader(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 300, 5000)
    path = tmp_path / "w.csv"
    path.write_text("".join(f"{t},{i},1\n" for t, i in enumerate(ids)))
    ours = read_csv(path, "time-col=1, obj-id-col=2, obj-size-col=3")
    params = lcs.ReaderInitParam(has_header=False, delimiter=",")
    params.time_field, params.obj_id_field, params.obj_size_field = 1, 2, 3
    reader = lcs.TraceReader(str(path), lcs.TraceType.CSV_TRACE, params)
    assert [req.obj_id for req in reader] == ours.blocks.tolist()


def test_csv_string_ids_are_numbered_in_order(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("a\nb\na\nc\n")
    assert read_csv(path, "obj-id-col=1, obj-id-is-num=false").blocks.tolist() == [0, 1, 0, 2]


@pytest.mark.parametrize("body,spec,where,message", [
    ("1,5\n2,x\n", "time-col=1, obj-id-col=2", "2", "object id 'x' is not"),
    ("1,5\n2\n", "time-col=1, obj-id-col=2", "2", "1 columns"),
    ("1,5,get\n2,6,delete\n", "obj-id-col=2, op-col=3", "2", "unknown op 'delete'"),
    ("t,5\n", "time-col=1, obj-id-col=2", "1", "time 't' is not a number"),
    ("1,5,-3\n", "obj-id-col=2, obj-size-col=3", "1", "must be non-negative"),
    ("1,99999999999999999999999\n", "obj-id-col=2", "1", "not a 64-bit"),
])
def test_bad_csv_lines_are_named(tmp_path, body, spec, where, message):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceError) as err:
        read_csv(path, spec)
    assert str(err.value).startswith(f"{path}:{where}:") and message in str(err.value)


@given(st.sampled_from([",", "tab", ";", "|"]))
def test_csv_spec_accepts_any_delimiter_including_a_comma(delimiter):
    spec = parse_csv_spec(f"time-col=1, obj-id-col=2, obj-size-col=3, delimiter={delimiter}, has-header=true")
    assert (spec.time_col, spec.obj_id_col, spec.size_col, spec.has_header) == (1, 2, 3, True)
    assert spec.delimiter == {"tab": "\t"}.get(delimiter, delimiter)


@pytest.mark.parametrize("text,message", [
    ("time-col=1", "needs obj-id-col"), ("obj-id-col=0", "1-based"), ("obj-id-col=2, colour=red", "unknown CSV spec key"),
    ("obj-id-col=2, has-header=maybe", "true or false"), ("garbage", "cannot parse"),
])
def test_bad_csv_specs_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_csv_spec(text)


# ---------------------------------------------------------------- Mooncake

def test_mooncake_flattens_requests_and_writes_on_first_touch(tmp_path):
    path = tmp_path / "m.jsonl"
    requests = [{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
                {"timestamp": 5, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]}]
    path.write_text("\n".join(json.dumps(r) for r in requests) + "\n")
    trace = mooncake_block_trace(path, bytes_per_token=2)
    assert trace.blocks.tolist() == [1, 2, 1, 2, 3]
    assert trace.writes.tolist() == [True, True, False, False, True]
    assert trace.timestamps_ns.tolist() == [0, 0, 5_000_000, 5_000_000, 5_000_000]
    assert trace.block_size == 512 * 2


def test_mooncake_errors_keep_their_line_numbers(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 0,\n')
    with pytest.raises(TraceError, match=r"m\.jsonl:2: not valid JSON"):
        mooncake_block_trace(path)


def test_the_shared_mooncake_trace_loads():
    trace = mooncake_block_trace(limit=100)
    assert len(trace) > 100 and trace.writes.any() and (~trace.writes).any()


# ---------------------------------------------------------------- formats

@pytest.mark.parametrize("name,fmt", [("a.cbt", "cxlhm"), ("w.oracleGeneral.bin", "oracle-general"),
                                      ("x.oracleGeneral.zst", "oracle-general"), ("t.csv", "csv"),
                                      ("m.jsonl", "mooncake")])
def test_format_is_guessed_from_the_name(name, fmt):
    assert guess_format(name) == fmt


def test_load_trace_dispatches_and_limits(tmp_path):
    path = tmp_path / "t.cbt"
    write_block_trace(path, trace_of([(i, i % 2 == 0) for i in range(10)]))
    trace = load_trace(path, limit=4, block_size=8192)
    assert trace.blocks.tolist() == [0, 1, 2, 3] and trace.block_size == 8192
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(path, "parquet")
    with pytest.raises(ValueError, match="cannot tell the format"):
        load_trace(tmp_path / "mystery.dat")
