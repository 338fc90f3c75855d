"""The fio I/O-engine protocol: what an `ioengine=` of `cxlhm fio` is, and the registry
that names them.

One engine is one `IOEngineOps`, as one fio engine is one `struct ioengine_ops`:

    fio's ioengine_ops          IOEngineOps
    name, version, flags        name, version (IOENGINE_VERSION), flags (EngineFlags)
    options                     options (its own job-file options), refused (fio's options
                                of the engine that are not modelled, each with the reason)
    setup, init, open_file      open(EngineJob) -> IOEngine, once per job clone, before any
                                job starts
    prep, queue, commit,        IOEngine.execute(chunk, arena, deadline_ns, keep_read_data):
    getevents, event            the engine takes a chunk of I/Os, keeps `iodepth` in flight
                                and hands back per-I/O latencies of the prefix it ran (one
                                Python call per I/O would cost more than the I/O itself)
    close_file, cleanup         IOEngine.drain() (time of the last completion), close()
    DDIR_SYNC, DDIR_DATASYNC    IOEngine.flush(data_only), optional: what the clone wrote
                                made durable (fsync=N, end_fsync, the verify phase's start)

`cxlhm fio` parses a job, checks the engine's options against the engine's own
declaration (`engine_problems`), opens the engine per clone and drives it; everything
else (patterns, verify, pacing, reports) is the runner's. A new engine is one file with
one IOEngineOps, registered with `ENGINES.add(ops.name, ops)` or published under the
`cxlhm.fio_engines` entry-point group; `cxlhm_apps.fio.testing.IOEngineConformance`
checks it. An engine built for another protocol version is refused by the registry, its
error naming both versions.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cxlhm.registry import Registry

if TYPE_CHECKING:
    from cxlhm_apps.fio.jobfile import JobSpec
    from cxlhm_apps.fio.options import Option

# The protocol's version: raised when IOEngineOps, EngineJob, IOEngine or Completed
# change in a way an engine written for the previous one would break on.
IOENGINE_VERSION = 1


class EngineFlags(enum.Flag):
    """What the runner needs to know about an engine (fio's FIO_* engine flags)."""
    NONE = 0
    SYNC = enum.auto()  # fio's FIO_SYNCIO: one I/O at a time; a job's iodepth is capped at 1 (fio says so)
    USES_DEVICE = enum.auto()  # jobs run on a cxlhm device, one per backing file shared by the clones naming it;
    #                            the file is the device's image, no job of another engine may touch it
    MEASURES_SLAT = enum.auto()  # reports submission latency (fio's slat); otherwise slat is 0, as fio's sync engines
    DISKLESS = enum.auto()  # fio's FIO_DISKLESSIO (and FIO_FAKEIO): no file is created, opened or cached, no data
    #                         moves (a verify passes unchecked); the job needs size=


@dataclasses.dataclass
class Completed:
    """What IOEngine.execute hands back: the executed prefix of a chunk."""
    count: int
    slat: np.ndarray | None  # ns per I/O; None when the engine cannot measure it
    clat: np.ndarray  # ns per I/O
    end_ns: int
    depth: int  # I/Os in flight while these ran
    submits: np.ndarray  # fio's submit-size buckets (7 counts)
    cache: np.ndarray  # [direction][hit, miss] device-block counts (zeros: no cache)
    prio: np.ndarray | None = None  # per I/O its priority tag (cmdprio.py: index << 16 | ioprio); None: no priorities


@dataclasses.dataclass(frozen=True)
class EngineJob:
    """What an engine is opened with: one job clone (fio's thread_data and its file)."""
    name: str  # the job's name
    clone: int  # which clone of the job (0-based)
    filename: str  # the file the clone does I/O on (laid out or extended already)
    file_end: int  # bytes of the file the clone's I/O stays below
    iodepth: int
    direct: bool
    writes: bool  # whether the job writes (the file is opened read-write)
    max_bs: int  # the largest I/O in bytes (a buffer slot)
    options: Mapping[str, Any]  # every option's value, the engine's own declared ones among them
    share: Any = None  # USES_DEVICE engines: the clone's device (engines.DeviceShare: handle and clock), else None
    spec: JobSpec | None = None  # the parsed job: error() names its file and line

    def error(self, option: str | None, message: str) -> Exception:
        """A setup error about `option`, with the job file's line where there is a job."""
        if self.spec is None:
            return ValueError(f"job {self.name!r}: {option}: {message}" if option else f"job {self.name!r}: {message}")
        return self.spec.error(option, message)


class IOEngine(Protocol):
    """One clone's open engine (fio's per-thread engine data)."""
    helper_cpu: tuple[float, float]  # CPU seconds (user, system) of threads of its own, added to the job's

    def now_ns(self) -> int:
        """The job's clock (CLOCK_MONOTONIC, or the device's model time)."""

    def execute(self, chunk, arena, deadline_ns: int, *, keep_read_data: bool) -> Completed:
        """Run the chunk's I/Os (pattern.Chunk: offset, size, direction, slot arrays) on the
        buffers of `arena` (engines.IoArena) with up to `iodepth` in flight, in issue
        order, stopping once `deadline_ns` passes; what ran is a prefix of the chunk.
        Reads fill their slots when `keep_read_data` (verify reads them). An I/O error
        raises OSError with errno and the I/O's offset."""

    def drain(self) -> int:
        """No more I/O: the time the last one completes."""

    # flush(self, data_only: bool = False) -> int, optional (an engine without it cannot
    # run fsync, fdatasync or end_fsync, and starts verify without a sync): fio's
    # fio_io_sync, with no I/O in flight - an fsync (data_only: fdatasync) of the file, or
    # the device's dirty DRAM written back. Returns the time it completed; an error
    # raises OSError with its errno.

    def close(self) -> None:
        """Release what open() took (files, rings, threads)."""


@dataclasses.dataclass(frozen=True)
class IOEngineOps:
    """One fio ioengine (see the module doc for fio's fields it stands for)."""
    name: str
    version: int  # the protocol version the engine is written for: IOENGINE_VERSION
    open: Callable[[EngineJob], IOEngine]
    flags: EngineFlags = EngineFlags.NONE
    options: tuple[Option, ...] = ()  # its own job-file options (group "engine"); values in EngineJob.options
    refused: Mapping[str, str] = dataclasses.field(default_factory=dict)  # fio's options of it not modelled: why
    help: str = ""  # one line for --cmdhelp and the docs
    unavailable: Callable[[], str | None] | None = None  # why it cannot run on this machine (None: it can)

    @property
    def sync(self) -> bool:
        return bool(self.flags & EngineFlags.SYNC)

    @property
    def uses_device(self) -> bool:
        return bool(self.flags & EngineFlags.USES_DEVICE)

    @property
    def measures_slat(self) -> bool:
        return bool(self.flags & EngineFlags.MEASURES_SLAT)

    @property
    def diskless(self) -> bool:
        return bool(self.flags & EngineFlags.DISKLESS)

    @property
    def plain_file(self) -> bool:
        """Whether the job's file is an ordinary file of the host's (page cache, unlink)."""
        return not self.flags & (EngineFlags.USES_DEVICE | EngineFlags.DISKLESS)

    def why_unavailable(self) -> str | None:
        return self.unavailable() if self.unavailable is not None else None


class EngineVersionError(TypeError):
    """An engine written for another version of this protocol."""


def as_ioengine(obj) -> IOEngineOps:
    """The registry's check: an IOEngineOps of this protocol version, or why not."""
    version = getattr(obj, "version", None)
    name = getattr(obj, "name", "?")
    if version is not None and version != IOENGINE_VERSION:
        raise EngineVersionError(
            f"fio ioengine {name!r} is written for fio I/O-engine protocol version {version}; this cxlhm runs "
            f"version {IOENGINE_VERSION} (cxlhm_apps.fio.ioengine.IOENGINE_VERSION): port the engine to it")
    if not isinstance(obj, IOEngineOps):
        raise TypeError(f"expected a cxlhm_apps.fio.ioengine.IOEngineOps, got {type(obj).__name__}")
    if not obj.name or not callable(obj.open):
        raise TypeError(f"fio ioengine {name!r}: needs a name and an open(EngineJob) callable")
    from cxlhm_apps.fio.options import BY_NAME  # (the option table imports this module lazily)
    for opt in obj.options:
        if opt.name in BY_NAME:
            raise TypeError(f"fio ioengine {obj.name!r}: its option {opt.name!r} is one of the job options every "
                            "engine shares; give it a name of its own")
        if opt.name in obj.refused:
            raise TypeError(f"fio ioengine {obj.name!r}: option {opt.name!r} is both declared and refused")
    return obj


ENGINES: Registry[IOEngineOps] = Registry("fio ioengine", "cxlhm.fio_engines", check=as_ioengine, builtins={
    "cxlhm": "cxlhm_apps.fio.engines:CXLHM",
    "null": "cxlhm_apps.fio.null_engine:NULL",
    **{name: f"cxlhm_apps.fio.raw_engines:{name.upper()}" for name in (
        "psync", "sync", "pvsync", "pvsync2", "mmap", "ftruncate", "posixaio", "libaio", "io_uring")},
})


def engine_ops(name: str) -> IOEngineOps:
    """The registered engine `name` (UnknownName / BrokenEntry say why not)."""
    return ENGINES.get(name)


@functools.cache
def _entry_point_engines() -> tuple[IOEngineOps, ...]:
    """The engines installed packages publish (the set does not change while a process runs)."""
    loaded, _broken = ENGINES.load_all(list(ENGINES.entry_points()))  # a broken one says so when a job names it
    return tuple(loaded.values())


def loaded_engines() -> list[IOEngineOps]:
    """Every engine that loads: the built-ins (and those added at run time), then the
    entry points'. One that does not load is left out here: a job that names it is
    refused with the registry's reason."""
    builtins, _broken = ENGINES.load_all(ENGINES.builtin_names())
    seen = set(builtins)
    return list(builtins.values()) + [e for e in _entry_point_engines() if e.name not in seen]


def engine_options() -> dict[str, tuple[Option, tuple[str, ...]]]:
    """Every engine's own options: name -> (the option, the engines that declare it).
    Engines declaring one name must parse it alike (the first declaration parses it)."""
    out: dict[str, tuple[Option, tuple[str, ...]]] = {}
    for ops in loaded_engines():
        for opt in ops.options:
            first, owners = out.get(opt.name, (opt, ()))
            out[opt.name] = (first, owners + (ops.name,))
    return out


def refused_engine_option(key: str) -> str | None:
    """Why a name no engine accepts is refused, when an engine declares it as fio's
    option it does not model (None: no engine knows it)."""
    key = key.strip().lower()
    owners = [(ops.name, ops.refused[key]) for ops in loaded_engines() if key in ops.refused]
    if not owners:
        return None
    return "; ".join(f"fio's option of ioengine={name}, not modelled here: {why}" for name, why in owners)


def engine_problems(job: JobSpec):
    """The job's problems with its engine, from the engine's own declaration, as the job
    file's errors: an option of another engine, an option of this engine that is not
    modelled, an engine that cannot run on this machine."""
    try:
        ops = engine_ops(job["ioengine"])
    except LookupError as exc:  # (the ioengine option reported it already)
        yield job.error("ioengine", str(exc))
        return
    why = ops.why_unavailable()
    if why:
        yield job.error("ioengine", f"ioengine={ops.name} cannot run here: {why}")
    declared = {opt.name for opt in ops.options}
    for name, why in ops.refused.items():  # (fio's general options an engine does not model)
        if name in job.given and name not in engine_options():
            yield job.error(name, f"ioengine={ops.name} does not model it: {why}")
    for name, (_opt, owners) in engine_options().items():
        if name not in job.given or name in declared:
            continue
        if name in ops.refused:
            yield job.error(name, f"ioengine={ops.name} does not model it: {ops.refused[name]}")
        else:
            yield job.error(name, f"applies to ioengine={', '.join(owners)} only (this job uses ioengine={ops.name})")
