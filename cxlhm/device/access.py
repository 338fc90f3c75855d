"""The access path: a host access as firmware passes - plan under the device lock, fill
from the back end, copy between device DRAM and the host's buffer, settle under the lock
again.

`AccessPath` owns the passes in flight: on the wall clock a pass's fill reads and its
copy run with the lock released (its slots BUSY meanwhile), so several host threads
keep I/O in flight together; the counts of such passes are in the device state, where
streams add theirs. On the model clock every pass keeps the lock and is charged to the
timing model in issue order.

It gets the device state and the parts a pass calls: write-behind (settled before a pass
that touches its blocks; a write may go behind), write-back waves (a large write's
victims), the stream registry (blocks being written back by a stream are not read back
before they land) and background work (on the model clock the idle gap before an access
goes to it).
"""
from __future__ import annotations

import time

import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm.device.background import BackgroundWork
from cxlhm.device.batches import split_batches
from cxlhm.device.behind import WriteBehind
from cxlhm.device.errors import DeviceClosed, DeviceFull, PoisonError, check_extent
from cxlhm.device.scratch import Scratch
from cxlhm.device.state import DeviceState
from cxlhm.device.stream import copyengine
from cxlhm.device.stream.registry import StreamRegistry
from cxlhm.device.waves import WriteWaves
from cxlhm.timing.recorder import record as record_latency


class AccessPath:
    """Device part: access() and access_one() as firmware passes."""

    def __init__(self, state: DeviceState, behind: WriteBehind, waves: WriteWaves, stream_registry: StreamRegistry,
                 background: BackgroundWork):
        self.state, self.behind, self.waves, self.stream_registry, self.background = state, behind, waves, stream_registry, background

    def extents(self, ext_hpa, ext_len, addrs=None):
        """Host extents (and their buffer addresses, if given) as int64 arrays, checked:
        (hpas, lens, addrs, blocks they touch)."""
        state = self.state
        ext_hpa = np.ascontiguousarray(ext_hpa, np.int64)
        ext_len = np.ascontiguousarray(ext_len, np.int64)
        if addrs is not None:
            addrs = np.ascontiguousarray(addrs, np.int64)
        if ext_hpa.shape != ext_len.shape or ext_hpa.ndim != 1 or (addrs is not None and addrs.shape != ext_hpa.shape):
            raise ValueError("extent addresses, lengths (and buffers) must be 1-D arrays of equal length")
        bad, blocks = fw.check_extents(ext_hpa, ext_len, state.capacity, state.block_size)
        if bad >= 0:
            check_extent(int(ext_hpa[bad]), int(ext_len[bad]), state.capacity)
        return ext_hpa, ext_len, addrs, blocks

    def access(self, ext_hpa: np.ndarray, ext_len: np.ndarray, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """Read (or write) the extents, laid end to end in the user buffer at `user_addr`,
        as concurrent I/Os. Returns the latency in ns on the device's clock. On the model
        clock `issue_ns` places the access in time (default: now, and the clock then
        moves to its completion, as for a synchronous host). Host threads may call it
        at once; on the wall clock their SSD reads overlap."""
        state = self.state
        ext_hpa, ext_len, _, blocks = self.extents(ext_hpa, ext_len)
        with state.lock:
            s = state.scratch()
            limit = state.batch_limit()
            started = t = self._begin(issue_ns)
            if blocks <= limit:
                t = self._access_batch(ext_hpa, ext_len, user_addr, is_write, owner, t, s)
            else:
                t = self._access_split(ext_hpa, ext_len, user_addr, is_write, owner, t, limit, s)
            return self._complete(started, t, issue_ns)

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None) -> float:
        """access() for a single extent (checked by the caller), without the array set-up
        (the common host call)."""
        state = self.state
        with state.lock:
            s = state.scratch()
            limit = state.batch_limit()
            started = t = self._begin(issue_ns)
            if n == 0 or (hpa + n - 1) // state.block_size - hpa // state.block_size < limit:
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
        for hpas, lens, start in split_batches(ext_hpa, ext_len, self.state.block_size, limit):
            t = self._access_batch(hpas, lens, user_addr + start, is_write, owner, t, s)
            pieces += hpas.shape[0]
        self.state.counters[C.HOST_WRITES if is_write else C.HOST_READS] -= pieces - int(np.count_nonzero(ext_len))
        return t

    def _begin(self, issue_ns: float | None) -> float:
        """Start an operation: its issue time on the model clock (after giving the idle
        gap before it to background work), or the wall clock's ns."""
        state = self.state
        if state.model_clock is None:
            return time.perf_counter_ns()
        if issue_ns is not None and issue_ns > state.model_clock.now_ns:
            self.background.idle_until(issue_ns)
        return state.model_clock.issue(issue_ns)

    def _complete(self, started: float, done: float, issue_ns: float | None) -> float:
        state = self.state
        if state.closed and state.power_lost:  # reliability: the power went during this access
            raise DeviceClosed("the device lost power during this access: its bytes may be lost")
        if state.model_clock is None:
            latency = time.perf_counter_ns() - started
        else:
            latency = done - started
            if issue_ns is None:  # a synchronous host: the next operation starts after this one
                state.model_clock.now_ns = max(state.model_clock.now_ns, done)
        if state.latency is not None:
            record_latency(state.latency.values, state.latency.meta, float(latency))
        return latency

    def wait_for_slots(self, hpas, lens) -> None:
        """Before planning, while other threads' accesses are in flight: wait (the lock
        released) until none of them holds a block of this pass, and they leave enough
        unpinned slots for it to find victims - else the planner would pick their BUSY
        slots' blocks apart or report DeviceFull. Nothing has been changed yet, so
        waking up and checking again is a plain retry."""
        state = self.state
        while state.inflight:
            blocks, busy = fw.touches_busy(state.bt, hpas, lens, state.block_size)
            room = state.n_slots - int(state.bt.scalars[btm.N_PINNED]) - state.inflight_slots
            if not busy and blocks <= room and not self.stream_registry.touches_victims(hpas, lens):
                return
            state.lock.wait_idle()
            if state.closed:
                raise DeviceClosed("the device is closed")

    def _access_batch(self, hpas, lens, user_addr, is_write, owner, t: float, s: Scratch) -> float:
        """One firmware pass; returns its completion on the model clock (else `t`).
        Called with the lock held and returns with it held; on the wall clock it is
        released while the pass's fill reads and copy run (_fill_and_copy)."""
        state = self.state
        self.behind.settle_for(hpas, lens)  # before waiting: its BUSY slots are freed only by a settle
        self.wait_for_slots(hpas, lens)
        self.behind.settle_for(hpas, lens)  # again: another thread may have written behind during the wait
        if state.bt.scalars[btm.N_PINNED]:  # pins that landed while this pass waited may leave it too few slots
            room = state.n_slots - int(state.bt.scalars[btm.N_PINNED])
            firsts = hpas // state.block_size
            if 0 < room < int(((hpas + np.maximum(lens, 1) - 1) // state.block_size - firsts + 1)[lens > 0].sum()):
                return self._access_split(hpas, lens, user_addr, is_write, owner, t, room, s)
        state.sync_time()  # the policy's deadlines and ages read it
        if not is_write:  # in the hold that plans: a thread that ran meanwhile may have poisoned
            state.media.check_readable(hpas, lens)
        counters = state.counters
        hits, misses = counters.item(C.HITS), counters.item(C.MISSES)
        ok, k, n_wb, n_fill, done = state.kernels.access(
            state.bt, state.ps, counters, state.ticks, hpas, lens, is_write, state.write_mode_code,
            owner, state.dram.base_address, state.block_size, s.slots_out, s.installed,
            s.writebacks, s.fills, user_addr, state.moves_data, copyengine.HELPER_MIN_BYTES - 1)
        behind = done and is_write and self.behind.qualifies(hpas, lens, k)  # (its DIRTY records go with its SUMs)
        sums = None  # a write that goes behind: its blocks' checksums, when its copy made them
        if done == fw.DONE_BUT_COPY:  # a long DRAM hit: on the copy engine's two threads, still under the lock
            sums = self.behind.long_copy(hpas, lens, s.slots_out, k, user_addr, is_write, behind)
        if is_write and not n_wb and not behind and state.media.checksums.log is not None:  # newer bytes only in DRAM
            state.media.checksums.note_dirty_array(state.bt.block[s.slots_out[:k]])
        s.hits += counters.item(C.HITS) - hits
        s.misses += counters.item(C.MISSES) - misses
        if state.model_clock is not None:
            through = k * state.block_size if is_write and state.write_mode_code == fw.WRITE_THROUGH else 0
            t = state.model_clock.charge_access(t, is_write, int(lens.sum()), s.fills, n_fill, s.writebacks, n_wb,
                                         s.slots_out, s.installed, k, through, counters)
        if done:
            if is_write:
                self.behind.written(hpas, lens, s.slots_out, k, dirty_logged=not behind, sums=sums)
            return t
        slots = s.slots_out
        # The model clock keeps the lock: its charges were made in issue order above, and
        # releasing would let background work or another host interleave its data moves.
        release = state.moves_data and n_fill > 0 and state.model_clock is None
        if release:
            state.inflight += 1
            state.inflight_slots += k
        try:
            waves = self.waves.plan(hpas, lens, is_write and ok, k, n_wb, n_fill, s)
            if waves is not None:
                self.waves.write(waves, hpas, user_addr, k, s)
            elif state.moves_data:
                if n_wb:
                    # Under the lock: a victim's bytes are on the SSD before any thread can
                    # miss on its block and read it back from there.
                    state.media.write_rows(s.writebacks[:n_wb], victims=True)
                    if is_write and state.media.checksums.log is not None:  # reliability: after the victims'
                        state.media.checksums.note_dirty_array(state.bt.block[slots[:k]])  # SUMs (one may be re-placed here)
                bad, copied = None, False
                if n_fill:
                    bad, copied = self._fill_and_copy(s, n_fill, hpas, lens, user_addr, is_write, ok, release)
                if bad is not None and bad.any():
                    # Newly placed blocks hold no valid bytes (failed fills; for a write,
                    # also the fully overwritten ones, since the copy will not happen).
                    self._invalidate_installed(s, k)
                    block = int(s.fills[np.flatnonzero(bad)[0], 2] // state.block_size)
                    raise PoisonError(5, f"block {block} (HPA {block * state.block_size:#x}) could not be read: "
                                         f"{state.media.poison.describe(block)}")
                if ok:
                    if not copied:
                        copyengine.copy_extents(state.dram.base_address, state.block_size, slots, hpas, lens, user_addr,
                                        not is_write)
                    if is_write and state.write_mode_code == fw.WRITE_THROUGH:
                        state.media.write_through(state.bt, slots[:k])
                elif is_write:  # no copy: blocks placed for a full overwrite were never filled
                    self._invalidate_installed(s, k)
        finally:
            fw.finish(state.bt, slots, k)
            if release:
                state.inflight -= 1
                state.inflight_slots -= k
                state.idle.notify_all()
        if not ok:
            raise DeviceFull("no evictable device-DRAM slot: every slot is pinned or in use by this access")
        if is_write:  # still under the lock that planned it: no thread reads in between
            self.behind.written(hpas, lens, slots, k, dirty_logged=True)
        return t

    def _fill_and_copy(self, s: Scratch, n_fill: int, hpas, lens, user_addr, is_write, copy: bool,
                       release: bool) -> tuple[np.ndarray, bool]:
        """The pass's fill reads, then - if `copy` and every fill read right - the copy
        between the slots and the host buffer. Returns (mask of fills that failed,
        whether the copy was made).

        With `release` the lock is dropped for both, so other host threads plan and run
        their own I/O meanwhile. What keeps that safe: every slot of this pass is BUSY,
        so no thread evicts, writes back or flushes it, and a thread whose access
        touches one of its blocks waits in wait_for_slots; the I/O rows are this
        thread's scratch; and counters, poison and checksum records are only changed
        after the lock is taken again (_settle_reads)."""
        state = self.state
        rows = s.fills[:n_fill]
        if release:
            state.lock.release()
        try:
            res, retries, mismatch = state.media.read_verified(rows)
            copied = copy and bool((res == rows[:, 1]).all()) and (mismatch is None or not mismatch.any())
            if copied:
                copyengine.copy_extents(state.dram.base_address, state.block_size, s.slots_out, hpas, lens, user_addr,
                                        not is_write)
        finally:
            if release:
                state.lock.acquire()
        return state.media.settle_reads(rows, res, retries, mismatch), copied

    def _invalidate_installed(self, s: Scratch, k: int) -> None:
        state = self.state
        now = int(state.ticks[0])
        for slot in s.slots_out[:k][s.installed[:k].astype(bool)]:
            if state.bt.block[slot] >= 0:
                state.kernels.invalidate(state.bt, state.ps, slot, now)

