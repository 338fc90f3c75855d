"""The emulated CXL-HM device: device DRAM + a back end + firmware, behind one HDM window.

`Device` is the device side. Hosts use it through `host_runtime.driver`, which adds
buffer handling; the device itself speaks in extents (HPA, length) and raw buffer
addresses, and checks every request as untrusted input.

It is a facade over parts with one job each: this module runs the access path (plan
a firmware pass, fill, copy, settle) and the control operations (flush, close); the
media path (cxlhm/device/media.py) does every I/O with retries, checksums and poison;
the sidecars (sidecar.py) keep what survives a reopen; background work (background.py),
streamed reads and writes (stream.py), write-back waves (waves.py), write-behind
(behind.py) and power-loss emulation (power.py) are parts of their own. The back end
is whichever `backend.kind` names (cxlhm/media/registry.py).

Host threads may use one device at once. One lock guards the firmware state; on the
wall clock an access plans under it, runs its fill reads and its copy without it (its
slots BUSY meanwhile), and settles under it again - so several threads keep I/O in
flight together. A stream (stream_io) holds it for a time slice; while several threads
stream at once, none waits at the SSD with it held (stream.py, _reap_unlocked). The model
clock keeps every access under the lock, in issue order.
"""
from __future__ import annotations

import inspect
import time
import weakref

import numba
import numpy as np

from cxlhm import policies as firmware_policies
from cxlhm import copyengine
from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm import readstream as rs
from cxlhm.config import ConfigError, DeviceConfig
from cxlhm.device.background import BackgroundWork
from cxlhm.device.batches import split_batches
from cxlhm.device.behind import WriteBehind
from cxlhm.device.errors import DeviceClosed, DeviceFull, MediaError, PoisonError, check_extent
from cxlhm.device.footprint import check_fits_in_memory
from cxlhm.device.interface import DeviceCaps
from cxlhm.device.lock import DeviceLock
from cxlhm.device.media import MediaPath
from cxlhm.device.power import PowerLoss
from cxlhm.device.scratch import Scratch, ThreadState
from cxlhm.device.sidecar import Sidecars, open_state
from cxlhm.device.stream import StreamReads
from cxlhm.device.waves import WriteWaves
from cxlhm.mailbox import Mailbox
from cxlhm.mailbox.poison import records_of
from cxlhm.media.dram import DeviceDram
from cxlhm.media.faults import FaultInjector, FaultPlan
from cxlhm.media.registry import open_backend
from cxlhm.modelclock import ModelClock
from cxlhm.timing import LatencyRecorder, TimingModel, charge_flush
from cxlhm.timing.recorder import record as record_latency

MAX_BATCH_BLOCKS = 4096  # blocks planned per firmware pass (bounds the scratch arrays)


class Device(StreamReads, WriteWaves, WriteBehind, BackgroundWork, PowerLoss):
    """The device as the host sees it (cxlhm.device.interface.HostDevice)."""

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

        check_fits_in_memory(cfg)  # before anything sized by DRAM is allocated
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
        self._local = ThreadState()
        # One lock over the block table, policy state, counters, poison and checksum
        # tables; not re-entrant, so releasing it around I/O means what it says (public
        # methods take it, their _locked variants expect it held). `_idle` is notified by
        # every access that released it, when its slots stop being BUSY.
        self._lock = DeviceLock()  # (counts its waiters: a stream's slice goes on while there are none)
        self._idle = self._lock.idle
        self._inflight = 0  # accesses with BUSY slots and the lock released
        self._stream_states: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # per thread: its stream
        # streams running (stream_io calls; changed under the lock): while more than one
        # runs, none waits at the SSD with the lock held (cxlhm/readstream_kernels.py, run)
        self._streams = np.zeros(1, np.int64)
        self._inflight_slots = 0  # slots they hold BUSY
        self.mailbox: Mailbox | None = None
        self.closed = False
        self.unclean_shutdown_detected = False
        self.rebuilt_sidecars = ""  # what backend.lost_sidecar had to rebuild at open ("": nothing)
        self._init_background()
        self._init_behind()

        self.dram = DeviceDram(self.n_slots, self.block_size, data=self.moves_data)
        self.media = MediaPath(None, self.block_size, cfg.backend.retries, self.counters, self.dram)
        self.sidecars: Sidecars | None = None
        if self.moves_data:
            try:
                self._open_media(cfg)
            except BaseException:
                if self.ssd is not None:
                    self.ssd.close()
                self.dram.close()
                raise
        self._init_power()
        self._start_background_thread()

    def _open_media(self, cfg: DeviceConfig) -> None:
        """The back end (its image locked), wrapped in a fault injector if asked, and the
        state its sidecars keep."""
        try:
            faults = FaultPlan.from_mapping(cfg.backend.faults, cfg.seed)
        except ValueError as exc:
            raise ConfigError(cfg.source_of("backend.faults"), "backend.faults", str(exc)) from None
        self.media.ssd = open_backend(cfg)
        self.media.ssd.register_memory(self.dram.base_address, self.dram.nbytes, self.block_size)
        if faults.active:
            self.media.ssd = FaultInjector(self.media.ssd, faults)
        if self.ssd.temporary:
            return
        self.sidecars = Sidecars(self.ssd.path, self.capacity, self.block_size, cfg.source_of)
        state = open_state(self.sidecars, cfg.backend.lost_sidecar)
        self.media.poison, self.media.checksums = state.poison, state.checksums
        self.unclean_shutdown_detected, self.rebuilt_sidecars = state.unclean, state.rebuilt
        self.media.unclean = state.unclean  # (what a checksum mismatch is likely to mean)

    @property
    def ssd(self):
        """The back end (None without data)."""
        return self.media.ssd

    @property
    def image_path(self) -> str | None:
        ssd = self.media.ssd
        return None if ssd is None or ssd.temporary else ssd.path

    @property
    def poison(self):
        return self.media.poison

    @property
    def checksums(self):
        return self.media.checksums

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(streams_io=self.can_stream, model_clock=self.model is not None,
                          moves_data=self.moves_data, integrity=self.moves_data, power_loss=self.moves_data,
                          persistent=self.ssd is not None and not self.ssd.temporary)

    @property
    def can_stream(self) -> bool:
        """Whether I/O may be streamed (stream_io): not on the model clock (it charges
        each access whole, in issue order), nor without data, nor on a back end without
        asynchronous I/O (injected faults too)."""
        return self.model is None and self.moves_data and self.ssd.caps.async_io

    def _write_metadata(self, *, clean: bool) -> None:
        if self.sidecars is not None:
            self.sidecars.write(clean=clean, poison=self.poison)

    def _poison(self, block: int, reason: str) -> None:
        self.media.poison_block(block, reason)

    # ------------------------------------------------------------ access path
    def check_extent(self, hpa: int, n: int) -> None:
        """Raise AccessOutOfRange unless [hpa, hpa+n) lies inside the HDM window."""
        check_extent(hpa, n, self.capacity)

    def _extents(self, ext_hpa, ext_len, addrs=None):
        """Host extents (and their buffer addresses, if given) as int64 arrays, checked:
        (hpas, lens, addrs, blocks they touch)."""
        ext_hpa = np.ascontiguousarray(ext_hpa, np.int64)
        ext_len = np.ascontiguousarray(ext_len, np.int64)
        if addrs is not None:
            addrs = np.ascontiguousarray(addrs, np.int64)
        if ext_hpa.shape != ext_len.shape or ext_hpa.ndim != 1 or (addrs is not None and addrs.shape != ext_hpa.shape):
            raise ValueError("extent addresses, lengths (and buffers) must be 1-D arrays of equal length")
        bad, blocks = fw.check_extents(ext_hpa, ext_len, self.capacity, self.block_size)
        if bad >= 0:
            self.check_extent(int(ext_hpa[bad]), int(ext_len[bad]))
        return ext_hpa, ext_len, addrs, blocks

    def access(self, ext_hpa: np.ndarray, ext_len: np.ndarray, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """Read (or write) the extents, laid end to end in the user buffer at `user_addr`,
        as concurrent I/Os. Returns the latency in ns on the device's clock. On the model
        clock `issue_ns` places the access in time (default: now, and the clock then
        moves to its completion, as for a synchronous host). Host threads may call it
        at once; on the wall clock their SSD reads overlap."""
        ext_hpa, ext_len, _, blocks = self._extents(ext_hpa, ext_len)
        with self._lock:
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
        streamed (stream_io, one read per block): each block is copied out as soon as
        it lands, while the next ones are still being read."""
        self.check_extent(hpa, n)
        bt = self.bt
        if (stream and not is_write and n and self.can_stream
                and (hpa + n - 1) // self.block_size > hpa // self.block_size
                and rs.missing_blocks(bt.index_keys, bt.index_slots, hpa, n, self.block_size, 2) > 1):
            return self._read_streamed(hpa, n, user_addr, owner)  # (the table was read unlocked: it only picks a path)
        with self._lock:
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

    def _access_split(self, ext_hpa, ext_len, user_addr, is_write, owner, t: float, limit: int, s) -> float:
        """An access touching more blocks than one firmware pass may hold: run it in
        pieces, one after the other. The planner counts a host operation per extent
        it sees, so pieces cut from one extent are folded back into one operation."""
        pieces = 0
        for hpas, lens, start in split_batches(ext_hpa, ext_len, self.block_size, limit):
            t = self._access_batch(hpas, lens, user_addr + start, is_write, owner, t, s)
            pieces += hpas.shape[0]
        self.counters[C.HOST_WRITES if is_write else C.HOST_READS] -= pieces - int(np.count_nonzero(ext_len))
        return t

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

    def now_ns(self) -> float:
        """Model clock only: its time (cxlhm.device.interface.ModelClockDevice)."""
        if self.model is None:
            raise ValueError("now_ns() needs clock: model (on the wall clock, read time.perf_counter_ns)")
        return self.model.now_ns

    def _scratch(self) -> Scratch:
        s = self._local.scratch
        if s is None:
            s = self._local.scratch = Scratch(self._batch)
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
            if not busy and blocks <= room and not self._touches_victims(hpas, lens):
                return
            self._lock.wait_idle()
            if self.closed:
                raise DeviceClosed("the device is closed")

    def _access_batch(self, hpas, lens, user_addr, is_write, owner, t: float, s: Scratch) -> float:
        """One firmware pass; returns its completion on the model clock (else `t`).
        Called with the lock held and returns with it held; on the wall clock it is
        released while the pass's fill reads and copy run (_fill_and_copy)."""
        self._settle_behind_for(hpas, lens)  # before waiting: its BUSY slots are freed only by a settle
        self._wait_for_slots(hpas, lens)
        self._settle_behind_for(hpas, lens)  # again: another thread may have written behind during the wait
        if self.bt.scalars[btm.N_PINNED]:  # pins that landed while this pass waited may leave it too few slots
            room = self.n_slots - int(self.bt.scalars[btm.N_PINNED])
            firsts = hpas // self.block_size
            if 0 < room < int(((hpas + np.maximum(lens, 1) - 1) // self.block_size - firsts + 1)[lens > 0].sum()):
                return self._access_split(hpas, lens, user_addr, is_write, owner, t, room, s)
        self._sync_time()  # the policy's deadlines and ages read it
        if not is_write:  # in the hold that plans: a thread that ran meanwhile may have poisoned
            self.media.check_readable(hpas, lens)
        counters = self.counters
        hits, misses = counters.item(C.HITS), counters.item(C.MISSES)
        ok, k, n_wb, n_fill, done = self.kernels.access(
            self.bt, self.ps, counters, self.clock, hpas, lens, is_write, self._write_mode_code,
            owner, self.dram.base_address, self.block_size, s.slots_out, s.installed,
            s.writebacks, s.fills, user_addr, self.moves_data, copyengine.HELPER_MIN_BYTES - 1)
        behind = done and is_write and self._writes_behind(hpas, lens, k)  # (its DIRTY records go with its SUMs)
        sums = None  # a write that goes behind: its blocks' checksums, when its copy made them
        if done == fw.DONE_BUT_COPY:  # a long DRAM hit: on the copy engine's two threads, still under the lock
            sums = self._long_copy(hpas, lens, s.slots_out, k, user_addr, is_write, behind)
        if is_write and not n_wb and not behind and self.checksums.log is not None:  # newer bytes only in DRAM
            self.checksums.note_dirty_array(self.bt.block[s.slots_out[:k]])
        s.hits += counters.item(C.HITS) - hits
        s.misses += counters.item(C.MISSES) - misses
        if self.model is not None:
            through = k * self.block_size if is_write and self._write_mode_code == fw.WRITE_THROUGH else 0
            t = self.model.charge_access(t, is_write, int(lens.sum()), s.fills, n_fill, s.writebacks, n_wb,
                                         s.slots_out, s.installed, k, through, counters)
        if done:
            if is_write:
                self._written(hpas, lens, s.slots_out, k, dirty_logged=not behind, sums=sums)
            return t
        slots = s.slots_out
        # The model clock keeps the lock: its charges were made in issue order above, and
        # releasing would let background work or another host interleave its data moves.
        release = self.moves_data and n_fill > 0 and self.model is None
        if release:
            self._inflight += 1
            self._inflight_slots += k
        try:
            waves = self._write_waves(hpas, lens, is_write and ok, k, n_wb, n_fill, s)
            if waves is not None:
                self._write_in_waves(waves, hpas, user_addr, k, s)
            elif self.moves_data:
                if n_wb:
                    # Under the lock: a victim's bytes are on the SSD before any thread can
                    # miss on its block and read it back from there.
                    self.media.write_rows(s.writebacks[:n_wb], victims=True)
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
                                         f"{self.poison.describe(block)}")
                if ok:
                    if not copied:
                        copyengine.copy_extents(self.dram.base_address, self.block_size, slots, hpas, lens, user_addr,
                                        not is_write)
                    if is_write and self._write_mode_code == fw.WRITE_THROUGH:
                        self.media.write_through(self.bt, slots[:k])
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
        if is_write:  # still under the lock that planned it: no thread reads in between
            self._written(hpas, lens, slots, k, dirty_logged=True)
        return t

    def _fill_and_copy(self, s: Scratch, n_fill: int, hpas, lens, user_addr, is_write, copy: bool,
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
            res, retries, mismatch = self.media.read_verified(rows)
            copied = copy and bool((res == rows[:, 1]).all()) and (mismatch is None or not mismatch.any())
            if copied:
                copyengine.copy_extents(self.dram.base_address, self.block_size, s.slots_out, hpas, lens, user_addr,
                                not is_write)
        finally:
            if release:
                self._lock.acquire()
        return self.media.settle_reads(rows, res, retries, mismatch), copied

    def _invalidate_installed(self, s: Scratch, k: int) -> None:
        now = int(self.clock[0])
        for slot in s.slots_out[:k][s.installed[:k].astype(bool)]:
            if self.bt.block[slot] >= 0:
                self.kernels.invalidate(self.bt, self.ps, slot, now)

    def poison_records(self, dpa: int, length: int, max_records: int):
        """Get Poison List: poisoned blocks intersecting [dpa, dpa+length), as whole blocks."""
        with self._lock:  # host threads add poison while the mailbox thread lists it
            blocks = list(self.poison.blocks)
        return records_of(blocks, self.block_size, dpa, length, max_records)

    # ------------------------------------------------------------ control
    def flush(self) -> int:
        """Write every dirty block back (blocks stay cached) and make it durable. Returns
        blocks written; raises MediaError if a write-back failed (those blocks stay dirty
        in device DRAM: a later flush tries again). Blocks of accesses still in flight
        in other threads are not complete, so not flushed (close() waits for them)."""
        with self._lock:
            written, failed = self._flush_locked()
        if self.power_lost:  # the power went before or during it: nothing is durable
            raise DeviceClosed("the device lost power: the flush did not complete")
        if failed:
            raise MediaError(5, f"write-back of {failed} dirty block(s) failed; they stay in device DRAM "
                                f"({written} written)")
        return written

    def _flush_locked(self) -> tuple[int, int]:
        """(blocks written, blocks whose write-back failed)."""
        if self.closed:
            return 0, 0
        written, failed = self._write_back(
            lambda bt, _, base, bs, rows: fw.collect_dirty(bt, base, bs, rows, rows.shape[0]), None)
        if self.moves_data:
            self.media.sync()
        if self.model is not None:  # durable on NAND, like a Global Persistent Flush
            self.model.now_ns = max(self.model.now_ns, charge_flush(self.timing.params, self.timing.state,
                                                                    self.model.now_ns))
        return written, failed

    def _write_back(self, collect, blocks) -> tuple[int, int]:
        """Write back what `collect(bt, blocks, base, block_size, rows) -> n` selects,
        round after round until it selects nothing; marks those blocks clean. Returns
        (blocks written, blocks whose write-back failed: they stay dirty)."""
        self.settle_behind()  # (its blocks are dirty until it lands)
        written = failed_blocks = 0
        rows = self._scratch().writebacks
        while True:
            n = collect(self.bt, blocks, self.dram.base_address, self.block_size, rows)
            if n == 0:
                break
            if self.moves_data:
                failed = self.media.write_rows(rows[:n], victims=False)
                if failed.any():  # the blocks stay dirty in DRAM; stop instead of retrying forever
                    ok = rows[:n][~failed]
                    fw.mark_clean(self.bt, self.dram.base_address, self.block_size, ok, ok.shape[0])
                    written += ok.shape[0]
                    failed_blocks = int(failed.sum())
                    break
            if self.model is not None:
                done = self.model.charge_write_back(self.model.now_ns, rows, n)
                self._background_done_ns = max(self._background_done_ns, done)
            fw.mark_clean(self.bt, self.dram.base_address, self.block_size, rows, n)
            written += n
            if blocks is not None:
                break  # a block list is done in one round
        self.media.count_writes(written)
        return written, failed_blocks

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
            self.kernels.hints(self.bt, self.ps, self.clock, 0, empty, empty, empty, empty)
            # the policy's own hint kernel, compiled from its argument types without running it
            hint = self.kernels.hint
            if hasattr(hint, "compile"):
                n_args = len(inspect.signature(hint.py_func).parameters)
                args = (self.bt, self.ps, self.clock) + (0,) * (n_args - 3)
                hint.compile(tuple(numba.typeof(a) for a in args))

    def close(self) -> None:
        """Flush dirty DRAM (like CXL Global Persistent Flush) and release everything."""
        if self.power_lost:  # nothing to flush with, and nothing may reach the back end now
            return self.simulate_power_loss()
        # Outside the lock: the mailbox and firmware threads may be waiting for it.
        if self.mailbox is not None:
            self.mailbox.close()
        self._stop_background_thread()
        with self._lock:
            if self.closed:
                return
            while self._inflight:  # accesses in flight finish first: their bytes go in the flush
                self._lock.wait_idle()
            try:
                self._flush_locked()
                for slot in np.flatnonzero(self.bt.flags & btm.DIRTY):  # could not be written back
                    self.media.poison_block(int(self.bt.block[slot]), "lost at close: write-back failed")
                if self.sidecars is not None:
                    saved = self.checksums.save()
                    self.sidecars.write(clean=True, poison=self.poison, sums=saved)
            finally:
                self.closed = True
                self._idle.notify_all()  # threads waiting to plan now see DeviceClosed
                if self.ssd is not None:
                    self.ssd.close()
                self.checksums.close()  # the integrity log
                self.dram.close()


    def block_checksums(self, first_block: int, n_blocks: int) -> list[int | None]:
        """The checksum recorded for each block of [first_block, first_block + n_blocks):
        that of the bytes the SSD holds for it (None: never written back, or its bytes
        are lost). Hosts fingerprint durable data with it (the KV store's flush)."""
        with self._lock:
            self.settle_behind()
            poison = self.poison.blocks
            found, sums = self.checksums.sums.lookup(np.arange(first_block, first_block + n_blocks, dtype=np.int64))
            return [None if b in poison or not f else s
                    for b, f, s in zip(range(first_block, first_block + n_blocks), found.tolist(), sums.tolist())]

    def integrity_report(self) -> dict:
        """What the last open recovered and what the integrity log holds now."""
        with self._lock:
            log = self.checksums.log
            return {"unclean_shutdown": self.unclean_shutdown_detected, **self.checksums.recovered,
                    "log_records": log.records if log is not None else 0,
                    "checksummed_blocks": len(self.checksums.sums), "poisoned_blocks": len(self.poison.blocks),
                    "dirty_logged_blocks": len(self.checksums.dirty), "power_lost": self.power_lost,
                    "rebuilt_sidecars": self.rebuilt_sidecars}
