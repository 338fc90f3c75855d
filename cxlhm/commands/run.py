"""`cxlhm run`: the main job - replay a slice of the Mooncake conversation trace
through a device and print a summary table."""
from __future__ import annotations

import os
import platform
import sys

from cxlhm.commands._device_args import add_device_arguments, config_from_args
from cxlhm.replay import replay
from cxlhm.traces.mooncake import DEFAULT_TRACE, read_requests
from cxlhm.units import format_size, parse_size
from host_runtime.driver import open_device

NAME = "run"
HELP = "replay a multi-turn request trace through the device and summarise (the default job)"
DESCRIPTION = """\
Replay a Mooncake-style trace through an emulated device with real data: each hash id is
one KV chunk; a request reads back the chunks earlier requests stored and stores its new
ones. Every chunk read is verified. Prints device counters and throughput.

example:
  cxlhm run --requests 2000 --set dram_bytes=64MiB --policy lru
"""


def add_arguments(parser):
    parser.add_argument("--trace", default=os.environ.get("CXLHM_TRACE", str(DEFAULT_TRACE)),
                        help="Mooncake-style JSONL trace (default: ../shared/traces/mooncake_conversation_trace.jsonl)")
    parser.add_argument("--requests", type=int, default=1000, help="replay the first N requests (default 1000)")
    parser.add_argument("--chunk-bytes", default="64KiB", help="bytes of KV per hash id (default 64KiB)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_arguments(parser)


def run(args) -> int:
    cfg = config_from_args(args)
    chunk_bytes = parse_size(args.chunk_bytes)
    requests = read_requests(args.trace, limit=args.requests)
    with open_device(cfg) as dev:
        result = replay(dev, requests, chunk_bytes, progress=not args.no_progress and sys.stderr.isatty())
    d = result.device
    rows = [
        ("device", f"{cfg.name} ({format_size(cfg.capacity)} window, {format_size(cfg.dram_bytes)} DRAM, "
                   f"{format_size(cfg.block_size)} blocks, policy {cfg.firmware.policy})"),
        ("trace", f"{args.trace} (first {result.requests} requests)"),
        ("chunks read / written", f"{result.chunks_read} / {result.chunks_written} ({format_size(chunk_bytes)} each)"),
        ("device DRAM hit ratio", f"{d['hit_ratio']:.3f} ({d['hits']} hits, {d['misses']} misses)"),
        ("evictions / write-backs", f"{d['evictions']} / {d['writebacks']}"),
        ("SSD read / written", f"{format_size(d['ssd_read_bytes'])} / {format_size(d['ssd_write_bytes'])}"),
        ("prefetch issued / useful / pollution",
         f"{d['prefetch_issued']} / {d['prefetch_useful']} / {d['prefetch_pollution']}"),
        ("corrupt chunks", str(result.corrupt_chunks)),
        ("wall time", f"{result.wall_s:.2f} s ({result.requests / max(result.wall_s, 1e-9):.0f} req/s, "
                      f"{(result.bytes_read + result.bytes_written) / max(result.wall_s, 1e-9) / 2**20:.0f} MiB/s host traffic)"),
        ("machine", f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"),
    ]
    width = max(len(k) for k, _ in rows)
    print("cxlhm run: " + " ".join(sys.argv[1:]))
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    return 1 if result.corrupt_chunks else 0
