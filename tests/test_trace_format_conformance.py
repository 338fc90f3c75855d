"""The built-in trace formats through the shipped trace-format conformance suite
(cxlhm.testing.traces), each with a writer of its own format."""
import json

import numpy as np

from cxlhm.testing.traces import TraceFormatConformance
from cxlhm.traces.blocktrace import BlockTrace, write_block_trace
from cxlhm.traces.lcs_csv import WRITTEN_SPEC, write_csv
from cxlhm.traces.oracle_general import write_oracle_general


class TestCxlhmBlockTrace(TraceFormatConformance):
    name, suffix = "cxlhm", ".cbt"

    def write_sample(self, path, blocks, writes):
        write_block_trace(path, BlockTrace(blocks, writes, 4096))
        return blocks, writes


class TestOracleGeneral(TraceFormatConformance):
    name, suffix = "oracle-general", ".oracleGeneral.bin"

    def write_sample(self, path, blocks, writes):
        write_oracle_general(path, BlockTrace(blocks, writes, 4096))
        return blocks, np.zeros_like(writes)  # the format has no operation: every request reads


class TestCsv(TraceFormatConformance):
    name, suffix, csv_spec = "csv", ".csv", WRITTEN_SPEC

    def write_sample(self, path, blocks, writes):
        write_csv(path, BlockTrace(blocks, writes, 4096))
        return blocks, writes


class TestMooncake(TraceFormatConformance):
    name, suffix = "mooncake", ".jsonl"

    def write_sample(self, path, blocks, writes):
        with open(path, "w") as f:
            for i, block in enumerate(blocks.tolist()):
                f.write(json.dumps({"timestamp": i, "input_length": 512, "output_length": 1, "hash_ids": [block]}) + "\n")
        first_touch = np.zeros(blocks.shape[0], bool)  # the format's rule: a hash id's first touch writes its KV
        first_touch[np.unique(blocks, return_index=True)[1]] = True
        return blocks, first_touch
