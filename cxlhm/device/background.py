"""Background work: request-lifecycle hints, prefetches, pins, the policy's idle-time
jobs (prefetch, flush) and the firmware thread that runs them on the wall clock - or,
on the model clock, the idle gaps between host operations.

Background work keeps the device lock through its I/O: it is off the host's path, and
its blocks are in flight only while nobody else can plan.

`BackgroundWork` owns the job table a round is handed out in and the firmware thread
(its wake-up and stop events, the last error it caught). It gets the device state, the
write-behind (settled first: hints and prefetches may evict or pin its blocks), the
write-back (the policy's flush jobs) and the stream registry (blocks a stream is writing
back are not prefetched from the SSD before they land).
"""
from __future__ import annotations

import threading

import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm.device.behind import WriteBehind
from cxlhm.device.state import DeviceState
from cxlhm.device.stream.registry import StreamRegistry
from cxlhm.device.writeback import WriteBack
from cxlhm.mailbox.hints import DeviceBusy, HintKind, deliver_each
from cxlhm.policies import JOB_FLUSH, JOB_PREFETCH, no_background

JOB_SLOTS = 256  # background jobs the policy may hand out per round


class BackgroundWork:
    """Device part: hints, prefetches, pins and the policy's background jobs. Owns the
    job table a round is handed out in and the firmware thread (its wake-up and stop
    events, the last error it caught)."""

    def __init__(self, state: DeviceState, behind: WriteBehind, write_back: WriteBack, stream_registry: StreamRegistry):
        self.state, self.behind, self.write_back, self.stream_registry = state, behind, write_back, stream_registry
        self._jobs = np.zeros((JOB_SLOTS, 3), np.int64)  # (kind, block, session)
        self.error: Exception | None = None  # the last exception the firmware thread caught
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start_thread(self) -> None:
        """On the wall clock with `firmware.background: thread`, when the policy has any."""
        if (self.state.cfg.firmware.background == "thread" and self.state.model_clock is None
                and self.state.policy.background is not no_background):
            self._thread = threading.Thread(target=self._loop, name="cxlhm-firmware",
                                                       daemon=True)
            self._thread.start()

    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0, *,
             lock_timeout: float = -1) -> bool:
        """Deliver a request-lifecycle hint. PIN/UNPIN are carried out by the runtime;
        every other kind goes to the policy's compiled on_hint hook. The caller (the
        mailbox) validates the range. Hints are advisory: returns False when one was
        not followed (e.g. a pin that would leave no DRAM for misses). `lock_timeout`
        (seconds, -1: no limit): DeviceBusy if the data path holds the device longer."""
        state = self.state
        if not state.lock.acquire(timeout=lock_timeout):
            raise DeviceBusy(f"the device was busy for {lock_timeout} s")
        try:
            if state.closed:
                return False
            self.behind.settle()  # hints may evict or pin its blocks
            state.sync_time()
            if kind in (HintKind.PIN, HintKind.UNPIN):
                return self._pin(first_block, n_blocks, kind == HintKind.PIN)
            state.kernels.hint(state.bt, state.ps, state.ticks, kind, session, first_block, n_blocks, arg)
        finally:
            state.lock.release()
        self._wake.set()
        return True

    def hint_batch(self, kind: int, sessions: np.ndarray, first_blocks: np.ndarray, n_blocks: np.ndarray,
                   args: np.ndarray, *, lock_timeout: float = -1) -> int:
        """Hints of one kind (int64 arrays), in order, with one firmware call for the
        batch (hint()'s per-call cost is paid once); returns how many were not followed.
        DeviceBusy when the data path held the device past `lock_timeout` s (its
        `delivered` says how many hints went through first)."""
        state = self.state
        if kind in (HintKind.PIN, HintKind.UNPIN):
            return deliver_each(self.hint, kind, sessions, first_blocks, n_blocks, args, lock_timeout=lock_timeout)
        if not state.lock.acquire(timeout=lock_timeout):
            raise DeviceBusy(f"the device was busy for {lock_timeout} s")
        try:
            if state.closed:
                return sessions.shape[0]
            self.behind.settle()
            state.sync_time()
            state.kernels.hints(state.bt, state.ps, state.ticks, kind, sessions, first_blocks, n_blocks, args)
        finally:
            state.lock.release()
        self._wake.set()
        return 0

    def run(self, budget: int = 32) -> int:
        """Run up to `budget` jobs of the policy's background work (prefetches, flushes)
        now. Returns the number of jobs the policy handed out (0: nothing to do)."""
        with self.state.lock:
            return self.run_locked(budget)

    def run_locked(self, budget: int = 32) -> int:
        if self.state.closed:
            return 0
        self.behind.settle()
        self.state.sync_time()
        budget = min(budget, self._jobs.shape[0], self.state.batch_limit())
        state = self.state
        n = state.kernels.background(state.bt, state.ps, state.ticks, budget, self._jobs)
        state.background_done_ns = state.model_clock.now_ns if state.model_clock is not None else 0.0
        jobs = self._jobs[:n]
        prefetch = jobs[jobs[:, 0] == JOB_PREFETCH]
        if prefetch.shape[0]:
            self.prefetch_locked(prefetch[:, 1].copy(), prefetch[:, 2].copy())
        flush = jobs[jobs[:, 0] == JOB_FLUSH, 1]
        if flush.shape[0]:
            self.state.counters[C.BG_FLUSHES] += self.write_back.write_back(fw.plan_flush, flush.copy())[0]
        return n

    def prefetch(self, blocks: np.ndarray, owners: np.ndarray | None = None) -> int:
        """Read `blocks` (device block numbers) SSD -> DRAM ahead of use; resident ones
        are skipped. Returns the number of blocks read."""
        with self.state.lock:
            return self.prefetch_locked(blocks, owners)

    def prefetch_locked(self, blocks: np.ndarray, owners: np.ndarray | None = None) -> int:
        # Background work keeps the lock through its I/O: it is off the host's path, and
        # its blocks are in flight only while nobody else can plan.
        self.behind.settle()
        blocks = np.ascontiguousarray(blocks, np.int64)
        owners = np.zeros_like(blocks) if owners is None else np.ascontiguousarray(owners, np.int64)
        victims = self.stream_registry.victim_blocks()
        if victims.shape[0]:  # streams' write-backs not landed yet: not read back from the SSD
            keep = ~np.isin(blocks, victims)
            blocks, owners = blocks[keep], owners[keep]
        state = self.state
        s = state.scratch()
        done = 0
        limit = state.batch_limit()
        for start in range(0, blocks.shape[0], limit):
            chunk = slice(start, start + limit)
            k, n_wb, n_fill = state.kernels.plan_prefetch(
                state.bt, state.ps, state.counters, state.ticks, blocks[chunk], owners[chunk],
                state.dram.base_address, state.block_size, s.slots_out, s.writebacks, s.fills)
            try:
                if state.moves_data:
                    if n_wb:
                        state.media.write_rows(s.writebacks[:n_wb], victims=True)
                    if n_fill:
                        bad = state.media.read_rows(s.fills[:n_fill])
                        for slot in s.slots_out[:k][bad]:  # never leave unfilled slots mapped
                            state.kernels.invalidate(state.bt, state.ps, slot, int(state.ticks[0]))
            finally:
                fw.finish(state.bt, s.slots_out, k)
            clock = state.model_clock
            if clock is not None:
                t = clock.charge_prefetch(clock.now_ns, s.fills, n_fill, s.writebacks, n_wb, s.slots_out, k)
                state.background_done_ns = max(state.background_done_ns, t)
            done += k
        return done

    def advance_to(self, t_ns: float) -> None:
        """Model clock only: let time pass until `t_ns` with the host idle, giving the
        gap to the firmware's background work (prefetches, write-backs)."""
        if self.state.model_clock is None:
            raise ValueError("advance_to() needs clock: model (on the wall clock, time passes by itself)")
        with self.state.lock:
            self.idle_until(float(t_ns))

    def idle_until(self, t_ns: float) -> None:
        """Run background rounds back to back - each issued when the previous one is
        done - while they start before `t_ns`; then the clock reads `t_ns`."""
        clock = self.state.model_clock
        while clock.now_ns < t_ns:
            if self.run_locked() == 0:
                break
            # the next round starts when this one's work is done (a round that moved no
            # data takes no time, but the policy's queue shrank, so the loop ends)
            clock.now_ns = max(clock.now_ns, min(self.state.background_done_ns, t_ns))
        clock.now_ns = max(clock.now_ns, t_ns)

    def _pin(self, first_block: int, n_blocks: int, pin: bool) -> bool:
        state = self.state
        if not pin:
            btm.set_pinned(state.bt, first_block, n_blocks, False)
            return True
        # Leave at least one slot for misses, or every later access would fail.
        if int(state.bt.scalars[btm.N_PINNED]) + n_blocks > state.n_slots - 1:
            return False
        missing = btm.set_pinned(state.bt, first_block, n_blocks, True)
        if missing:
            self.prefetch_locked(np.arange(first_block, first_block + n_blocks, dtype=np.int64))
            missing = btm.set_pinned(state.bt, first_block, n_blocks, True)
        return missing == 0

    def _loop(self) -> None:
        """The firmware's idle loop: run background work whenever the policy has some."""
        while not self._stop.is_set():
            try:
                ran = self.run()
            except Exception as exc:  # a failed prefetch must not kill the firmware
                self.error = exc
                ran = 0
            if not ran:
                self._wake.wait(0.01)
                self._wake.clear()

    def stop_thread(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join()
            self._thread = None

