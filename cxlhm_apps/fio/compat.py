"""fio's own job files as acceptance corpora: each example runs as written through real
fio and through `cxlhm fio`, adapted the same way for both (file names, sizes, run
time), and the two JSON reports are compared.

Two corpora, both fio's (GPL-2.0), so neither is copied into this repository:
- examples (the default): fio's examples/ folder, the job files users start from;
- tests (--corpus tests): fio's own regression jobs, t/jobs/, each written against a
  bug fio once had (odd option mixes, replayed logs, verify corner cases), run as fio's
  t/run-fio-tests.py runs them: a `-pre` job first, in the same folder, then the job.
Each corpus is read from its variable ($FIO_EXAMPLES, $FIO_TESTS: a folder of *.fio),
else from a fio checkout ($FIO_SOURCE/examples, $FIO_SOURCE/t/jobs), else from the cache
that `--fetch` fills from fio's repository at the commit its manifest names
(compat_manifest.txt, compat_manifest_tests.txt: each file's name and SHA-256, checked
before use).

What is compared, per job in order: the name and group, the set of JSON keys (job and
direction level), which directions did I/O, the read share of a mixed job, the mean
block size per direction, the bytes per direction (where the job ends on its size, not
on its run time), the run time (where it ends on its run time), and the depth most of
the I/O ran at (iodepth_level). Speed is not compared here (bench/ does that).

Real fio is `fio` on PATH unless `--fio` names another: a path, or `built`, the fio that
`make fio-newer` (fio_build.py) builds at the manifest's commit, for which the examples
were written. The examples' ${VAR}s get the same values (EXAMPLE_ENV) on both sides.

    python -m cxlhm_apps.fio.compat [--corpus examples|tests] [--fetch | --fetch-if-missing] [--size 16m]
                                    [--runtime 2] [--markdown] [--engine cxlhm] [--fio fio|PATH|built]
                                    [EXAMPLE...]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cxlhm_apps.fio import values as V
from cxlhm_apps.fio.raw_engines import ENGINE_OPS

from cxlhm_apps.fio.compat_corpus import (CACHE, CORPORA, EXAMPLES, MANIFEST, REGRESSION_JOBS,  # noqa: F401
                                        Corpus, Manifest, check_corpus, corpus_dir, fetch, read_manifest)
MODELLED_ENGINES = set(ENGINE_OPS) | {"null"}  # fio's engines on a plain file, and its diskless null
SIZE_OPTIONS = ("size", "filesize", "io_size", "io_limit")
TIME_OPTIONS = ("runtime", "timeout")
FIO_TIMEOUT_S = 60
# keys our JSON has that fio's does not (cxlhm's device summary, verify counts)
OUR_EXTRA_KEYS = {"cxlhm_verify", "cachehit"}
# job keys fio's JSON gained after 3.33 (the layout cxlhm's follows): the job's start time
# and the latency target / window in other units; a newer fio's report has them, ours not
NEWER_FIO_KEYS = {"job_start", "latency_target_ns", "latency_window_us"}
# what the examples' ${VAR}s stand for, the same for fio and cxlhm fio: sprandom.fio's and
# the xnvme examples' own instructions (FIO_BS the drive's mapping unit, 4 KiB there)
EXAMPLE_ENV = {"FIO_BS": "4096", "FIO_RW": "randread", "FIO_IODEPTH": "1"}
BS_TOLERANCE = 0.10  # mean block size: random draws of bssplit/bsrange
MIX_TOLERANCE = 5.0  # read share of a mixed job, percentage points
RUNTIME_TOLERANCE = 0.15
BYTES_TOLERANCE = 0.005  # random block sizes: the I/Os that reach the budget are whole, fio's and ours
# A depth level within this many points of the histogram's top is as much "the depth most of
# the I/O ran at": a job that alternates between two depths (flow's sleeps) splits ~50/50.
DEPTH_TIE_POINTS = 5.0


# ---------------------------------------------------------------- adapting a file

_LINE = re.compile(r"^(\s*)([A-Za-z0-9_]+)(\s*=\s*)(.*?)(\s*)$")


@dataclasses.dataclass
class Adapted:
    text: str
    engines: set[str]
    changes: list[str]


def _strip(line: str) -> str:
    for i, ch in enumerate(line):
        if ch in ";#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def adapt(text: str, *, size_cap: int, runtime_cap_s: int, names: dict[str, str] | None = None) -> Adapted:
    """The example with its files in the run's folder (every filename/directory made a
    name there, one per distinct original), sizes capped at `size_cap` and run times at
    `runtime_cap_s`. A file that gives no size (it names a block device, whose size
    fio takes) gets size=`size_cap` in every section, and one that gives no run time
    runtime=`runtime_cap_s` (a rate-limited or looping example would run for minutes).
    Everything else as written. `names` (original -> local) is shared by the files of
    one run (a pre job and its job name the same files alike)."""
    given = {m.group(2).lower() for m in map(_LINE.match, map(_strip, text.splitlines())) if m}
    added = []
    if not given & {"size", "filesize", "io_size", "io_limit"}:
        added.append(f"size={size_cap}")
    if not given & set(TIME_OPTIONS):
        added.append(f"runtime={runtime_cap_s}s")
    names = {} if names is None else names
    engines: set[str] = set()
    changes: list[str] = []
    out = []
    for raw in text.splitlines():
        line = _strip(raw)
        if line.strip().startswith("[") and added:
            out.append(raw)
            out.extend(added)
            continue
        m = _LINE.match(line)
        if not m:
            out.append(raw)
            continue
        indent, key, eq, value, _ = m.groups()
        name = key.lower()
        new = value
        if name == "ioengine":
            engines.add(value.strip())
        elif name == "filename":
            parts = [p for p in re.split(r"(?<!\\):", value) if p]
            mapped = [names.setdefault(p, f"file{len(names)}.dat") for p in parts]
            new = ":".join(mapped)
        elif name == "directory":
            new = "."
        elif name in SIZE_OPTIONS:
            try:
                n = V.parse_size(value)
                if n > size_cap:
                    new = str(size_cap)
            except ValueError:
                pass  # a percentage or a range: as written
        elif name in TIME_OPTIONS:
            try:
                if V.parse_time_ns(value) > runtime_cap_s * 10**9:
                    new = f"{runtime_cap_s}s"
            except ValueError:
                pass
        if new != value:
            changes.append(f"{key}={value} -> {new}")
        out.append(f"{indent}{key}{eq}{new}")
    if not engines:
        engines.add("psync")  # fio's default
    changes += [f"{a} added" for a in added]
    return Adapted("\n".join(out) + "\n", engines, list(dict.fromkeys(changes)))


# ---------------------------------------------------------------- running both

@dataclasses.dataclass
class Outcome:
    ok: bool
    report: dict | None
    message: str


def _json_of(stdout: str) -> dict | None:
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        return json.loads(stdout[start:])
    except ValueError:
        return None


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess | None:
    """Run to the end, or None after FIO_TIMEOUT_S. Output goes to files (a job process
    fio forked may outlive fio and hold a pipe open). Past the time: SIGTERM first, so
    fio ends its job processes, then SIGKILL, then any process still running this run's
    job file (fio's job processes start sessions of their own)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        try:
            proc.wait(timeout=FIO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _end_stragglers(args[-1])
            return None
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(args, proc.returncode, out.read(), err.read())


def _end_stragglers(job_path: str) -> None:
    """Kill what still runs with this run's own job file (a unique temporary path) on its
    command line: fio job processes whose parent is gone."""
    import signal
    import time
    mine = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if job_path.encode() in f.read().split(b"\0"):
                    mine.append(int(pid))
        except OSError:
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(1)


def clip(text: str, limit: int) -> str:
    """`text` whole when it fits in `limit` characters, else cut at a word, with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ,;:(") + "\u2026"


def clip_lines(lines: list[str], limit: int) -> str:
    """Whole lines joined by " | " while they fit in `limit` characters (a line is never cut
    mid-word; the count of those left out closes the text)."""
    kept: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 3 > limit and kept:
            kept.append(f"and {len(lines) - len(kept)} more problems (cxlhm fio on the file lists them all)")
            break
        kept.append(clip(line, limit))
        used += len(kept[-1]) + 3
    return " | ".join(kept)


def run_fio(fio: str, job: Path, cwd: Path) -> Outcome:
    proc = _run([fio, "--output-format=json", str(job)], cwd, dict(os.environ, **EXAMPLE_ENV))
    if proc is None:
        return Outcome(False, None, f"fio did not finish in {FIO_TIMEOUT_S} s")
    report = _json_of(proc.stdout)
    if proc.returncode != 0 or report is None or any(j.get("error") for j in report.get("jobs", [])):
        text = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        reason = next((t for t in text if "error=" in t), None) or next(
            (t for t in text if "error" in t.lower() or "fio:" in t), text[-1] if text else "no output")
        return Outcome(False, report, clip(reason.strip(), 160))
    return Outcome(True, report, "")


def run_ours(job: Path, cwd: Path) -> Outcome:
    code = "import sys; from cxlhm_apps.cli import main; sys.exit(main(sys.argv[1:]))"
    env = dict(os.environ, **EXAMPLE_ENV, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2])] +
                                                      [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = _run([sys.executable, "-c", code, "fio", "--output-format=json", "--eta=never", str(job)], cwd, env)
    if proc is None:
        return Outcome(False, None, f"did not finish in {FIO_TIMEOUT_S} s")
    report = _json_of(proc.stdout)
    if proc.returncode != 0 or report is None:
        lines = [t.removeprefix("cxlhm fio: error: ") for t in proc.stderr.strip().splitlines()
                 if t.strip() and not t.startswith("note:")]
        return Outcome(False, report, clip_lines(lines, 2000) or f"exit {proc.returncode}")
    return Outcome(True, report, "")


# ---------------------------------------------------------------- comparing

def _mean_bs(d: dict) -> float | None:
    return d["io_bytes"] / d["total_ios"] if d.get("total_ios") else None


def _dominant_depth(job: dict) -> str | None:
    levels = job.get("iodepth_level") or {}
    return max(levels, key=lambda k: levels[k]) if levels and max(levels.values()) > 0 else None


def _top_depths(job: dict) -> set[str]:
    """The depth levels that hold within DEPTH_TIE_POINTS of the most I/O."""
    levels = job.get("iodepth_level") or {}
    top = max(levels.values(), default=0)
    return {k for k, v in levels.items() if v >= top - DEPTH_TIE_POINTS} if top > 0 else set()


def _time_based(job: dict) -> bool:
    return "time_based" in job.get("job options", {})


def _hit_cap(job: dict, runtime_cap_s: int) -> bool:
    """Whether the job ran into the run-time cap (it was cut short of its size)."""
    runtime_ms = max((d.get("runtime", 0) for d in (job["read"], job["write"])), default=0)
    return runtime_ms >= runtime_cap_s * 1000 * 0.9


def compare(fio: dict, ours: dict, *, runtime_cap_s: int) -> list[str]:
    """Differences between fio's report and ours on the compared fields (empty: none)."""
    diffs = []
    fj, oj = fio.get("jobs", []), ours.get("jobs", [])
    if len(fj) != len(oj):
        diffs.append(f"jobs: fio {len(fj)}, cxlhm {len(oj)}")
    if {j["groupid"] for j in fj} != {j["groupid"] for j in oj}:
        diffs.append(f"groups: fio {sorted({j['groupid'] for j in fj})}, cxlhm {sorted({j['groupid'] for j in oj})}")
    for f, o in zip(fj, oj):
        who = f["jobname"]
        if f["jobname"] != o["jobname"] or f["groupid"] != o["groupid"]:
            diffs.append(f"{who}: name/group fio {f['jobname']}/{f['groupid']}, cxlhm {o['jobname']}/{o['groupid']}")
        missing = set(f) - set(o) - NEWER_FIO_KEYS
        extra = set(o) - set(f) - OUR_EXTRA_KEYS
        for d in ("read", "write"):
            missing |= {f"{d}.{k}" for k in set(f[d]) - set(o[d])}
            extra |= {f"{d}.{k}" for k in set(o[d]) - set(f[d]) if k not in OUR_EXTRA_KEYS}
        if missing:
            diffs.append(f"{who}: keys missing {sorted(missing)}")
        if extra:
            diffs.append(f"{who}: keys fio lacks {sorted(extra)}")
        fo, oo = f.get("job options", {}), o.get("job options", {})
        # (a bare flag's empty value: fio after 3.33 writes "", 3.33 and cxlhm leave it out)
        fo = {k: v for k, v in fo.items() if v != "" or k in oo}
        if fo != oo:
            keys = sorted(k for k in set(fo) | set(oo) if fo.get(k) != oo.get(k))
            diffs.append(f"{who}: job options differ in " +
                         ", ".join(f"{k} (fio {fo.get(k)!r}, cxlhm {oo.get(k)!r})" for k in keys))
        active_f = [d for d in ("read", "write") if f[d]["total_ios"]]
        active_o = [d for d in ("read", "write") if o[d]["total_ios"]]
        if active_f != active_o:
            diffs.append(f"{who}: directions fio {active_f}, cxlhm {active_o}")
            continue
        # A job ends on its size, or on its run time (time_based, or the cap cut it short:
        # then its bytes are the machine's speed, the benches' business). Where only one
        # side was cut short, the other ended on its size, so did at least as much.
        timed = _time_based(f)
        cut = [_hit_cap(x, runtime_cap_s) for x in (f, o)]
        if len(active_f) == 2:
            share = [100.0 * x["read"]["total_ios"] / (x["read"]["total_ios"] + x["write"]["total_ios"]) for x in (f, o)]
            if abs(share[0] - share[1]) > MIX_TOLERANCE:
                diffs.append(f"{who}: read share fio {share[0]:.1f}%, cxlhm {share[1]:.1f}%")
        for d in active_f:
            bf, bo = _mean_bs(f[d]), _mean_bs(o[d])
            if abs(bf - bo) > BS_TOLERANCE * bf:
                diffs.append(f"{who}: {d} mean block fio {bf / 1024:.1f} KiB, cxlhm {bo / 1024:.1f} KiB")
        # bytes: per direction, or in all for a mixed job (its split is random draws)
        if not timed:
            for label, dirs in (((d, (d,)) for d in active_f) if len(active_f) == 1 else [("total", ("read", "write"))]):
                bf, bo = (sum(x[d]["io_bytes"] for d in dirs) for x in (f, o))
                if not any(cut):
                    if abs(bf - bo) > BYTES_TOLERANCE * bf:
                        diffs.append(f"{who}: {label} bytes fio {bf}, cxlhm {bo}")
                elif cut[0] != cut[1]:
                    whole, short = (bo, bf) if cut[0] else (bf, bo)
                    if whole < short * (1 - BYTES_TOLERANCE):
                        side = "cxlhm" if cut[0] else "fio"
                        diffs.append(f"{who}: {label} bytes fio {bf}, cxlhm {bo} "
                                     f"({side} ended on its size with less than the other did in its run time)")
        if timed:
            rf, ro = f["job_runtime"], o["job_runtime"]
            if abs(rf - ro) > RUNTIME_TOLERANCE * rf + 100:
                diffs.append(f"{who}: job_runtime fio {rf} ms, cxlhm {ro} ms")
        if _top_depths(f).isdisjoint(_top_depths(o)) and _dominant_depth(f) != _dominant_depth(o):
            diffs.append(f"{who}: I/O depth fio {_dominant_depth(f)}, cxlhm {_dominant_depth(o)}")
    return diffs


# ---------------------------------------------------------------- one example, the whole corpus

@dataclasses.dataclass
class Row:
    example: str
    status: str  # "agrees", "differs", "refused", "fio refuses", "engine not modelled"
    detail: list[str]
    adapted: list[str]


def on_engine(text: str, engine: str) -> str:
    """The job file with every job on `engine`: each ioengine= line says it, and each
    section starts with it (a job that named none would otherwise get fio's default)."""
    out = []
    for raw in text.splitlines():
        m = _LINE.match(_strip(raw))
        if m and m.group(2).lower() == "ioengine":
            out.append(f"{m.group(1)}ioengine={engine}")
            continue
        out.append(raw)
        if _strip(raw).strip().startswith("["):
            out.append(f"ioengine={engine}")
    return "\n".join(out) + "\n"


def pre_job(name: str, names) -> str | None:
    """The job t/run-fio-tests.py runs before `name` in the same folder (X-pre.fio before
    X-post.fio or X.fio), if the corpus has one."""
    stem = name.removesuffix(".fio").removesuffix("-post")
    return f"{stem}-pre.fio" if f"{stem}-pre.fio" in names and not name.endswith("-pre.fio") else None


def run_example(path: Path, fio: str, *, size_cap: int, runtime_cap_s: int, keep: Path | None = None,
                engine: str | None = None, pre: Path | None = None, companions: tuple[Path, ...] = ()) -> Row:
    """One example through real fio (as written, adapted) and through cxlhm fio (the
    same, or with every job on `engine`: then its options and I/O depth are not
    compared, the engine being another). `pre`: a job each side runs first in its
    folder (its own report only has to succeed); `companions`: files the jobs read
    (an I/O log), copied into both folders."""
    names: dict[str, str] = {}
    first = (adapt(pre.read_text(errors="replace"), size_cap=size_cap, runtime_cap_s=runtime_cap_s, names=names)
             if pre else None)
    adapted = adapt(path.read_text(errors="replace"), size_cap=size_cap, runtime_cap_s=runtime_cap_s, names=names)
    other = sorted((adapted.engines | (first.engines if first else set())) - MODELLED_ENGINES)
    if other:
        return Row(path.name, "engine not modelled", [f"ioengine={', '.join(other)}"], adapted.changes)
    with tempfile.TemporaryDirectory(prefix="cxlhm-compat-", dir=keep) as tmp:
        tmp = Path(tmp)
        steps = []  # (label, fio's job file, ours)
        for label, source, text in (("pre job", pre, first.text if first else None),
                                    ("job", path, adapted.text)):
            if source is None:
                continue
            job = tmp / source.name
            job.write_text(text)
            ours_job = job
            if engine:
                ours_job = tmp / f"on-{engine}-{source.name}"
                ours_job.write_text(on_engine(text, engine))
            steps.append((label, job, ours_job))
        for side in ("fio", "ours"):
            (tmp / side).mkdir()
            for extra in companions:
                shutil.copyfile(extra, tmp / side / extra.name)
        for label, job, ours_job in steps:
            theirs = run_fio(fio, job, tmp / "fio")
            prefix = f"{pre.name}: " if label == "pre job" else ""
            if not theirs.ok:
                return Row(path.name, "fio refuses", [prefix + theirs.message], adapted.changes)
            ours = run_ours(ours_job, tmp / "ours")
            if not ours.ok:
                return Row(path.name, "refused", [prefix + m for m in ours.message.split(" | ")], adapted.changes)
            if label == "pre job":
                share_replayed_logs(adapted.text, tmp / "fio", tmp / "ours")
    diffs = compare(theirs.report, ours.report, runtime_cap_s=runtime_cap_s)
    if engine:
        diffs = [d for d in diffs if "job options differ" not in d and "I/O depth" not in d]
    return Row(path.name, "differs" if diffs else "agrees", diffs, adapted.changes)


_READ_IOLOG = re.compile(r"^\s*read_iolog\s*=\s*(\S+)\s*$", re.MULTILINE)


def share_replayed_logs(job_text: str, fio_folder: Path, our_folder: Path) -> None:
    """The I/O logs the job replays, as fio's pre job wrote them, in our folder too: the
    replays are compared on the same I/O (each side's pre job writes as many I/Os as
    its speed allows in its run time)."""
    for name in _READ_IOLOG.findall(job_text):
        if (fio_folder / name).is_file() and not Path(name).is_absolute():
            shutil.copyfile(fio_folder / name, our_folder / name)


_PROBLEM = re.compile(r"^.*?:\d+: option '([^']+)': (.*)$")


def summarize(detail: list[str]) -> str:
    """A refusal's problems in short: the options that share a reason, then the reason
    (`zonemode, zonesize (zoned block devices are not modelled)`)."""
    by_reason: dict[str, list[str]] = {}
    for line in detail:
        m = _PROBLEM.match(line)
        if not m:
            if not line.startswith("("):
                by_reason.setdefault(line, [])
            continue
        option, reason = m.groups()
        reason = reason.removeprefix("fio's option, not modelled here: ").removesuffix("; remove it to run the job")
        names = by_reason.setdefault(reason, [])
        if option not in names:
            names.append(option)
    return "; ".join(f"{', '.join(names)} ({reason})" if names else reason for reason, names in by_reason.items())


def table(rows: list[Row], *, markdown: bool) -> str:
    order = {"agrees": 0, "differs": 1, "refused": 2, "fio refuses": 3, "engine not modelled": 4}
    rows = sorted(rows, key=lambda r: (order[r.status], r.example))
    counts = {s: sum(r.status == s for r in rows) for s in order}
    head = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if markdown:
        lines = [f"{len(rows)} examples: {head}.", "", "| example | as written | differences from fio / why |",
                 "|---|---|---|"]
        for r in rows:
            detail = summarize(r.detail) if r.status == "refused" else "; ".join(r.detail)
            lines.append(f"| {r.example} | {r.status} | {detail.replace('|', '/') or '-'} |")
        return "\n".join(lines) + "\n"
    lines = [f"{len(rows)} examples: {head}"]
    for r in rows:
        lines.append(f"{r.example:<36} {r.status}")
        for d in r.detail:
            lines.append(f"    {d}")
    return "\n".join(lines) + "\n"


def resolve_fio(choice: str, manifest: Manifest) -> str | None:
    """The fio binary `--fio` names: `built` (fio_build's, at the manifest's commit), a
    path, or a name on PATH; None when there is none."""
    if choice == "built":
        from cxlhm_apps.fio.fio_build import built
        path = built(manifest.commit)
        return str(path) if path else None
    if os.sep in choice:
        return choice if os.access(choice, os.X_OK) else None
    return shutil.which(choice)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cxlhm_apps.fio.compat", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", nargs="*", help="example file names (default: every one)")
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="examples",
                        help="examples: fio's examples/ (default); tests: fio's regression jobs, t/jobs/")
    parser.add_argument("--fetch", action="store_true", help="download fio's examples (the manifest's commit) first")
    parser.add_argument("--fetch-if-missing", action="store_true", help="download them only when none are found")
    parser.add_argument("--size", default="16m", help="cap for size/filesize/io_size (default 16m, at most 1g)")
    parser.add_argument("--runtime", type=int, default=2, help="cap for runtime in seconds (default 2, at most 5)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/fio.md)")
    parser.add_argument("--engine", help="run cxlhm's side with every job on this ioengine (e.g. cxlhm: the device)")
    parser.add_argument("--fio", default="fio", help="real fio to compare with: a path, a name on PATH (default fio), "
                        "or `built`: the one `make fio-newer` builds at the manifest's commit")
    args = parser.parse_args(argv)
    corpus = CORPORA[args.corpus]
    manifest = read_manifest(corpus.manifest)
    if args.fetch or (args.fetch_if_missing and corpus_dir(corpus) is None):
        print(f"fetched into {fetch(manifest, corpus)}", file=sys.stderr)
    folder = corpus_dir(corpus)
    if folder is None:
        print(f"no corpus: set {corpus.env} (a folder of {corpus.title}) or FIO_SOURCE (a fio checkout), "
              "or run with --fetch", file=sys.stderr)
        return 2
    problems = check_corpus(folder, manifest)
    if problems:
        print(f"{folder} is not fio {manifest.commit[:12]}'s {corpus.folder}: " + "; ".join(problems[:5]),
              file=sys.stderr)
        return 2
    fio = resolve_fio(args.fio, manifest)
    if fio is None:
        print("real fio is not installed (apt-get install fio)" if args.fio == "fio" else
              f"--fio {args.fio}: no fio there (`make fio-newer` builds the one --fio built names)", file=sys.stderr)
        return 2
    size_cap = min(V.parse_size(args.size), 1 << 30)
    runtime_cap = max(1, min(args.runtime, 5))
    every = sorted(manifest.files)
    names = args.examples or [n for n in every if n.endswith(".fio") and not any(pre_job(m, every) == n for m in every)]
    companions = tuple(folder / n for n in every if not n.endswith(".fio"))
    version = subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()
    rows = []
    for name in names:
        pre = pre_job(name, every)
        rows.append(run_example(folder / name, fio, size_cap=size_cap, runtime_cap_s=runtime_cap,
                                engine=args.engine, pre=folder / pre if pre else None, companions=companions))
        print(f"{name}: {rows[-1].status}", file=sys.stderr)
    side = f"cxlhm fio with ioengine={args.engine}" if args.engine else "cxlhm fio"
    print(f"{version} vs {side}; {corpus.title} at {manifest.commit[:12]}; sizes capped at {args.size}, "
          f"run time at {runtime_cap} s; file names made local; "
          f"{', '.join(f'{k}={v}' for k, v in EXAMPLE_ENV.items())} for the examples' ${{VAR}}s\n")
    print(table(rows, markdown=args.markdown), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
