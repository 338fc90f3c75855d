"""What `cxlhm run` tells its user: comparisons say higher or lower the right way round,
a +hints configuration of a policy without on_hint is flagged, the block size is stated once."""
from __future__ import annotations

import pytest

from cxlhm_apps.cli import main
from cxlhm_apps.cliutil import compare_ratio, hints_ignored

SMALL = ["--requests", "60", "--no-progress", "--no-plot", "--set", "dram_bytes=16MiB", "--set", "capacity=4GiB",
         "--set", "data=none"]


@pytest.mark.parametrize("base, value, words", [
    (100.0, 50.0, "2.00x lower"),
    (100.0, 101.0, "1.01x higher"),
    (100.0, 99.0, "1.01x lower"),
    (100.0, 100.2, "the same"),
    (0.0, 0.0, "the same"),
])
def test_compare_ratio_says_the_direction(base, value, words):
    assert compare_ratio(base, value) == words


def test_policies_without_on_hint_are_known():
    assert hints_ignored("lru") and hints_ignored("s3fifo")
    assert not hints_ignored("hymcache")


def test_plus_hints_without_on_hint_warns_and_the_report_reads_right(capsys):
    assert main(["run", "--configs", "lru,lru+hints,hymcache+hints", *SMALL]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings == ["cxlhm run: warning: lru+hints: lru has no on_hint hook, so it ignores the lifecycle hints "
                        "and runs as plain lru (give the policy an on_hint, see docs/policies.md)"]
    assert "lru+hints vs lru: KV-load p99 the same, p50 the same" in out  # the same firmware, the same result
    line = next(line for line in out.splitlines() if line.strip().startswith("hymcache+hints vs lru"))
    assert " lower" in line or " higher" in line or "the same" in line
    assert "0.99x lower" not in out
    assert "block = chunk = 64 KiB" in out and "chunks of" not in out  # one block size, stated once


def test_no_warning_for_a_policy_that_takes_hints(capsys):
    assert main(["run", "--configs", "hymcache+hints", *SMALL]) == 0
    assert "warning" not in capsys.readouterr().err


def test_policies_lists_which_take_hints(capsys):
    assert main(["policies", "lru", "hymcache"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("lru ") and out[0].endswith("; no on_hint: ignores hints]")
    hym = next(line for line in out if line.startswith("hymcache"))
    assert hym.endswith("; takes hints (on_hint)]")
