"""The bridge to libCacheSim: `cxlhm trace export/import` writes what libCacheSim's own
readers read (checked by replaying both through libCacheSim), `cxlhm.testing.golden`
puts any registered policy beside its libCacheSim namesake, `cxlhm mrc --libcachesim`."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlhm_apps.cli import main
from cxlhm.sim import simulate
from cxlhm.testing.golden import compare, format_rows, namesake
from cxlhm.traces.blocktrace import BlockTrace, read_block_trace
from cxlhm.traces.formats import load_trace
from cxlhm.traces.libcachesim_io import export_trace, format_name, import_trace, libcachesim_reader
from cxlhm.traces.mooncake import DEFAULT_TRACE
from cxlhm.traces.synthetic import zipf_trace

lcs = pytest.importorskip("libcachesim")


@pytest.fixture(scope="module")
def zipf():
    return zipf_trace(20_000, 2_000, 0.9, seed=5)


@pytest.mark.parametrize("fmt", ["oracleGeneral", "csv"])
def test_libcachesim_reads_the_export_as_the_same_requests(zipf, tmp_path, fmt):
    path = tmp_path / f"z.{fmt}"
    export_trace(zipf, path, fmt, obj_size=1)
    for slots in (50, 500):
        theirs, _ = lcs.LRU(slots).process_trace(libcachesim_reader(path, fmt))
        assert round(theirs * len(zipf)) == simulate("lru", zipf.blocks, slots).misses
    back = import_trace(path, fmt)
    assert np.array_equal(back.blocks, zipf.blocks)


@settings(max_examples=40, deadline=None)
@given(blocks=st.lists(st.integers(0, 2**62), min_size=1, max_size=60),
       writes=st.lists(st.booleans(), min_size=60, max_size=60),
       stamps=st.lists(st.integers(0, 2**40), min_size=60, max_size=60))
def test_csv_round_trip_keeps_ids_ops_and_nanoseconds(tmp_path_factory, blocks, writes, stamps):
    n = len(blocks)
    trace = BlockTrace(blocks=np.array(blocks, np.int64), writes=np.array(writes[:n], np.bool_), block_size=4096,
                       timestamps_ns=np.sort(np.array(stamps[:n], np.int64)))
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    export_trace(trace, path, "csv")
    back = import_trace(path, "csv")
    assert np.array_equal(back.blocks, trace.blocks) and np.array_equal(back.writes, trace.writes)
    assert np.all(np.abs(back.timestamps_ns - trace.timestamps_ns) <= 256)  # float seconds: ns at this range


def test_trace_command_exports_and_imports(tmp_path, capsys):
    og = tmp_path / "m.oracleGeneral.bin"
    assert main(["trace", "export", DEFAULT_TRACE, str(og), "--format", "oracleGeneral", "--limit", "3000",
                 "--obj-size", "1"]) == 0
    assert "wrote" in capsys.readouterr().out and og.stat().st_size == 3000 * 24
    mooncake = load_trace(DEFAULT_TRACE, limit=3000)
    assert np.array_equal(import_trace(og, "oracleGeneral").blocks, mooncake.blocks)
    csv = tmp_path / "m.csv"
    assert main(["trace", "export", str(og), str(csv), "--format", "csv"]) == 0
    assert "objects of 64 KiB" in capsys.readouterr().out  # the device block, as cxlhm mrc reads it
    cbt = tmp_path / "m.cbt"
    assert main(["trace", "import", str(csv), str(cbt), "--format", "csv", "--block-size", "64KiB"]) == 0
    back = read_block_trace(cbt)
    assert np.array_equal(back.blocks, mooncake.blocks) and back.block_size == 65536


@pytest.mark.parametrize("argv, message", [
    (["export", "IN", "OUT", "--format", "parquet"], "unknown libCacheSim trace format 'parquet'; accepted: oracleGeneral, csv"),
    (["export", "IN", "IN", "--format", "csv"], "is the input"),
    (["import", "MISSING", "OUT", "--format", "csv"], "MISSING"),
])
def test_trace_command_errors_are_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "IN").write_text("time,obj_id\n1,2\n")
    assert main(["trace", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_namesakes():
    assert namesake("lecar") == "LeCaR" and namesake("s3fifo") == "S3FIFO" and namesake("lru") == "LRU"
    assert namesake("hymcache") is None
    assert format_name("oracle-general") == "oracleGeneral"


def test_golden_reports_the_difference(zipf):
    rows = compare("lru", zipf, [100, 400])
    assert [(r.libcachesim, r.slots) for r in rows] == [("LRU", 100), ("LRU", 400)]
    assert [r.difference_points for r in rows] == pytest.approx([0.0, 0.0], abs=1e-9)  # the same misses
    rows = compare("fifo", zipf, [100], libcachesim="LRU")  # any class, by name: the difference shows
    assert rows[0].difference_points > 1
    table = format_rows(rows)
    assert "fifo" in table and "LRU" in table and "+" in table.splitlines()[1]
    with pytest.raises(LookupError, match="no policy named like 'hymcache'"):
        compare("hymcache", zipf, [100])


def test_golden_main(tmp_path, capsys):
    path = tmp_path / "z.oracleGeneral.bin"
    export_trace(zipf_trace(5_000, 500, 0.9, seed=2), path, "oracleGeneral", obj_size=1)
    from cxlhm.testing.golden import main as golden_main
    assert golden_main(["--trace", str(path), "--policies", "lru,clock", "--sizes", "10%"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["policy", "libCacheSim", "blocks"] and len(out) == 3
    assert all(line.endswith("+0.00") for line in out[1:])


def test_mrc_prints_libcachesim_beside_ours(tmp_path, capsys):
    path = tmp_path / "z.oracleGeneral.bin"
    export_trace(zipf_trace(5_000, 500, 0.9, seed=2), path, "oracleGeneral", obj_size=1)
    assert main(["mrc", "--trace", str(path), "--policies", "lru,sieve,hymcache", "--sizes", "10,50", "--no-plot",
                 "--libcachesim"]) == 0
    out = capsys.readouterr().out
    assert "libCacheSim, same requests (objects = blocks)" in out
    assert out.count("(+0.00)") == 4 and "no libCacheSim policy of the same name: hymcache" in out
    assert main(["mrc", "--trace", str(path), "--policies", "lru", "--sizes", "10", "--no-plot", "--libcachesim",
                 "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["libcachesim"]["lru (LRU)"]["10"] == pytest.approx(figures["lru"]["10"])
