"""The emulated CXL-HM device: device DRAM + SSD back end + firmware, behind one HDM window.

`Device` is the device side. Hosts use it through `host_runtime.driver`, which adds
buffer handling; the device itself speaks in extents (HPA, length) and raw buffer
addresses, and checks every request as untrusted input.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np

import firmware_policies
from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm.config import ConfigError, DeviceConfig
from cxlhm.integrity import BlockChecksums, PoisonError, PoisonTable, checksum
from cxlhm.media.dram import DeviceDram
from cxlhm.media.faults import FaultInjector, FaultPlan
from cxlhm.mailbox import Mailbox
from cxlhm.mailbox.hints import HintKind
from cxlhm.media.ssd import SsdBackend
from cxlhm.modelclock import ModelClock
from cxlhm.timing import LatencyRecorder, TimingModel, charge_flush
from cxlhm.timing.recorder import record as record_latency
from firmware_policies.base import JOB_FLUSH, JOB_PREFETCH, no_background

METADATA_FORMAT = 1
MAX_BATCH_BLOCKS = 4096  # blocks planned per firmware pass (bounds the scratch arrays)


class AccessOutOfRange(IndexError):
    """An access falls (partly) outside the HDM window."""


class MediaError(OSError):
    """The SSD back end failed an I/O the device could not hide."""


__all__ = ["AccessOutOfRange", "Device", "DeviceClosed", "DeviceFull", "MediaError", "PoisonError"]


class DeviceFull(RuntimeError):
    """Every DRAM slot is pinned or busy, so a missing block has nowhere to go."""


class DeviceClosed(RuntimeError):
    pass


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

        self.bt = btm.new_block_table(self.n_slots)
        self.ps = self.policy.make_state(self.n_slots, self.params)
        self.counters = C.new_counters()
        self.clock = np.zeros(1, np.int64)  # logical: one tick per block access
        self.kernels = fw.kernels_for(self.policy)
        self.timing = TimingModel.from_device_config(cfg)  # validated even on the wall clock
        self.model = ModelClock(self.timing, self.n_slots) if cfg.clock == "model" else None
        self.latency: LatencyRecorder | None = None

        batch = min(self.n_slots, MAX_BATCH_BLOCKS)
        self._slots_out = np.zeros(batch, np.int64)
        self._installed = np.zeros(batch, np.uint8)
        self._one_hpa = np.zeros(1, np.int64)  # scratch for access_one (used under the lock)
        self._one_len = np.zeros(1, np.int64)
        self._writebacks = fw.new_io_rows(batch)
        self._fills = fw.new_io_rows(batch)
        self._lock = threading.RLock()
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

        if self.moves_data:
            _check_fits_in_memory(cfg)
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
        moves to its completion, as for a synchronous host)."""
        ext_hpa = np.ascontiguousarray(ext_hpa, np.int64)
        ext_len = np.ascontiguousarray(ext_len, np.int64)
        if ext_hpa.shape != ext_len.shape or ext_hpa.ndim != 1:
            raise ValueError("extent addresses and lengths must be 1-D arrays of equal length")
        bad, blocks = fw.check_extents(ext_hpa, ext_len, self.capacity, self.block_size)
        if bad >= 0:
            self.check_extent(int(ext_hpa[bad]), int(ext_len[bad]))
        with self._lock:
            if self.poison:
                for hpa, n in zip(ext_hpa.tolist(), ext_len.tolist()):
                    self._check_poison(hpa, n, is_write)
            limit = self._batch_limit()
            started = t = self._begin(issue_ns)
            if blocks <= limit:
                t = self._access_batch(ext_hpa, ext_len, user_addr, is_write, owner, t)
            else:
                t = self._access_split(ext_hpa, ext_len, user_addr, is_write, owner, t, limit)
            return self._complete(started, t, issue_ns)

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None) -> float:
        """access() for a single extent, without the array set-up (the common host call)."""
        self.check_extent(hpa, n)
        with self._lock:
            if self.poison:
                self._check_poison(hpa, n, is_write)
            limit = self._batch_limit()
            started = t = self._begin(issue_ns)
            if n == 0 or (hpa + n - 1) // self.block_size - hpa // self.block_size < limit:
                self._one_hpa[0], self._one_len[0] = hpa, n
                t = self._access_batch(self._one_hpa, self._one_len, user_addr, is_write, owner, t)
            else:
                t = self._access_split(np.array([hpa], np.int64), np.array([n], np.int64), user_addr, is_write,
                                       owner, t, limit)
            return self._complete(started, t, issue_ns)

    def _access_split(self, ext_hpa, ext_len, user_addr, is_write, owner, t: float, limit: int) -> float:
        """An access touching more blocks than one firmware pass may hold: run it in
        pieces, one after the other. The planner counts a host operation per extent
        it sees, so pieces cut from one extent are folded back into one operation."""
        pieces = 0
        for hpas, lens, start in _split_batches(ext_hpa, ext_len, self.block_size, limit):
            t = self._access_batch(hpas, lens, user_addr + start, is_write, owner, t)
            pieces += hpas.shape[0]
        self.counters[C.HOST_WRITES if is_write else C.HOST_READS] -= pieces - int(np.count_nonzero(ext_len))
        return t

    def _check_poison(self, hpa: int, n: int, is_write: bool) -> None:
        """Reads of poisoned blocks fail; a write that covers a whole poisoned block
        replaces its lost bytes and clears the poison; a partial write cannot."""
        if n == 0:
            return
        bs = self.block_size
        first, last = hpa // bs, (hpa + n - 1) // bs
        while (block := self.poison.first_poisoned(first, last)) >= 0:
            covered = is_write and block * bs >= hpa and (block + 1) * bs <= hpa + n
            if not covered:
                raise PoisonError(5, f"block {block} (HPA {block * bs:#x}, {bs} bytes) is poisoned: "
                                     f"{self.poison.blocks[block]}")
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

    def _batch_limit(self) -> int:
        """Blocks one firmware pass may touch: every one needs a slot it can hold busy."""
        if self.closed:
            raise DeviceClosed("the device is closed")
        limit = min(self._slots_out.shape[0], self.n_slots - int(self.bt.scalars[btm.N_PINNED]))
        if limit <= 0:
            raise DeviceFull("every device-DRAM slot is pinned; unpin something first")
        return limit

    def _access_batch(self, hpas, lens, user_addr, is_write, owner, t: float) -> float:
        """One firmware pass; returns its completion on the model clock (else `t`)."""
        ok, k, n_wb, n_fill, done = self.kernels.access(
            self.bt, self.ps, self.counters, self.clock, hpas, lens, is_write, self._write_mode_code,
            owner, self.dram.base_address, self.block_size, self._slots_out, self._installed,
            self._writebacks, self._fills, user_addr, self.moves_data)
        if self.model is not None:
            through = k * self.block_size if is_write and self._write_mode_code == fw.WRITE_THROUGH else 0
            t = self.model.charge_access(t, is_write, int(lens.sum()), self._fills, n_fill, self._writebacks, n_wb,
                                         self._slots_out, self._installed, k, through, self.counters)
        if done:
            return t
        slots = self._slots_out
        try:
            if self.moves_data:
                if n_wb:
                    self._write_rows(self._writebacks[:n_wb], victims=True)
                bad = self._read_rows(self._fills[:n_fill]) if n_fill else None
                if bad is not None and bad.any():
                    # Newly placed blocks hold no valid bytes (failed fills; for a write,
                    # also the fully overwritten ones, since the copy will not happen).
                    now = int(self.clock[0])
                    for slot in slots[:k][self._installed[:k].astype(bool)]:
                        if self.bt.block[slot] >= 0:
                            self.kernels.invalidate(self.bt, self.ps, slot, now)
                    block = int(self._fills[np.flatnonzero(bad)[0], 2] // self.block_size)
                    raise PoisonError(5, f"block {block} (HPA {block * self.block_size:#x}) could not be read: "
                                         f"{self.poison.blocks.get(block, 'media error')}")
                if ok:
                    fw.copy_extents(self.dram.base_address, self.block_size, slots, hpas, lens, user_addr, not is_write)
                    if is_write and self._write_mode_code == fw.WRITE_THROUGH:
                        self._write_through(slots[:k])
        finally:
            fw.finish(self.bt, slots, k)
        if not ok:
            raise DeviceFull("no evictable device-DRAM slot: every slot is pinned or in use by this access")
        return t

    def _submit_retrying(self, ops: np.ndarray) -> np.ndarray:
        """Submit, then resubmit failed or short ops up to `backend.retries` times.
        Returns the ops' final results (bytes, or -errno)."""
        res = self.ssd.submit(ops)
        if (res == ops[:, 1]).all():
            return res
        res = res.copy()  # the back end reuses its result array
        for _ in range(self.retries):
            failed = np.flatnonzero(res != ops[:, 1])
            if failed.size == 0:
                break
            self.counters[C.MEDIA_RETRIES] += failed.size
            res[failed] = self.ssd.submit(ops[failed])
        return res

    def _read_rows(self, rows: np.ndarray) -> np.ndarray:
        """SSD -> slot reads with retries and checksum verification. A block that cannot
        be read correctly is poisoned; returns the mask of such rows."""
        res = self._submit_retrying(rows)
        bad = res != rows[:, 1]
        if not self.checksums.sums and not bad.any():
            return bad  # the common case: nothing to verify, nothing failed
        for i in range(rows.shape[0]):
            block = int(rows[i, 2] // self.block_size)
            if bad[i]:
                self._poison(block, f"SSD read failed: {os.strerror(-int(res[i])) if res[i] < 0 else 'short read'}")
            elif self.checksums.sums and not self.checksums.matches(block, self._slot_bytes(rows[i, 0])):
                self.counters[C.CHECKSUM_MISMATCHES] += 1
                self._poison(block, "checksum mismatch on SSD read")
                bad[i] = True
        return bad

    def _write_rows(self, rows: np.ndarray, *, victims: bool) -> np.ndarray:
        """Slot -> SSD writes with retries, recording each block's checksum. Returns the
        mask of rows that failed. A failed victim's bytes are gone: it is poisoned."""
        sums = [checksum(self._slot_bytes(addr)) for addr in rows[:, 0].tolist()]
        res = self._submit_retrying(rows)
        failed = res != rows[:, 1]
        for i, block in enumerate((rows[:, 2] // self.block_size).tolist()):
            if not failed[i]:
                self.checksums.sums[block] = sums[i]
            else:
                self.checksums.sums.pop(block, None)  # the SSD holds neither the old nor the new bytes
                if victims:
                    self._poison(block, f"write-back failed: {os.strerror(-int(res[i])) if res[i] < 0 else 'short write'}")
        return failed

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
    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0) -> bool:
        """Deliver a request-lifecycle hint. PIN/UNPIN are carried out by the runtime;
        every other kind goes to the policy's compiled on_hint hook. The caller (the
        mailbox) validates the range. Hints are advisory: returns False when one was
        not followed (e.g. a pin that would leave no DRAM for misses), never raises."""
        with self._lock:
            if self.closed:
                return False
            self._sync_time()
            if kind in (HintKind.PIN, HintKind.UNPIN):
                return self._pin(first_block, n_blocks, kind == HintKind.PIN)
            self.kernels.hint(self.bt, self.ps, self.clock, kind, session, first_block, n_blocks, arg)
        self._background_wake.set()
        return True

    def run_background(self, budget: int = 32) -> int:
        """Run up to `budget` jobs of the policy's background work (prefetches, flushes)
        now. Returns the number of jobs the policy handed out (0: nothing to do)."""
        with self._lock:
            if self.closed:
                return 0
            self._sync_time()
            budget = min(budget, self._jobs.shape[0], self._batch_limit())
            n = self.kernels.background(self.bt, self.ps, self.clock, budget, self._jobs)
            self._background_done_ns = self.model.now_ns if self.model is not None else 0.0
            jobs = self._jobs[:n]
            prefetch = jobs[jobs[:, 0] == JOB_PREFETCH]
            if prefetch.shape[0]:
                self.prefetch(prefetch[:, 1].copy(), prefetch[:, 2].copy())
            flush = jobs[jobs[:, 0] == JOB_FLUSH, 1]
            if flush.shape[0]:
                self.counters[C.BG_FLUSHES] += self._write_back(fw.plan_flush, flush.copy())
            return n

    def prefetch(self, blocks: np.ndarray, owners: np.ndarray | None = None) -> int:
        """Read `blocks` (device block numbers) SSD -> DRAM ahead of use; resident ones
        are skipped. Returns the number of blocks read."""
        blocks = np.ascontiguousarray(blocks, np.int64)
        owners = np.zeros_like(blocks) if owners is None else np.ascontiguousarray(owners, np.int64)
        done = 0
        with self._lock:
            limit = self._batch_limit()
            for start in range(0, blocks.shape[0], limit):
                chunk = slice(start, start + limit)
                k, n_wb, n_fill = self.kernels.plan_prefetch(
                    self.bt, self.ps, self.counters, self.clock, blocks[chunk], owners[chunk],
                    self.dram.base_address, self.block_size, self._slots_out, self._writebacks, self._fills)
                try:
                    if self.moves_data:
                        if n_wb:
                            self._write_rows(self._writebacks[:n_wb], victims=True)
                        if n_fill:
                            bad = self._read_rows(self._fills[:n_fill])
                            for slot in self._slots_out[:k][bad]:  # never leave unfilled slots mapped
                                self.kernels.invalidate(self.bt, self.ps, slot, int(self.clock[0]))
                finally:
                    fw.finish(self.bt, self._slots_out, k)
                if self.model is not None:
                    t = self.model.charge_prefetch(self.model.now_ns, self._fills, n_fill, self._writebacks, n_wb,
                                                   self._slots_out, k)
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
            if self.run_background() == 0:
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
            self.prefetch(np.arange(first_block, first_block + n_blocks, dtype=np.int64))
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
        """Write every dirty block back to the SSD (blocks stay cached). Returns blocks written."""
        with self._lock:
            if self.closed:
                return 0
            written = self._write_back(lambda bt, _, base, bs, rows: fw.collect_dirty(bt, base, bs, rows, rows.shape[0]), None)
            if self.moves_data:
                self.ssd.sync()
            if self.model is not None:  # durable on NAND, like a Global Persistent Flush
                self.model.now_ns = max(self.model.now_ns, charge_flush(self.timing.params, self.timing.state,
                                                                        self.model.now_ns))
        return written

    def _write_back(self, collect, blocks) -> int:
        """Write back what `collect(bt, blocks, base, block_size, rows) -> n` selects,
        round after round until it selects nothing; marks those blocks clean."""
        written = 0
        rows = self._writebacks
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
            btm.set_pinned(self.bt, 0, 0, False)
            self.kernels.plan_prefetch(self.bt, self.ps, self.counters, self.clock, empty, empty,
                                       self.dram.base_address, self.block_size, self._slots_out,
                                       self._writebacks, self._fills)

    def close(self) -> None:
        """Flush dirty DRAM (like CXL Global Persistent Flush) and release everything."""
        # Outside the lock: the mailbox thread may be waiting for it.
        if self.mailbox is not None:
            self.mailbox.close()
        with self._lock:
            if self.closed:
                return
            self._stop_background_thread()
            try:
                self.flush()
                for slot in np.flatnonzero(self.bt.flags & btm.DIRTY):  # could not be written back
                    self._poison(int(self.bt.block[slot]), "lost at close: write-back failed")
                if self.moves_data:
                    self.checksums.save()
                self._write_metadata(clean=True)
            finally:
                self.closed = True
                if self.ssd is not None:
                    self.ssd.close()
                self.dram.close()


def _check_fits_in_memory(cfg: DeviceConfig) -> None:
    """Device DRAM is real memory here: refuse what this machine cannot hold."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if cfg.dram_bytes > physical * 0.8:
        raise ConfigError(cfg.source_of("dram_bytes"), "dram_bytes",
                          f"{cfg.dram_bytes} bytes of device DRAM do not fit this machine's {physical} bytes of "
                          f"memory (at most 80% may be used); lower it, or use data: none for timing-only runs")


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
