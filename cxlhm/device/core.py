"""The emulated CXL-HM device: device DRAM + a back end + firmware, behind one HDM window.

`Device` is the device side. Hosts use it through `host_runtime.driver`, which adds
buffer handling; the device itself speaks in extents (HPA, length) and raw buffer
addresses, and checks every request as untrusted input.

It is made of parts, each a class that owns its own state and gets in its constructor
the device state (state.py: the block table, the policy's state, the counters, the lock,
per-thread scratch, the clocks, the configuration's constants) and the few other parts
it calls:

    access.py      the access path: plan a firmware pass, fill, copy, settle
    media.py       every I/O with the back end, with retries, checksums and poison
    stream/        streamed I/O (stream_io), and the registry of the threads' streams
    behind.py      write-behind: large writes go to the SSD behind the host
    waves.py       a large write's victims written back in waves
    writeback.py   write-back of dirty blocks: flush, background flushes
    background.py  hints, prefetches, pins, the policy's background jobs, the firmware thread
    power.py       power-loss emulation
    sidecar.py     what survives a reopen (poison, checksums, the clean-shutdown mark)

This module makes the parts and wires them, opens the back end, and runs the control
operations (flush, close, statistics); every other public method delegates to the part
that owns it. The back end is whichever `backend.kind` names (cxlhm/media/registry.py).

Host threads may use one device at once. One lock guards the firmware state; on the
wall clock an access plans under it, runs its fill reads and its copy without it (its
slots BUSY meanwhile), and settles under it again - so several threads keep I/O in
flight together. A stream (stream_io) holds it for a time slice; while several threads
stream at once, none waits at the SSD with it held (stream/driver.py, _reap_unlocked).
The model clock keeps every access under the lock, in issue order.
"""
from __future__ import annotations

import inspect

import numba
import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm.config import ConfigError, DeviceConfig
from cxlhm.device.access import AccessPath
from cxlhm.device.background import BackgroundWork
from cxlhm.device.behind import WriteBehind
from cxlhm.device.errors import DeviceClosed, MediaError, check_extent
from cxlhm.device.interface import DeviceCaps
from cxlhm.device.power import PowerLoss
from cxlhm.device.sidecar import Sidecars, open_state
from cxlhm.device.state import MAX_BATCH_BLOCKS, DeviceState
from cxlhm.device.stream import loop
from cxlhm.device.stream.driver import Streams, StreamResult
from cxlhm.device.stream.registry import StreamRegistry
from cxlhm.device.waves import WriteWaves
from cxlhm.device.writeback import WriteBack
from cxlhm.mailbox import Mailbox
from cxlhm.mailbox.poison import records_of
from cxlhm.media.faults import FaultInjector, FaultPlan
from cxlhm.media.registry import open_backend
from cxlhm.timing import LatencyRecorder

__all__ = ["MAX_BATCH_BLOCKS", "Device"]


class Device:
    """The device as the host sees it (cxlhm.device.interface.HostDevice)."""

    def __init__(self, cfg: DeviceConfig):
        self.state = state = DeviceState(cfg)
        self.cfg, self.capacity, self.block_size, self.n_slots = cfg, state.capacity, state.block_size, state.n_slots
        self.policy, self.params, self.write_mode = state.policy, state.params, state.write_mode
        self.moves_data = state.moves_data
        self.bt, self.ps, self.counters, self.kernels = state.bt, state.ps, state.counters, state.kernels
        self.timing_model = state.timing_model  # the resource model (cxlhm/timing), validated even on the wall clock
        self.model_clock = state.model_clock  # the model clock (clock: model), else None
        self.dram, self.media = state.dram, state.media
        self.mailbox: Mailbox | None = None
        self.unclean_shutdown_detected = False
        self.rebuilt_sidecars = ""  # what backend.lost_sidecar had to rebuild at open ("": nothing)
        self.sidecars: Sidecars | None = None
        if self.moves_data:
            try:
                self._open_media(cfg)
            except BaseException:
                if self.media.ssd is not None:
                    self.media.ssd.close()
                self.dram.close()
                raise

        self.stream_registry = StreamRegistry(state)
        self.behind = WriteBehind(state)
        self.waves = WriteWaves(state)
        self.write_back = WriteBack(state, self.behind)
        self.background = BackgroundWork(state, self.behind, self.write_back, self.stream_registry)
        self.access_path = AccessPath(state, self.behind, self.waves, self.stream_registry, self.background)
        self.streams = Streams(state, self.stream_registry, self.behind, self.access_path)
        self.power = PowerLoss(state, self.behind)
        self.background.start_thread()

    def _open_media(self, cfg: DeviceConfig) -> None:
        """The back end (its image locked), wrapped in a fault injector if asked, and the
        state its sidecars keep."""
        try:
            faults = FaultPlan.from_mapping(cfg.backend.faults, cfg.seed)
        except ValueError as exc:
            raise ConfigError(cfg.source_of("backend.faults"), "backend.faults", str(exc)) from None
        media = self.media
        media.ssd = open_backend(cfg)
        media.ssd.register_memory(self.dram.base_address, self.dram.nbytes, self.block_size)
        if faults.active:
            media.ssd = FaultInjector(media.ssd, faults)
        if media.ssd.temporary:
            return
        self.sidecars = Sidecars(media.ssd.path, self.capacity, self.block_size, cfg.source_of)
        opened = open_state(self.sidecars, cfg.backend.lost_sidecar)
        media.poison, media.checksums = opened.poison, opened.checksums
        self.unclean_shutdown_detected, self.rebuilt_sidecars = opened.unclean, opened.rebuilt
        media.unclean = opened.unclean  # (what a checksum mismatch is likely to mean)

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
    def closed(self) -> bool:
        return self.state.closed

    @property
    def power_lost(self) -> bool:
        """The power went (simulate_power_loss, or an injected cut): nothing more reaches
        the back end."""
        return self.state.power_lost

    @property
    def latency(self) -> LatencyRecorder | None:
        return self.state.latency

    @property
    def background_error(self) -> Exception | None:
        """The last exception the firmware thread's background work raised."""
        return self.background.error

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(streams_io=self.can_stream, model_clock=self.model_clock is not None,
                          moves_data=self.moves_data, integrity=self.moves_data, power_loss=self.moves_data,
                          persistent=self.ssd is not None and not self.ssd.temporary)

    @property
    def can_stream(self) -> bool:
        """Whether I/O may be streamed (stream_io; DeviceState.can_stream says when)."""
        return self.state.can_stream

    def _write_metadata(self, *, clean: bool) -> None:
        if self.sidecars is not None:
            self.sidecars.write(clean=clean, poison=self.poison)

    def _poison(self, block: int, reason: str) -> None:
        self.media.poison_block(block, reason)

    # ------------------------------------------------------------ access path
    def check_extent(self, hpa: int, n: int) -> None:
        """Raise AccessOutOfRange unless [hpa, hpa+n) lies inside the HDM window."""
        check_extent(hpa, n, self.capacity)

    def access(self, ext_hpa: np.ndarray, ext_len: np.ndarray, user_addr: int, is_write: bool, owner: int = 0,
               issue_ns: float | None = None) -> float:
        """HostDevice.access, run by the access path (cxlhm/device/access.py, AccessPath.access)."""
        return self.access_path.access(ext_hpa, ext_len, user_addr, is_write, owner, issue_ns)

    def access_one(self, hpa: int, n: int, user_addr: int, is_write: bool, owner: int = 0,
                   issue_ns: float | None = None, *, stream: bool = True) -> float:
        """access() for a single extent, without the array set-up (the common host call).
        On the wall clock a read of several blocks some of which are on the SSD is
        streamed (stream_io, one read per block): each block is copied out as soon as
        it lands, while the next ones are still being read."""
        check_extent(hpa, n, self.capacity)
        bs, bt = self.block_size, self.bt
        if (stream and not is_write and n and (hpa + n - 1) // bs > hpa // bs and self.state.can_stream
                and loop.missing_blocks(bt.index_keys, bt.index_slots, hpa, n, bs, 2) > 1):
            return self.streams.read_streamed(hpa, n, user_addr, owner)  # (the table was read unlocked: it only picks a path)
        return self.access_path.access_one(hpa, n, user_addr, is_write, owner, issue_ns)

    def stream_io(self, ext_hpa, ext_len, addrs, depth: int, *, deadline_ns: int = 0, slat=None, clat=None,
                  owner: int = 0, writes=None) -> StreamResult:
        """Many reads (and writes) in flight from one thread (cxlhm.device.interface.StreamDevice;
        Streams.stream_io says how)."""
        return self.streams.stream_io(ext_hpa, ext_len, addrs, depth, deadline_ns=deadline_ns, slat=slat, clat=clat,
                                     owner=owner, writes=writes)

    def record_latencies(self, every: int = 1, capacity: int = 1 << 20) -> LatencyRecorder:
        """Keep per-access latencies (every `every`-th, bounded memory) on the device's clock."""
        self.state.latency = LatencyRecorder(capacity, every)
        return self.state.latency

    def thread_hits_misses(self) -> tuple[int, int]:
        """Device-block hits and misses of the calling thread's accesses so far: exact
        per thread while other threads access the device too (each pass's are counted
        in the lock hold that plans it)."""
        s = self.state.scratch()
        return s.hits, s.misses

    def now_ns(self) -> float:
        """Model clock only: its time (cxlhm.device.interface.ModelClockDevice)."""
        if self.model_clock is None:
            raise ValueError("now_ns() needs clock: model (on the wall clock, read time.perf_counter_ns)")
        return self.model_clock.now_ns

    def advance_to(self, t_ns: float) -> None:
        """Model clock only: let time pass until `t_ns` with the host idle, giving the
        gap to the firmware's background work (prefetches, write-backs)."""
        self.background.advance_to(t_ns)

    # ------------------------------------------------------------ hints and background work
    def hint(self, kind: int, session: int, first_block: int, n_blocks: int, arg: int = 0, *,
             lock_timeout: float = -1) -> bool:
        """Deliver a request-lifecycle hint (BackgroundWork.hint)."""
        return self.background.hint(kind, session, first_block, n_blocks, arg, lock_timeout=lock_timeout)

    def hint_batch(self, kind: int, sessions: np.ndarray, first_blocks: np.ndarray, n_blocks: np.ndarray,
                   args: np.ndarray, *, lock_timeout: float = -1) -> int:
        """Hints of one kind, in one firmware call (BackgroundWork.hint_batch)."""
        return self.background.hint_batch(kind, sessions, first_blocks, n_blocks, args, lock_timeout=lock_timeout)

    def prefetch(self, blocks: np.ndarray, owners: np.ndarray | None = None) -> int:
        """Read `blocks` (device block numbers) SSD -> DRAM ahead of use; resident ones
        are skipped. Returns the number of blocks read."""
        return self.background.prefetch(blocks, owners)

    def run_background(self, budget: int = 32) -> int:
        """Run up to `budget` jobs of the policy's background work (prefetches, flushes)
        now. Returns the number of jobs the policy handed out (0: nothing to do)."""
        return self.background.run(budget)

    def drain(self) -> None:
        """Wait until the writes the device made behind the host have landed (on the SSD,
        not yet durable: flush() makes them so)."""
        self.behind.drain()

    def poison_records(self, dpa: int, length: int, max_records: int):
        """Get Poison List: poisoned blocks intersecting [dpa, dpa+length), as whole blocks."""
        with self.state.lock:  # host threads add poison while the mailbox thread lists it
            blocks = list(self.poison.blocks)
        return records_of(blocks, self.block_size, dpa, length, max_records)

    # ------------------------------------------------------------ control
    def flush(self) -> int:
        """Write every dirty block back (blocks stay cached) and make it durable. Returns
        blocks written; raises MediaError if a write-back failed (those blocks stay dirty
        in device DRAM: a later flush tries again). Blocks of accesses still in flight
        in other threads are not complete, so not flushed (close() waits for them)."""
        with self.state.lock:
            written, failed = self.write_back.flush_locked()
        if self.power_lost:  # the power went before or during it: nothing is durable
            raise DeviceClosed("the device lost power: the flush did not complete")
        if failed:
            raise MediaError(5, f"write-back of {failed} dirty block(s) failed; they stay in device DRAM "
                                f"({written} written)")
        return written

    def stats(self) -> dict:
        out = C.as_dict(self.counters)
        out["resident_blocks"] = int(self.n_slots - self.bt.scalars[btm.N_FREE])
        out["dirty_blocks"] = int(np.count_nonzero(self.bt.flags & btm.DIRTY))
        if self.model_clock is not None:
            out["model_now_ns"] = self.model_clock.now_ns
            out.update(self.timing_model.stats())
        return out

    def start_mailbox(self, **options) -> Mailbox:
        """The register block and the firmware thread that services its doorbell."""
        with self.state.lock:
            if self.mailbox is None:
                self.mailbox = Mailbox(self, **options).start()
            return self.mailbox

    def warm_up(self) -> None:
        """Compile the hint-side kernels now (the mailbox calls this before it reports
        ready), so the first PIN does not spend seconds compiling past a host timeout."""
        with self.state.lock:
            empty = np.zeros(0, np.int64)
            s = self.state.scratch()
            btm.set_pinned(self.bt, 0, 0, False)
            self.kernels.plan_prefetch(self.bt, self.ps, self.counters, self.state.ticks, empty, empty,
                                       self.dram.base_address, self.block_size, s.slots_out,
                                       s.writebacks, s.fills)
            self.kernels.hints(self.bt, self.ps, self.state.ticks, 0, empty, empty, empty, empty)
            # the policy's own hint kernel, compiled from its argument types without running it
            hint = self.kernels.hint
            if hasattr(hint, "compile"):
                n_args = len(inspect.signature(hint.py_func).parameters)
                args = (self.bt, self.ps, self.state.ticks) + (0,) * (n_args - 3)
                hint.compile(tuple(numba.typeof(a) for a in args))

    def close(self) -> None:
        """Flush dirty DRAM (like CXL Global Persistent Flush) and release everything."""
        if self.power_lost:  # nothing to flush with, and nothing may reach the back end now
            return self.simulate_power_loss()
        # Outside the lock: the mailbox and firmware threads may be waiting for it.
        if self.mailbox is not None:
            self.mailbox.close()
        self.background.stop_thread()
        with self.state.lock:
            if self.closed:
                return
            while self.state.inflight:  # accesses in flight finish first: their bytes go in the flush
                self.state.lock.wait_idle()
            try:
                self.write_back.flush_locked()
                for slot in np.flatnonzero(self.bt.flags & btm.DIRTY):  # could not be written back
                    self.media.poison_block(int(self.bt.block[slot]), "lost at close: write-back failed")
                if self.sidecars is not None:
                    saved = self.checksums.save()
                    self.sidecars.write(clean=True, poison=self.poison, sums=saved)
            finally:
                self.state.closed = True
                self.state.idle.notify_all()  # threads waiting to plan now see DeviceClosed
                if self.ssd is not None:
                    self.ssd.close()
                self.checksums.close()  # the integrity log
                self.dram.close()

    def block_checksums(self, first_block: int, n_blocks: int) -> list[int | None]:
        """The checksum recorded for each block of [first_block, first_block + n_blocks):
        that of the bytes the SSD holds for it (None: never written back, or its bytes
        are lost). Hosts fingerprint durable data with it (the KV store's flush)."""
        with self.state.lock:
            self.behind.settle()
            poison = self.poison.blocks
            found, sums = self.checksums.sums.lookup(np.arange(first_block, first_block + n_blocks, dtype=np.int64))
            return [None if b in poison or not f else s
                    for b, f, s in zip(range(first_block, first_block + n_blocks), found.tolist(), sums.tolist())]

    def integrity_report(self) -> dict:
        """What the last open recovered and what the integrity log holds now."""
        with self.state.lock:
            log = self.checksums.log
            return {"unclean_shutdown": self.unclean_shutdown_detected, **self.checksums.recovered,
                    "log_records": log.records if log is not None else 0,
                    "checksummed_blocks": len(self.checksums.sums), "poisoned_blocks": len(self.poison.blocks),
                    "dirty_logged_blocks": len(self.checksums.dirty), "power_lost": self.power_lost,
                    "rebuilt_sidecars": self.rebuilt_sidecars}

    # ------------------------------------------------------------ power loss
    def arm_power_loss(self, at_write: int | None = None, *, pages: int = -1, torn_bytes: int = -1,
                       action: str = "freeze") -> int:
        """Cut the back end's power while its `at_write`-th write op from now is in flight
        (PowerLoss.arm). Returns the absolute write number of the cut."""
        return self.power.arm(at_write, pages=pages, torn_bytes=torn_bytes, action=action)

    def simulate_power_loss(self) -> None:
        """The power goes now (or went, at an injected cut): nothing more reaches the
        back end or the integrity log, device DRAM is dropped, and the device is closed
        without close()'s flush and clean-shutdown mark."""
        self.power.cut()
        if self.mailbox is not None:
            self.mailbox.close()
        self.background.stop_thread()
        self.power.release()
