"""The emulated CXL-HM device: device DRAM + SSD back end + firmware, behind one HDM window.

`Device` is the device side. Hosts use it through `host_runtime.driver`, which adds
buffer handling; the device itself speaks in extents (HPA, length) and raw buffer
addresses, and checks every request as untrusted input.

Host threads may use one device at once. One lock guards the firmware state; on the
wall clock an access plans under it, runs its SSD fill reads and its copy without it
(its slots BUSY meanwhile), and settles under it again - so several threads keep SSD
I/O in flight together. A thread can also keep many reads of its own in flight with
read_start / read_reap (split-phase reads). The model clock keeps every access under
the lock, in issue order.
"""
from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

import firmware_policies
from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm import readstream as rs
from cxlhm import sumtable
from cxlhm.config import ConfigError, DeviceConfig
from cxlhm.integrity import BlockChecksums, PoisonError, PoisonTable, checksum
from cxlhm.media.dram import DeviceDram
from cxlhm.media.faults import FaultInjector, FaultPlan
from cxlhm.mailbox import Mailbox
from cxlhm.mailbox.hints import DeviceBusy, HintKind
from cxlhm.media.ssd import SsdBackend
from cxlhm.modelclock import ModelClock
from cxlhm.timing import LatencyRecorder, TimingModel, charge_flush
from cxlhm.timing.recorder import record as record_latency
from firmware_policies.base import JOB_FLUSH, JOB_PREFETCH, no_background

METADATA_FORMAT = 1
MAX_BATCH_BLOCKS = 4096  # blocks planned per firmware pass (bounds the scratch arrays)
METADATA_BYTES_PER_SLOT = 160  # block table (~73 B with its hash index and prefetch ghosts) + policy state (hymcache ~54 B)


class AccessOutOfRange(IndexError):
    """An access falls (partly) outside the HDM window."""


class MediaError(OSError):
    """The SSD back end failed an I/O the device could not hide."""


__all__ = ["AccessOutOfRange", "Device", "DeviceBusy", "DeviceClosed", "DeviceFull", "MediaError", "PoisonError", "ReadTicket",
           "WOULD_BLOCK"]


class DeviceFull(RuntimeError):
    """Every DRAM slot is pinned or busy, so a missing block has nowhere to go."""


class DeviceClosed(RuntimeError):
    pass


_NO_BLOCKS, _NO_SUMS = np.zeros(0, np.int64), np.zeros(0, np.uint64)  # an empty sum table: verify nothing
STREAM_PASSES = 4  # passes of a wide streamed read in flight at once (_read_streamed)
TICKET_TAG = 1 << 16  # a fill's io_uring tag: ticket id * TICKET_TAG + its row (< MAX_BATCH_BLOCKS)


class _WouldBlock:
    def __repr__(self) -> str:
        return "WOULD_BLOCK"


WOULD_BLOCK = _WouldBlock()  # read_start: reap this thread's reads first


class ReadTicket:
    """A read begun by Device.read_start: its pass's slots and fill rows, and which
    extents wait for which fills, so each extent completes as soon as its blocks are in."""
    __slots__ = ("id", "hpas", "lens", "addrs", "slots", "installed", "fills", "k", "n_fill", "ext_first",
                 "res", "mismatch", "retries", "row_ext", "row_ptr", "pending", "failed", "ready", "left", "troubled")

    def __init__(self, ticket_id: int, hpas: np.ndarray, lens: np.ndarray, addrs: np.ndarray, blocks: int):
        self.id = ticket_id
        self.hpas, self.lens, self.addrs = hpas, lens, addrs
        self.slots = np.empty(blocks, np.int64)
        self.installed = np.empty(blocks, np.uint8)
        self.fills = fw.new_io_rows(blocks)
        self.k = self.n_fill = self.retries = 0
        self.left = hpas.shape[0]  # extents not yet reported complete
        self.troubled = False  # some fill failed, was retried or mismatched: settle it row by row

    def link(self, block_size: int) -> np.ndarray:
        """After planning: which fill rows each extent waits for (fw.link_read). Returns
        the extents that wait for none: all their blocks were in DRAM already."""
        m, n, k = self.hpas.shape[0], self.n_fill, self.k
        ints = np.empty(3 * m + k + 2 * n + 1, np.int64)  # one allocation, cut in views
        self.ext_first, self.pending, self.ready = ints[:m], ints[m:2 * m], ints[2 * m:3 * m]
        self.row_ext, self.row_ptr, self.res = ints[3 * m:3 * m + k], ints[3 * m + k:3 * m + k + n + 1], ints[-n:]
        flags = np.zeros(m + n, bool)
        self.failed, self.mismatch = flags[:m], flags[m:]
        fw.link_read(self.slots, self.installed, k, self.hpas, self.lens, block_size, self.ext_first,
                     self.pending, self.row_ext, self.row_ptr)
        return np.flatnonzero(self.pending == 0)

    def rows_done(self, rows: np.ndarray, good: np.ndarray) -> np.ndarray:
        """Fills `rows` are in (good: right bytes); returns the extents they complete."""
        n = fw.rows_read(rows, good, self.row_ext, self.row_ptr, self.pending, self.failed, self.ready)
        return self.ready[:n].copy()


class _StreamJob(NamedTuple):
    """One read_stream call: its compiled kernels and state, its reads and their
    outputs, the thread's ring, and the owner its blocks are placed for."""
    run: Callable
    complete: Callable
    state: rs.StreamState
    hpas: np.ndarray
    lens: np.ndarray
    addrs: np.ndarray
    slat: np.ndarray
    clat: np.ndarray
    failed: np.ndarray
    ring: int
    fd: int
    owner: int


@dataclasses.dataclass(frozen=True)
class StreamResult:
    """What Device.read_stream ran: reads[:count] (complete), and their device-block
    hits and misses."""
    count: int
    hits: int
    misses: int
    submits: np.ndarray | None = None  # reads per submission, in fio's 7 buckets (cxlhm.fio.stats.submit_bucket)
    peak_in_flight: int = 0  # the most reads it had at the SSD at once


class _Scratch:
    """One host thread's planner scratch: the slots and I/O rows of its pass in flight."""
    __slots__ = ("slots_out", "installed", "writebacks", "fills", "one_hpa", "one_len", "hits", "misses")

    def __init__(self, batch: int):
        self.slots_out = np.zeros(batch, np.int64)
        self.installed = np.zeros(batch, np.uint8)
        self.writebacks = fw.new_io_rows(batch)
        self.fills = fw.new_io_rows(batch)
        self.one_hpa = np.zeros(1, np.int64)  # access_one's extent as arrays
        self.one_len = np.zeros(1, np.int64)
        self.hits = self.misses = 0  # device-block hits and misses of this thread's accesses


def metadata_path(image_path: str) -> Path:
    return Path(image_path + ".cxlhm.json")


class Device:
    def __init__(self, cfg: DeviceConfig):
        self.cfg = cfg
        self.capacity, self.block_size = cfg.capacity, cfg.block_size
        self.n_slots = cfg.dram_slots
        try:
            self.policy = firmware_policies.get(cfg.firmware.policy)
        except firmware_policies.UnknownPolicy as exc:
            raise ConfigError(cfg.source_of("firmware.policy"), "firmware.policy", str(exc)) from None
        try:
            self.params = self.policy.resolve_params(cfg.firmware.params)
        except firmware_policies.PolicyParamError as exc:
            raise ConfigError(cfg.source_of("firmware.params"), "firmware.params", str(exc)) from None
        self.write_mode = cfg.firmware.write_mode or self.policy.write_mode
        self._write_mode_code = fw.WRITE_MODE_CODES[self.write_mode]
        self.moves_data = cfg.data == "real"

        _check_fits_in_memory(cfg)  # before anything sized by DRAM is allocated
        self.bt = btm.new_block_table(self.n_slots)
        self.ps = self.policy.make_state(self.n_slots, self.params)
        self.counters = C.new_counters()
        self.clock = np.zeros(1, np.int64)  # logical: one tick per block access
        self.kernels = fw.kernels_for(self.policy)
        self.timing = TimingModel.from_device_config(cfg)  # validated even on the wall clock
        self.model = ModelClock(self.timing, self.n_slots) if cfg.clock == "model" else None
        self.latency: LatencyRecorder | None = None

        self._batch = min(self.n_slots, MAX_BATCH_BLOCKS)
        # Planner scratch is per host thread: another thread plans while this one
        # waits for its fills with the lock released (see _fill_and_copy).
        self._local = threading.local()
        # One lock over the block table, policy state, counters, poison and checksum
        # tables; not re-entrant, so releasing it around I/O means what it says (public
        # methods take it, their _locked variants expect it held). `_idle` is notified by
        # every access that released it, when its slots stop being BUSY.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0  # accesses with BUSY slots and the lock released
        self._inflight_slots = 0  # slots they hold BUSY
        self._ticket_ids = 0  # split-phase reads (read_start) begun so far
        self.mailbox: Mailbox | None = None
        self.closed = False
        self.unclean_shutdown_detected = False

        self._jobs = np.zeros((256, 3), np.int64)  # background jobs: (kind, block, session)
        self._background_done_ns = 0.0  # model clock: when the last background round's work is done
        self._t0_ns = time.monotonic_ns()
        self.background_error: Exception | None = None
        self._background_wake = threading.Event()
        self._stop_background = threading.Event()
        self._background_thread: threading.Thread | None = None

        self.dram = DeviceDram(self.n_slots, self.block_size, data=self.moves_data)
        self.ssd = None
        self.poison = PoisonTable()
        self.checksums = BlockChecksums(None)
        self.retries = cfg.backend.retries
        if self.moves_data:
            try:
                faults = FaultPlan.from_mapping(cfg.backend.faults, cfg.seed)
            except ValueError as exc:
                raise ConfigError(cfg.source_of("backend.faults"), "backend.faults", str(exc)) from None
            self.ssd = SsdBackend(cfg.backend.path, self.capacity, cfg.backend.queue_depth,
                                  source=cfg.source_of("backend.path"))
            if faults.active:
                self.ssd = FaultInjector(self.ssd, faults)
            self._open_metadata()
        if (cfg.firmware.background == "thread" and self.model is None
                and self.policy.background is not no_background):
            self._background_thread = threading.Thread(target=self._background_loop, name="cxlhm-firmware", daemon=True)
            self._background_thread.start()

    # ------------------------------------------------------------ persistence
    def _open_metadata(self) -> None:
        if self.ssd.temporary:
            return
        path = metadata_path(self.ssd.path)
        if path.exists():
            try:
                meta = json.loads(path.read_text())
                self.unclean_shutdown_detected = not meta.get("clean", False)
                self.poison = PoisonTable(meta.get("poison"))
            except (OSError, ValueError, AttributeError):
                self.unclean_shutdown_detected = True
        self.checksums = BlockChecksums(Path(self.ssd.path + ".cxlhm.sums"), self.block_size)
        self._open_integrity_log()  # reliability (issue 10): replays it after an unclean shutdown
        self._write_metadata(clean=False)  # until a clean close says otherwise

    def _write_metadata(self, *, clean: bool) -> None:
        if self.ssd is None or self.ssd.temporary:
            return
        path = metadata_path(self.ssd.path)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"format": METADATA_FORMAT, "capacity": self.capacity,
                                   "block_size": self.block_size, "clean": clean,
                                   "poison": self.poison.to_json()}))
        os.replace(tmp, path)

    # ------------------------------------------------------------ access path
    def check_extent(self, hpa: int, n: int) -> None:
        """Raise AccessOutOfRange unless [hpa, hpa+n) lies inside the HDM window."""
        if hpa < 0 or n < 0 or hpa > self.capacity - n:
            raise AccessOutOfRange(f"access [{hpa:#x}, +{n}) is outside the HDM window [0, {self.capacity:#x})")

    def access(self, ext_hpa: np.ndarray, ext_len: np.ndarray, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """Read (or write) the extents, laid end to end in the user buffer at `user_addr`,
        as concurrent I/Os. Returns the latency in ns on the device's clock. On the model
        clock `issue_ns` places the access in time (default: now, and the clock then
        moves to its completion, as for a synchronous host). Host threads may call it
        at once; on the wall clock their SSD reads overlap."""
        ext_hpa = np.ascontiguousarray(ext_hpa, np.int64)
        ext_len = np.ascontiguousarray(ext_len, np.int64)
        if ext_hpa.shape != ext_len.shape or ext_hpa.ndim != 1:
            raise ValueError("extent addresses and lengths must be 1-D arrays of equal length")
        bad, blocks = fw.check_extents(ext_hpa, ext_len, self.capacity, self.block_size)
        if bad >= 0:
            self.check_extent(int(ext_hpa[bad]), int(ext_len[bad]))
        with self._lock:
            if self.poison:  # refuse before any pass changes anything (each pass checks again)
                for hpa, n in zip(ext_hpa.tolist(), ext_len.tolist()):
                    self._check_poison(hpa, n, is_write, clear=False)
            s = self._scratch()
            limit = self._batch_limit()
            started = t = self._begin(issue_ns)
            if blocks <= limit:
                t = self._access_batch(ext_hpa, ext_len, user_addr, is_write, owner, t, s)
            else:
                t = self._access_split(ext_hpa, ext_len, user_addr, is_write, owner, t, limit, s)
            return self._complete(started, t, issue_ns)

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None, *, stream: bool = True) -> float:
        """access() for a single extent, without the array set-up (the common host call).
        On the wall clock a read of several blocks some of which are on the SSD is
        streamed (read_stream, one read per block): each block is copied out as soon as
        it lands, while the next ones are still being read."""
        self.check_extent(hpa, n)
        bt = self.bt
        if (stream and not is_write and n and self.splits_reads
                and (hpa + n - 1) // self.block_size > hpa // self.block_size and not self.reads_in_flight()
                and rs.missing_blocks(bt.index_keys, bt.index_slots, hpa, n, self.block_size, 2) > 1):
            return self._read_streamed(hpa, n, user_addr, owner)  # (the table was read unlocked: it only picks a path)
        with self._lock:
            if self.poison:
                self._check_poison(hpa, n, is_write, clear=False)
            s = self._scratch()
            limit = self._batch_limit()
            started = t = self._begin(issue_ns)
            if n == 0 or (hpa + n - 1) // self.block_size - hpa // self.block_size < limit:
                s.one_hpa[0], s.one_len[0] = hpa, n
                t = self._access_batch(s.one_hpa, s.one_len, user_addr, is_write, owner, t, s)
            else:
                t = self._access_split(np.array([hpa], np.int64), np.array([n], np.int64), user_addr, is_write,
                                       owner, t, limit, s)
            return self._complete(started, t, issue_ns)

    def _read_streamed(self, hpa: int, n: int, user_addr: int, owner: int) -> float:
        """One multi-block read through read_stream, counted as one host read. Up to a
        quarter of the SSD queue of blocks it is one stream read: planned as one firmware
        pass, like access(), its blocks copied out as they land. A wider read is cut in
        such passes (like _access_split), four in flight: a pass's blocks tend to land
        together (the block layer merges adjacent reads into one request), and while
        one pass is copied out the other three keep the SSD's queue full."""
        started = time.perf_counter_ns()
        bs = self.block_size
        with self._lock:
            piece = max(1, min(self._batch_limit(), self.ssd.queue_depth // STREAM_PASSES))
        first, last = hpa // bs, (hpa + n - 1) // bs
        cuts = np.arange(first + piece, last + 1, piece, dtype=np.int64) * bs
        starts = np.concatenate(([hpa], cuts))
        lens = np.diff(np.concatenate((starts, [hpa + n])))
        ran = self.read_stream(starts, lens, user_addr + (starts - hpa), STREAM_PASSES, owner=owner)
        extra = ran.count - (ran.count == starts.shape[0])  # the pieces' host reads beyond this one
        if extra:
            with self._lock:
                self.counters[C.HOST_READS] -= extra
        if ran.count < starts.shape[0]:  # it stopped before a poisoned block: the erroring path
            rest = int(starts[ran.count])
            self.access_one(rest, hpa + n - rest, user_addr + rest - hpa, False, owner, stream=False)
        latency = time.perf_counter_ns() - started
        if self.latency is not None:
            with self._lock:
                record_latency(self.latency.values, self.latency.meta, float(latency))
        return latency

    def _access_split(self, ext_hpa, ext_len, user_addr, is_write, owner, t: float, limit: int, s) -> float:
        """An access touching more blocks than one firmware pass may hold: run it in
        pieces, one after the other. The planner counts a host operation per extent
        it sees, so pieces cut from one extent are folded back into one operation."""
        pieces = 0
        for hpas, lens, start in _split_batches(ext_hpa, ext_len, self.block_size, limit):
            t = self._access_batch(hpas, lens, user_addr + start, is_write, owner, t, s)
            pieces += hpas.shape[0]
        self.counters[C.HOST_WRITES if is_write else C.HOST_READS] -= pieces - int(np.count_nonzero(ext_len))
        return t

    def _check_poison(self, hpa: int, n: int, is_write: bool, *, clear: bool = True) -> None:
        """Reads of poisoned blocks fail; a write that covers a whole poisoned block
        replaces its lost bytes and clears the poison (`clear`: now - only in the lock
        hold that plans the write, or another thread could read the lost bytes from
        the SSD in between); a partial write cannot."""
        if n == 0:
            return
        bs = self.block_size
        first, last = hpa // bs, (hpa + n - 1) // bs
        while (block := self.poison.first_poisoned(first, last)) >= 0:
            covered = is_write and block * bs >= hpa and (block + 1) * bs <= hpa + n
            if not covered:
                raise PoisonError(5, f"block {block} (HPA {block * bs:#x}, {bs} bytes) is poisoned: "
                                     f"{self.poison.blocks[block]}")
            if clear:
                self.poison.clear(block)
            first = block + 1

    def _begin(self, issue_ns: float | None) -> float:
        """Start an operation: its issue time on the model clock (after giving the idle
        gap before it to background work), or the wall clock's ns."""
        if self.model is None:
            return time.perf_counter_ns()
        if issue_ns is not None and issue_ns > self.model.now_ns:
            self._idle_until(issue_ns)
        return self.model.issue(issue_ns)

    def _complete(self, started: float, done: float, issue_ns: float | None) -> float:
        if self.closed and self.power_lost:  # reliability: the power went during this access
            raise DeviceClosed("the device lost power during this access: its bytes may be lost")
        if self.model is None:
            latency = time.perf_counter_ns() - started
        else:
            latency = done - started
            if issue_ns is None:  # a synchronous host: the next operation starts after this one
                self.model.now_ns = max(self.model.now_ns, done)
        if self.latency is not None:
            record_latency(self.latency.values, self.latency.meta, float(latency))
        return latency

    def record_latencies(self, every: int = 1, capacity: int = 1 << 20) -> LatencyRecorder:
        """Keep per-access latencies (every `every`-th, bounded memory) on the device's clock."""
        self.latency = LatencyRecorder(capacity, every)
        return self.latency

    def thread_hits_misses(self) -> tuple[int, int]:
        """Device-block hits and misses of the calling thread's accesses so far: exact
        per thread while other threads access the device too (each pass's are counted
        in the lock hold that plans it)."""
        s = self._scratch()
        return s.hits, s.misses

    def _scratch(self) -> _Scratch:
        s = getattr(self._local, "scratch", None)
        if s is None:
            s = self._local.scratch = _Scratch(self._batch)
        return s

    def _batch_limit(self) -> int:
        """Blocks one firmware pass may touch: every one needs a slot it can hold busy."""
        if self.closed:
            raise DeviceClosed("the device is closed")
        limit = min(self._batch, self.n_slots - int(self.bt.scalars[btm.N_PINNED]))
        if limit <= 0:
            raise DeviceFull("every device-DRAM slot is pinned; unpin something first")
        return limit

    def _wait_for_slots(self, hpas, lens) -> None:
        """Before planning, while other threads' accesses are in flight: wait (the lock
        released) until none of them holds a block of this pass, and they leave enough
        unpinned slots for it to find victims - else the planner would pick their BUSY
        slots' blocks apart or report DeviceFull. Nothing has been changed yet, so
        waking up and checking again is a plain retry."""
        while self._inflight:
            blocks, busy = fw.touches_busy(self.bt, hpas, lens, self.block_size)
            room = self.n_slots - int(self.bt.scalars[btm.N_PINNED]) - self._inflight_slots
            if not busy and blocks <= room:
                return
            self._idle.wait()
            if self.closed:
                raise DeviceClosed("the device is closed")

    def _access_batch(self, hpas, lens, user_addr, is_write, owner, t: float, s: _Scratch) -> float:
        """One firmware pass; returns its completion on the model clock (else `t`).
        Called with the lock held and returns with it held; on the wall clock it is
        released while the pass's fill reads and copy run (_fill_and_copy)."""
        self._wait_for_slots(hpas, lens)
        if self.bt.scalars[btm.N_PINNED]:  # pins that landed while this pass waited may leave it too few slots
            room = self.n_slots - int(self.bt.scalars[btm.N_PINNED])
            firsts = hpas // self.block_size
            if 0 < room < int(((hpas + np.maximum(lens, 1) - 1) // self.block_size - firsts + 1)[lens > 0].sum()):
                return self._access_split(hpas, lens, user_addr, is_write, owner, t, room, s)
        self._sync_time()  # the policy's deadlines and ages read it
        if self.poison:  # again, in the hold that plans: a thread that ran meanwhile may have poisoned
            for hpa, n in zip(hpas.tolist(), lens.tolist()):
                self._check_poison(hpa, n, is_write)
        counters = self.counters
        hits, misses = counters.item(C.HITS), counters.item(C.MISSES)
        ok, k, n_wb, n_fill, done = self.kernels.access(
            self.bt, self.ps, counters, self.clock, hpas, lens, is_write, self._write_mode_code,
            owner, self.dram.base_address, self.block_size, s.slots_out, s.installed,
            s.writebacks, s.fills, user_addr, self.moves_data)
        if is_write and not n_wb and self.checksums.log is not None:  # reliability: newer bytes only in DRAM
            self.checksums.note_dirty_array(self.bt.block[s.slots_out[:k]])
        s.hits += counters.item(C.HITS) - hits
        s.misses += counters.item(C.MISSES) - misses
        if self.model is not None:
            through = k * self.block_size if is_write and self._write_mode_code == fw.WRITE_THROUGH else 0
            t = self.model.charge_access(t, is_write, int(lens.sum()), s.fills, n_fill, s.writebacks, n_wb,
                                         s.slots_out, s.installed, k, through, counters)
        if done:
            return t
        slots = s.slots_out
        # The model clock keeps the lock: its charges were made in issue order above, and
        # releasing would let background work or another host interleave its data moves.
        release = self.moves_data and n_fill > 0 and self.model is None
        if release:
            self._inflight += 1
            self._inflight_slots += k
        try:
            if self.moves_data:
                if n_wb:
                    # Under the lock: a victim's bytes are on the SSD before any thread can
                    # miss on its block and read it back from there.
                    self._write_rows(s.writebacks[:n_wb], victims=True)
                    if is_write and self.checksums.log is not None:  # reliability: after the victims'
                        self.checksums.note_dirty_array(self.bt.block[slots[:k]])  # SUMs (one may be re-placed here)
                bad, copied = None, False
                if n_fill:
                    bad, copied = self._fill_and_copy(s, n_fill, hpas, lens, user_addr, is_write, ok, release)
                if bad is not None and bad.any():
                    # Newly placed blocks hold no valid bytes (failed fills; for a write,
                    # also the fully overwritten ones, since the copy will not happen).
                    self._invalidate_installed(s, k)
                    block = int(s.fills[np.flatnonzero(bad)[0], 2] // self.block_size)
                    raise PoisonError(5, f"block {block} (HPA {block * self.block_size:#x}) could not be read: "
                                         f"{self.poison.blocks.get(block, 'media error')}")
                if ok:
                    if not copied:
                        fw.copy_extents(self.dram.base_address, self.block_size, slots, hpas, lens, user_addr,
                                        not is_write)
                    if is_write and self._write_mode_code == fw.WRITE_THROUGH:
                        self._write_through(slots[:k])
                elif is_write:  # no copy: blocks placed for a full overwrite were never filled
                    self._invalidate_installed(s, k)
        finally:
            fw.finish(self.bt, slots, k)
            if release:
                self._inflight -= 1
                self._inflight_slots -= k
                self._idle.notify_all()
        if not ok:
            raise DeviceFull("no evictable device-DRAM slot: every slot is pinned or in use by this access")
        return t

    def _fill_and_copy(self, s: _Scratch, n_fill: int, hpas, lens, user_addr, is_write, copy: bool,
                       release: bool) -> tuple[np.ndarray, bool]:
        """The pass's fill reads, then - if `copy` and every fill read right - the copy
        between the slots and the host buffer. Returns (mask of fills that failed,
        whether the copy was made).

        With `release` the lock is dropped for both, so other host threads plan and run
        their own I/O meanwhile. What keeps that safe: every slot of this pass is BUSY,
        so no thread evicts, writes back or flushes it, and a thread whose access
        touches one of its blocks waits in _wait_for_slots; the I/O rows are this
        thread's scratch; and counters, poison and checksum records are only changed
        after the lock is taken again (_settle_reads)."""
        rows = s.fills[:n_fill]
        if release:
            self._lock.release()
        try:
            res, retries, mismatch = self._read_verified(rows)
            copied = copy and bool((res == rows[:, 1]).all()) and (mismatch is None or not mismatch.any())
            if copied:
                fw.copy_extents(self.dram.base_address, self.block_size, s.slots_out, hpas, lens, user_addr,
                                not is_write)
        finally:
            if release:
                self._lock.acquire()
        return self._settle_reads(rows, res, retries, mismatch), copied

    def _invalidate_installed(self, s: _Scratch, k: int) -> None:
        now = int(self.clock[0])
        for slot in s.slots_out[:k][s.installed[:k].astype(bool)]:
            if self.bt.block[slot] >= 0:
                self.kernels.invalidate(self.bt, self.ps, slot, now)

    def _submit_retrying(self, ops: np.ndarray, retries: int | None = None) -> tuple[np.ndarray, int]:
        """Submit, then resubmit failed or short ops up to `retries` (`backend.retries`)
        times. Returns the ops' final results (bytes, or -errno) and the number of
        retries (the caller counts them under the lock)."""
        res = self.ssd.submit(ops)
        if (res == ops[:, 1]).all():
            return res, 0
        res = res.copy()  # the back end reuses its result array
        retried = 0
        for _ in range(self.retries if retries is None else retries):
            failed = np.flatnonzero(res != ops[:, 1])
            if failed.size == 0:
                break
            retried += failed.size
            res[failed] = self.ssd.submit(ops[failed])
        return res, retried

    def _read_rows(self, rows: np.ndarray) -> np.ndarray:
        """SSD -> slot reads with retries and checksum verification, under the lock. A
        block that cannot be read correctly is poisoned; returns the mask of such rows."""
        return self._settle_reads(rows, *self._read_verified(rows))

    def _read_verified(self, rows: np.ndarray) -> tuple[np.ndarray, int, np.ndarray | None]:
        """SSD -> slot reads with retries, each read block checked against its recorded
        checksum: (results, retries, mask of checksum mismatches or None). Needs no lock:
        it touches only the rows' slots (BUSY, this thread's) and reads the checksum
        table, whose entries for these blocks cannot change meanwhile (only a write-back
        of a block records its sum, and a BUSY block is never written back)."""
        res, retries = self._submit_retrying(rows)
        check = self._rows_with_sums(rows)
        if not check:
            return res, retries, None  # the common case: nothing to verify
        mismatch = np.zeros(rows.shape[0], bool)
        for i in check:
            mismatch[i] = res[i] == rows[i, 1] and not self._fill_matches(rows[i])
        return res, retries, mismatch

    def _rows_with_sums(self, rows: np.ndarray) -> list[int]:
        """Indices of the I/O rows whose blocks have a recorded checksum (a set
        intersection: most reads are of blocks the device never wrote back)."""
        sums = self.checksums.sums
        if not sums:
            return []
        blocks = (rows[:, 2] // self.block_size).tolist()
        known = sums.keys() & set(blocks)
        return [i for i, block in enumerate(blocks) if block in known] if known else []

    def _fill_matches(self, row: np.ndarray) -> bool:
        expected = self.checksums.sums.get(int(row[2] // self.block_size))
        slot_address = row[0:1]
        return expected is None or expected == int(self._hash_slots(slot_address)[0])

    def _settle_reads(self, rows: np.ndarray, res: np.ndarray, retries: int, mismatch) -> np.ndarray:
        """Under the lock: count the retries, poison each block that could not be read
        correctly; returns the mask of such rows."""
        self.counters[C.MEDIA_RETRIES] += retries
        bad = res != rows[:, 1]
        if mismatch is None and not bad.any():
            return bad
        for i in np.flatnonzero(bad if mismatch is None else bad | mismatch).tolist():
            block = int(rows[i, 2] // self.block_size)
            if bad[i]:
                self._poison(block, f"SSD read failed: {os.strerror(-int(res[i])) if res[i] < 0 else 'short read'}")
            else:
                self.counters[C.CHECKSUM_MISMATCHES] += 1
                self._poison(block, "checksum mismatch on SSD read")
        return bad if mismatch is None else bad | mismatch

    def _write_rows(self, rows: np.ndarray, *, victims: bool) -> np.ndarray:
        """Slot -> SSD writes with retries, recording each block's checksum (under the
        lock). Returns the mask of rows that failed. A failed victim's bytes are gone:
        it is poisoned."""
        sums = self._hash_slots(rows[:, 0])
        blocks = rows[:, 2] // self.block_size
        self.checksums.intend(blocks.tolist(), sums.tolist())  # reliability: write-ahead
        res, retries = self._submit_retrying(rows)
        self.counters[C.MEDIA_RETRIES] += retries
        failed = res != rows[:, 1]
        self.checksums.sums.set_many(blocks[~failed], sums[~failed])
        for i in np.flatnonzero(failed).tolist():
            block = int(blocks[i])
            self.checksums.sums.pop(block, None)  # the SSD holds neither the old nor the new bytes
            if victims:
                self._poison(block, f"write-back failed: {os.strerror(-int(res[i])) if res[i] < 0 else 'short write'}")
        return failed

    def _hash_slots(self, addrs: np.ndarray) -> np.ndarray:
        """xxh3-64 of the whole slot at each address (compiled when xxhash allows)."""
        if sumtable.COMPILED_HASH:
            sums = np.empty(addrs.shape[0], np.uint64)
            sumtable.hash_blocks(np.ascontiguousarray(addrs), self.block_size, sums)
            return sums
        return np.fromiter((checksum(self._slot_bytes(a)) for a in addrs.tolist()), np.uint64, addrs.shape[0])

    # ------------------------------------------------------------ split-phase reads
    # access() returns when its SSD reads are done, so a host thread has at most one
    # pass in flight. A host that keeps many reads of its own in flight (fio's engine at
    # iodepth N) starts them with read_start() and collects each as its fills complete
    # with read_reap(), on one thread and one ring: no batch waits for its slowest read.
    # The rules are those of access() with the lock released: a started read's slots
    # are BUSY until it ends, victims are written back under the lock before its fills
    # are queued, and counters, poison and checksum records change only under the lock.
    def read_start(self, ext_hpa, ext_len, addrs, owner: int = 0):
        """Start reading extent e into the host buffer at addrs[e], for every e, without
        waiting for the SSD. Returns None when the read is already complete (every block
        was in DRAM, or this device runs reads whole: model clock, no data, injected
        faults), WOULD_BLOCK when it cannot start without waiting for one of this
        thread's own reads in flight (a block of it is in flight, or DRAM or ring room
        is taken: reap, then try again), else a ReadTicket whose extents complete
        through read_reap() on this thread."""
        ext_hpa = np.ascontiguousarray(ext_hpa, np.int64)
        ext_len = np.ascontiguousarray(ext_len, np.int64)
        addrs = np.ascontiguousarray(addrs, np.int64)
        if not ext_hpa.shape == ext_len.shape == addrs.shape or ext_hpa.ndim != 1:
            raise ValueError("extent addresses, lengths and buffers must be 1-D arrays of equal length")
        bad, blocks = fw.check_extents(ext_hpa, ext_len, self.capacity, self.block_size)
        if bad >= 0:
            self.check_extent(int(ext_hpa[bad]), int(ext_len[bad]))
        mine = self._read_tickets()
        with self._lock:
            split = self.splits_reads and 0 < blocks <= min(self._batch_limit(), self.ssd.queue_depth)
            if split:
                if self._blocked(ext_hpa, ext_len) or blocks > self.ssd.async_room():
                    if mine:
                        return WOULD_BLOCK  # waiting here could wait for this thread's own reads
                    self._wait_for_slots(ext_hpa, ext_len)  # only other threads' accesses: safe
                if self.poison:  # in the hold that plans (the wait may have let a thread poison)
                    for hpa, n in zip(ext_hpa.tolist(), ext_len.tolist()):
                        self._check_poison(hpa, n, False)
                return self._plan_read(ext_hpa, ext_len, addrs, owner, blocks, mine)
        if mine and blocks:
            return WOULD_BLOCK  # read whole only with nothing of this thread's in flight
        for hpa, n, addr in zip(ext_hpa.tolist(), ext_len.tolist(), addrs.tolist()):
            self.access_one(hpa, n, addr, False, owner)  # whole, one extent after the other
        return None

    # ------------------------------------------------------------ streamed reads
    def read_stream(self, ext_hpa, ext_len, addrs, depth: int, *, deadline_ns: int = 0, slat=None, clat=None,
                    owner: int = 0) -> StreamResult:
        """Read extent i into the host buffer at addrs[i], in order, keeping up to `depth`
        of them in flight, the per-read work compiled (cxlhm/readstream.py). Stops early
        at CLOCK_MONOTONIC `deadline_ns` (if > 0), and before the first read touching a
        poisoned block (those take the erroring
        path): the result says how many ran. Their submission and
        completion latencies (ns) go to `slat` and `clat` when given. Every read that
        ran is complete on return, its bytes in its buffer, or raised: a read whose
        fill failed is read again through access(), which retries and poisons."""
        ext_hpa = np.ascontiguousarray(ext_hpa, np.int64)
        ext_len = np.ascontiguousarray(ext_len, np.int64)
        addrs = np.ascontiguousarray(addrs, np.int64)
        n = ext_hpa.shape[0]
        if not ext_hpa.shape == ext_len.shape == addrs.shape or ext_hpa.ndim != 1:
            raise ValueError("extent addresses, lengths and buffers must be 1-D arrays of equal length")
        bad, _ = fw.check_extents(ext_hpa, ext_len, self.capacity, self.block_size)
        if bad >= 0:
            self.check_extent(int(ext_hpa[bad]), int(ext_len[bad]))
        slat = np.zeros(n, np.int64) if slat is None else slat
        clat = np.zeros(n, np.int64) if clat is None else clat
        if not self.splits_reads or n == 0 or depth < 1 or self.reads_in_flight():
            return StreamResult(0, 0, 0)
        # the most blocks a stream read holds; wider reads run through access(), which splits them
        max_blocks = min(max(1, int(rs.blocks_per_read(ext_hpa, ext_len, self.block_size))), self._batch,
                         self.ssd.queue_depth)
        complete, run = rs.kernels_for(self.policy)
        state = self._stream_state(min(depth, self.ssd.queue_depth), max_blocks, complete)
        st = state.st
        st[:] = 0
        st[rs.PARKED] = -1
        state.submits[:] = 0
        failed = np.zeros(n, np.int64)
        job = _StreamJob(run, complete, state, ext_hpa, ext_len, addrs, slat, clat, failed, *self.ssd.stream_ring(),
                         owner)
        stop, version = self._stream_stop(ext_hpa, ext_len, n)
        hits0, misses0 = self.thread_hits_misses()
        counted = held = 0  # fills the back end was told of, slots the device was told of
        try:
            while True:
                with self._lock:
                    if self.closed:
                        raise DeviceClosed("the device is closed")
                    if len(self.poison.blocks) != version:  # new poison records: stop here
                        stop = min(stop, int(st[rs.NEXT]))
                    self._sync_time()  # once per time slice: the policy's deadlines and ages read it
                    status = self._stream_run(job, stop, deadline_ns, counted, held)
                    if status == rs.WRITE_BACK or status == rs.DEVICE_FULL:  # before any thread misses on them
                        self._write_rows(state.writebacks[:int(st[rs.PARKED_WBS])], victims=True)
                    if status == rs.VERIFY:
                        self._stream_verify(state, complete, ext_hpa, ext_len, addrs, clat, failed)
                    counted, held = self._stream_account(st, counted, held)
                    self._idle.notify_all()  # reads of this stream may have ended: threads waiting for their slots
                    if status == rs.DEVICE_FULL:
                        raise DeviceFull("no evictable device-DRAM slot: every slot is pinned or in use")
                    alone = not self._inflight
                    if status == rs.BLOCKED and not alone:  # another thread's access holds what it needs
                        i = int(st[rs.NEXT])
                        self._wait_for_slots(ext_hpa[i:i + 1], ext_len[i:i + 1])
                    elif status == rs.FINISHED:
                        break
                if status == rs.WIDE or (status == rs.BLOCKED and alone):  # access() splits it over passes
                    i = int(st[rs.NEXT])
                    begin = time.monotonic_ns()
                    self.access_one(int(ext_hpa[i]), int(ext_len[i]), int(addrs[i]), False, owner, stream=False)
                    clat[i], slat[i] = time.monotonic_ns() - begin, 0
                    st[rs.NEXT] = i + 1
        finally:
            if st[rs.IN_FLIGHT]:  # an error: collect what is in flight, or its slots stay BUSY
                self._stream_drain(job, counted, held)
        s = self._scratch()
        s.hits += int(st[rs.HITS])
        s.misses += int(st[rs.MISSES])
        for i in failed[:int(st[rs.FAILED])].tolist():  # again, through the path that retries and poisons
            self.access_one(int(ext_hpa[i]), int(ext_len[i]), int(addrs[i]), False, owner, stream=False)
        return StreamResult(int(st[rs.NEXT]), s.hits - hits0, s.misses - misses0, state.submits.copy(),
                            int(st[rs.PEAK]))

    def _stream_state(self, depth: int, max_blocks: int, complete) -> rs.StreamState:
        state = getattr(self._local, "stream", None)
        if state is None or state.depth != depth or state.max_blocks < max_blocks:
            state = self._local.stream = rs.StreamState(depth, max_blocks)
            # compile the verifying completion now, not in the middle of a timed stream
            empty = np.zeros(0, np.int64)
            complete(self.bt, self.ps, self.clock, self.dram.base_address, self.block_size, empty, empty, empty,
                     empty, empty, state.arrays(), empty, empty, state.bad[:0], 0, empty, _NO_SUMS)
        return state

    def _stream_stop(self, hpas, lens, n: int) -> tuple[int, int]:
        """Where the stream must stop (the reads before it touch no poisoned block), and
        the poison table's size it was computed for."""
        with self._lock:
            poisoned = np.array(sorted(self.poison.blocks), np.int64)
        return rs.clean_prefix(hpas, lens, self.block_size, poisoned), poisoned.shape[0]

    def _stream_verify_mode(self) -> tuple[int, np.ndarray, np.ndarray]:
        """Under the lock: how a stream verifies its reaped blocks (readstream's VERIFY_*),
        and the sum table it reads (its arrays change when it grows)."""
        table = self.checksums.sums.table
        if table.count == 0:
            return rs.VERIFY_NONE, table.keys, table.values
        return (rs.VERIFY_HERE if sumtable.COMPILED_HASH else rs.VERIFY_ALL), table.keys, table.values

    def _stream_verify(self, state, complete, hpas, lens, addrs, clat, failed) -> None:
        """Under the lock: the stream's last reap, checked against the blocks' checksum
        records (a mismatch poisons the block; its read fails over to access()), then
        completed."""
        st = state.st
        if st[rs.ERRNO]:
            err, st[rs.ERRNO] = int(-st[rs.ERRNO]), 0
            raise MediaError(err, f"io_uring reap failed: {os.strerror(err)}")
        n = int(st[rs.REAPED])
        tags, res, bad, blocks = state.reaped_tags[:n], state.reaped_res[:n], state.bad[:n], state.blocks[:n]
        bad[:] = 0
        rs.reaped_blocks(state.arrays(), self.block_size, hpas, tags, n, blocks)
        sums = self.checksums.sums
        for j, block in enumerate(blocks.tolist()):
            if block in sums and res[j] == self.block_size:
                if not self.checksums.matches(block, self.dram.slots[rs.slot_of_reaped(state.arrays(), tags[j])]):
                    bad[j] = 1
                    self.counters[C.CHECKSUM_MISMATCHES] += 1
                    self._poison(block, "checksum mismatch on SSD read")
        complete(self.bt, self.ps, self.clock, self.dram.base_address, self.block_size, hpas, lens, addrs, clat,
                 failed, state.arrays(), tags, res, bad, n, _NO_BLOCKS, _NO_SUMS)
        st[rs.REAPED] = 0

    def _stream_account(self, st, counted: int, held: int) -> tuple[int, int]:
        """Under the lock: tell the back end how many fills the stream has out on its ring,
        and the device how many slots it holds BUSY (other threads plan around them, and
        count it as an access in flight while it holds any). Returns both for next time."""
        fills, slots = int(st[rs.FILLS]), int(st[rs.SLOTS])
        self.ssd.note_queued(fills - counted)
        self._inflight_slots += slots - held
        self._inflight += (slots > 0) - (held > 0)
        return fills, slots

    def _stream_run(self, job: "_StreamJob", stop: int, deadline_ns: int, counted: int, held: int) -> int:
        """Under the lock: one time slice of the stream's compiled loop (readstream.run)."""
        return job.run(self.bt, self.ps, self.counters, self.clock, self._write_mode_code, self.dram.base_address,
                       self.block_size, job.hpas, job.lens, job.addrs, stop, deadline_ns, job.slat, job.clat,
                       job.failed, job.state.arrays(), job.ring, job.fd, self.ssd.async_room() + counted,
                       self._inflight_slots - held, self.n_slots, job.owner, *self._stream_verify_mode())

    def _stream_drain(self, job: "_StreamJob", counted: int, held: int) -> None:
        """After an error: issue nothing more, wait for the stream's fills in flight and
        complete them (their slots must not stay BUSY)."""
        st = job.state.st
        while st[rs.IN_FLIGHT]:
            with self._lock:
                if self._stream_run(job, int(st[rs.NEXT]), 0, counted, held) == rs.VERIFY:
                    self._stream_verify(job.state, job.complete, job.hpas, job.lens, job.addrs, job.clat, job.failed)
                counted, held = self._stream_account(st, counted, held)
                self._idle.notify_all()

    @property
    def splits_reads(self) -> bool:
        """Whether read_start() really splits reads (else it runs them whole): not on the
        model clock (it charges each access whole, in issue order), nor without data,
        nor with injected faults (FaultInjector.submit has no split-phase form)."""
        return self.model is None and self.moves_data and type(self.ssd) is SsdBackend

    def _blocked(self, hpas, lens) -> bool:
        if not self._inflight:
            return False
        blocks, busy = fw.touches_busy(self.bt, hpas, lens, self.block_size)
        return busy or blocks > self.n_slots - int(self.bt.scalars[btm.N_PINNED]) - self._inflight_slots

    def _plan_read(self, hpas, lens, addrs, owner, blocks, mine) -> ReadTicket | None:
        """read_start under the lock: plan, write back victims, queue the fills."""
        s = self._scratch()
        t = ReadTicket(self._ticket_ids, hpas, lens, addrs, blocks)
        self._ticket_ids += 1
        counters = self.counters
        hits, misses = counters.item(C.HITS), counters.item(C.MISSES)
        ok, k, n_wb, n_fill = self.kernels.plan(
            self.bt, self.ps, counters, self.clock, hpas, lens, False, self._write_mode_code, owner,
            self.dram.base_address, self.block_size, t.slots, t.installed, s.writebacks, t.fills)
        s.hits += counters.item(C.HITS) - hits
        s.misses += counters.item(C.MISSES) - misses
        t.k, t.n_fill = k, n_fill
        try:
            if n_wb:  # under the lock: on the SSD before any thread can miss on these blocks
                self._write_rows(s.writebacks[:n_wb], victims=True)
            if not ok or not n_fill:  # nothing to wait for (all hits), or no room: run it whole
                if n_fill:
                    for slot in t.slots[:k][self._read_rows(t.fills[:n_fill])]:
                        self.kernels.invalidate(self.bt, self.ps, slot, int(self.clock[0]))
                if ok:
                    t.link(self.block_size)
                    fw.copy_extents_each(self.dram.base_address, self.block_size, t.slots, t.ext_first, hpas, lens,
                                         addrs, np.arange(hpas.shape[0]), True)
        except BaseException:
            fw.finish(self.bt, t.slots, k)
            raise
        if not ok or not n_fill:
            fw.finish(self.bt, t.slots, k)
            if not ok:
                raise DeviceFull("no evictable device-DRAM slot: every slot is pinned or in use by this access")
            return None
        ready = t.link(self.block_size)
        queued = self.ssd.queue(t.fills[:n_fill], t.id * TICKET_TAG + np.arange(n_fill, dtype=np.int64))
        assert queued == n_fill  # room was checked in read_start
        self._inflight += 1
        self._inflight_slots += k
        mine[t.id] = t
        if ready.size:  # extents whose blocks were all in DRAM: complete now
            fw.copy_extents_each(self.dram.base_address, self.block_size, t.slots, t.ext_first, hpas, lens, addrs,
                                 ready, True)
            self._local.ready.append((t, ready, np.zeros(ready.size, bool)))
            t.left -= ready.size
        return t

    def read_reap(self, most: int = 0) -> list:
        """Collect this thread's started reads: waits until at least one extent is
        complete (unless none is in flight) and returns (ticket, extents, failed) for
        the extents completed now - their bytes are in their buffers, except where
        `failed` (a bool array) says they could not be read (the blocks are poisoned).
        `most` > 0 takes at most that many SSD completions (the rest wait for the next
        call), so a host can start new reads before the SSD runs dry. A ticket whose
        extents have all completed gives its slots back."""
        mine = self._read_tickets()
        out, self._local.ready = self._local.ready, []
        if not mine:
            return out
        tags, res = self.ssd.reap(0 if out else 1, most)
        if not tags.shape[0]:
            if not out and not self.ssd.queued():  # reads waiting for fills nobody will complete
                raise RuntimeError("split-phase reads lost track of their SSD reads")
            return out
        ids, rows = np.divmod(tags, TICKET_TAG)
        ended = []
        base, bs = self.dram.base_address, self.block_size
        first = int(ids[0])
        single = bool((ids == first).all())  # the usual case: every completion is one read's
        for tid in ([first] if single else np.unique(ids).tolist()):
            t = mine[tid]  # no lock below: these slots are BUSY, this thread's
            if single:
                mine_rows, got = rows, res
            else:
                mine_rows, got = rows[ids == tid], res[ids == tid]
            t.res[mine_rows] = got
            good = got == t.fills[mine_rows, 1]
            if not good.all():
                t.troubled = True
                if self.retries:  # failed or short: again, whole, on the batch ring
                    for row in mine_rows[~good].tolist():
                        again, retried = self._submit_retrying(t.fills[row:row + 1], self.retries - 1)
                        t.res[row], t.retries = again[0], t.retries + 1 + retried
                    good = t.res[mine_rows] == t.fills[mine_rows, 1]
            for i in self._rows_with_sums(t.fills[mine_rows]):  # safe unlocked: see _read_verified
                if good[i] and not self._fill_matches(t.fills[mine_rows[i]]):
                    t.mismatch[mine_rows[i]] = t.troubled = True
                    good[i] = False
            ready = t.rows_done(mine_rows, good)
            if ready.size:
                failed = t.failed[ready]
                fine = ready[~failed] if failed.any() else ready
                if fine.size:
                    fw.copy_extents_each(base, bs, t.slots, t.ext_first, t.hpas, t.lens, t.addrs, fine, True)
                out.append((t, ready, failed))
                t.left -= ready.size
                if t.left == 0:
                    ended.append(t)
        if ended:
            with self._lock:
                for t in ended:
                    self._end_read(t)
                    del mine[t.id]
                self._idle.notify_all()
        return out

    def _end_read(self, t: ReadTicket) -> None:
        """Under the lock: count, poison what could not be read, release the slots."""
        if t.troubled:  # a fill failed, was retried or did not match its checksum
            bad = self._settle_reads(t.fills[:t.n_fill], t.res, t.retries, t.mismatch)
        else:
            bad = None
        if bad is not None and bad.any():
            now = int(self.clock[0])
            for slot in t.slots[:t.k][t.installed[:t.k].astype(bool)][bad]:  # never leave unfilled slots mapped
                self.kernels.invalidate(self.bt, self.ps, slot, now)
        fw.finish(self.bt, t.slots, t.k)
        self._inflight -= 1
        self._inflight_slots -= t.k

    def reads_in_flight(self) -> int:
        """Started reads of the calling thread not yet fully reaped."""
        return len(self._read_tickets())

    def _read_tickets(self) -> dict:
        mine = getattr(self._local, "tickets", None)
        if mine is None:
            mine = self._local.tickets = {}
            self._local.ready = []
        return mine

    def _slot_bytes(self, addr: int) -> np.ndarray:
        return self.dram.slots[(addr - self.dram.base_address) // self.block_size]

    def _poison(self, block: int, reason: str) -> None:
        if block not in self.poison.blocks:
            self.counters[C.POISONED_BLOCKS] += 1
        self.poison.add(block, reason)

    def poison_records(self, dpa: int, length: int, max_records: int):
        """Get Poison List: poisoned blocks intersecting [dpa, dpa+length), as whole blocks."""
        from cxlhm.mailbox.poison import PoisonList, PoisonRecord
        bs = self.block_size
        with self._lock:  # host threads add poison while the mailbox thread lists it
            blocks = sorted(b for b in self.poison.blocks if b * bs < dpa + length and (b + 1) * bs > dpa)
        records = tuple(PoisonRecord(b * bs, bs) for b in blocks[:max_records])
        return PoisonList(records=records, more_records=len(blocks) > max_records)

    def _write_through(self, slots: np.ndarray) -> None:
        unique = np.unique(slots)
        ops = fw.new_io_rows(unique.shape[0])
        ops[:, 0] = self.dram.base_address + unique * self.block_size
        ops[:, 1] = self.block_size
        ops[:, 2] = self.bt.block[unique] * self.block_size
        ops[:, 3] = 1
        failed = self._write_rows(ops, victims=False)
        if failed.any():
            self.bt.flags[unique[failed]] |= btm.DIRTY  # the DRAM copy is right: keep it for a later write-back
            block = int(ops[np.flatnonzero(failed)[0], 2] // self.block_size)
            raise MediaError(5, f"write-through of block {block} to the SSD failed; the data stays in device DRAM")
        n = unique.shape[0]
        self.counters[C.WRITEBACKS] += n
        self.counters[C.SSD_WRITES] += n
        self.counters[C.SSD_WRITE_BYTES] += n * self.block_size

    # ------------------------------------------------------------ hints and background work
    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0, *,
             lock_timeout: float = -1) -> bool:
        """Deliver a request-lifecycle hint. PIN/UNPIN are carried out by the runtime;
        every other kind goes to the policy's compiled on_hint hook. The caller (the
        mailbox) validates the range. Hints are advisory: returns False when one was
        not followed (e.g. a pin that would leave no DRAM for misses). `lock_timeout`
        (seconds, -1: no limit): DeviceBusy if the data path holds the device longer."""
        if not self._lock.acquire(timeout=lock_timeout):
            raise DeviceBusy(f"the device was busy for {lock_timeout} s")
        try:
            if self.closed:
                return False
            self._sync_time()
            if kind in (HintKind.PIN, HintKind.UNPIN):
                return self._pin(first_block, n_blocks, kind == HintKind.PIN)
            self.kernels.hint(self.bt, self.ps, self.clock, kind, session, first_block, n_blocks, arg)
        finally:
            self._lock.release()
        self._background_wake.set()
        return True

    def run_background(self, budget: int = 32) -> int:
        """Run up to `budget` jobs of the policy's background work (prefetches, flushes)
        now. Returns the number of jobs the policy handed out (0: nothing to do)."""
        with self._lock:
            return self._run_background_locked(budget)

    def _run_background_locked(self, budget: int = 32) -> int:
        if self.closed:
            return 0
        self._sync_time()
        budget = min(budget, self._jobs.shape[0], self._batch_limit())
        n = self.kernels.background(self.bt, self.ps, self.clock, budget, self._jobs)
        self._background_done_ns = self.model.now_ns if self.model is not None else 0.0
        jobs = self._jobs[:n]
        prefetch = jobs[jobs[:, 0] == JOB_PREFETCH]
        if prefetch.shape[0]:
            self._prefetch_locked(prefetch[:, 1].copy(), prefetch[:, 2].copy())
        flush = jobs[jobs[:, 0] == JOB_FLUSH, 1]
        if flush.shape[0]:
            self.counters[C.BG_FLUSHES] += self._write_back(fw.plan_flush, flush.copy())
        return n

    def prefetch(self, blocks: np.ndarray, owners: np.ndarray | None = None) -> int:
        """Read `blocks` (device block numbers) SSD -> DRAM ahead of use; resident ones
        are skipped. Returns the number of blocks read."""
        with self._lock:
            return self._prefetch_locked(blocks, owners)

    def _prefetch_locked(self, blocks: np.ndarray, owners: np.ndarray | None = None) -> int:
        # Background work keeps the lock through its I/O: it is off the host's path, and
        # its blocks are in flight only while nobody else can plan.
        blocks = np.ascontiguousarray(blocks, np.int64)
        owners = np.zeros_like(blocks) if owners is None else np.ascontiguousarray(owners, np.int64)
        s = self._scratch()
        done = 0
        limit = self._batch_limit()
        for start in range(0, blocks.shape[0], limit):
            chunk = slice(start, start + limit)
            k, n_wb, n_fill = self.kernels.plan_prefetch(
                self.bt, self.ps, self.counters, self.clock, blocks[chunk], owners[chunk],
                self.dram.base_address, self.block_size, s.slots_out, s.writebacks, s.fills)
            try:
                if self.moves_data:
                    if n_wb:
                        self._write_rows(s.writebacks[:n_wb], victims=True)
                    if n_fill:
                        bad = self._read_rows(s.fills[:n_fill])
                        for slot in s.slots_out[:k][bad]:  # never leave unfilled slots mapped
                            self.kernels.invalidate(self.bt, self.ps, slot, int(self.clock[0]))
            finally:
                fw.finish(self.bt, s.slots_out, k)
            if self.model is not None:
                t = self.model.charge_prefetch(self.model.now_ns, s.fills, n_fill, s.writebacks, n_wb,
                                               s.slots_out, k)
                self._background_done_ns = max(self._background_done_ns, t)
            done += k
        return done

    def advance_to(self, t_ns: float) -> None:
        """Model clock only: let time pass until `t_ns` with the host idle, giving the
        gap to the firmware's background work (prefetches, write-backs)."""
        if self.model is None:
            raise ValueError("advance_to() needs clock: model (on the wall clock, time passes by itself)")
        with self._lock:
            self._idle_until(float(t_ns))

    def _idle_until(self, t_ns: float) -> None:
        """Run background rounds back to back - each issued when the previous one is
        done - while they start before `t_ns`; then the clock reads `t_ns`."""
        while self.model.now_ns < t_ns:
            if self._run_background_locked() == 0:
                break
            # the next round starts when this one's work is done (a round that moved no
            # data takes no time, but the policy's queue shrank, so the loop ends)
            self.model.now_ns = max(self.model.now_ns, min(self._background_done_ns, t_ns))
        self.model.now_ns = max(self.model.now_ns, t_ns)

    def _pin(self, first_block: int, n_blocks: int, pin: bool) -> bool:
        if not pin:
            btm.set_pinned(self.bt, first_block, n_blocks, False)
            return True
        # Leave at least one slot for misses, or every later access would fail.
        if int(self.bt.scalars[btm.N_PINNED]) + n_blocks > self.n_slots - 1:
            return False
        missing = btm.set_pinned(self.bt, first_block, n_blocks, True)
        if missing:
            self._prefetch_locked(np.arange(first_block, first_block + n_blocks, dtype=np.int64))
            missing = btm.set_pinned(self.bt, first_block, n_blocks, True)
        return missing == 0

    def _sync_time(self) -> None:
        """Policies read the time (deadlines, pauses) from the block table."""
        if self.model is not None:
            self.bt.scalars[btm.NOW_NS] = int(self.model.now_ns)
        else:
            self.bt.scalars[btm.NOW_NS] = time.monotonic_ns() - self._t0_ns

    def _background_loop(self) -> None:
        """The firmware's idle loop: run background work whenever the policy has some."""
        while not self._stop_background.is_set():
            try:
                ran = self.run_background()
            except Exception as exc:  # a failed prefetch must not kill the firmware
                self.background_error = exc
                ran = 0
            if not ran:
                self._background_wake.wait(0.01)
                self._background_wake.clear()

    def _stop_background_thread(self) -> None:
        if self._background_thread is not None:
            self._stop_background.set()
            self._background_wake.set()
            self._background_thread.join()
            self._background_thread = None

    # ------------------------------------------------------------ control
    def flush(self) -> int:
        """Write every dirty block back to the SSD (blocks stay cached). Returns blocks
        written. Blocks of accesses still in flight in other threads are not complete,
        so not flushed (close() waits for them)."""
        with self._lock:
            written = self._flush_locked()
        if self.power_lost:  # reliability: the power went before or during it: nothing is durable
            raise DeviceClosed("the device lost power: the flush did not complete")
        return written

    def _flush_locked(self) -> int:
        if self.closed:
            return 0
        written = self._write_back(lambda bt, _, base, bs, rows: fw.collect_dirty(bt, base, bs, rows, rows.shape[0]), None)
        if self.moves_data:
            self.ssd.sync()
            self.checksums.sync()  # reliability: the integrity log too
        if self.model is not None:  # durable on NAND, like a Global Persistent Flush
            self.model.now_ns = max(self.model.now_ns, charge_flush(self.timing.params, self.timing.state,
                                                                    self.model.now_ns))
        return written

    def _write_back(self, collect, blocks) -> int:
        """Write back what `collect(bt, blocks, base, block_size, rows) -> n` selects,
        round after round until it selects nothing; marks those blocks clean."""
        written = 0
        rows = self._scratch().writebacks
        while True:
            n = collect(self.bt, blocks, self.dram.base_address, self.block_size, rows)
            if n == 0:
                break
            if self.moves_data:
                failed = self._write_rows(rows[:n], victims=False)
                if failed.any():  # the blocks stay dirty in DRAM; stop instead of retrying forever
                    ok = rows[:n][~failed]
                    fw.mark_clean(self.bt, self.dram.base_address, self.block_size, ok, ok.shape[0])
                    written += ok.shape[0]
                    break
            if self.model is not None:
                done = self.model.charge_write_back(self.model.now_ns, rows, n)
                self._background_done_ns = max(self._background_done_ns, done)
            fw.mark_clean(self.bt, self.dram.base_address, self.block_size, rows, n)
            written += n
            if blocks is not None:
                break  # a block list is done in one round
        self.counters[C.WRITEBACKS] += written
        self.counters[C.SSD_WRITES] += written
        self.counters[C.SSD_WRITE_BYTES] += written * self.block_size
        return written

    def stats(self) -> dict:
        out = C.as_dict(self.counters)
        out["resident_blocks"] = int(self.n_slots - self.bt.scalars[btm.N_FREE])
        out["dirty_blocks"] = int(np.count_nonzero(self.bt.flags & btm.DIRTY))
        if self.model is not None:
            out["model_now_ns"] = self.model.now_ns
            out.update(self.timing.stats())
        return out

    def start_mailbox(self, **options) -> Mailbox:
        """The register block and the firmware thread that services its doorbell."""
        with self._lock:
            if self.mailbox is None:
                self.mailbox = Mailbox(self, **options).start()
            return self.mailbox

    def warm_up(self) -> None:
        """Compile the hint-side kernels now (the mailbox calls this before it reports
        ready), so the first PIN does not spend seconds compiling past a host timeout."""
        with self._lock:
            empty = np.zeros(0, np.int64)
            s = self._scratch()
            btm.set_pinned(self.bt, 0, 0, False)
            self.kernels.plan_prefetch(self.bt, self.ps, self.counters, self.clock, empty, empty,
                                       self.dram.base_address, self.block_size, s.slots_out,
                                       s.writebacks, s.fills)

    def close(self) -> None:
        """Flush dirty DRAM (like CXL Global Persistent Flush) and release everything."""
        if self.power_lost:  # reliability: nothing to flush with, and nothing may reach the SSD now
            return self.simulate_power_loss()
        # Outside the lock: the mailbox and firmware threads may be waiting for it.
        if self.mailbox is not None:
            self.mailbox.close()
        self._stop_background_thread()
        if not self.closed:
            while self.reads_in_flight():  # this thread's own split reads: collect them, or wait forever
                self.read_reap()
        with self._lock:
            if self.closed:
                return
            while self._inflight:  # accesses in flight finish first: their bytes go in the flush
                self._idle.wait()
            try:
                self._flush_locked()
                for slot in np.flatnonzero(self.bt.flags & btm.DIRTY):  # could not be written back
                    self._poison(int(self.bt.block[slot]), "lost at close: write-back failed")
                if self.moves_data:
                    self.checksums.save()
                self._write_metadata(clean=True)
            finally:
                self.closed = True
                self._idle.notify_all()  # threads waiting to plan now see DeviceClosed
                if self.ssd is not None:
                    self.ssd.close()
                self.checksums.close()  # reliability: the integrity log
                self.dram.close()


    # ------------------------------------------------------------ reliability: crashes and power loss (issue 10)
    # Added as a block of its own; see cxlhm/integrity.py and cxlhm/media/faults.py.
    def _open_integrity_log(self) -> None:
        """The integrity log keeps checksums and poison right across an unclean shutdown
        (replayed here after one); a power cut injected by the back end freezes it."""
        self.checksums.attach_log(Path(self.ssd.path + ".cxlhm.ilog"), self.poison,
                                  unclean=self.unclean_shutdown_detected)
        if isinstance(self.ssd, FaultInjector):
            self.ssd.on_power_loss.append(self._on_power_cut)

    def _on_power_cut(self) -> None:
        """At an injected cut (maybe inside an access holding the lock): record nothing
        more, and refuse later accesses - the device has no power. The access in flight
        finishes; what it wrote is lost or poison after the reopen."""
        self.checksums.freeze()
        self._power_cut = True
        self.closed = True

    def arm_power_loss(self, at_write: int | None = None, *, pages: int = -1, torn_bytes: int = -1,
                       action: str = "freeze") -> int:
        """Cut the back end's power while its `at_write`-th write op from now (default:
        the next) is in flight: that write lands only partly, later ones not at all
        (cxlhm/media/faults.py). Wraps the back end in a FaultInjector first if it has
        none. Returns the absolute write number of the cut."""
        with self._lock:
            if self.ssd is None:
                raise ValueError("a device without data (data: none) has no SSD to lose power")
            if not isinstance(self.ssd, FaultInjector):
                self.ssd = FaultInjector(self.ssd, FaultPlan(seed=self.cfg.seed))
                self.ssd.on_power_loss.append(self._on_power_cut)
            return self.ssd.arm_power_loss(at_write, pages=pages, torn_bytes=torn_bytes, action=action)

    @property
    def power_lost(self) -> bool:
        return getattr(self, "_power_cut", False)

    def simulate_power_loss(self) -> None:
        """The power goes now (or went, at an injected cut): nothing more reaches the SSD
        or the integrity log, device DRAM is dropped, and the device is closed without
        close()'s flush and clean-shutdown mark. Reopening the image is an unclean start:
        every block is read back as the bytes last written to it or as poison."""
        if isinstance(self.ssd, FaultInjector):
            self.ssd.cut_power()  # runs _on_power_cut
        else:
            self._on_power_cut()
        if self.mailbox is not None:
            self.mailbox.close()
        self._stop_background_thread()
        while self.reads_in_flight():
            self.read_reap()
        with self._lock:
            if getattr(self, "_released", False):
                return
            while self._inflight:
                self._idle.wait()
            self._released = True
            self._idle.notify_all()
            self.checksums.close()
            if self.ssd is not None:
                self.ssd.close()
            self.dram.close()

    def block_checksums(self, first_block: int, n_blocks: int) -> list[int | None]:
        """The checksum recorded for each block of [first_block, first_block + n_blocks):
        that of the bytes the SSD holds for it (None: never written back, or its bytes
        are lost). Hosts fingerprint durable data with it (the KV store's flush)."""
        with self._lock:
            sums = self.checksums.sums
            poison = self.poison.blocks
            return [None if b in poison else sums.get(b) for b in range(first_block, first_block + n_blocks)]

    def integrity_report(self) -> dict:
        """What the last open recovered and what the integrity log holds now."""
        with self._lock:
            log = self.checksums.log
            return {"unclean_shutdown": self.unclean_shutdown_detected, **self.checksums.recovered,
                    "log_records": log.records if log is not None else 0,
                    "checksummed_blocks": len(self.checksums.sums), "poisoned_blocks": len(self.poison.blocks),
                    "dirty_logged_blocks": len(self.checksums.dirty), "power_lost": self.power_lost}

def _check_fits_in_memory(cfg: DeviceConfig) -> None:
    """Device DRAM (when data moves) and the per-slot metadata are real memory here:
    refuse what this machine cannot hold, before allocating any of it."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    needed = cfg.dram_slots * METADATA_BYTES_PER_SLOT + (cfg.dram_bytes if cfg.data == "real" else 0)
    if needed > physical * 0.8:
        raise ConfigError(cfg.source_of("dram_bytes"), "dram_bytes",
                          f"{cfg.dram_bytes} bytes of device DRAM need {needed} bytes of this machine's {physical} "
                          f"(DRAM when data moves, ~{METADATA_BYTES_PER_SLOT} B of metadata per block slot; at most "
                          f"80% may be used): lower dram_bytes, raise block_size, or use data: none")


def _split_batches(ext_hpa: np.ndarray, ext_len: np.ndarray, block_size: int, limit: int):
    """Yield (hpas, lens, user_offset) groups touching at most `limit` blocks each,
    cutting extents at block boundaries where needed."""
    group_h: list[int] = []
    group_l: list[int] = []
    used = 0
    group_start = pos = 0
    for h, n in zip(ext_hpa.tolist(), ext_len.tolist()):
        while n > 0:
            # bytes of this extent that fit in the blocks left in the group
            fits = (block_size - h % block_size) + (limit - used - 1) * block_size
            take = min(n, fits)
            group_h.append(h)
            group_l.append(take)
            used += (h + take - 1) // block_size - h // block_size + 1
            h, n, pos = h + take, n - take, pos + take
            if used >= limit:
                yield np.array(group_h, np.int64), np.array(group_l, np.int64), group_start
                group_h, group_l, used, group_start = [], [], 0, pos
    if group_h:
        yield np.array(group_h, np.int64), np.array(group_l, np.int64), group_start
