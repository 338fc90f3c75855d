"""fio's read_iolog: a job whose I/O is replayed from an I/O log (fio's trace formats 2
and 3, as write_iolog writes the latter) instead of drawn from rw, bs and size.

What fio 3.33 does, and so what this does:
* The log's directions, offsets and lengths are the job's I/O, in the log's order, once
  (`loops` and `time_based` do not repeat it; `runtime` can cut it short).
* The files are the log's: the job's filename is not used. The I/O may name one file
  here (fio's several files per job are not modelled); replay_redirect sends it all to one.
* Timing: format 3 lines carry microseconds since the job began; fio waits the gap from
  the previous line before each one (file lines too: their gaps add to the next I/O's),
  counted from the last I/O's issue, so a replay that falls behind stays behind.
  replay_time_scale=P replays the gaps at P percent of speed, replay_no_stall without them.
  A format 2 `wait N` holds the next I/O until N ms after the run began.
* replay_scale divides each offset, replay_align rounds it down to a power of 2,
  replay_skip=read,write,trim,sync leaves those actions out.
* A line fio cannot read is skipped with fio's message, as fio does; a trim is refused
  (trim is not modelled), unless replay_skip leaves trims out.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time

import numpy as np

from cxlhm_apps.fio import syncs
from cxlhm_apps.fio.options import READ, REPLAY_SKIPPABLE, WRITE, RwMode

VERSION_2 = "fio version 2 iolog"
VERSION_3 = "fio version 3 iolog"
_IO_ACTIONS = {"read": READ, "write": WRITE}
_SYNC_ACTIONS = {"sync": syncs.FSYNC, "datasync": syncs.FDATASYNC}
_FILE_ACTIONS = ("add", "open", "close")
BATCH_HORIZON_NS = 1_000_000
_BLKTRACE_MAGIC = 0x65617400  # a blktrace record's magic (its low byte: the version)


class ReplayError(ValueError):
    """The log cannot be replayed; the message says why, and where."""


@dataclasses.dataclass
class ReplayLog:
    """A log read and shaped by the job's replay_* options, ready to replay."""
    path: str
    version: int
    file: str | None  # the file the I/O goes to (None: the log holds no I/O)
    direction: np.ndarray  # int8, READ / WRITE, per I/O in the log's order
    offset: np.ndarray  # int64 bytes
    size: np.ndarray  # int64 bytes
    gap_ns: np.ndarray  # int64: the wait before each I/O, from the previous one's issue
    not_before_ns: np.ndarray  # int64: a format 2 wait, from the run's start (0: none)
    sync_at: np.ndarray  # int64: the I/O each sync comes before (len(offset): after the last)
    sync_kind: np.ndarray  # int8: syncs.FSYNC / FDATASYNC
    skipped: list[str]  # fio's messages for the lines it skips

    @property
    def extent(self) -> int:
        """The bytes of the file the I/O reaches."""
        return int((self.offset + self.size).max()) if self.offset.shape[0] else 0

    @property
    def paced(self) -> bool:
        return bool(self.gap_ns.any() or self.not_before_ns.any())

    def rw(self) -> RwMode:
        """fio's td_ddir for the log: the directions it holds, in the log's order."""
        reads, writes = bool((self.direction == READ).any()), bool((self.direction == WRITE).any())
        name = "rw" if reads and writes else ("write" if writes else "read")
        return RwMode(name, False, reads, writes)

    def size_range(self, d: int) -> tuple[int, int] | None:
        sizes = self.size[self.direction == d]
        return (int(sizes.min()), int(sizes.max())) if sizes.shape[0] else None


def _is_blktrace(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) == 4 and any(int.from_bytes(head, order) & 0xFFFFFF00 == _BLKTRACE_MAGIC
                                  for order in ("little", "big"))


def _fields(line: str, version: int) -> tuple[int | None, list[str], int]:
    """(ttime, [file, action, offset, bytes] as far as they read, count) the way fio's
    sscanf reads a line: it stops at the first field that is not what it expects."""
    words = line.split()
    out: list = []
    ttime = None
    if version == 3:
        if not words or not words[0].isdigit():
            return None, [], 0
        ttime, words = int(words[0]), words[1:]
        out.append(ttime)
    for i, word in enumerate(words[:4]):
        if i >= 2 and not word.isdigit():
            break
        out.append(word)
    return ttime, out[1:] if version == 3 else out, len(out)


def read_log(path: str, values: dict) -> ReplayLog:
    """Read `path` as fio's read_iolog does, shaped by the job's replay options. Raises
    ReplayError for a log fio would not replay, or one replayed here only in part."""
    if path == "-" or not os.path.isfile(path):
        raise ReplayError(f"{path}: no such log file" if path != "-" else
                          "reading the log from standard input is not modelled (name a file)")
    if _is_blktrace(path):
        raise ReplayError(f"{path} is a blktrace; replaying blktrace files is not modelled (fio's trace "
                          "formats 2 and 3 are)")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    header = lines[0] if lines else ""
    if header.startswith(VERSION_2):
        version = 2
    elif header.startswith(VERSION_3):
        version = 3
    else:
        raise ReplayError(f"{path}: iolog version 1 is no longer supported (fio's words); the first line must be "
                          f"{VERSION_2!r} or {VERSION_3!r}")
    skip: frozenset[str] = values["replay_skip"] or frozenset()
    no_stall, scale_time = values["replay_no_stall"], values["replay_time_scale"]
    redirect = values["replay_redirect"]
    scale, align = values["replay_scale"] or 1, values["replay_align"] or 0
    added: list[str] = []
    closed: set[str] = set()
    io_files: set[str] = set()
    direction: list[int] = []
    offset: list[int] = []
    size: list[int] = []
    gap: list[int] = []
    not_before: list[int] = []
    sync_at: list[int] = []
    sync_kind: list[int] = []
    skipped: list[str] = []
    last_ttime, pending_gap, wait_until = 0, 0, 0
    for number, line in enumerate(lines[1:], start=2):
        ttime, fields, count = _fields(line, version)
        delay = 0
        if version == 3:  # (fio takes each line's gap before it knows what the line is)
            if ttime is not None:  # (a line without a time leaves fio's last one as it was)
                if last_ttime and not no_stall and ttime >= last_ttime:
                    delay = (ttime - last_ttime) * 1000 * 100 // scale_time
                last_ttime = ttime
        where = f"{path}:{number}"
        io_line = count == (5 if version == 3 else 4)
        file_line = count == (3 if version == 3 else 2)
        if not (io_line or file_line):
            skipped.append(f"bad iolog{version}: {line.strip()} ({where})")
            continue
        name, action = redirect or fields[0], fields[1]
        if file_line:
            if action not in _FILE_ACTIONS:
                skipped.append(f"fio: bad iolog file action: {action} ({where})")
                continue
            if action == "add":
                added.append(fields[0])
            (closed.add if action == "close" else closed.discard)(fields[0])
            pending_gap += delay
            continue
        if action == "wait":
            if version == 3:
                skipped.append(f"iolog: ignoring wait command with version 3 for file {fields[0]} ({where})")
            elif not no_stall:
                wait_until = int(fields[2]) * 1_000_000  # (ms since the run began)
            continue
        if action in REPLAY_SKIPPABLE and action in skip:
            continue
        if action == "trim":
            raise ReplayError(f"{where}: the log trims; trim is not modelled (replay_skip=trim leaves the "
                              "trims out)")
        if action not in _IO_ACTIONS and action not in _SYNC_ACTIONS:
            skipped.append(f"fio: bad iolog file action: {action} ({where})")
            continue
        if not redirect and fields[0] not in added:
            raise ReplayError(f"{where}: I/O on {fields[0]}, a file the log never added")
        if not redirect and fields[0] in closed:  # (fio 3.33 stops on an assertion)
            raise ReplayError(f"{where}: I/O on {fields[0]} after the log closed it")
        if action in _SYNC_ACTIONS:
            sync_at.append(len(offset))
            sync_kind.append(_SYNC_ACTIONS[action])
            pending_gap += delay
            continue
        length = int(fields[3])
        if length <= 0:
            raise ReplayError(f"{where}: a {action} of {length} bytes (an I/O moves at least one byte)")
        at = int(fields[2]) // scale
        if align:
            at &= ~(align - 1)
        io_files.add(name)
        direction.append(_IO_ACTIONS[action])
        offset.append(at)
        size.append(length)
        gap.append(pending_gap + delay)
        not_before.append(wait_until)
        pending_gap, wait_until = 0, 0
    if len(io_files) > 1:
        raise ReplayError(f"{path}: I/O on {len(io_files)} files ({', '.join(sorted(io_files))}); one file per job "
                          "is modelled (replay_redirect= sends the I/O of every file to one)")
    if not direction and not sync_at:
        raise ReplayError(f"{path}: the log holds no I/O to replay")
    return ReplayLog(path, version, next(iter(io_files), None), np.array(direction, np.int8),
                     np.array(offset, np.int64), np.array(size, np.int64), np.array(gap, np.int64),
                     np.array(not_before, np.int64), np.array(sync_at, np.int64), np.array(sync_kind, np.int8),
                     skipped)


def apply_to_job(job) -> ReplayLog:
    """Read the job's log and give the job fio's shape for it: the log's directions and
    block sizes, one region from the file's start to the furthest byte the log reaches,
    the log's file. Raises the job's error (naming read_iolog) when it cannot be replayed."""
    try:
        log = read_log(job["read_iolog"], job.values)
    except ReplayError as e:
        raise job.error("read_iolog", str(e)) from None
    except OSError as e:
        raise job.error("read_iolog", f"{job['read_iolog']}: {e.strerror}") from None
    if log.file is None:
        raise job.error("read_iolog", f"{log.path}: the log syncs but reads and writes nothing")
    v = job.values
    v["rw"] = log.rw()
    ranges = [log.size_range(d) or (v["bs"][d], v["bs"][d]) for d in (READ, WRITE)]
    v["bsrange"], v["bssplit"] = (ranges[0], ranges[1]), (None, None)
    v["bs"] = (ranges[0][0], ranges[1][0])
    v["blockalign"] = (1, 1)  # (the log's offsets are taken as they are)
    v["offset"], v["offset_increment"], v["size"], v["io_size"] = 0, 0, log.extent, None
    v["filename"], v["directory"] = log.file.replace(":", "\\:"), None
    v["number_ios"] = None
    if v["write_iolog"]:
        v["write_iolog"] = None
        log.skipped.append("fio: read iolog overrides write_iolog")
    return log


def notes(plans) -> list[str]:
    """What each replayed log skipped, once per job."""
    seen: dict[int, ReplayLog] = {id(p.replay): p.replay for p in plans if p.replay is not None}
    return [f"{note}" for log in seen.values() for note in log.skipped]


class ReplayGenerator:
    """The log's I/O in order, for the runner's loop (the parts of IoGenerator it uses)."""

    def __init__(self, log: ReplayLog):
        self.log = log
        self.max_bs = int(log.size.max())
        self.align = 1
        self.pass_starts: list[int] = []
        self.cache_drops: list[int] = []
        self.drop_at_passes = self.drop_at_restarts = False
        self.issued = 0
        self.bytes_left = int(log.size.sum())

    def next_chunk(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = slice(self.issued, self.issued + max(0, n))
        out = self.log.direction[s].copy(), self.log.offset[s].copy(), self.log.size[s].copy()
        self.issued += out[0].shape[0]
        self.bytes_left -= int(out[2].sum())
        return out


class ReplaySyncs:
    """The log's syncs, where they fall among its I/Os (SyncSchedule's interface)."""

    def __init__(self, log: ReplayLog):
        self.at, self.kind = log.sync_at, log.sync_kind
        self.next = 0  # of the syncs, those done
        self.ios = 0

    def due(self) -> int:
        if self.next < self.at.shape[0] and self.at[self.next] == self.ios:
            return int(self.kind[self.next])
        return 0

    def due_at_end(self, bytes_left: int | None) -> int:
        return self.due()

    def run_length(self, direction: np.ndarray) -> int:
        if self.next >= self.at.shape[0]:
            return direction.shape[0]
        return max(1, min(direction.shape[0], int(self.at[self.next]) - self.ios))

    def did_ios(self, direction: np.ndarray) -> None:
        self.ios += direction.shape[0]

    def did_sync(self) -> None:
        self.next += 1


class ReplayPacer:
    """The log's timing (Pacer's interface): an I/O goes once its gap has passed since
    the previous one was issued, and not before a format 2 wait's time. An I/O goes up
    to BATCH_HORIZON_NS early, with the others due by then in one batch (a batch costs
    the runner more than the few microseconds between a log's I/Os, and a sleep wakes
    late: one at a time, a replay would fall ever further behind). Going early never adds
    up: the next gap counts from the I/O's time in the log's schedule."""
    needs = "replaying an I/O log's timing (replay_no_stall=1 replays without it)"
    paced = True

    def __init__(self, log: ReplayLog, run_start_ns: int, stop: threading.Event, sleep=time.sleep):
        self.gap, self.not_before = log.gap_ns, log.not_before_ns
        self.run_start = run_start_ns
        self.stop, self.sleep = stop, sleep
        self.next = 0  # I/Os of the log issued
        self.last_issue = 0
        self._last_due = 0

    def restart(self, epoch_ns: int) -> None:
        if not self.next:
            self.last_issue = epoch_ns

    def _due(self, i: int, last_issue: int) -> int:
        return max(last_issue + int(self.gap[i]), self.run_start + int(self.not_before[i]) if self.not_before[i] else 0)

    def admit(self, chunk, now_ns, end_ns: int) -> int:
        """How many of the chunk's leading I/Os go now, after sleeping until the first is
        due. 0: the job's time ended (or it was stopped) while waiting."""
        due = self._due(self.next, self.last_issue)
        early = BATCH_HORIZON_NS if due < end_ns else 0  # (the job's end is not come early to)
        while not self.stop.is_set():
            left = min(due, end_ns) - now_ns()
            if left <= early:
                break
            self.sleep(min(left - early // 2, 100_000_000) / 1e9)
        now = now_ns()
        if self.stop.is_set() or now >= end_ns:
            return 0
        # the schedule goes on from the first I/O's time in it: its due time where it goes
        # early, now where it is late (fio's gaps count from the last issue)
        n, due = 1, max(now, due)
        while n < len(chunk):
            following = self._due(self.next + n, due)
            if following > now + BATCH_HORIZON_NS:  # (the first I/O went up to that early too)
                break
            n, due = n + 1, following
        self._last_due = due  # (the batch's last I/O's time in the log's schedule: no drift ahead)
        return n

    def deadline(self) -> int:
        return 2**62

    def did(self, chunk) -> None:
        if len(chunk):
            self.next += len(chunk)
            self.last_issue = self._last_due


def attach(worker, log: ReplayLog | None) -> None:
    """Give a job clone the log's I/O, syncs and timing in place of those its options
    make (the job's values already have the log's shape: apply_to_job)."""
    if log is None:
        return
    worker.gen = ReplayGenerator(log)
    worker._budget_total = worker.gen.bytes_left
    worker.syncs = ReplaySyncs(log) if log.sync_at.shape[0] else None
    worker.pacer = ReplayPacer(log, time.monotonic_ns(), worker._stop) if log.paced else None
