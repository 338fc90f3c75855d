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
    if not header.startswith((VERSION_2, VERSION_3)):
        raise ReplayError(f"{path}: iolog version 1 is no longer supported (fio's words); the first line must be "
                          f"{VERSION_2!r} or {VERSION_3!r}")
    reader = _LogReader(path, 3 if header.startswith(VERSION_3) else 2, values)
    for number, line in enumerate(lines[1:], start=2):
        reader.line(line, f"{path}:{number}")
    return reader.result()


class _LogReader:
    """fio's read_iolog loop: one line at a time, into the replay's arrays."""

    def __init__(self, path: str, version: int, values: dict):
        self.path, self.version = path, version
        self.skip: frozenset[str] = values["replay_skip"] or frozenset()
        self.no_stall, self.time_scale = values["replay_no_stall"], values["replay_time_scale"]
        self.redirect = values["replay_redirect"]
        self.scale, self.align = values["replay_scale"] or 1, values["replay_align"] or 0
        self.added: list[str] = []
        self.closed: set[str] = set()
        self.io_files: set[str] = set()
        self.ios: list[tuple[int, int, int, int, int]] = []  # direction, offset, size, gap, not before
        self.syncs: list[tuple[int, int]] = []  # (the I/O it comes before, kind)
        self.skipped: list[str] = []
        self.last_ttime = 0
        self.pending_gap = self.wait_until = 0  # what the lines since the last I/O hold it back by

    def _gap(self, ttime: int | None) -> int:
        """fio's delay_since_ttime, taken for every line before it knows what the line is."""
        if self.version != 3 or ttime is None:  # (a line without a time leaves fio's last one as it was)
            return 0
        delay = 0
        if self.last_ttime and not self.no_stall and ttime >= self.last_ttime:
            delay = (ttime - self.last_ttime) * 1000 * 100 // self.time_scale
        self.last_ttime = ttime
        return delay

    def line(self, line: str, where: str) -> None:
        ttime, fields, count = _fields(line, self.version)
        delay = self._gap(ttime)
        if count == (3 if self.version == 3 else 2):
            self._file_action(fields[0], fields[1], delay, where)
        elif count == (5 if self.version == 3 else 4):
            self._action(fields, delay, where)
        else:
            self.skipped.append(f"bad iolog{self.version}: {line.strip()} ({where})")

    def _file_action(self, name: str, action: str, delay: int, where: str) -> None:
        if action not in _FILE_ACTIONS:
            self.skipped.append(f"fio: bad iolog file action: {action} ({where})")
            return
        if action == "add":
            self.added.append(name)
        (self.closed.add if action == "close" else self.closed.discard)(name)
        self.pending_gap += delay

    def _action(self, fields: list[str], delay: int, where: str) -> None:
        name, action = fields[0], fields[1]
        if action == "wait":
            if self.version == 3:
                self.skipped.append(f"iolog: ignoring wait command with version 3 for file {name} ({where})")
            elif not self.no_stall:
                self.wait_until = int(fields[2]) * 1_000_000  # (ms since the run began)
            return
        if action in REPLAY_SKIPPABLE and action in self.skip:
            return
        if action == "trim":
            raise ReplayError(f"{where}: the log trims; trim is not modelled (replay_skip=trim leaves the "
                              "trims out)")
        if action not in _IO_ACTIONS and action not in _SYNC_ACTIONS:
            self.skipped.append(f"fio: bad iolog file action: {action} ({where})")
            return
        if not self.redirect and name not in self.added:
            raise ReplayError(f"{where}: I/O on {name}, a file the log never added")
        if not self.redirect and name in self.closed:  # (fio 3.33 stops on an assertion)
            raise ReplayError(f"{where}: I/O on {name} after the log closed it")
        if action in _SYNC_ACTIONS:
            self.syncs.append((len(self.ios), _SYNC_ACTIONS[action]))
            self.pending_gap += delay
            return
        length = int(fields[3])
        if not 0 < length < 1 << 32:
            raise ReplayError(f"{where}: a {action} of {length} bytes (an I/O moves at least one byte, and fio "
                              "reads a length as a 32-bit number)")
        offset = int(fields[2]) // self.scale
        if self.align:
            offset &= ~(self.align - 1)
        self.io_files.add(self.redirect or name)
        self.ios.append((_IO_ACTIONS[action], offset, length, self.pending_gap + delay, self.wait_until))
        self.pending_gap = self.wait_until = 0

    def result(self) -> ReplayLog:
        if len(self.io_files) > 1:
            raise ReplayError(f"{self.path}: I/O on {len(self.io_files)} files ({', '.join(sorted(self.io_files))}); "
                              "one file per job is modelled (replay_redirect= sends the I/O of every file to one)")
        if not self.ios and not self.syncs:
            raise ReplayError(f"{self.path}: the log holds no I/O to replay")
        ios = np.array(self.ios, np.int64).reshape(-1, 5)
        syncs_ = np.array(self.syncs, np.int64).reshape(-1, 2)
        return ReplayLog(self.path, self.version, next(iter(self.io_files), None), ios[:, 0].astype(np.int8),
                         ios[:, 1].copy(), ios[:, 2].copy(), ios[:, 3].copy(), ios[:, 4].copy(),
                         syncs_[:, 0].copy(), syncs_[:, 1].astype(np.int8), self.skipped)


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
