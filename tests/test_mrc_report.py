"""What `cxlhm mrc` prints: one block size for the run, stated once, the same with and
without --timing; tables no wider than 100 columns, every figure in --json."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cxlhm_apps.cli import main
from cxlhm_apps.commands.mrc import TABLE_WIDTH
from cxlhm.traces.blocktrace import BlockTrace, write_block_trace
from cxlhm.traces.oracle_general import write_oracle_general

ALL = "fifo,lru,clock,sieve,arc,s3fifo,belady"


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    path = tmp_path_factory.mktemp("mrc") / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {i}, "input_length": 512, "output_length": 1, '
                            f'"hash_ids": [{i % 5}, {i % 17 + 5}, {i % 61 + 30}]}}\n' for i in range(400)))
    return str(path)


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith(("trace ", "block ", "latency:", "plot:"))]


def _dram_labels(text: str) -> list[str]:
    return re.findall(r"^\s*\d+\s+(\d[\d.]* [KMGT]?i?B)\s", text, re.MULTILINE)


def test_one_block_size_with_and_without_timing(mooncake, capsys):
    assert main(["mrc", "--trace", mooncake, "--policies", "lru", "--sizes", "8,10%,1MiB", "--no-plot"]) == 0
    plain = capsys.readouterr().out
    assert main(["mrc", "--trace", mooncake, "--policies", "lru", "--sizes", "8,10%,1MiB", "--no-plot",
                 "--timing", "cmm-h"]) == 0
    timed = capsys.readouterr().out
    for text in (plain, timed):
        assert "block = 64 KiB (cmm-h's device block; one record = one block)" in text
        assert len(re.findall(r"\d+ [KMGT]iB block|blocks of", text)) == 0  # the size is stated once, not again
    assert _dram_labels(plain) == ["512 KiB", "1 MiB"]  # 8 blocks (= 10% of 83) and 1 MiB = 16 blocks of 64 KiB
    assert _dram_labels(timed) == _dram_labels(plain) * 3  # each section of the timed table: the same sizes
    assert "MiB" in plain and "GiB" not in plain


def test_the_block_size_follows_block_size_and_the_cbt_trace(tmp_path, capsys):
    blocks = np.arange(200, dtype=np.int64) % 50
    og = tmp_path / "t.oracleGeneral.bin"
    write_oracle_general(og, BlockTrace(blocks=blocks, writes=np.zeros(200, np.bool_), block_size=4096))
    assert main(["mrc", "--trace", str(og), "--policies", "lru", "--sizes", "10", "--no-plot"]) == 0
    assert "block = 64 KiB (cmm-h's device block" in capsys.readouterr().out
    assert main(["mrc", "--trace", str(og), "--policies", "lru", "--sizes", "10", "--no-plot",
                 "--block-size", "4KiB"]) == 0
    out = capsys.readouterr().out
    assert "block = 4 KiB (--block-size)" in out and "40 KiB" in out
    cbt = tmp_path / "t.cbt"
    write_block_trace(cbt, BlockTrace(blocks=blocks, writes=np.zeros(200, np.bool_), block_size=8192))
    assert main(["mrc", "--trace", str(cbt), "--policies", "lru", "--sizes", "10", "--no-plot"]) == 0
    assert "block = 8 KiB (as the trace records it)" in capsys.readouterr().out


def test_the_timing_table_fits_100_columns_and_json_has_every_figure(mooncake, capsys):
    assert main(["mrc", "--trace", mooncake, "--policies", ALL, "--sizes", "4,16,64", "--no-plot",
                 "--timing", "cmm-h"]) == 0
    text = capsys.readouterr().out
    lines = _table_lines(text)
    assert lines and max(len(line) for line in lines) <= TABLE_WIDTH
    assert [line for line in lines if line.endswith(":")] == ["miss ratio:", "mean latency, us:", "p99 latency, us:"]
    assert main(["mrc", "--trace", mooncake, "--policies", ALL, "--sizes", "4,16,64", "--no-plot",
                 "--timing", "cmm-h", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == set(ALL.split(","))
    assert set(figures["lru"]["16"]) == {"miss_ratio", "mean_ns", "p50_ns", "p99_ns", "model_ns"}


def test_many_policies_split_into_tables_that_fit():
    from types import SimpleNamespace
    from cxlhm_apps.commands.mrc import format_report
    results = {f"policy_with_a_long_name_{k}": {4: SimpleNamespace(miss_ratio=0.5), 400: SimpleNamespace(miss_ratio=0.25)}
               for k in range(9)}
    text = format_report(results, 65536, timing=False)
    assert max(len(line) for line in text.splitlines()) <= TABLE_WIDTH
    assert sum(line.lstrip().startswith("blocks") for line in text.splitlines()) > 1
    for name in results:
        assert text.count(name) == 1
