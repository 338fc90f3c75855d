"""Background work: request-lifecycle hints, prefetches, pins, the policy's idle-time
jobs (prefetch, flush) and the firmware thread that runs them on the wall clock - or,
on the model clock, the idle gaps between host operations.

Background work keeps the device lock through its I/O: it is off the host's path, and
its blocks are in flight only while nobody else can plan.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm.mailbox.hints import DeviceBusy, HintKind, deliver_each
from cxlhm.policies import JOB_FLUSH, JOB_PREFETCH, no_background

JOB_SLOTS = 256  # background jobs the policy may hand out per round


class BackgroundWork:
    """Device part: hints and background work (mixed into Device, which it reads the state of)."""

    def _init_background(self) -> None:
        self._jobs = np.zeros((JOB_SLOTS, 3), np.int64)  # (kind, block, session)
        self._background_done_ns = 0.0  # model clock: when the last background round's work is done
        self._t0_ns = time.monotonic_ns()
        self.background_error: Exception | None = None
        self._background_wake = threading.Event()
        self._stop_background = threading.Event()
        self._background_thread: threading.Thread | None = None

    def _start_background_thread(self) -> None:
        """On the wall clock with `firmware.background: thread`, when the policy has any."""
        if (self.cfg.firmware.background == "thread" and self.model is None
                and self.policy.background is not no_background):
            self._background_thread = threading.Thread(target=self._background_loop, name="cxlhm-firmware",
                                                       daemon=True)
            self._background_thread.start()

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
            self.settle_behind()  # hints may evict or pin its blocks
            self._sync_time()
            if kind in (HintKind.PIN, HintKind.UNPIN):
                return self._pin(first_block, n_blocks, kind == HintKind.PIN)
            self.kernels.hint(self.bt, self.ps, self.clock, kind, session, first_block, n_blocks, arg)
        finally:
            self._lock.release()
        self._background_wake.set()
        return True

    def hint_batch(self, kind: int, sessions: np.ndarray, first_blocks: np.ndarray, n_blocks: np.ndarray,
                   args: np.ndarray, *, lock_timeout: float = -1) -> int:
        """Hints of one kind (int64 arrays), in order, with one firmware call for the
        batch (hint()'s per-call cost is paid once); returns how many were not followed.
        DeviceBusy when the data path held the device past `lock_timeout` s (its
        `delivered` says how many hints went through first)."""
        if kind in (HintKind.PIN, HintKind.UNPIN):
            return deliver_each(self.hint, kind, sessions, first_blocks, n_blocks, args, lock_timeout=lock_timeout)
        if not self._lock.acquire(timeout=lock_timeout):
            raise DeviceBusy(f"the device was busy for {lock_timeout} s")
        try:
            if self.closed:
                return sessions.shape[0]
            self.settle_behind()
            self._sync_time()
            self.kernels.hints(self.bt, self.ps, self.clock, kind, sessions, first_blocks, n_blocks, args)
        finally:
            self._lock.release()
        self._background_wake.set()
        return 0

    def run_background(self, budget: int = 32) -> int:
        """Run up to `budget` jobs of the policy's background work (prefetches, flushes)
        now. Returns the number of jobs the policy handed out (0: nothing to do)."""
        with self._lock:
            return self._run_background_locked(budget)

    def _run_background_locked(self, budget: int = 32) -> int:
        if self.closed:
            return 0
        self.settle_behind()
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
            self.counters[C.BG_FLUSHES] += self._write_back(fw.plan_flush, flush.copy())[0]
        return n

    def prefetch(self, blocks: np.ndarray, owners: np.ndarray | None = None) -> int:
        """Read `blocks` (device block numbers) SSD -> DRAM ahead of use; resident ones
        are skipped. Returns the number of blocks read."""
        with self._lock:
            return self._prefetch_locked(blocks, owners)

    def _prefetch_locked(self, blocks: np.ndarray, owners: np.ndarray | None = None) -> int:
        # Background work keeps the lock through its I/O: it is off the host's path, and
        # its blocks are in flight only while nobody else can plan.
        self.settle_behind()
        blocks = np.ascontiguousarray(blocks, np.int64)
        owners = np.zeros_like(blocks) if owners is None else np.ascontiguousarray(owners, np.int64)
        victims = self.victim_blocks()
        if victims.shape[0]:  # streams' write-backs not landed yet: not read back from the SSD
            keep = ~np.isin(blocks, victims)
            blocks, owners = blocks[keep], owners[keep]
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
                        self.media.write_rows(s.writebacks[:n_wb], victims=True)
                    if n_fill:
                        bad = self.media.read_rows(s.fills[:n_fill])
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

