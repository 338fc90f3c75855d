"""`cxlhm trace`: move traces between cxlhm and libCacheSim."""
from __future__ import annotations

import sys
from pathlib import Path

from cxlhm_apps.cliutil import CommandError, check_output_path, positive_int, size_arg, trace_block_size
from cxlhm.traces.blocktrace import write_block_trace
from cxlhm.traces.formats import format_names, load_trace
from cxlhm.traces.lcs_csv import WRITTEN_SPEC
from cxlhm.traces.libcachesim_io import FORMATS, export_trace, format_name, import_trace
from cxlhm.units import format_size

NAME = "trace"
HELP = "export a trace to libCacheSim's formats (oracleGeneral, csv) or import one as a cxlhm block trace"
DESCRIPTION = f"""\
export: read a trace cxlhm reads (Mooncake JSONL, .cbt, oracleGeneral, CSV) and write it
in a format libCacheSim reads: oracleGeneral (24-byte records with each request's next
access, which libCacheSim's Belady needs) or csv ({WRITTEN_SPEC.replace(", has-header=true", "")},
a header line). Every access becomes one request for one object, the block id its
object id; the object size is --obj-size (default the block size, as `cxlhm mrc` takes
it: a .cbt trace's own, else the device's 64 KiB; 1 makes libCacheSim's
cache sizes count objects, as cxlhm's count blocks). oracleGeneral keeps whole seconds and
no op (writes are read back as reads); csv keeps nanoseconds and the op.

import: read a libCacheSim trace (csv with --csv-spec, default the columns export writes)
and write a cxlhm block trace (.cbt), each object one block of --block-size bytes.

examples:
  cxlhm trace export "$(python -c 'from cxlhm.traces.mooncake import DEFAULT_TRACE; print(DEFAULT_TRACE)')" \\
        mooncake.oracleGeneral.bin --format oracleGeneral --obj-size 1
  cxlhm trace export w.cbt w.csv --format csv
  cxlhm trace import w.oracleGeneral.bin w.cbt --format oracleGeneral --block-size 4KiB
  cxlhm trace import w.csv w.cbt --format csv --csv-spec "time-col=1, obj-id-col=2, has-header=false"
"""


def add_arguments(parser):
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="a cxlhm-readable trace to a libCacheSim format")
    export.add_argument("input", help="the trace to read")
    export.add_argument("output", help="the file to write")
    export.add_argument("--format", required=True, help=f"what to write: {' or '.join(FORMATS)}")
    export.add_argument("--input-format", default=None,
                        help=f"the input's format: {', '.join(format_names())} (default: guessed from its name)")
    export.add_argument("--csv-spec", default=None, help="columns of a CSV input (libCacheSim style)")
    export.add_argument("--obj-size", type=size_arg, default=None,
                        help="bytes per object written (default: the block size; 1: sizes count objects)")
    export.add_argument("--limit", type=positive_int, default=None, help="the first N accesses only")
    imp = actions.add_parser("import", help="a libCacheSim trace to a cxlhm block trace (.cbt)")
    imp.add_argument("input", help="the libCacheSim trace to read")
    imp.add_argument("output", help="the .cbt file to write")
    imp.add_argument("--format", required=True, help=f"the input's format: {' or '.join(FORMATS)}")
    imp.add_argument("--csv-spec", default=None, help=f"columns of a CSV input (default: {WRITTEN_SPEC})")
    imp.add_argument("--block-size", type=size_arg, default=4096, help="bytes per block (default 4KiB)")
    imp.add_argument("--limit", type=positive_int, default=None, help="the first N requests only")


def run(args) -> int:
    fmt = format_name(args.format)
    output = Path(args.output)
    check_output_path(output, "output")
    if Path(args.input).resolve() == output.resolve():
        raise CommandError(f"output {output}: is the input; write to another file")
    if args.action == "export":
        block_size = trace_block_size(args.input, args.input_format, None)  # as `cxlhm mrc` reads it
        trace = load_trace(args.input, args.input_format, limit=args.limit, csv_spec=args.csv_spec,
                           block_size=block_size)
        if len(trace) == 0:
            raise CommandError(f"{args.input}: no accesses in the trace")
        export_trace(trace, output, fmt, obj_size=args.obj_size)
        size = args.obj_size or trace.block_size
        print(f"wrote {output}: {fmt}, {len(trace)} requests for {trace.unique_blocks} objects of "
              f"{format_size(size)}")
        if fmt == "csv":
            print(f"  read it back: --csv-spec \"{WRITTEN_SPEC}\" (libCacheSim: time, obj-id, obj-size, op fields "
                  "1-4, has-header)")
        else:
            print("  libCacheSim: TraceType.ORACLE_GENERAL_TRACE")
    else:
        trace = import_trace(args.input, fmt, csv_spec=args.csv_spec, block_size=args.block_size, limit=args.limit)
        if len(trace) == 0:
            raise CommandError(f"{args.input}: no requests in the trace")
        write_block_trace(output, trace)
        print(f"wrote {output}: cxlhm block trace, {len(trace)} accesses to {trace.unique_blocks} blocks of "
              f"{format_size(trace.block_size)}")
    sys.stdout.flush()
    return 0
