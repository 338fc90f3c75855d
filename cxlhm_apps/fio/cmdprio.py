"""fio's command priorities on libaio, io_uring and the device engine (cxlhm):
`cmdprio_percentage`, `cmdprio_class`, `cmdprio`, `cmdprio_bssplit`, with the job's default
priority `prioclass` / `prio`.

An I/O priority (Linux ioprio) is a class (1 realtime, 2 best effort, 3 idle) and a level
(0-7), one 16-bit value `class << 13 | level`. As fio's engines/cmdprio.c:
- cmdprio_percentage=P (per direction, "r,w"): each I/O draws 0-99; below P it carries
  ioprio(cmdprio_class, cmdprio) (class defaults to 1, realtime; level to 0);
- cmdprio_bssplit=BS/PCT[/CLASS/LEVEL]:... (per direction): an I/O of block size BS draws
  0-99 and takes the entry whose running sum of percentages of that size first exceeds
  the draw; an entry without CLASS/LEVEL takes cmdprio_class/cmdprio;
- any other I/O carries the job's default priority, ioprio(prioclass, prio) (0: none).

Completion latencies are kept per priority: the job's default first, then each distinct
priority of the direction's entries in the order given (fio's clat_prio index). Each I/O
is tagged with `index << 16 | ioprio` so the statistics keep fio's order (stats.py).
The draw uses the job's own seeded generator, not fio's: the same share of I/Os, not the
same ones.

libaio hands each I/O's priority to the kernel and the file engines run the job's thread
at prioclass/prio; ioengine=cxlhm keeps the tags for the statistics and logs only, as a
file whose device has no priority scheduling: the device model serves every I/O alike
(`device_notes` says so in the run's output).
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from cxlhm_apps.fio import values as V
from cxlhm_apps.fio.options import Option

IOPRIO_CLASS_SHIFT = 13
PRIO_INDEX_SHIFT = 16  # a tag's bits above the ioprio: its index in the direction's priority list
DEFAULT_CLASS = 1  # fio's cmdprio_class default: realtime


def ioprio_value(klass: int, level: int) -> int:
    return (klass << IOPRIO_CLASS_SHIFT) | level


def _pair(lo: int, hi: int, what: str):
    """A per-direction integer ("r,w"; one value is both) within lo..hi."""
    def parse(text: str, kb_base: int) -> tuple[int | None, int | None]:
        out = []
        for part in V.split_directions(text)[:2]:
            if part is None:
                out.append(None)
                continue
            n = V.parse_int(part)
            if not lo <= n <= hi:
                raise ValueError(f"{what} must be from {lo} to {hi}, got {part!r}")
            out.append(n)
        return out[0], out[1]
    return parse


BsEntry = tuple[int, int, int | None]  # block size, percentage, ioprio (None: cmdprio_class/cmdprio)


def _bssplit_dir(text: str, kb_base: int) -> tuple[BsEntry, ...]:
    entries = []
    for item in text.split(":"):
        fields = [f.strip() for f in item.split("/")]
        if len(fields) == 5:  # a priority hint (a Command Duration Limits descriptor): reaches only a drive
            hint = V.parse_int(fields[4]) if fields[4] else -1  # with CDL on; fio 3.33 reports by class and
            if not 0 <= hint <= 1023:                            # level alone, and so do the stats here
                raise ValueError(f"{item!r}: the priority hint must be from 0 to 1023")
            fields = fields[:4]
        if len(fields) not in (2, 4) or not all(fields):
            raise ValueError(f"{item!r}: expected BS/PERCENT, BS/PERCENT/CLASS/LEVEL or BS/PERCENT/CLASS/LEVEL/HINT")
        bs = V.parse_size(fields[0], kb_base=kb_base)
        pct = V.parse_int(fields[1])
        if bs <= 0 or not 0 <= pct <= 100:
            raise ValueError(f"{item!r}: the block size must be positive and the percentage 0-100")
        prio = None
        if len(fields) == 4:
            klass, level = V.parse_int(fields[2]), V.parse_int(fields[3])
            if not 1 <= klass <= 3 or not 0 <= level <= 7:
                raise ValueError(f"{item!r}: the class must be 1-3 and the level 0-7")
            prio = ioprio_value(klass, level)
        entries.append((bs, pct, prio))
    for bs in {e[0] for e in entries}:
        total = sum(e[1] for e in entries if e[0] == bs)
        if total > 100:
            raise ValueError(f"the percentages for block size {bs} add up to {total}, more than 100")
    return tuple(entries)


def parse_cmdprio_bssplit(text: str, kb_base: int):
    out = []
    for part in V.split_directions(text)[:2]:
        out.append(None if part is None else _bssplit_dir(part, kb_base))
    return out[0], out[1]


# the job's default priority: an option of every file engine (fio sets it on the job's thread)
PRIO_OPTIONS = (
    Option("prioclass", "int", lambda t, kb: _range(t, 0, 3, "prioclass"), None,
           "the job's I/O priority class (0 none, 1 realtime, 2 best effort, 3 idle), set on its thread "
           "(ioprio_set; ioengine=cxlhm: in the per-priority statistics only)", group="engine"),
    Option("prio", "int", lambda t, kb: _range(t, 0, 7, "prio"), None,
           "the job's I/O priority level (0-7), set on its thread (ioprio_set; ioengine=cxlhm: in the "
           "per-priority statistics only)", group="engine"),
)

OPTIONS = (
    Option("cmdprio_percentage", "int", _pair(0, 100, "a percentage"), (None, None),
           "ioengine=libaio/io_uring/cxlhm: share of I/Os (per direction) issued with priority cmdprio_class/cmdprio",
           group="engine"),
    Option("cmdprio_class", "int", _pair(1, 3, "an I/O priority class"), (None, None),
           "ioengine=libaio/io_uring/cxlhm: class of the prioritised I/Os (1 realtime, 2 best effort, 3 idle)",
           group="engine"),
    Option("cmdprio", "int", _pair(0, 7, "an I/O priority level"), (None, None),
           "ioengine=libaio/io_uring/cxlhm: level (0-7) of the prioritised I/Os", group="engine"),
    Option("cmdprio_bssplit", "str", parse_cmdprio_bssplit, (None, None),
           "ioengine=libaio/io_uring/cxlhm: priority share per block size, BS/PCT[/CLASS/LEVEL[/HINT]]:... (a hint, "
           "for drives with Command Duration Limits, is accepted and not sent)", group="engine"),
)


def _range(text: str, lo: int, hi: int, what: str) -> int:
    n = V.parse_int(text)
    if not lo <= n <= hi:
        raise ValueError(f"{what} must be from {lo} to {hi}, got {text!r}")
    return n


@dataclasses.dataclass
class _Dir:
    prios: list[int]  # index -> ioprio; index 0 is the job's default
    percent: int = 0  # percentage mode: the share, tagged with prios[1]
    by_bs: dict[int, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)  # bs -> [(cum pct, index)]


class CmdPrio:
    """Which priority each I/O of a job carries (see the module doc)."""

    def __init__(self, values, seed: int):
        get = lambda name: values.get(name) or (None, None)  # noqa: E731
        pct, classes, levels, split = get("cmdprio_percentage"), get("cmdprio_class"), get("cmdprio"), \
            get("cmdprio_bssplit")
        if any(p is not None for p in pct) and any(s is not None for s in split):
            raise ValueError("cmdprio_percentage and cmdprio_bssplit are exclusive (as in fio)")
        self.default = job_ioprio(values)
        self.active = any(p for p in pct if p) or any(s is not None for s in split)
        self._rng = np.random.default_rng(seed)
        self._dirs = []
        for d in (0, 1):
            prios = [self.default]
            implicit = ioprio_value(classes[d] or DEFAULT_CLASS, levels[d] or 0)

            def index(p: int) -> int:
                if p not in prios:
                    prios.append(p)
                return prios.index(p)
            dir_ = _Dir(prios)
            if pct[d]:
                dir_.percent = pct[d]
                index(implicit)
            for bs, share, prio in split[d] or ():
                cum = dir_.by_bs.setdefault(bs, [])
                cum.append(((cum[-1][0] if cum else 0) + share, index(implicit if prio is None else prio)))
            self._dirs.append(dir_)

    def tags(self, direction: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Per I/O: `index << 16 | ioprio` (index 0: the job's default priority)."""
        n = direction.shape[0]
        draw = self._rng.integers(0, 100, n)
        index = np.zeros(n, np.int64)
        for d, dir_ in enumerate(self._dirs):
            mine = direction == d
            if dir_.percent:
                index[mine & (draw < dir_.percent)] = 1
            for bs, cum in dir_.by_bs.items():
                this = mine & (size == bs)
                lower = 0
                for upper, i in cum:
                    index[this & (draw >= lower) & (draw < upper)] = i
                    lower = upper
        prio_of = np.zeros((2, max(len(d.prios) for d in self._dirs)), np.int64)
        for d, dir_ in enumerate(self._dirs):
            prio_of[d, :len(dir_.prios)] = dir_.prios
        return (index << PRIO_INDEX_SHIFT) | prio_of[direction.astype(np.int64), index]


def cmdprio_for(values, clone: int) -> CmdPrio | None:
    """The job's priorities, or None when it sets none."""
    prio = CmdPrio(values, seed=(int(values.get("randseed") or 0x89) * 1000003 + clone) & 0xFFFFFFFF)
    return prio if prio.active or prio.default else None


def job_cmdprio(job) -> CmdPrio | None:
    """For an engine's opener (an ioengine.EngineJob): the clone's priorities, None when
    the job sets none; a combination fio refuses is the job file's error."""
    try:
        return cmdprio_for(job.options, job.clone)
    except ValueError as exc:
        raise job.error("cmdprio_bssplit", str(exc)) from None


PRIORITY_NAMES = tuple(opt.name for opt in PRIO_OPTIONS + OPTIONS)


def device_note(job) -> str | None:
    """What the run says of a device job (ioengine=cxlhm, a jobfile.JobSpec) that sets
    priorities: they are counted, not applied (None: it sets none)."""
    given = [name for name in PRIORITY_NAMES if name in job.given]
    if not given:
        return None
    path, line = job.where(given[0])
    return (f"note: {path}:{line}: job {job.name!r}: {'/'.join(given)}: each I/O's priority is kept in the "
            "per-priority statistics and logs, but the device model does not order I/Os by priority (as a file "
            "whose device has no priority scheduling)")


# ioprio_set(2) / ioprio_get(2) have no libc wrapper: their system call numbers
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}
IOPRIO_WHO_PROCESS = 1


def job_ioprio(values) -> int:
    """The job's default priority, ioprio(prioclass, prio) (0: none given)."""
    klass, level = values.get("prioclass"), values.get("prio")
    return ioprio_value(klass or 0, level or 0) if (klass or level) else 0


def set_thread_ioprio(ioprio: int) -> None:
    """Give the calling thread the I/O priority, as fio does on a job's thread with
    prioclass/prio (who=0: the calling task). OSError when the kernel refuses it."""
    import ctypes
    import os
    number = _IOPRIO_SET.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"ioprio_set's system call number is not known for {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, IOPRIO_WHO_PROCESS, 0, ioprio) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"ioprio_set({ioprio:#06x}): {os.strerror(err)}")


def thread_ioprio() -> int:
    """The calling thread's I/O priority (ioprio_get; -1 where it cannot be read)."""
    import ctypes
    import os
    number = _IOPRIO_GET.get(os.uname().machine)
    return -1 if number is None else ctypes.CDLL(None).syscall(number, IOPRIO_WHO_PROCESS, 0)


@contextlib.contextmanager
def job_priority(ioprio: int):
    """The calling thread at `ioprio` while the block runs (the job's I/O), then back to
    what it had: runner threads outlive a job."""
    if not ioprio:
        yield
        return
    before = thread_ioprio()
    set_thread_ioprio(ioprio)
    try:
        yield
    finally:
        if before >= 0:
            set_thread_ioprio(before)


def ioprio_of(tags: np.ndarray) -> np.ndarray:
    """The priority values (class << 13 | level) of I/O tags."""
    return tags & ((1 << PRIO_INDEX_SHIFT) - 1)


def split_tag(tag: int) -> tuple[int, int, int]:
    """(index, class, level) of a tag."""
    ioprio = tag & ((1 << PRIO_INDEX_SHIFT) - 1)
    return tag >> PRIO_INDEX_SHIFT, ioprio >> IOPRIO_CLASS_SHIFT, ioprio & 7
