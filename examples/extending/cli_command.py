"""`cxlhm footprint`: how much device DRAM a trace's working set needs - its accesses,
distinct blocks, write share and the bytes those blocks take - before choosing the
`--sizes` of `cxlhm mrc`.

A command is a module with NAME, HELP, add_arguments(parser) and run(args) -> exit
status (DESCRIPTION optional). Raising ValueError, LookupError, OSError or ConfigError
for bad input gives the user one line and exit status 2; `cxlhm` does that for every
command.
"""
from __future__ import annotations

import numpy as np

from cxlhm.units import format_size
from cxlhm.traces.formats import format_names, load_trace
from cxlhm_apps.cliutil import positive_int, size_arg, trace_block_size

NAME = "footprint"
HELP = "a trace's accesses, distinct blocks, write share and the DRAM bytes its blocks take"


def add_arguments(parser):
    parser.add_argument("trace", help="trace file")
    parser.add_argument("--format", default=None, help=f"trace format: {', '.join(format_names())} "
                                                       "(default: guessed from the file name)")
    parser.add_argument("--block-size", type=size_arg, default=None,
                        help="bytes per block (default: a .cbt trace's own, else the device's)")
    parser.add_argument("--limit", type=positive_int, default=None, help="only the first N accesses")


def run(args) -> int:
    block_size = trace_block_size(args.trace, args.format, args.block_size)
    trace = load_trace(args.trace, args.format, limit=args.limit, block_size=block_size)
    distinct = trace.unique_blocks
    writes = int(np.count_nonzero(trace.writes))
    print(f"accesses        {len(trace)}")
    print(f"distinct blocks {distinct}")
    print(f"writes          {writes / len(trace):.1%}" if len(trace) else "writes          -")
    print(f"footprint       {format_size(distinct * trace.block_size)} ({trace.block_size} B blocks)")
    return 0
