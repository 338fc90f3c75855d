"""The option table: every job-file option cxlhm-fio accepts, with its type, default
and help. The parser validates against it, `cxlhm fio --cmdhelp` prints it, and an
option that is not here is an error (never silently ignored).

Values are parsed by the option's `kind`; sizes need the job's kb_base, so every
parse function takes it. It is one file because it is one table, fio's options in fio's
groups, which the parser, `--cmdhelp` and docs/fio.md read in its order; the functions
above it are the small converters its rows name.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from cxlhm_apps.fio import values as V
from cxlhm_apps.fio.distributions import parse_distribution
from cxlhm_apps.fio.placement import parse_cpu_list as _cpu_list, parse_cpu_mask as _cpu_mask
from cxlhm_apps.fio.steadystate import DEFAULT as _SS_DEFAULT
from cxlhm_apps.fio.sprandom import parse_op as _spr_op
from cxlhm_apps.fio.steadystate import parse_steadystate
from cxlhm_apps.fio.verify_pattern import parse_buffer_pattern, verify_pattern_option

DIRECTIONS = ("read", "write", "trim")
READ, WRITE = 0, 1


# ---------------------------------------------------------------- compound values

@dataclasses.dataclass(frozen=True)
class RwMode:
    """``rw=randread:8`` -> RwMode("randread", random=True, reads=True, writes=False, modifier=8)."""
    name: str
    random: bool
    reads: bool
    writes: bool
    modifier: int = 0  # random: I/Os per new offset; sequential: bytes skipped after each I/O

    @property
    def mixed(self) -> bool:
        return self.reads and self.writes


_RW_MODES = {
    "read": (False, True, False), "write": (False, False, True),
    "randread": (True, True, False), "randwrite": (True, False, True),
    "rw": (False, True, True), "readwrite": (False, True, True), "randrw": (True, True, True),
}
MAX_RW_MODIFIER = 2**31 - 1
_UNSUPPORTED_RW = ("trim", "randtrim", "trimwrite", "randtrimwrite")


def parse_rw(text: str, kb_base: int) -> RwMode:
    mode, sep, modifier_text = text.strip().partition(":")
    mode = mode.strip().lower()
    if mode in _UNSUPPORTED_RW:
        raise ValueError(f"{mode!r} is not supported: the emulated device has no trim (supported: {', '.join(_RW_MODES)})")
    if mode not in _RW_MODES:
        raise ValueError(f"unknown I/O pattern {mode!r}; accepted: {', '.join(_RW_MODES)} (optionally with :N)")
    random, reads, writes = _RW_MODES[mode]
    modifier = 0
    if sep:
        # random patterns count I/Os per new offset; sequential ones skip a size after each I/O
        # (sequential: a negative size goes backwards, as fio's rw=read:-8k)
        backwards = not random and modifier_text.strip().startswith("-")
        if random:
            modifier = V.parse_int(modifier_text)
        else:
            modifier = V.parse_size(modifier_text.strip().lstrip("-"), kb_base=kb_base) * (-1 if backwards else 1)
        if random and modifier < 1:
            raise ValueError(f"the :N suffix must be at least 1, got {modifier_text!r}")
        if abs(modifier) > MAX_RW_MODIFIER:  # fio keeps it in a C int
            raise ValueError(f"the :N suffix must be at most {MAX_RW_MODIFIER}, got {modifier_text!r}")
    return RwMode("rw" if mode == "readwrite" else mode, random, reads, writes, modifier)


def parse_bs(text: str, kb_base: int) -> tuple[int | None, int | None]:
    """Per-direction block sizes (read, write); None keeps the default."""
    out = []
    for part in V.split_directions(text)[:2]:
        if part is None:
            out.append(None)
            continue
        n = V.parse_size(part, kb_base=kb_base)
        if n <= 0:
            raise ValueError(f"a block size must be positive, got {part!r}")
        out.append(n)
    return out[0], out[1]


def parse_bsrange(text: str, kb_base: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    out = []
    for part in V.split_directions(text.replace("/", ","))[:2]:
        if part is None:
            out.append(None)
            continue
        lo, hi = V.parse_size_range(part, kb_base=kb_base)
        if lo <= 0:
            raise ValueError(f"block sizes must be positive, got {part!r}")
        out.append((lo, hi))
    return out[0], out[1]


Split = tuple[tuple[int, float], ...]  # (block size, percent) pairs summing to 100


def _parse_one_split(text: str, kb_base: int) -> Split:
    given: list[tuple[int, float | None]] = []
    for item in text.split(":"):
        item = item.strip()
        if not item:
            raise ValueError(f"empty entry in {text!r}; expected SIZE/PERCENT:SIZE/PERCENT")
        size_text, _, pct_text = item.partition("/")
        size = V.parse_size(size_text, kb_base=kb_base)
        if size <= 0:
            raise ValueError(f"block sizes must be positive, got {size_text!r}")
        pct = V.parse_float(pct_text) if pct_text.strip() else None
        if pct is not None and not 0 <= pct <= 100:
            raise ValueError(f"a percentage must be within 0-100, got {pct_text!r}")
        given.append((size, pct))
    if len(given) > 64:
        raise ValueError("at most 64 block sizes per direction")
    fixed = sum(p for _, p in given if p is not None)
    if fixed > 100 + 1e-9:
        raise ValueError(f"percentages add up to {fixed:g}%, more than 100%")
    blanks = [i for i, (_, p) in enumerate(given) if p is None]
    if not blanks and abs(fixed - 100) > 1e-9:
        raise ValueError(f"percentages add up to {fixed:g}%, not 100% (leave one blank to take the rest)")
    share = (100.0 - fixed) / len(blanks) if blanks else 0.0  # fio fills blanks evenly
    return tuple((size, share if pct is None else pct) for size, pct in given)


def parse_bssplit(text: str, kb_base: int) -> tuple[Split | None, Split | None]:
    out = []
    for part in V.split_directions(text)[:2]:
        out.append(None if part is None else _parse_one_split(part, kb_base))
    return out[0], out[1]


def parse_float_list(text: str, kb_base: int) -> tuple[float, ...]:
    items = tuple(V.parse_float(x) for x in text.split(":") if x.strip())
    if not items or len(items) > 20 or any(not 0 < x <= 100 for x in items):
        raise ValueError(f"expected 1-20 percentiles in (0, 100] separated by ':', got {text!r}")
    return tuple(sorted(items))


# ---------------------------------------------------------------- the table

@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    kind: str  # shown in --cmdhelp
    parse: Callable[[str, int], Any]
    default: Any
    help: str
    aliases: tuple[str, ...] = ()
    flag: bool = False  # may be given without a value (means 1)
    group: str = "job"


def _choice(*choices: str) -> Callable[[str, int], str]:
    def parse(text: str, kb_base: int) -> str:
        word = text.strip()
        if word not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}; got {text!r}")
        return word
    return parse


def _ioengine(text: str, kb_base: int) -> str:
    """A registered ioengine (built-in, or an outside package's through the
    cxlhm.fio_engines entry points)."""
    from cxlhm_apps.fio.ioengine import ENGINES  # (the engines import this table's types)
    from cxlhm.registry import RegistryError
    word = text.strip()
    if word not in ENGINES:
        raise ValueError(f"must be one of {', '.join(ENGINES.names())}; got {text!r}")
    try:
        ENGINES.get(word)  # an engine that does not load (or speaks another protocol version) says why here
    except RegistryError as exc:
        raise ValueError(str(exc)) from None
    return word


def _int_at_least(lo: int, hi: int | None = None) -> Callable[[str, int], int]:
    def parse(text: str, kb_base: int) -> int:
        n = V.parse_int(text)
        if n < lo or (hi is not None and n > hi):
            raise ValueError(f"must be an integer {'from ' + str(lo) + ' to ' + str(hi) if hi is not None else '>= ' + str(lo)}, got {text!r}")
        return n
    return parse


def _power_of_two(text: str, kb_base: int) -> int:
    n = V.parse_size(text, kb_base=kb_base)
    if n < 0 or n & (n - 1):
        raise ValueError(f"must be a power of 2 (or 0: none), got {text!r}")
    return n


REPLAY_SKIPPABLE = ("read", "write", "trim", "sync")


def parse_replay_skip(text: str, kb_base: int) -> frozenset[str]:
    words = [w.strip() for w in text.strip().split(",")]
    for word in words:
        if word not in REPLAY_SKIPPABLE:
            raise ValueError(f"unknown action {word!r}; accepted: {', '.join(REPLAY_SKIPPABLE)} (comma-separated)")
    return frozenset(words)


def _size(text: str, kb_base: int) -> int:
    n = V.parse_size(text, kb_base=kb_base)
    if n < 0:
        raise ValueError(f"must not be negative, got {text!r}")
    return n


def _positive_size(text: str, kb_base: int) -> int:
    if text.strip().startswith("-"):
        raise ValueError(f"must be a positive size, got {text!r}")
    n = V.parse_size(text, kb_base=kb_base)
    if n <= 0:
        raise ValueError(f"must be a positive size, got {text!r}")
    return n


def _size_or_percent(text: str, kb_base: int):
    if text.strip().startswith("-"):
        raise ValueError(f"must not be negative, got {text!r}")
    return V.parse_size_or_percent(text, kb_base=kb_base)


def _time(text: str, kb_base: int) -> int:
    if text.strip().startswith("-"):
        raise ValueError(f"must not be negative, got {text!r}")
    return V.parse_time_ns(text)


def _verify_interval(text: str, kb_base: int) -> int:
    n = _size(text, kb_base)
    if n < 80:
        raise ValueError(f"must be at least 80 bytes (two verify headers, fio's minimum); got {text!r}")
    return n


def _bool(text: str, kb_base: int) -> bool:
    return V.parse_bool(text)


def _text(text: str, kb_base: int) -> str:
    return text


def _rate(text: str, kb_base: int) -> tuple[int | None, int | None]:
    """Per-direction bytes per second (read, write; a trim value is accepted and unused)."""
    out = []
    for part in V.split_directions(text)[:2]:
        n = None if part is None else V.parse_size(part, kb_base=kb_base)
        if n is not None and n < 0:
            raise ValueError(f"a rate must not be negative, got {part!r}")
        out.append(n)
    return out[0], out[1]


def _rate_iops(text: str, kb_base: int) -> tuple[int | None, int | None]:
    """Per-direction I/Os per second (read, write; a trim value is accepted and unused)."""
    out = []
    for part in V.split_directions(text)[:2]:
        n = None if part is None else V.parse_int(part)
        if n is not None and n < 0:
            raise ValueError(f"a rate must not be negative, got {part!r}")
        out.append(n)
    return out[0], out[1]


def _time_us(text: str, kb_base: int) -> int:
    """A time whose bare number is microseconds (fio's thinktime)."""
    if text.strip().startswith("-"):
        raise ValueError(f"must not be negative, got {text!r}")
    return V.parse_time_ns(text, default_unit="us")


def _latency_target(text: str, kb_base: int) -> int:
    """fio keeps it in whole microseconds (rounded up: 1ns is 1us), compared in ns."""
    return -(-_time_us(text, kb_base) // 1000) * 1000


def _max_latency(text: str, kb_base: int) -> tuple[int, int]:
    """fio's max_latency: read,write (one value: both), microseconds when bare, kept in ns."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 3:
        raise ValueError(f"at most read,write,trim values; got {text!r}")
    read = _time_us(parts[0], kb_base) if parts[0] else 0
    write = _time_us(parts[1], kb_base) if len(parts) > 1 and parts[1] else (read if len(parts) == 1 else 0)
    return read, write


def _latency_percentile(text: str, kb_base: int) -> float:
    pct = V.parse_float(text)
    if not 0.0 < pct <= 100.0:
        raise ValueError(f"must be above 0 and at most 100, got {text!r}")
    return pct


def _start_delay(text: str, kb_base: int) -> tuple[int, int]:
    """fio's startdelay: a time (bare: seconds) or a range LO-HI, each clone drawing its own."""
    lo_text, sep, hi_text = text.strip().partition("-")
    lo = _time(lo_text, kb_base)
    hi = _time(hi_text, kb_base) if sep else lo
    return (lo, hi) if lo <= hi else (hi, lo)


def _percentages(text: str, kb_base: int) -> tuple[int, int]:
    """Per-direction whole percentages 0-100 (read,write; a trim value is accepted and unused)."""
    out = []
    for part in V.split_directions(text)[:2]:
        n = 100 if part is None else V.parse_int(part)
        if not 0 <= n <= 100:
            raise ValueError(f"a percentage must be within 0-100, got {part!r}")
        out.append(n)
    return out[0], out[1]


MEMORY_TYPES = ("malloc", "shm", "shmhuge", "mmap", "mmapshared", "mmaphuge")


def _memory_type(text: str, kb_base: int) -> str:
    """fio's mem: a type, and for the mmap ones an optional :FILE (kept in the text)."""
    kind, sep, path = text.strip().partition(":")
    if kind not in MEMORY_TYPES or (sep and (not path or not kind.startswith("mmap"))):
        raise ValueError(f"must be one of {', '.join(MEMORY_TYPES)} (mmap, mmapshared and mmaphuge may take "
                         f":FILE); got {text!r}")
    return text.strip()


def _file_service(text: str, kb_base: int) -> str:
    """fio's file_service_type: a kind, :N for how many I/Os go to a file before the next,
    or for the distributions their parameter."""
    kind, sep, arg = text.strip().partition(":")
    kinds = ("random", "roundrobin", "sequential", "zipf", "pareto", "normal", "gauss")
    if kind not in kinds or (sep and not arg.strip()):
        raise ValueError(f"must be one of {', '.join(kinds)}, optionally with :N; got {text!r}")
    if sep:
        V.parse_float(arg)
    return text.strip()


def _only(accepted: tuple[str, ...], why: str) -> Callable[[str, int], str]:
    """An option of fio's that is modelled at the values that leave the job as it is
    (fio's default among them); any other value is refused with `why`."""
    def parse(text: str, kb_base: int) -> str:
        word = text.strip().lower()
        if word not in accepted:
            raise ValueError(f"{why}; accepted: {', '.join(accepted)}; got {text!r}")
        return word
    return parse


def _log_chunk(text: str, kb_base: int) -> int:
    n = _size(text, kb_base)
    if not 1024 <= n <= 512 << 20:  # (fio's range for it)
        raise ValueError(f"must be from 1024 to 512m bytes, got {text!r}")
    return n


def _kb_base(text: str, kb_base: int) -> int:
    n = V.parse_int(text)
    if n not in (1000, 1024):
        raise ValueError(f"must be 1000 or 1024, got {text!r}")
    return n


def _distribution(text: str, kb_base: int):
    return parse_distribution(text, kb_base=kb_base)


OPTIONS: tuple[Option, ...] = (
    # description
    Option("name", "str", _text, None, "job name (defaults to the section name)", group="description"),
    Option("description", "str", _text, "", "free text shown in the report", group="description"),
    # target
    Option("ioengine", "str", _ioengine, "psync",
           "psync (fio's default), sync, pvsync, pvsync2, mmap, ftruncate, posixaio, libaio, io_uring: fio's engines on a plain "
           "file; cxlhm: the emulated device (driver API)",
           group="target"),
    Option("filename", "str", _text, None,
           "file to do I/O on; for ioengine=cxlhm the device's backing SSD image. Default: "
           "DIRECTORY/JOBNAME.CLONE.0 (filename_format)",
           group="target"),
    Option("directory", "str", _text, None, "folder of the job's files (with filename: a relative name is in it)",
           group="target"),
    Option("filename_format", "str", _text, "$jobname.$jobnum.$filenum",
           "name of a job's file when filename is not given: $jobname, $jobnum (clone), $filenum, $clientuid",
           group="target"),
    Option("filesize", "int", _positive_size, None, "size of the job's file (default: size); I/O stays within it",
           group="target"),
    Option("direct", "bool", _bool, False,
           "O_DIRECT I/O (bypass the host page cache); 0: buffered, as in fio. The device (ioengine=cxlhm) has no "
           "host page cache: both values run the same there",
           group="target"),
    Option("buffered", "bool", _bool, True, "the inverse of direct (the later of the two written wins)",
           group="target"),
    Option("fallocate", "str", _choice("native", "posix", "keep", "truncate", "none", "0", "1"), "native",
           "how a written file the job needs larger is allocated before it starts, as fio on Linux: native "
           "(fallocate, the default) or posix (posix_fallocate; 1) size and allocate it, keep allocates and "
           "keeps its size, truncate sizes it sparse, none (0) leaves it to the writes", group="target"),
    Option("unlink", "bool", _bool, False, "remove the job's file once the run ends (fio: when the job is done)",
           group="target"),
    Option("overwrite", "bool", _bool, False,
           "lay a written file out (write it whole) before the job, as for a job that reads, so the writes "
           "overwrite data", group="target"),
    Option("create_on_open", "bool", _bool, False,
           "fio creates the file when the job opens it; here every file is set up before any job starts "
           "(the I/O and the report are the same)", group="target"),
    Option("invalidate", "bool", _bool, True,
           "drop the page cache of the job's region of its file before the job starts, as fio does by "
           "default (buffered reads then come from the disk, not from pages a layout or an earlier job "
           "left cached); 0 keeps them. The device (ioengine=cxlhm) has no host page cache",
           group="target"),
    Option("fadvise_hint", "str", _choice("0", "1", "sequential", "random"), "1",
           "the access the kernel's page cache is told to expect (posix_fadvise; mmap: madvise): 1, the job's own "
           "(random for randread/randwrite/randrw, else sequential), sequential, random, or 0: none", group="target"),
    Option("create_fsync", "bool", _bool, True, "fsync a file after laying it out (fio's default)",
           group="target"),
    Option("create_only", "bool", _bool, False, "set the job's file up and do no I/O", group="target"),
    Option("file_append", "bool", _bool, False,
           "the job's region starts at the file's end as it is before the run (offset is added to it)",
           group="target"),
    Option("clocksource", "str", _choice("gettimeofday", "clock_gettime", "cpu"), "clock_gettime",
           "fio's clock for its time stamps; accepted, every time here is CLOCK_MONOTONIC's (a note says so "
           "for the others)", group="target"),
    Option("gtod_cpu", "int", _int_at_least(0), 0,
           "fio: a CPU that only keeps the time of day; accepted, not applied (a note says so)", group="target"),
    Option("lockmem", "int", _only(("0",), "locking memory away from the job (lockmem) is not modelled"), "0",
           "fio: lock this much memory to run as with less (only 0, none, is modelled)", group="target"),
    Option("pre_read", "bool", _bool, False,
           "read the job's region once into the page cache before it starts (buffered jobs on a file; turns "
           "invalidate off, as fio)", group="target"),
    Option("nrfiles", "int", _int_at_least(1), 1,
           "files per job: 1 (fio's default) is modelled; more are refused", aliases=("nr_files",), group="target"),
    Option("openfiles", "int", _int_at_least(1), 1, "files a job keeps open at once (one file per job here)",
           group="target"),
    Option("file_service_type", "str", _file_service, "roundrobin",
           "how a job of several files picks the next (random, roundrobin, sequential, zipf/pareto/normal/gauss:N); "
           "with one file per job every choice is that file", group="target"),
    Option("sync", "bool", _bool, False,
           "open the file O_SYNC: each write returns once it is durable (fio 3.33's sync=1)", group="target"),
    Option("fsync", "int", _int_at_least(0), 0,
           "fsync the file before the next I/O after every N writes (the device: write its dirty DRAM back); "
           "each sync's latency in the report's sync statistics (0: never)", group="target"),
    Option("fdatasync", "int", _int_at_least(0), 0,
           "as fsync, with fdatasync (metadata not synced); fsync's N wins where both fall due", group="target"),
    Option("end_fsync", "bool", _bool, False, "sync the file once when the job's I/O ends (inside its run time)",
           group="target"),
    Option("fsync_on_close", "bool", _bool, False, "sync the file as the job closes it (after its run time)",
           group="target"),
    Option("allow_file_create", "bool", _bool, True,
           "create a missing file (0: a job whose file does not exist fails, as fio's)", group="target"),
    Option("mem", "str", _memory_type, "malloc",
           "what the job's I/O buffers are allocated from: malloc, shm, mmap[:FILE], mmapshared[:FILE] (here "
           "anonymous memory, no FILE: the same I/O), shmhuge, mmaphuge[:FILE] (huge pages: refused where the "
           "system has none, where fio's job fails with err=12)", aliases=("iomem",), group="target"),
    Option("thread", "bool", _bool, False,
           "jobs as threads instead of processes; every job runs in a thread of this process either way",
           aliases=("threads",), flag=True, group="target"),
    # I/O pattern
    Option("rw", "str", parse_rw, RwMode("read", False, True, False),
           "read, write, randread, randwrite, rw/readwrite, randrw; ':N' = I/Os per new random offset, or bytes skipped after each sequential I/O",
           aliases=("readwrite",), group="pattern"),
    Option("rw_sequencer", "str", _choice("sequential", "identical"), "sequential",
           "with rw=...:N on random I/O: sequential = N sequential I/Os per random offset, identical = the same offset N times",
           group="pattern"),
    Option("rwmixread", "int", _int_at_least(0, 100), 50, "percentage of mixed I/O that is reads", group="pattern"),
    Option("rwmixwrite", "int", _int_at_least(0, 100), 50, "percentage of mixed I/O that is writes (sets rwmixread=100-N)", group="pattern"),
    Option("bs", "int[,int]", parse_bs, (4096, 4096), "block size per I/O, per direction: bs=READ,WRITE (4k)",
           aliases=("blocksize",), group="pattern"),
    Option("bsrange", "irange[,irange]", parse_bsrange, (None, None),
           "random block size within LO-HI (multiples of LO), per direction", aliases=("blocksize_range",), group="pattern"),
    Option("bssplit", "str", parse_bssplit, (None, None),
           "weighted block sizes: SIZE/PCT:SIZE/PCT[,...] per direction; blank percentages share the rest", group="pattern"),
    Option("size", "int|%", _size_or_percent, None, "region (and, without io_size, amount) of I/O per job clone", group="pattern"),
    Option("offset", "int|%", _size_or_percent, 0, "start of the region in the file", group="pattern"),
    Option("offset_increment", "int|%", _size_or_percent, 0,
           "clone N of the job starts at offset + N * offset_increment", group="pattern"),
    Option("blockalign", "int[,int]", parse_bs, (None, None),
           "alignment of random offsets, per direction (default: the smallest block size)", aliases=("ba",),
           group="pattern"),
    Option("zonemode", "str", _choice("none", "strided", "zbd"), "none",
           "strided: sequential I/O in zones of zonesize bytes, each zonerange + zoneskip after the last "
           "(wrapping at the file's end); zbd (zoned block devices) is refused", group="pattern"),
    Option("zonesize", "int", _size, 0, "zonemode=strided: bytes of I/O per zone", aliases=("zone_size",),
           group="pattern"),
    Option("zonerange", "int", _size, 0, "zonemode=strided: the zone's span (default zonesize)",
           aliases=("zone_range",), group="pattern"),
    Option("zoneskip", "int", _size, 0, "zonemode=strided: bytes skipped after each zone", aliases=("zone_skip",),
           group="pattern"),
    Option("loops", "int", _int_at_least(1), 1, "run the job's whole I/O this many times", group="pattern"),
    Option("io_size", "int", _positive_size, None, "bytes of I/O to do (may exceed size: wraps around)",
           aliases=("io_limit",), group="pattern"),
    Option("number_ios", "int", _int_at_least(1), None, "stop after this many I/Os", group="pattern"),
    Option("random_distribution", "str", _distribution, None,
           "random (uniform), zipf:THETA[:CENTER], pareto:H[:CENTER], normal:DEV%[:CENTER], zoned:PCT/SIZE%:..., zoned_abs:PCT/SIZE:...",
           group="pattern"),
    Option("randseed", "int", _int_at_least(0), 0x89, "seed for offsets, directions and block sizes", group="pattern"),
    Option("randrepeat", "bool", _bool, True, "repeatable random sequence across runs (0: seed from the clock)", group="pattern"),
    Option("io_submit_mode", "str", _choice("inline", "offload"), "inline",
           "who submits the job's I/O: inline (its own thread) or offload (fio's pool of submitting threads); "
           "accepted, and every job submits inline here (the same I/O; offload's hand-over cost is not added)",
           group="timing"),
    Option("random_generator", "str", _choice("tausworthe", "lfsr", "tausworthe64"), "tausworthe",
           "fio's generator of random offsets and block sizes: tausworthe and tausworthe64 draw fio's own "
           "sequence; lfsr is accepted, and its offsets come from cxlhm's generator (every block once per "
           "pass, as fio's LFSR gives them; the sequence is not fio's)",
           group="pattern"),
    Option("sprandom", "bool", _bool, False, "SPRandom preconditioning (rw=randwrite): sprandom.py", group="target"),
    Option("spr_op", "float", _spr_op, 0.15, "SPRandom's over-provisioning ratio, in (0, 1)", group="target"),
    Option("spr_num_regions", "int", _int_at_least(1, 1 << 24), 100, "SPRandom's number of regions", group="target"),
    Option("spr_cs", "size", _size, 0, "SPRandom's device cache size (bytes; 0: none)", group="target"),
    Option("percentage_random", "int[,int]", _percentages, (100, 100),
           "share of a random job's I/O per direction at a random offset; the rest go on from where the "
           "direction's last I/O ended (0: all sequential from the region's start); sequential rw ignores it",
           group="pattern"),
    Option("norandommap", "bool", _bool, False, "random offsets may repeat within a pass (default: every block once per pass)",
           flag=True, group="pattern"),
    Option("kb_base", "int", _kb_base, 1024, "1024: 4k = 4096 (fio's default); 1000: SI prefixes, KiB/MiB for powers of two",
           group="pattern"),
    # queueing and timing
    Option("iodepth", "int", _int_at_least(1, 4096), 1, "I/Os in flight per job clone (the device sees them as concurrent)", group="timing"),
    Option("iodepth_batch_complete_min", "int", _int_at_least(0, 4096), 1,
           "fio: wait for at least N completions at a time; accepted, completions are reaped as they come "
           "(a note says so)", aliases=("iodepth_batch_complete",), group="timing"),
    Option("iodepth_batch_complete_max", "int", _int_at_least(0, 4096), 0,
           "fio: take at most N completions at a time (0: iodepth); accepted, as iodepth_batch_complete_min",
           group="timing"),
    Option("iodepth_batch_submit", "int", _int_at_least(0, 4096), 1,
           "I/Os prepared before one submit (0: iodepth). ioengine=io_uring: SQEs per io_uring_enter, as in fio; "
           "ioengine=cxlhm: the device takes each I/O as it comes and submits its own SSD I/O one at a time",
           aliases=("iodepth_batch",), group="timing"),
    Option("serialize_overlap", "bool", _bool, False,
           "an I/O overlapping one in flight waits for it (without it two overlapping writes may land in either "
           "order and verify can fail, as in fio; the cxlhm engine always applies a job's overlapping writes in order)",
           flag=True, group="timing"),
    Option("numjobs", "int", _int_at_least(1, 1024), 1, "identical clones of this job, run concurrently", group="timing"),
    Option("cpus_allowed", "str", _cpu_list, None,
           "CPUs the job's thread runs on (0-3,6); its side thread and the device's threads are not pinned",
           group="timing"),
    Option("cpumask", "str", _cpu_mask, None, "cpus_allowed as a bit mask (0x3: CPUs 0 and 1)", group="timing"),
    Option("cpus_allowed_policy", "str", _choice("shared", "split"), "shared",
           "shared: every clone may use all of the CPUs; split: each takes one of them, in turn", group="timing"),
    Option("nice", "int", _int_at_least(-20, 19), 0, "the job thread's nice value (-20 to 19), as fio's nice",
           group="timing"),
    Option("exec_prerun", "str", _text, None,
           "a shell command before the job's I/O, its output in <job>.prerun.txt; if it fails the job does no I/O",
           group="timing"),
    Option("exec_postrun", "str", _text, None, "a shell command after the job, its output in <job>.postrun.txt",
           group="timing"),
    Option("numa_cpu_nodes", "str", _text, None,
           "NUMA nodes the job's CPUs are on: accepted, not applied (placement only; reported as not modelled)",
           group="timing"),
    Option("numa_mem_policy", "str", _text, None,
           "NUMA memory policy of the job's buffers: accepted, not applied (placement only; reported as not modelled)",
           group="timing"),
    Option("runtime", "time", _time, None, "stop after this long (seconds unless a unit is given)", aliases=("timeout",), group="timing"),
    Option("time_based", "bool", _bool, False, "run for the whole runtime, wrapping around the region", flag=True, group="timing"),
    Option("startdelay", "time[-time]", _start_delay, (0, 0),
           "start the job this long after the run began (bare: seconds); LO-HI: each clone draws its delay",
           group="timing"),
    Option("ramp_time", "time", _time, 0, "run this long before recording statistics", group="timing"),
    Option("group_reporting", "bool", _bool, False, "report each group as one job", flag=True, group="timing"),
    Option("latency_target", "time", _latency_target, 0,
           "search for the highest queue depth whose latency meets this (microseconds unless a unit is given)",
           group="timing"),
    Option("latency_window", "time", _time_us, 0, "the latency-target search's measuring window", group="timing"),
    Option("latency_percentile", "float", _latency_percentile, 100.0,
           "share of I/Os (percent, above 0, at most 100) that must meet latency_target", group="timing"),
    Option("latency_run", "bool", _bool, False, "keep searching after the depth is found (default: stop the job)",
           flag=True, group="timing"),
    Option("stonewall", "bool", _bool, False, "wait for the jobs above to finish first; starts a new reporting group",
           aliases=("wait_for_previous",), flag=True, group="timing"),
    Option("new_group", "bool", _bool, False, "start a new reporting group", flag=True, group="timing"),
    Option("flow", "int", _int_at_least(-(1 << 20), 1 << 20), 0,
           "weight in token-based flow control: jobs of one flow_id keep their I/O counts in the ratio of their "
           "weights", group="timing"),
    Option("flow_id", "int", _int_at_least(0), 0, "the flow control group of the job", group="timing"),
    Option("flow_sleep", "int", _int_at_least(0), 0, "microseconds a job ahead of its flow share waits",
           group="timing"),
    Option("thinktime", "time", _time_us, 0,
           "pause this long (bare number: microseconds) after every thinktime_blocks I/Os, with the I/O in "
           "flight completed first", group="timing"),
    Option("thinktime_spin", "time", _time_us, 0, "spin (busy) this part of thinktime, sleep the rest",
           group="timing"),
    Option("thinktime_blocks", "int", _int_at_least(1), 1, "I/Os between two think times", group="timing"),
    Option("thinktime_blocks_type", "str", _choice("complete", "issue"), "complete",
           "what thinktime_blocks counts: I/Os completed or issued (batches here complete before the next, "
           "so both count the same)", group="timing"),
    Option("thinktime_iotime", "time", _time, 0,
           "also think after this much I/O time (bare number: seconds); thinktime_blocks then counts only "
           "where given", group="timing"),
    Option("rate", "int[,int]", _rate, (None, None),
           "bandwidth cap per direction in bytes/s (rate=READ,WRITE): an I/O waits until it is due",
           group="timing"),
    Option("rate_iops", "int[,int]", _rate_iops, (None, None), "IOPS cap per direction (rate_iops=READ,WRITE)",
           group="timing"),
    Option("rate_min", "int[,int]", _rate, (None, None),
           "minimum bandwidth per direction in bytes/s (rate_min=READ,WRITE): a job below it over a rate_cycle "
           "window, after its first 2 s, fails (err=5)", aliases=("ratemin",), group="timing"),
    Option("rate_iops_min", "int[,int]", _rate_iops, (None, None),
           "minimum IOPS per direction: a job below it over a rate_cycle window, after its first 2 s, fails",
           group="timing"),
    Option("rate_cycle", "int", _int_at_least(0), 1000, "window (ms) over which rate_min / rate_iops_min are "
           "measured", aliases=("ratecycle",), group="timing"),
    Option("rate_process", "str", _choice("linear", "poisson"), "linear",
           "linear: I/Os due at even intervals; poisson: exponential gaps of the same mean", group="timing"),
    Option("steadystate", "str", parse_steadystate, _SS_DEFAULT,
           "steady-state criterion: iops, iops_slope, bw or bw_slope, ':' and a limit (N% of the mean, or an "
           "absolute IOPS / bytes per second); the job ends once met over ss_dur", aliases=("ss",),
           group="timing"),
    Option("steadystate_duration", "time", _time, 0,
           "steady-state window (whole seconds; 0: no detection); samples once a second", aliases=("ss_dur",),
           group="timing"),
    Option("steadystate_ramp_time", "time", _time, 0, "time before steady-state samples are taken (plus 1 s)",
           aliases=("ss_ramp",), group="timing"),
    Option("steadystate_check_interval", "time", _time, 1_000_000_000, "steady-state sampling interval (whole "
           "seconds, at least 1, the same for every job; ss_dur a multiple of it)", aliases=("ss_interval",),
           group="timing"),
    Option("wait_for", "str", _text, None, "start once every clone of the named (earlier) job has finished",
           group="timing"),
    Option("exitall_on_error", "bool", _bool, False, "when this job fails, end every other job", flag=True,
           group="timing"),
    Option("iodepth_low", "int", _int_at_least(0, 4096), 0,
           "fio: refill the queue once it drains to this depth; only iodepth (the default, 0 here) is modelled: "
           "each completion makes room for the next I/O", group="timing"),
    Option("continue_on_error", "str", _only(("none", "0"), "continuing past a failed I/O is not modelled (a "
                                              "failed I/O ends the job)"), "none",
           "which errors a job goes on after (only none, fio's default, is modelled)", group="timing"),
    Option("verify_async", "int", _only(("0",), "asynchronous verify threads are not modelled"), "0",
           "fio: threads that verify apart from the job's (only 0, none, is modelled)", group="verify"),
    Option("trim_percentage", "int", _only(("0",), "trim verification is not modelled (no trim)"), "0",
           "fio: share of verified blocks trimmed first (only 0 is modelled)", group="verify"),
    Option("exitall", "bool", _bool, False, "when this job finishes, end the others (exit_what says which)",
           flag=True, group="timing"),
    Option("exit_what", "str", _choice("group", "stonewall", "all"), "group",
           "with exitall: group = the jobs of its reporting group; stonewall = every running job (the next "
           "stonewall phase still runs); all = every job", group="timing"),
    # verification
    Option("verify", "str", _choice("0", "null", "crc32c", "crc32c-intel", "md5", "xxhash", "meta", "pattern"), "0",
           "checksum written blocks (header + checksum) and check them when read: crc32c, md5, xxhash; meta: the "
           "header alone; pattern: verify_pattern alone, no header (0: off)", group="verify"),
    Option("verify_pattern", "str", verify_pattern_option, None, "fill written blocks with this pattern (0x hex, decimal, "
           "\"string\", %o: the block's offset); checked by verify=meta|pattern", group="verify"),
    Option("fill_device", "bool", _bool, False, "write until the file system is full (fio's meaning); here "
           "bounded by size= / filesize=, which must fit in the free space", aliases=("fill_fs",), group="target"),
    Option("create_serialize", "bool", _bool, True, "lay files out one job after another (always so here: "
           "every file is laid out before any job starts)", group="target"),
    Option("verify_interval", "int", _verify_interval, None, "a verify header every N bytes of a block (where N "
           "divides it) instead of one per block", group="verify"),
    Option("do_verify", "bool", _bool, True, "read back and check what a write job wrote, after it finishes", group="verify"),
    Option("verify_fatal", "bool", _bool, False, "stop the job at the first verification failure", group="verify"),
    Option("verify_only", "bool", _bool, False,
           "a job that writes does not: its writes are counted as done and its verify phase checks what "
           "the same job wrote last time (fio's dry run)", group="verify"),
    Option("verify_dump", "bool", _bool, False,
           "write a failing block's bytes as read to FILE.OFFSET.received (.hdr_fail: a bad header) in the "
           "working folder (fio's names; "
           "its .expected is not: the payload here is not made again from the header's seed)", group="verify"),
    Option("experimental_verify", "bool", _bool, False,
           "fio's replayed verify (its offsets drawn again, not logged): the same blocks are read back and "
           "checked, in the history's order (one pass: not with loops > 1 or time_based)", group="verify"),
    Option("verify_backlog", "int", _int_at_least(0), 0, "verify every N written blocks as the job goes (0: at the end)", group="verify"),
    # what writes carry
    Option("dedupe_percentage", "int", _int_at_least(0, 100), 0,
           "share of written blocks that copy another block (dedupe_mode says which)", group="pattern"),
    Option("dedupe_mode", "str", _choice("repeat", "working_set"), "repeat",
           "repeat: a copy repeats the last unique block; working_set: a random page of the working set",
           group="pattern"),
    Option("dedupe_working_set_percentage", "int", _int_at_least(0, 100), 5,
           "dedupe_mode=working_set: the set is this share of size (the job's first unique blocks)", group="pattern"),
    Option("dedupe_global", "bool", _bool, False,
           "dedupe_mode=working_set: the working set is spread over every job with it (jobs copy each other's "
           "blocks)", group="pattern"),
    Option("buffer_compress_percentage", "int", _int_at_least(0, 100), 0,
           "share of each buffer_compress_chunk of a written block that is zero (the rest random)", group="pattern"),
    Option("buffer_compress_chunk", "int", _positive_size, 512, "the unit buffer_compress_percentage applies to",
           group="pattern"),
    Option("scramble_buffers", "bool", _bool, True, "write each buffer's offset and time into every 512 bytes of it", group="pattern"),
    Option("refill_buffers", "bool", _bool, False, "fresh contents in a buffer before every write", flag=True, group="pattern"),
    Option("zero_buffers", "bool", _bool, False, "buffers start all zero (then not scrambled)", flag=True, group="pattern"),
    Option("buffer_pattern", "str", parse_buffer_pattern, None, "fill write buffers with this pattern (verify_pattern's form, no %o)", group="pattern"),
    # reporting
    Option("clat_percentiles", "bool", _bool, True, "show completion-latency percentiles", group="report"),
    Option("max_latency", "str", _max_latency, (0, 0),
           "end the job with ETIMEDOUT once an I/O's total latency exceeds this (read,write; bare: us), as fio",
           group="report"),
    Option("gtod_reduce", "bool", _bool, False,
           "keep no latencies (disable_lat, disable_clat, disable_slat and disable_bw_measurement at once): "
           "the report's latencies are zeros and its latency lines go, as fio's", group="report"),
    Option("disable_lat", "bool", _bool, False, "keep no total latencies (lat)", group="report"),
    Option("disable_clat", "bool", _bool, False,
           "keep no completion latencies (clat, the latency distribution, the syncs' latencies)", group="report"),
    Option("disable_slat", "bool", _bool, False, "keep no submission latencies (slat)", group="report"),
    Option("disable_bw_measurement", "bool", _bool, False,
           "write no per-I/O bandwidth log entries (the report's bandwidth samples stay, as in fio)",
           aliases=("disable_bw",), group="report"),
    Option("lat_percentiles", "bool", _bool, False, "also show total-latency percentiles", group="report"),
    Option("slat_percentiles", "bool", _bool, False, "also show submission-latency percentiles", group="report"),
    Option("write_lat_log", "str", _text, None,
           "log every I/O's latency to NAME_lat.N.log, NAME_clat.N.log, NAME_slat.N.log (fio's format; "
           "bare: NAME is the job's name)", flag=True, group="report"),
    Option("write_bw_log", "str", _text, None, "log bandwidth to NAME_bw.N.log (fio's format; bare: the job's name)",
           flag=True, group="report"),
    Option("write_iops_log", "str", _text, None, "log IOPS to NAME_iops.N.log (fio's format; bare: the job's name)",
           flag=True, group="report"),
    Option("write_hist_log", "str", _text, None,
           "log completion-latency histograms to NAME_clat_hist.N.log every log_hist_msec (fio's format; bare: "
           "the job's name)", flag=True, group="report"),
    Option("log_hist_msec", "int", _int_at_least(0), 0,
           "write_hist_log's interval in ms (0, fio's default: the log stays empty)", group="report"),
    Option("log_hist_coarseness", "int", _int_at_least(0, 6), 0,
           "write_hist_log: sum each 2^N neighbouring bins (0: fio's 1856 bins per line)", group="report"),
    Option("log_prio", "bool", _bool, False,
           "the logs' last column is each I/O's priority value (class << 13 | level); 0: 1 for an I/O of the "
           "realtime class, else 0 (fio's default)", group="report"),
    Option("log_offset", "bool", _bool, False, "logs carry each I/O's offset (a column before the last)",
           group="report"),
    Option("write_iolog", "str", _text, None,
           "write the job's I/O to this file in fio's trace format v3 (microseconds, file, action, offset, "
           "length); appended to, as fio does", group="report"),
    Option("read_iolog", "str", _text, None,
           "replay this I/O log (fio's trace format 2 or 3, as write_iolog writes): its I/O, file, syncs and "
           "timing take the place of rw, bs, size and filename", group="replay"),
    Option("read_iolog_chunked", "bool", _bool, False,
           "fio reads the log in pieces as it replays, to save memory; here it is read whole (the same I/O)",
           group="replay"),
    Option("replay_no_stall", "bool", _bool, False,
           "replay as fast as iodepth allows, not at the log's times", group="replay"),
    Option("replay_time_scale", "int", _int_at_least(1), 100,
           "replay the log's gaps at this percentage of speed (100: as logged, 200: twice as fast)", group="replay"),
    Option("replay_redirect", "str", _text, None, "send the I/O of every file in the log to this one",
           group="replay"),
    Option("replay_scale", "int", _int_at_least(1), 1, "divide each offset in the log by this", group="replay"),
    Option("replay_align", "int", _power_of_two, 0, "round each offset in the log down to a multiple of this "
           "(a power of 2)", group="replay"),
    Option("replay_skip", "str", parse_replay_skip, frozenset(),
           "leave these actions of the log out: read, write, trim, sync (comma-separated)", group="replay"),
    Option("per_job_logs", "bool", _bool, True,
           "1: each clone's logs are its own (NAME_bw.N.log); 0: jobs naming NAME share NAME_bw.log, each "
           "appending its lines as it ends (a file an earlier run left grows)", group="report"),
    Option("bwavgtime", "int", _int_at_least(1), 500,
           "the window (ms) of each bandwidth sample in the report's bw statistics", group="report"),
    Option("iopsavgtime", "int", _int_at_least(1), 500,
           "the window (ms) of each IOPS sample in the report's iops statistics", group="report"),
    Option("significant_figures", "int", _int_at_least(1, 10), 4,
           "significant figures of the text report's bandwidths, IOPS and sizes (1-10); latencies keep fio's 6",
           group="report"),
    Option("unit_base", "str", _choice("0", "8", "1"), "0",
           "the text report's bandwidths (IOPS/BW line, Run status group, steadystate, eta) in bytes (0, 8) or "
           "bits (1); the bw samples line stays in bytes, as in fio 3.33", group="report"),
    Option("stats", "bool", _bool, True, "0: the job runs and reports nothing (zeros, and no text block), as fio",
           group="report"),
    Option("disk_util", "bool", _bool, True,
           "fio's disk utilisation statistics; accepted, none are reported here (the file's disk is the host's)",
           group="report"),
    Option("unified_rw_reporting", "str", _only(("none", "0"), "one statistic for reads and writes together "
                                                 "(mixed/both) is not modelled"), "none",
           "fio: report reads and writes as one (only none, apart, fio's default, is modelled)", group="report"),
    Option("log_compression", "int", _log_chunk, 0,
           "fio keeps its logs compressed in memory in chunks of this size; the files it writes are the same "
           "(accepted, the logs here are kept as they are)", group="report"),
    Option("log_store_compressed", "bool", _only(("0", "false", "no"), "logs stored compressed (.fz files) are not "
                                                 "modelled"), "0",
           "fio: write the logs zlib-compressed (only 0 is modelled)", group="report"),
    Option("log_avg_msec", "int", _int_at_least(0), 0,
           "average the logs over windows of this many ms (0: one line per I/O)", group="report"),
    Option("percentile_list", "float_list", parse_float_list, None, "percentiles to report, e.g. 50:99:99.9 (default: fio's 17)",
           group="report"),
    # the emulated device's options (ioengine=cxlhm only) are that engine's: engines.DEVICE_OPTIONS
)

BY_NAME: dict[str, Option] = {}
for _opt in OPTIONS:
    BY_NAME[_opt.name] = _opt
    for _alias in _opt.aliases:
        BY_NAME[_alias] = _opt

NOT_MODELLED = ("numa_cpu_nodes", "numa_mem_policy")
# fio's own name where this table's differs (fio reports an option by it in "job options")
FIO_NAME = {"blockalign": "ba", "iodepth_batch_submit": "iodepth_batch"}  # accepted, said in the run's messages
GROUP_TITLES = {"description": "Description", "target": "Target", "pattern": "I/O pattern",
                "timing": "Queueing and timing", "verify": "Data verification", "report": "Reporting",
                "replay": "Replaying an I/O log (read_iolog)",
                "engine": "Engine options (each with its own ioengine)",
                "device": "Emulated device (ioengine=cxlhm)"}


def engine_options() -> dict[str, tuple[Option, tuple[str, ...]]]:
    """Options that belong to ioengines, each declared by its engine (IOEngineOps.options):
    name -> (option, the engines that declare it)."""
    from cxlhm_apps.fio.ioengine import engine_options  # (the engines import this table's types)
    return engine_options()


def all_options() -> tuple[Option, ...]:
    return OPTIONS + tuple(opt for opt, _ in engine_options().values())


def lookup(name: str) -> Option | None:
    key = name.strip().lower()
    opt = BY_NAME.get(key)
    if opt is None and key in engine_options():
        opt = engine_options()[key][0]
    return opt


def unknown_option_message(key: str) -> str:
    """Why `key` is refused, and what would be accepted."""
    import difflib

    from cxlhm_apps.fio.fio_names import NOT_MODELLED_WHY
    from cxlhm_apps.fio.ioengine import refused_engine_option
    engine_why = refused_engine_option(key)  # fio's option of an engine, refused by the engine's own declaration
    if engine_why:
        return f"{engine_why}; remove it to run the job"
    why = NOT_MODELLED_WHY.get(key.lower())
    if why:
        return f"fio's option, not modelled here: {why}; remove it to run the job"
    names = list(BY_NAME) + list(engine_options())
    close = difflib.get_close_matches(key.lower(), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown or unsupported option{hint}; `cxlhm fio --cmdhelp` lists the supported ones"


def format_default(opt: Option) -> str:
    d = opt.default
    if d is None or d == (None, None):
        return "-"
    if isinstance(d, bool):
        return "1" if d else "0"
    if isinstance(d, RwMode):
        return d.name
    if isinstance(d, tuple):
        return ",".join(str(x) for x in d) if len(set(d)) > 1 else str(d[0])
    return str(d)


def cmdhelp(name: str | None = None) -> str:
    """The option listing (`cxlhm fio --cmdhelp [OPTION]`), generated from the table."""
    if name:
        opt = lookup(name)
        if opt is None:
            raise KeyError(name)
        aliases = f" (alias: {', '.join(opt.aliases)})" if opt.aliases else ""
        return (f"{opt.name}{aliases}\n  type: {opt.kind}\n  default: {format_default(opt)}\n  {opt.help}\n")
    lines = []
    for group, title in GROUP_TITLES.items():
        lines.append(f"{title}:")
        for opt in all_options():
            if opt.group == group:
                names = "/".join((opt.name,) + opt.aliases)
                lines.append(f"  {names:<28} {opt.kind:<16} default {format_default(opt):<10} {opt.help}")
        lines.append("")
    return "\n".join(lines)
