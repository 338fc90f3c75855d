"""fio job files: INI text -> validated JobSpecs.

Syntax handled (fio's): ``[global]`` and ``[job]`` sections, where a global section
applies to the jobs *below* it in the same file; ``;`` and ``#`` comment lines (and
trailing comments after whitespace); ``include FILE`` (relative to the including
file, no sections inside); ``${VAR}`` environment expansion and fio's ``$pagesize``,
``$mb_memory`` and ``$ncpus`` keywords in values; bare flags (``time_based``).

Every problem is a JobFileError naming file, line and option. Nothing is silently
ignored: an option that is not in the table (options.py) is an error. A file's
problems are gathered and raised together (JobFileErrors): one run lists every
option that has to change, not just the first.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import stat
from pathlib import Path
from typing import Any

from cxlhm_apps.fio import clocks, files, sprandom, steadystate
from cxlhm_apps.fio import options as O

MAX_INCLUDE_DEPTH = 16
_ENV_RE = re.compile(r"\$\{([^}]*)\}")
_KEY_RE = re.compile(r"^[A-Za-z0-9_]+$")


class JobFileError(ValueError):
    """A job file is wrong. str() reads ``FILE:LINE: option 'X': what is wrong``."""

    def __init__(self, path: str, line: int, option: str | None, message: str):
        self.path, self.line, self.option, self.message = path, line, option, message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: option {option!r}: {message}" if option else f"{where}: {message}")


class JobFileErrors(JobFileError):
    """Several problems, one line each; path/line/option are the first one's."""

    def __init__(self, errors: list[JobFileError]):
        first = errors[0]
        self.errors = errors
        self.path, self.line, self.option, self.message = first.path, first.line, first.option, first.message
        ValueError.__init__(self, "\n".join(str(e) for e in errors) + f"\n({len(errors)} problems, every one listed)")


class _Collector:
    """Gathers JobFileErrors (once each: a bad global is met by every job below it)."""

    def __init__(self):
        self.errors: list[JobFileError] = []
        self._seen: set[str] = set()

    def add(self, exc: JobFileError) -> None:
        for one in getattr(exc, "errors", None) or [exc]:
            if str(one) not in self._seen:
                self._seen.add(str(one))
                self.errors.append(one)

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise JobFileErrors(self.errors)


@dataclasses.dataclass(frozen=True)
class RawOption:
    """One ``key=value`` line as written (value after ${ENV} expansion; None for a bare flag)."""
    key: str  # as written
    text: str | None
    path: str
    line: int

    @property
    def option(self) -> O.Option | None:
        return O.lookup(self.key)

    @property
    def canonical(self) -> str:
        return self.option.name

    def as_written(self) -> str:
        return self.key if self.text is None else f"{self.key}={self.text}"


@dataclasses.dataclass
class Section:
    name: str
    path: str
    line: int
    options: list[RawOption]

    @property
    def is_global(self) -> bool:
        return self.name == "global"


@dataclasses.dataclass
class JobSpec:
    """One job of the file, with every option parsed (defaults filled in)."""
    name: str
    index: int
    path: str  # where its section starts, for errors found later
    line: int
    values: dict[str, Any]
    given: dict[str, RawOption]  # effective options as written: globals above + the job's own
    job_options: list[RawOption]  # written in the job's own section (fio's "job options")

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def where(self, name: str | None = None) -> tuple[str, int]:
        raw = self.given.get(name) if name else None
        return (raw.path, raw.line) if raw else (self.path, self.line)

    def error(self, name: str | None, message: str) -> JobFileError:
        path, line = self.where(name)
        raw = self.given.get(name) if name else None
        return JobFileError(path, line, raw.key if raw else name, message)

    def option_text(self, name: str) -> str | None:
        raw = self.given.get(name)
        if raw is None:
            return None
        return "1" if raw.text is None else raw.text


# ---------------------------------------------------------------- reading text

def _expand(value: str) -> str:
    value = _ENV_RE.sub(lambda m: os.environ.get(m.group(1), ""), value)
    if "$" in value:
        keywords = {"$pagesize": str(os.sysconf("SC_PAGE_SIZE")), "$ncpus": str(os.cpu_count() or 1),
                    "$mb_memory": str(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20)}
        for word, replacement in keywords.items():
            value = value.replace(word, replacement)
    return value


def _strip_comment(line: str) -> str:
    for i, ch in enumerate(line):
        if ch in ";#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


MAX_JOB_FILE_BYTES = 16 << 20  # a job file is text a person wrote; far larger input is a mistake


def _read_text(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise JobFileError(str(path), 0, None, "is not a regular file; a job file is a text file")
            data = f.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as exc:
        raise JobFileError(str(path), 0, None, f"cannot read: {exc.strerror}") from None
    return _decode(data, str(path))


def _decode(data: bytes, where: str) -> str:
    if len(data) > MAX_JOB_FILE_BYTES:
        raise JobFileError(where, 0, None, f"is larger than {MAX_JOB_FILE_BYTES >> 20} MiB; is it a job file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobFileError(where, data[:exc.start].count(b"\n") + 1, None, "not UTF-8 text") from None


class Sections(list):
    """The sections of one job file, remembering the file (for errors about the whole file)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path


def read_sections(text: str, path: str = "<stdin>", *, _depth: int = 0, _in_section: Section | None = None,
                  _include: bool = False, problems: _Collector | None = None) -> Sections:
    """Split job-file text into sections of raw options. Checks syntax and option names;
    values are checked by build_jobs (they depend on kb_base and the job's other options).
    Problems with single option lines go to `problems` (default: raised together at the
    end); a broken structure (section header, include) is raised at once."""
    sections = Sections(path)
    own = problems is None
    problems = _Collector() if own else problems
    current = _in_section
    base_dir = Path(path).parent if not path.startswith("<") else Path.cwd()
    for lineno, raw_line in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw_line).strip()
        if not line:
            continue
        if line.startswith("["):
            if _include:
                raise JobFileError(path, lineno, None, "an included file may not contain [sections]")
            if not line.endswith("]") or len(line) < 3:
                raise JobFileError(path, lineno, None, f"malformed section header {line!r}; expected [name]")
            name = line[1:-1].strip()
            if not name or "[" in name or "]" in name:
                raise JobFileError(path, lineno, None, f"malformed section header {line!r}; expected [name]")
            current = Section(name, path, lineno, [])
            sections.append(current)
            continue
        if line.startswith("include ") or line.startswith("include\t") or line == "include":
            target = _expand(line[len("include"):].strip())
            if not target:
                raise JobFileError(path, lineno, None, "include needs a file name")
            if current is None:
                raise JobFileError(path, lineno, None, "include outside of a section")
            if _depth >= MAX_INCLUDE_DEPTH:
                raise JobFileError(path, lineno, None, f"includes nested deeper than {MAX_INCLUDE_DEPTH} (a cycle?)")
            inc_path = Path(target) if Path(target).is_absolute() else base_dir / target
            try:
                found, regular = inc_path.exists(), inc_path.is_file()
            except (OSError, ValueError) as exc:  # a name too long for the file system, a NUL byte
                raise JobFileError(path, lineno, None, f"include: cannot use {str(inc_path)[:120]!r}: "
                                   f"{getattr(exc, 'strerror', None) or exc}") from None
            if not found:
                raise JobFileError(path, lineno, None, f"include: no such file {str(inc_path)!r}")
            if not regular:
                raise JobFileError(path, lineno, None, f"include: {str(inc_path)!r} is not a regular file; "
                                                       "include takes a job file")
            read_sections(_read_text(inc_path), str(inc_path), _depth=_depth + 1, _in_section=current, _include=True,
                          problems=problems)
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not _KEY_RE.match(key):
            problems.add(JobFileError(path, lineno, None, f"cannot parse {line!r}; expected option=value"))
            continue
        if current is None:
            problems.add(JobFileError(path, lineno, key, "option outside of a section; start with [global] or [jobname]"))
            continue
        opt = O.lookup(key)
        if opt is None:
            problems.add(JobFileError(path, lineno, key, O.unknown_option_message(key)))
            continue
        if sep:
            text_value = _expand(value.strip())
        elif opt.flag:
            text_value = None
        else:
            problems.add(JobFileError(path, lineno, key, f"needs a value ({key}=...)"))
            continue
        current.options.append(RawOption(key, text_value, path, lineno))
    if own:
        problems.raise_any()
    return sections


def read_job_file(path: str, problems: _Collector | None = None) -> Sections:
    """Sections of a job file; '-' reads standard input."""
    if path == "-":
        import sys
        stream = getattr(sys.stdin, "buffer", None)  # (a text stream stands in for it in tests)
        data = stream.read(MAX_JOB_FILE_BYTES + 1) if stream else sys.stdin.read(MAX_JOB_FILE_BYTES + 1).encode()
        return read_sections(_decode(data, "<stdin>"), "<stdin>", problems=problems)
    return read_sections(_read_text(Path(path)), path, problems=problems)


# ---------------------------------------------------------------- building jobs

def _parse_value(raw: RawOption, kb_base: int) -> Any:
    opt = raw.option
    if raw.text is None:
        return True
    try:
        return opt.parse(raw.text, kb_base)
    except (ValueError, OverflowError, ArithmeticError) as exc:
        raise JobFileError(raw.path, raw.line, raw.key, str(exc)) from None


def _build_job(section: Section, globals_in_force: dict[str, RawOption], index: int,
               problems: _Collector) -> JobSpec | None:
    """The job, or None with its problems added to `problems` (every bad value, then the
    rules between options where the values themselves were good)."""
    given = dict(globals_in_force)
    for raw in section.options:
        given[raw.canonical] = raw
    kb_base = 1024
    if "kb_base" in given:
        try:
            kb_base = _parse_value(given["kb_base"], 1024)
        except JobFileError as exc:
            problems.add(exc)
    values = {opt.name: opt.default for opt in O.all_options()}
    bad: set[str] = set()
    for name, raw in given.items():
        try:
            values[name] = _parse_value(raw, kb_base)
        except JobFileError as exc:
            problems.add(exc)
            bad.add(name)
    if "buffered" in given and ("direct" not in given or _later(given["buffered"], given["direct"])):
        values["direct"] = not values["buffered"]  # fio: buffered is direct's inverse, the later one wins
    values["buffered"] = not values["direct"]
    job = JobSpec(_job_name(section, values), index, section.path, section.line, values, given, list(section.options))
    # the rules between options, where the values they involve are good (a bad one
    # stands at its default, which would make a rule's complaint misleading)
    for exc in _check_job(job):
        if not {O.lookup(exc.option).name if exc.option and O.lookup(exc.option) else exc.option} & bad:
            problems.add(exc)
    return None if bad else job


def _later(a: RawOption, b: RawOption) -> bool:
    return (a.path, a.line) > (b.path, b.line) if a.path == b.path else True


def _job_name(section: Section, values: dict[str, Any]) -> str:
    """fio's job name: name= in the job's own section, else the section's name (a name=
    in [global] names no job: fio takes each job's name from its section)."""
    own = next((raw for raw in reversed(section.options) if raw.canonical == "name"), None)
    return own.text if own is not None and own.text else section.name


def _check_job(job: JobSpec):
    """The rules between options that the job breaks, as JobFileErrors (single values
    were checked while parsing)."""
    v, given = job.values, job.given
    if "rwmixread" in given and "rwmixwrite" in given:
        if v["rwmixread"] + v["rwmixwrite"] != 100:
            later = max(("rwmixread", "rwmixwrite"), key=lambda k: (given[k].path, given[k].line))
            yield job.error(later, f"rwmixread={v['rwmixread']} and rwmixwrite={v['rwmixwrite']} do not add up to 100")
    elif "rwmixwrite" in given:
        v["rwmixread"] = 100 - v["rwmixwrite"]
    v["rwmixwrite"] = 100 - v["rwmixread"]
    if v["time_based"] and v["runtime"] is None:
        yield job.error("time_based", "time_based needs a runtime")
    if v["runtime"] is not None and v["runtime"] <= 0:
        yield job.error("runtime", "must be positive")
    from cxlhm_apps.fio.ioengine import engine_problems  # (the engines import the option table)
    yield from engine_problems(job)  # the engine's own options, by its declaration
    if v["ioengine"] == "cxlhm":
        unavailable = clocks.model_clock_unavailable()
        if v["cxlhm_clock"] == "model" and unavailable:
            yield job.error("cxlhm_clock", unavailable)
    rated = any(v["rate"]) or any(v["rate_iops"])
    if (rated or v["thinktime"] or any(v["startdelay"])) and v["ioengine"] == "cxlhm" and v["cxlhm_clock"] == "model":
        name = ("thinktime" if v["thinktime"] else "startdelay" if any(v["startdelay"])
                else ("rate" if any(v["rate"]) else "rate_iops"))
        yield job.error(name, "needs wall time (the model clock never sleeps); use cxlhm_clock=wall")
    if v["steadystate_duration"] and v["ioengine"] == "cxlhm" and v["cxlhm_clock"] == "model":
        yield job.error("steadystate_duration", "needs wall time (steady state is sampled once a wall-clock "
                                                "second); use cxlhm_clock=wall")
    if 0 < v["steadystate_duration"] < 1_000_000_000:
        yield job.error("steadystate_duration", "must be at least 1s (fio counts whole seconds), or 0 for none")
    if rated and v["rw"].reads and v["rw"].writes and v["verify"] not in ("0", "null"):
        name = "rate" if any(v["rate"]) else "rate_iops"
        yield job.error(name, "on a mixed job with verify is not modelled (fio's rate turns an I/O's "
                              "direction, which verify's stamped writes cannot follow)")
    elif rated and v["rw"].reads and v["rw"].writes:
        from cxlhm_apps.fio.pattern import size_choices  # (pattern imports the options table)
        try:
            read_sizes, write_sizes = size_choices(v)
        except ValueError:
            read_sizes = write_sizes = None  # (the block-size options report their own problem)
        if read_sizes != write_sizes:
            name = "rate" if any(v["rate"]) else "rate_iops"
            yield job.error(name, "on a mixed job whose reads and writes have different block sizes is not "
                                  "modelled (fio's rate turns an I/O's direction and draws its size again)")
    if any(v["rate_min"]) and any(v["rate_iops_min"]):  # fio: "rate and rate_iops are mutually exclusive"
        later = max(("rate_min", "rate_iops_min"), key=lambda k: (given[k].path, given[k].line))
        yield job.error(later, "rate_min and rate_iops_min are mutually exclusive (give one)")
    for low, high in (("rate_min", "rate"), ("rate_iops_min", "rate_iops")):
        for d, direction in enumerate(("read", "write")):
            if v[high][d] and v[low][d] and v[high][d] < v[low][d]:  # fio: "minimum rate exceeds rate"
                yield job.error(low, f"the {direction} minimum ({v[low][d]}) exceeds {high} ({v[high][d]})")
    if v["zonemode"] == "zbd":
        yield job.error("zonemode", "zbd needs a zoned block device (not modelled); zonemode=strided is")
    elif v["zonemode"] == "strided":
        if not v["zonesize"]:
            yield job.error("zonemode", "strided needs zonesize= (the bytes of I/O per zone)")
        if v["rw"].random or v["rw"].modifier:
            yield job.error("zonemode", "strided zones are modelled for plain sequential I/O (rw=read, write, rw); "
                                        f"got rw={v['rw'].name}" + (f":{v['rw'].modifier}" if v["rw"].modifier else ""))
    contents = [n for n in ("dedupe_percentage", "buffer_compress_percentage") if v[n]]
    if contents and v["verify"] not in ("0", "null"):
        yield job.error(contents[0], "with verify is not modelled (verify writes its own block contents)")
    if v["dedupe_percentage"] and v["dedupe_mode"] == "working_set":
        if "size" not in given:  # fio: "pregenerated dedupe working set requires size to be set"
            yield job.error("dedupe_mode", "working_set needs size= (the working set is a share of it)")
        elif v["dedupe_working_set_percentage"] + v["dedupe_percentage"] > 100:
            blame = max((n for n in ("dedupe_percentage", "dedupe_working_set_percentage") if n in given),
                        key=lambda n: (given[n].path, given[n].line))
            yield job.error(blame,
                            f"dedupe_percentage={v['dedupe_percentage']} cannot be reached with "
                            f"{v['dedupe_working_set_percentage']}% of size kept as the (unique) working set "
                            "(the two add up to more than 100)")
    if v["verify_backlog"] and v["verify"] in ("0", "null"):
        yield job.error("verify_backlog", "needs verify=crc32c|md5|xxhash")
    if v["experimental_verify"] and (v["loops"] > 1 or v["time_based"]) and v["do_verify"]:
        yield job.error("experimental_verify", "with loops > 1 or time_based is not modelled (fio's replayed "
                                               "verify takes passes of the job's own; it is modelled for one pass)")
    if v["read_iolog"]:
        def is_set(value) -> bool:
            return any(value) if isinstance(value, tuple) else value not in ("0", "null", "none", False, 0, None)
        yield from (job.error(name, "with read_iolog is not modelled (the log's I/O is replayed as it is)")
                    for name in ("verify", "sprandom", "zonemode", "rate", "rate_iops", "thinktime", "flow")
                    if name in given and is_set(v[name]))
    if 0 < v["iodepth_low"] < v["iodepth"]:
        yield job.error("iodepth_low", f"refilling the queue only once it drains to {v['iodepth_low']} is not "
                                       "modelled (each completion makes room for the next I/O, as with "
                                       f"iodepth_low={v['iodepth']}, fio's default)")
    if v["nrfiles"] > 1:
        yield job.error("nrfiles", f"several files per job are not modelled (nrfiles={v['nrfiles']}); give each "
                                   "file its own job, or one file (filename=) to the job")
    if v["pre_read"]:
        v["invalidate"] = False  # (fio: pre-read pages are what the job is meant to find)
        if v["ioengine"] == "cxlhm":
            yield job.error("pre_read", "the device has no host page cache to pre-read into (a read job before, "
                                        "with stonewall, warms its DRAM)")
        elif v["direct"]:
            yield job.error("pre_read", "with direct=1 fails in fio (its pre-read buffer is not aligned for "
                                        "O_DIRECT: err=5, pre_read); pre_read is for buffered jobs")
    if v["mem"].partition(":")[0] in ("shmhuge", "mmaphuge") and not files.huge_pages_free():
        yield job.error("mem", f"{v['mem']} needs huge pages and the system has none free (/proc/meminfo "
                               "HugePages_Free; fio's job fails with err=12); malloc, shm or mmap run the same I/O")
    for name in ("bs", "bsrange", "bssplit"):
        if name in given:
            read, write = v[name]
            if read is None and write is None:
                yield job.error(name, "gives no block size")
    yield from (job.error(name, why) for name, why in sprandom.problems(job))


def _steadystate_groups(jobs: list[JobSpec]) -> list[JobFileError]:
    """fio rejects a reporting group whose jobs' steady-state options differ (a job
    without them among jobs with them included)."""
    out, group, first = [], 0, None
    for k, job in enumerate(jobs):
        if k and (job["stonewall"] or job["new_group"]):
            group, first = group + 1, None
        dur_s = job["steadystate_duration"] // 1_000_000_000
        settings = (dur_s, job["steadystate_ramp_time"], job["steadystate"]) if dur_s else ()
        if first is None:
            first = (job, settings)
        elif settings != first[1]:
            name = next((n for n in ("steadystate", "steadystate_duration", "steadystate_ramp_time")
                         if n in job.given), "steadystate_duration")
            out.append(job.error(name, f"steady-state options must be the same for every job of a reporting "
                                       f"group (job {first[0].name!r} has others)"))
    return out + [job.error(name, why) for job, name, why in steadystate.interval_problems(jobs)]


def build_jobs(files: list[list[Section]], problems: _Collector | None = None) -> tuple[list[JobSpec], list[RawOption]]:
    """Jobs of every file, in order, and the global options as written (for the report).
    Globals apply to the jobs below them in their own file only. Every problem found is
    raised at the end, together with those already in `problems`."""
    problems = problems or _Collector()
    jobs: list[JobSpec] = []
    all_globals: dict[str, RawOption] = {}
    for sections in files:
        in_force: dict[str, RawOption] = {}
        for section in sections:
            if section.is_global:
                for raw in section.options:
                    in_force[raw.canonical] = raw
                    all_globals[raw.canonical] = raw
                    try:
                        _parse_value(raw, 1024)  # a bad global is an error even with no job below it
                    except JobFileError as exc:
                        problems.add(exc)
                continue
            job = _build_job(section, in_force, len(jobs), problems)
            if job is not None:
                jobs.append(job)
    for exc in _steadystate_groups(jobs):
        problems.add(exc)
    for k, job in enumerate(jobs):  # fio: the waitee is a job defined before the waiter
        waitee = job["wait_for"]
        if waitee and waitee not in {j.name for j in jobs[:k]}:
            problems.add(job.error("wait_for", f"no job named {waitee!r} is defined before job {job.name!r} "
                                               "(wait_for names an earlier job)"))
    problems.raise_any()
    if not jobs:
        where = getattr(files[-1], "path", "<input>") if files else "<input>"
        raise JobFileError(where, 0, None, "no jobs defined (add a [jobname] section)")
    return jobs, list(all_globals.values())


def load_jobs(paths: list[str], command_line: str = "") -> tuple[list[JobSpec], list[RawOption]]:
    """The jobs of the files, then of `command_line` (job-file text made of the command
    line's job options, cxlhm_apps/fio/cmdline.py); every problem of every file in one
    JobFileError."""
    from cxlhm_apps.fio.cmdline import SOURCE
    problems = _Collector()
    sources = [read_job_file(p, problems) for p in paths]
    if command_line:
        sources.append(read_sections(command_line, SOURCE, problems=problems))
    return build_jobs(sources, problems)
