"""fio job files: INI text -> validated JobSpecs.

Syntax handled (fio's): ``[global]`` and ``[job]`` sections, where a global section
applies to the jobs *below* it in the same file; ``;`` and ``#`` comment lines (and
trailing comments after whitespace); ``include FILE`` (relative to the including
file, no sections inside); ``${VAR}`` environment expansion and fio's ``$pagesize``,
``$mb_memory`` and ``$ncpus`` keywords in values; bare flags (``time_based``).

Every problem is a JobFileError naming file, line and option. Nothing is silently
ignored: an option that is not in the table (options.py) is an error.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import stat
from pathlib import Path
from typing import Any

from cxlhm_apps.fio import clocks
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
                  _include: bool = False) -> Sections:
    """Split job-file text into sections of raw options. Checks syntax and option names;
    values are checked by build_jobs (they depend on kb_base and the job's other options)."""
    sections = Sections(path)
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
            read_sections(_read_text(inc_path), str(inc_path), _depth=_depth + 1, _in_section=current, _include=True)
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not _KEY_RE.match(key):
            raise JobFileError(path, lineno, None, f"cannot parse {line!r}; expected option=value")
        opt = O.lookup(key)
        if opt is None:
            close = difflib.get_close_matches(key.lower(), list(O.BY_NAME), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise JobFileError(path, lineno, key, f"unknown or unsupported option{hint}; `cxlhm fio --cmdhelp` lists the supported ones")
        if current is None:
            raise JobFileError(path, lineno, key, "option outside of a section; start with [global] or [jobname]")
        if sep:
            text_value = _expand(value.strip())
        elif opt.flag:
            text_value = None
        else:
            raise JobFileError(path, lineno, key, f"needs a value ({key}=...)")
        current.options.append(RawOption(key, text_value, path, lineno))
    return sections


def read_job_file(path: str) -> Sections:
    """Sections of a job file; '-' reads standard input."""
    if path == "-":
        import sys
        stream = getattr(sys.stdin, "buffer", None)  # (a text stream stands in for it in tests)
        data = stream.read(MAX_JOB_FILE_BYTES + 1) if stream else sys.stdin.read(MAX_JOB_FILE_BYTES + 1).encode()
        return read_sections(_decode(data, "<stdin>"), "<stdin>")
    return read_sections(_read_text(Path(path)), path)


# ---------------------------------------------------------------- building jobs

def _parse_value(raw: RawOption, kb_base: int) -> Any:
    opt = raw.option
    if raw.text is None:
        return True
    try:
        return opt.parse(raw.text, kb_base)
    except (ValueError, OverflowError, ArithmeticError) as exc:
        raise JobFileError(raw.path, raw.line, raw.key, str(exc)) from None


def _build_job(section: Section, globals_in_force: dict[str, RawOption], index: int) -> JobSpec:
    given = dict(globals_in_force)
    for raw in section.options:
        given[raw.canonical] = raw
    kb_base = 1024
    if "kb_base" in given:
        kb_base = _parse_value(given["kb_base"], 1024)
    values = {opt.name: opt.default for opt in O.OPTIONS}
    for name, raw in given.items():
        values[name] = _parse_value(raw, kb_base)
    job = JobSpec(values["name"] or section.name, index, section.path, section.line, values, given, list(section.options))
    _check_job(job)
    return job


def _check_job(job: JobSpec) -> None:
    """Rules between options (single values were checked while parsing)."""
    v, given = job.values, job.given
    if "rwmixread" in given and "rwmixwrite" in given:
        if v["rwmixread"] + v["rwmixwrite"] != 100:
            later = max(("rwmixread", "rwmixwrite"), key=lambda k: (given[k].path, given[k].line))
            raise job.error(later, f"rwmixread={v['rwmixread']} and rwmixwrite={v['rwmixwrite']} do not add up to 100")
    elif "rwmixwrite" in given:
        v["rwmixread"] = 100 - v["rwmixwrite"]
    v["rwmixwrite"] = 100 - v["rwmixread"]
    if v["time_based"] and v["runtime"] is None:
        raise job.error("time_based", "time_based needs a runtime")
    if v["runtime"] is not None and v["runtime"] <= 0:
        raise job.error("runtime", "must be positive")
    if not v["direct"]:
        raise job.error("direct", "only direct=1 is supported: both engines bypass the host page cache")
    if v["ioengine"] != "cxlhm":
        for name in O.DEVICE_OPTIONS:
            if name in given:
                raise job.error(name, f"applies to ioengine=cxlhm only (this job uses ioengine={v['ioengine']})")
    if v["ioengine"] == "cxlhm":
        unavailable = clocks.model_clock_unavailable()
        if v["cxlhm_clock"] == "model" and unavailable:
            raise job.error("cxlhm_clock", unavailable)
    if v["verify_backlog"] and v["verify"] in ("0", "null"):
        raise job.error("verify_backlog", "needs verify=crc32c|md5|xxhash")
    for name in ("bs", "bsrange", "bssplit"):
        if name in given:
            read, write = v[name]
            if read is None and write is None:
                raise job.error(name, "gives no block size")


def build_jobs(files: list[list[Section]]) -> tuple[list[JobSpec], list[RawOption]]:
    """Jobs of every file, in order, and the global options as written (for the report).
    Globals apply to the jobs below them in their own file only."""
    jobs: list[JobSpec] = []
    all_globals: dict[str, RawOption] = {}
    for sections in files:
        in_force: dict[str, RawOption] = {}
        for section in sections:
            if section.is_global:
                for raw in section.options:
                    in_force[raw.canonical] = raw
                    all_globals[raw.canonical] = raw
                    _parse_value(raw, 1024)  # a bad global is an error even with no job below it
                continue
            jobs.append(_build_job(section, in_force, len(jobs)))
    if not jobs:
        where = getattr(files[-1], "path", "<input>") if files else "<input>"
        raise JobFileError(where, 0, None, "no jobs defined (add a [jobname] section)")
    return jobs, list(all_globals.values())


def load_jobs(paths: list[str]) -> tuple[list[JobSpec], list[RawOption]]:
    return build_jobs([read_job_file(p) for p in paths])
