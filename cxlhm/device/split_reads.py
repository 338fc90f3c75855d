"""Split-phase reads: a host thread keeps many reads of its own in flight and collects
each as its fills complete (read_start / read_reap), on one thread and one io_uring
ring - no batch waits for its slowest read. The fio engine falls back to it after a
streamed read stopped before a poisoned block.

The rules are those of the access path with the lock released: a started read's slots
are BUSY until it ends, victims are written back under the lock before its fills are
queued, and counters, poison and checksum records change only under the lock. Needs a
back end with `caps.async_io` (else reads run whole).
"""
from __future__ import annotations

import numpy as np

from cxlhm import blocktable as btm
from cxlhm import counters as C
from cxlhm import firmware as fw
from cxlhm.device.errors import DeviceFull

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



class SplitReads:
    """Device part: read_start / read_reap (mixed into Device, which it reads the state of)."""

    def read_start(self, ext_hpa, ext_len, addrs, owner: int = 0):
        """Start reading extent e into the host buffer at addrs[e], for every e, without
        waiting for the SSD. Returns None when the read is already complete (every block
        was in DRAM, or this device runs reads whole: model clock, no data, injected
        faults), WOULD_BLOCK when it cannot start without waiting for one of this
        thread's own reads in flight (a block of it is in flight, or DRAM or ring room
        is taken: reap, then try again), else a ReadTicket whose extents complete
        through read_reap() on this thread."""
        ext_hpa, ext_len, addrs, blocks = self._extents(ext_hpa, ext_len, addrs)
        mine = self._read_tickets()
        with self._lock:
            split = self.splits_reads and 0 < blocks <= min(self._batch_limit(), self.ssd.queue_depth)
            if split:
                if self._blocked(ext_hpa, ext_len) or blocks > self.ssd.async_room():
                    if mine:
                        return WOULD_BLOCK  # waiting here could wait for this thread's own reads
                    self._wait_for_slots(ext_hpa, ext_len)  # only other threads' accesses: safe
                self.media.check_readable(ext_hpa, ext_len)  # in the hold that plans (a thread may have poisoned)
                return self._plan_read(ext_hpa, ext_len, addrs, owner, blocks, mine)
        if mine and blocks:
            return WOULD_BLOCK  # read whole only with nothing of this thread's in flight
        for hpa, n, addr in zip(ext_hpa.tolist(), ext_len.tolist(), addrs.tolist()):
            self.access_one(hpa, n, addr, False, owner)  # whole, one extent after the other
        return None

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
                self.media.write_rows(s.writebacks[:n_wb], victims=True)
            if not ok or not n_fill:  # nothing to wait for (all hits), or no room: run it whole
                if n_fill:
                    for slot in t.slots[:k][self.media.read_rows(t.fills[:n_fill])]:
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
                if self.media.retries:  # failed or short: again, whole, on the batch ring
                    for row in mine_rows[~good].tolist():
                        again, retried = self.media.submit_retrying(t.fills[row:row + 1], self.media.retries - 1)
                        t.res[row], t.retries = again[0], t.retries + 1 + retried
                    good = t.res[mine_rows] == t.fills[mine_rows, 1]
            for i in self.media.rows_with_sums(t.fills[mine_rows]):  # safe unlocked: see _read_verified
                if good[i] and not self.media.fill_matches(t.fills[mine_rows[i]]):
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
            bad = self.media.settle_reads(t.fills[:t.n_fill], t.res, t.retries, t.mismatch)
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
        return self._local.tickets

