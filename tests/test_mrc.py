"""Miss-ratio curves: size parsing, the curves themselves, and the `cxlhm mrc` and
`cxlhm policies` commands."""
import json
import re

import pytest

import firmware_policies
from cxlhm_apps.cli import main
from cxlhm.mrc import format_table, miss_ratio_curves, parse_cache_size, parse_cache_sizes, simulate_curves
from cxlhm.sim import simulate
from cxlhm.traces.blocktrace import write_block_trace
from cxlhm.traces.synthetic import zipf_trace

SIZES = [8, 32, 128, 512]


@pytest.fixture(scope="module")
def trace():
    return zipf_trace(20_000, 1_500, 0.8, seed=5)


@pytest.fixture(scope="module")
def curves(trace):
    return miss_ratio_curves(trace, ["lru", "fifo", "belady"], SIZES)


@pytest.fixture
def trace_file(tmp_path, trace):
    path = tmp_path / "z.cbt"
    write_block_trace(path, trace)
    return str(path)


@pytest.mark.parametrize("text,slots", [("100", 100), ("64MiB", 16384), ("64KiB", 16), ("10%", 150), ("100%", 1500),
                                        ("0.1%", 1), ("6000", 6000)])
def test_sizes_are_blocks_bytes_or_shares(text, slots):
    assert parse_cache_size(text, 4096, unique_blocks=1500) == slots


@pytest.mark.parametrize("text,message", [("1KiB", "smaller than one block"), ("0", "at least one block"),
                                          ("lots", "neither a block count"), ("150%", "within"), ("x%", "percentage")])
def test_bad_sizes_say_why(text, message):
    with pytest.raises(ValueError, match=message):
        parse_cache_size(text, 4096, unique_blocks=1500)


def test_size_lists_are_sorted_and_distinct():
    assert parse_cache_sizes("1000, 10,4KiB,10", 4096) == [1, 10, 1000]
    with pytest.raises(ValueError, match="no cache sizes"):
        parse_cache_sizes(" , ", 4096)


def test_curves_equal_single_simulations(trace, curves):
    for slots in SIZES:
        assert curves["lru"][slots] == simulate("lru", trace.blocks, slots).miss_ratio


def test_stack_policies_never_get_worse_with_more_dram(curves):
    for name in ("lru", "belady"):  # inclusion property: a bigger cache holds a superset
        ratios = [curves[name][s] for s in SIZES]
        assert ratios == sorted(ratios, reverse=True) and ratios[0] > ratios[-1]


def test_belady_bounds_the_curves(curves):
    for slots in SIZES:
        assert curves["belady"][slots] <= min(curves["lru"][slots], curves["fifo"][slots])


def test_parameters_reach_the_policy(trace):
    plain = miss_ratio_curves(trace, ["s3fifo"], [64])
    tuned = miss_ratio_curves(trace, ["s3fifo"], [64], params={"s3fifo": {"small_ratio": 0.5}})
    assert plain != tuned
    with pytest.raises(firmware_policies.PolicyParamError, match="small_ratio"):
        miss_ratio_curves(trace, ["s3fifo"], [64], params={"s3fifo": {"small_ratio": 2.0}})
    with pytest.raises(ValueError, match="not in the run"):
        miss_ratio_curves(trace, ["lru"], [64], params={"s3fifo": {"small_ratio": 0.2}})


def test_table_has_a_row_per_size_and_a_column_per_policy(curves):
    lines = format_table(curves, 4096).splitlines()
    assert lines[0].split() == ["slots", "bytes", "lru", "fifo", "belady"]
    assert [line.split()[0] for line in lines[1:]] == [str(s) for s in SIZES]


def test_mrc_command_json_and_plot(trace_file, tmp_path, capsys):
    png = tmp_path / "curve.png"
    assert main(["mrc", "--trace", trace_file, "--policies", "lru,belady", "--sizes", "32,128", "--json",
                 "--out", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"lru", "belady"} and set(out["lru"]) == {"32", "128"}
    assert 0 <= out["belady"]["128"] <= out["lru"]["128"] <= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mrc_command_table_with_byte_sizes_and_params(trace, trace_file, tmp_path, capsys):
    assert main(["mrc", "--trace", trace_file, "--format", "cxlhm", "--policies", "fifo,s3fifo",
                 "--sizes", "512KiB,10%", "--param", "s3fifo.small_ratio=0.2", "--no-plot", "--limit", "5000"]) == 0
    out = capsys.readouterr().out
    distinct = trace.head(5000).unique_blocks
    assert f"5000 accesses, {distinct} distinct blocks" in out and "fifo" in out and "s3fifo" in out
    # 512 KiB of 4 KiB blocks; 10% of the blocks replayed
    assert re.search(r"\n +128  512 KiB", out) and re.search(rf"\n +{distinct // 10}  ", out)
    assert not (tmp_path / "mrc.png").exists()


@pytest.mark.parametrize("args,message", [
    (["--policies", "lru,nosuch"], "unknown firmware policy 'nosuch'"),
    (["--sizes", "0"], "at least one block"),
    (["--param", "lru"], "POLICY.KEY=VALUE"),
    (["--format", "parquet"], "unknown trace format"),
])
def test_mrc_command_errors(trace_file, capsys, args, message):
    assert main(["mrc", "--trace", trace_file, "--no-plot"] + args) == 2
    assert message in capsys.readouterr().err


def test_mrc_command_names_a_bad_trace_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("1,5\n2,oops\n")
    assert main(["mrc", "--trace", str(bad), "--sizes", "2", "--no-plot"]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err


def test_timed_curves_are_the_timed_simulations_and_keep_the_miss_ratios(trace, curves):
    timed = simulate_curves(trace, ["lru"], [32, 512], timing="cmm-h")
    for slots in (32, 512):
        r = timed["lru"][slots]
        alone = simulate("lru", trace.blocks, slots, writes=trace.writes, timing="cmm-h", block_size=trace.block_size)
        assert r.timing["mean_ns"] == alone.timing["mean_ns"] and r.timing["p99_ns"] == alone.timing["p99_ns"]
        assert r.miss_ratio == curves["lru"][slots]
    # more DRAM, fewer misses to the SSD: a lower mean latency
    assert timed["lru"][512].timing["mean_ns"] < timed["lru"][32].timing["mean_ns"]


def test_mrc_command_with_timing_reports_latency(trace_file, capsys):
    assert main(["mrc", "--trace", trace_file, "--policies", "lru,fifo", "--sizes", "32,512", "--timing", "cmm-h",
                 "--no-plot", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for policy in ("lru", "fifo"):
        small, large = out[policy]["32"], out[policy]["512"]
        assert 0 < small["mean_ns"] <= small["p99_ns"] and large["miss_ratio"] < small["miss_ratio"]
    assert main(["mrc", "--trace", trace_file, "--policies", "lru", "--sizes", "32", "--timing", "cmm-h",
                 "--no-plot"]) == 0
    table = capsys.readouterr().out
    assert "mean latency, us:" in table and "p99 latency, us:" in table and "timing profile cmm-h" in table


def test_mrc_command_names_an_unknown_timing_profile(trace_file, capsys):
    assert main(["mrc", "--trace", trace_file, "--sizes", "32", "--timing", "nosuchprofile", "--no-plot"]) == 2
    assert "nosuchprofile" in capsys.readouterr().err


def test_policies_command_lists_every_policy_with_its_parameters(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    for name in ("fifo", "lru", "clock", "sieve", "arc", "s3fifo", "belady"):
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert firmware_policies.get(name).description in line
    assert "small_ratio (float, default 0.1)" in out and "n_bit_counter (int, default 1)" in out
    assert main(["policies", "nosuch"]) == 2


def test_sizes_above_the_trace_footprint_simulate_at_it():
    from cxlhm.mrc import parse_cache_sizes
    assert parse_cache_sizes("1TiB,5", 4096, unique_blocks=20) == [5, 20]
    assert parse_cache_sizes("1TiB", 4096, unique_blocks=None) == [(1 << 40) // 4096]


def test_timing_uses_the_profile_block_size_and_writes_a_latency_plot(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i}, "input_length": 512, "output_length": 1, '
                             f'"hash_ids": [{i % 5}, {i % 17 + 5}]}}\n' for i in range(300)))
    out = tmp_path / "m.png"
    assert main(["mrc", "--trace", str(trace), "--policies", "lru", "--sizes", "4,16", "--timing", "cmm-h",
                 "--queue-depth", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "block = 64 KiB (cmm-h's device block" in text
    assert "each record one device block access, closed loop, queue depth 4" in text
    assert out.stat().st_size > 0 and (tmp_path / "m-latency.png").stat().st_size > 0
    assert main(["mrc", "--trace", str(trace), "--policies", "lru", "--sizes", "4", "--timing", "cmm-h",
                 "--open-loop", "--json", "--no-plot"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["lru"]["4"]["mean_ns"] > 0


def test_mrc_plot_goes_to_a_new_output_folder_not_the_current_directory(trace_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CXLHM_OUT_DIR", str(tmp_path / "out"))
    assert main(["mrc", "--trace", trace_file, "--policies", "lru", "--sizes", "32", "--limit", "2000"]) == 0
    plots = list((tmp_path / "out" / "mrc").glob("*/mrc.png"))
    assert len(plots) == 1 and f"plot: {plots[0]}" in capsys.readouterr().out
    assert not (tmp_path / "mrc.png").exists()
