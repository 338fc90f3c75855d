"""`cxlhm fio JOBFILE...`: fio job files against the emulated device, fio's output."""
from __future__ import annotations

import argparse
import os
import sys

NAME = "fio"
HELP = "run fio job files against the emulated device; fio's text or JSON output"
DESCRIPTION = """\
Run fio job files ([global] and job sections, fio's option syntax, fio's meaning) with
fio's own file engines (psync - fio's default -, sync, pvsync, pvsync2, mmap, posixaio,
libaio, io_uring; buffered or direct=1) or ioengine=cxlhm (the emulated CXL-HM device),
and print fio's normal report or fio's JSON. `-` reads a job file from standard input.
--compare-fio runs the same jobs through real fio (a device's image is replaced by a
file of fio's own beside it) and prints IOPS, bandwidth and latency ratios.

examples:
  cxlhm fio bench/jobs/randread-4k-qd32.fio
  cxlhm fio --output-format=json --output out.json job.fio
  echo -e "[j]\\nrw=randread\\nsize=64m\\nruntime=5" | cxlhm fio -
  cxlhm fio --cmdhelp            # every supported option
  cxlhm fio --cmdhelp iodepth
  cxlhm fio --name=etcd --rw=write --ioengine=sync --fdatasync=1 --size=22m --bs=2300

Job options on the command line are fio's: --name=NAME starts a job, the options before
the first --name apply to every job ([global]); --key=value, --key value or a bare --flag.
"""


def split_argv(words: list[str]) -> tuple[list[str], list[str]]:
    """cxlhm fio's own arguments, and the fio job options among them (cmdline.py)."""
    from cxlhm_apps.fio.cmdline import split_argv as split
    return split(words)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cxlhm_apps.fio.options import cmdhelp

    parser.epilog = "supported job options (anything else is an error):\n\n" + cmdhelp()
    parser.add_argument("jobfiles", nargs="*", metavar="JOBFILE", help="fio job file(s); - for standard input")
    parser.add_argument("--output-format", default="normal", choices=("normal", "json", "json+"),
                        help="normal: fio's text report; json / json+: fio's JSON (json+ adds latency bins)")
    parser.add_argument("--output", metavar="FILE", help="write the report to FILE instead of standard output")
    parser.add_argument("--compare-fio", action="store_true",
                        help="also run the jobs through real fio (their own engines; device jobs as io_uring, O_DIRECT, never on a device's image) and print the ratios")
    parser.add_argument("--cmdhelp", nargs="?", const="", metavar="OPTION",
                        help="list the supported job options, or describe one")
    parser.add_argument("--eta", choices=("auto", "always", "never"), default="auto",
                        help="progress line on stderr while running (auto: when stderr is a terminal)")
    parser.add_argument("--eta-newline", metavar="TIME",
                        help="fio's: a new progress line every TIME; taken so fio's command lines run, the progress "
                             "line is cxlhm's own (redrawn in place, --eta says when)")
    parser.add_argument("--eta-interval", metavar="TIME", help="fio's: how often the progress updates; taken as --eta-newline")
    parser.add_argument("--readonly", action="store_true",
                        help="as fio's: refuse to run a job that writes (a safety check against writing to a device)")


def run(args: argparse.Namespace) -> int:
    from cxlhm_apps.fio import cmdline, compare, report
    from cxlhm_apps.fio.jobfile import JobFileError, load_jobs
    from cxlhm_apps.fio.options import cmdhelp
    from cxlhm_apps.fio.runner import run_jobs

    if args.cmdhelp is not None:
        try:
            print(cmdhelp(args.cmdhelp or None), end="")
        except KeyError:
            print(f"cxlhm fio: error: no option named {args.cmdhelp!r}; `cxlhm fio --cmdhelp` lists them", file=sys.stderr)
            return 2
        return 0
    job_words = getattr(args, "extra_words", [])
    if not args.jobfiles and not job_words:
        print("cxlhm fio: error: no job file given (use - for standard input, --name=NAME and fio's options for a "
              "job on the command line, --cmdhelp for the options)", file=sys.stderr)
        return 2
    try:
        jobs, global_options = load_jobs(args.jobfiles, cmdline.job_text(job_words) if job_words else "")
    except (JobFileError, cmdline.NoJobDefined) as exc:
        print(f"cxlhm fio: error: {exc}", file=sys.stderr)
        return 2
    writers = sorted({job.name for job in jobs if job["rw"].writes})
    if args.readonly and writers:
        print(f"cxlhm fio: error: --readonly: job(s) {', '.join(writers)} write (fio: write bit set, but "
              "fio is in read-only mode); drop --readonly or make them read", file=sys.stderr)
        return 2
    fio = None
    if args.compare_fio:
        fio = compare.fio_binary()
        if fio is None:
            print(f"cxlhm fio: error: {compare.INSTALL_HINT}", file=sys.stderr)
            return 3
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        print(f"cxlhm fio: error: --output {args.output}: its folder does not exist", file=sys.stderr)
        return 2
    progress = args.eta == "always" or (args.eta == "auto" and sys.stderr.isatty())
    try:
        result = run_jobs(jobs, progress=progress, readonly=args.readonly)
    except JobFileError as exc:
        print(f"cxlhm fio: error: {exc}", file=sys.stderr)
        return 2
    for message in result.messages:
        print(message, file=sys.stderr)
    if args.output_format == "normal":
        text = report.format_normal(result)
    else:
        text = report.format_json(result, global_options, plus=args.output_format == "json+")
    if fio is not None:
        try:
            theirs = compare.run_fio(jobs, fio)
        except (RuntimeError, ValueError, OSError) as exc:
            print(f"cxlhm fio: error: --compare-fio: {exc}", file=sys.stderr)
            return 3
        side_by_side = compare.compare_text(compare.ours_summary(result), theirs, report.VERSION)
        if args.output_format == "normal":
            text += side_by_side
        else:
            print(side_by_side, file=sys.stderr, end="")
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as exc:
            print(f"cxlhm fio: error: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 1 if result.failed else 0
