"""`cxlhm calibrate`: measure a real back end and fit the timing model's NAND parameters."""
from __future__ import annotations

import argparse
import os
import shlex
import stat
import sys

import yaml
from tqdm import tqdm

from cxlhm.config import ConfigError, available_profiles, load_config
from cxlhm.timing import calibration as cal
from cxlhm.timing.params import parse_timing
from cxlhm.units import format_size, parse_duration_ns, parse_size

NAME = "calibrate"
HELP = "measure an SSD back end and write a timing-profile fragment that reproduces it"
DESCRIPTION = """\
Measure the back end at PATH the way fio would (O_DIRECT, io_uring, closed loop):
4 KiB random-read IOPS at QD 1, 2, 4, 8, 16, 32, 64 and 1 MiB sequential-read
bandwidth at QD 16, each for --runtime. A region that was never written is laid out
first (reads of file holes never reach the disk). Then fit the timing model's NAND
parameters (dies, tR, FTL overhead, channels and rate, page size) so that the model
clock reproduces those figures, print model vs measured, and write the `timing:`
fragment (use it with --device FRAGMENT.yaml, or paste it into a profile).

Example: cxlhm calibrate --backend /data/ssd.img --size 1GiB --runtime 5s -o mine.yaml"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", required=True, metavar="PATH",
                        help="file or block device to measure (a file is created and laid out if needed)")
    parser.add_argument("--size", default="1GiB", help="bytes of PATH to use (default 1GiB; multiple of 1 MiB)")
    parser.add_argument("--runtime", default="5s", help="time per measurement point (default 5s; 8 points)")
    parser.add_argument("--output", "-o", metavar="FRAGMENT.yaml", help="write the fragment here (default: stdout)")
    parser.add_argument("--device", "-d", default="cmm-h", metavar="PROFILE|FILE.yaml",
                        help="profile whose non-NAND timing keys (link, DRAM, controller) the fit builds on")
    parser.add_argument("--overwrite", action="store_true",
                        help="allow laying out a file that already holds data but has unwritten holes")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random offsets (default 0)")


MAX_RUNTIME_S = 3600.0  # per measurement point: 8 points, so a mistyped unit cannot run for days


def run(args: argparse.Namespace) -> int:
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        raise ConfigError("--size", "size", str(exc)) from None
    try:
        runtime_s = parse_duration_ns(args.runtime, default_unit="s") / 1e9
    except ValueError as exc:
        raise ConfigError("--runtime", "runtime", str(exc)) from None
    if not 0 < runtime_s <= MAX_RUNTIME_S:
        raise ConfigError("--runtime", "runtime", f"must be positive and at most {MAX_RUNTIME_S:g} s per point, "
                          f"got {args.runtime!r}")
    if not 0 <= args.seed < 2**63:
        raise ConfigError("--seed", "seed", f"must be 0..2**63-1, got {args.seed}")
    _check_room(args.backend, size)
    _check_output(args.output)
    cfg = load_config(args.device)
    base = parse_timing(cfg.timing, cfg.source_of("timing"))
    if base.backing != "nand":
        raise ConfigError(cfg.source_of("timing"), "timing.backing", "calibration fits NAND parameters; "
                          "choose a profile with backing: nand (e.g. cmm-h or nvme-tlc)")

    command = "cxlhm calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == NAME else \
        f"cxlhm calibrate --backend {shlex.quote(args.backend)} --size {args.size} --runtime {args.runtime}"
    with tqdm(total=len(cal.QDS) + 5, unit="step", leave=False, file=sys.stderr) as bar:
        def step(label: str) -> None:
            bar.set_description(label)
            bar.update(1)
        measured = cal.measure(args.backend, size, runtime_s, seed=args.seed, overwrite=args.overwrite, progress=step)
        fitted = cal.fit(measured, base, size, progress=step)
    model = cal.model_figures(fitted, size)

    print(f"{command}\nmachine: {measured.machine}\nwhen: {measured.when}\n")
    print(comparison_table(measured, model))
    text = fragment_yaml(fitted, measured, model, command, base=args.device)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"\nwrote {args.output}")
    else:
        print("\n" + text)
    return 0


def _check_room(path: str, size: int) -> None:
    """A new or regular backend file is laid out in full: refuse a size its file system
    cannot hold before writing anything (a block device is checked when it is opened)."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        return
    try:
        vfs = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return  # a missing folder: opening the backend names it
    room = vfs.f_bavail * vfs.f_frsize + (st.st_blocks * 512 if st is not None else 0)
    if size > room:
        raise ConfigError("--size", "size", f"{format_size(size)} does not fit: the file system of {path} has "
                          f"{format_size(room)} free (calibration writes the whole region)")


def _check_output(path: str | None) -> None:
    """Where the fragment goes must be writable before minutes of measuring, not after."""
    if path is None:
        return
    if os.path.isdir(path):
        raise ConfigError("--output", "output", f"{path} is a folder; give a file name such as {path}/timing.yaml")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ConfigError("--output", "output", f"{path} is not a regular file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError("--output", "output", f"folder {folder} does not exist")
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise ConfigError("--output", "output", f"{path} is not writable")


def comparison_table(measured: cal.Measurement, model: cal.Figures) -> str:
    rows = [("what", "measured", "model", "model/measured")]
    for qd, iops in measured.iops.items():
        rows.append((f"4 KiB random read QD{qd} (IOPS)", f"{iops:,.0f}", f"{model.iops[qd]:,.0f}",
                     f"{model.iops[qd] / iops:.3f}"))
    rows.append(("4 KiB random read QD1 mean latency", f"{measured.qd1_latency_ns / 1e3:.1f} us",
                 f"{model.qd1_latency_ns / 1e3:.1f} us", f"{model.qd1_latency_ns / measured.qd1_latency_ns:.3f}"))
    rows.append((f"1 MiB sequential read QD{cal.SEQ_QD}", f"{measured.seq_read_bw / 1e9:.3f} GB/s",
                 f"{model.seq_read_bw / 1e9:.3f} GB/s", f"{model.seq_read_bw / measured.seq_read_bw:.3f}"))
    if measured.layout_write_bw:
        rows.append((f"1 MiB sequential write QD{cal.LAYOUT_QD} (layout)", f"{measured.layout_write_bw / 1e9:.3f} GB/s",
                     "not fitted", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"
                     for r in rows)


def fragment_yaml(fitted, measured: cal.Measurement, model: cal.Figures, command: str, base: str) -> str:
    """The `timing:` NAND keys, each with where it came from, and a header saying how
    they were measured (every number carries its source). `base` is the
    profile name or config file the fit built on."""
    is_profile = base in available_profiles()
    headline = ", ".join(f"QD{q} {measured.iops[q]:,.0f} -> {model.iops[q]:,.0f} IOPS"
                         for q in measured.iops if q in cal.HEADLINE_QDS)
    why = {
        "ssd_command_latency": "fitted: FTL/command latency that holds no die (shapes IOPS growth with QD)",
        "nand_channels": "fitted (with dies per channel: total dies = random-read parallelism)",
        "nand_dies_per_channel": "fitted",
        "nand_page_size": "chosen so the dies do not cap sequential reads below the measured bandwidth",
        "nand_read_latency": "fitted effective tR (QD1 latency minus the fixed path, split with the FTL latency)",
        "nand_channel_rate": "fitted to the measured 1 MiB sequential read bandwidth",
        "write_buffer_bytes": "2 pages per die (NVMeVirt rule), at least the base profile's",
    }
    values = {
        "ssd_command_latency": f"{fitted.ssd_command_latency:.0f}ns",
        "nand_channels": fitted.nand_channels,
        "nand_dies_per_channel": fitted.nand_dies_per_channel,
        "nand_page_size": fitted.nand_page_size,
        "nand_read_latency": f"{fitted.nand_read_latency:.0f}ns",
        "nand_channel_rate": f"{fitted.nand_channel_rate / 1e6:.6g}MB/s",
        "write_buffer_bytes": fitted.write_buffer_bytes,
    }
    lines = [
        "# cxlhm timing fragment: NAND parameters measured and fitted by `cxlhm calibrate`.",
        f"# Measured {measured.when} on {measured.machine}",
        f"# by: {command}",
        f"# Region: {format_size(measured.size)} of {measured.path}, {measured.runtime_s:g} s per point.",
        f"# Measured -> model: {headline}; 1 MiB seq read QD{cal.SEQ_QD} "
        f"{measured.seq_read_bw / 1e9:.3f} -> {model.seq_read_bw / 1e9:.3f} GB/s.",
        f"# Keys not listed (link, DRAM, controller, tPROG) come from {base}; use this file as a user config"
        " (--device FRAGMENT.yaml) or paste the timing keys into a profile.",
    ]
    if is_profile:
        lines.append(f"profile: {base}")
    lines.append("timing:")
    for key, value in values.items():
        lines.append(f"  {key}: {yaml.safe_dump(value).strip().removesuffix('...').strip()}  # {why[key]}")
    return "\n".join(lines) + "\n"
