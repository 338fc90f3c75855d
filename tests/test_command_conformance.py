"""Built-in `cxlhm` subcommands through the shipped command conformance suite
(cxlhm_apps.testing); tests/test_cli_hostile.py throws hostile input at every one."""
import numpy as np

from cxlhm.traces.blocktrace import BlockTrace, write_block_trace
from cxlhm_apps.testing import CommandConformance


class TestPolicies(CommandConformance):
    name = "policies"

    def good_runs(self, tmp_path):
        return [["policies"], ["policies", "lru", "s3fifo"]]

    def bad_runs(self, tmp_path):
        return [["policies", "no-such-policy"], ["policies", "--bogus"]]


class TestTrace(CommandConformance):
    name = "trace"

    def good_runs(self, tmp_path):
        source = tmp_path / "t.cbt"
        write_block_trace(source, BlockTrace(np.arange(10, dtype=np.int64), np.zeros(10, bool), 4096))
        return [["trace", "export", str(source), str(tmp_path / "t.csv"), "--format", "csv"]]

    def bad_runs(self, tmp_path):
        (tmp_path / "bad.cbt").write_bytes(b"not a block trace")
        return [["trace", "export", str(tmp_path / "bad.cbt"), str(tmp_path / "o.csv"), "--format", "csv"],
                ["trace", "export", str(tmp_path / "missing.cbt"), str(tmp_path / "o.csv"), "--format", "csv"]]
