"""fio's pacing of a job's submissions: `thinktime` (a pause after every
`thinktime_blocks` I/Os, or every `thinktime_iotime` of I/O) and `rate` / `rate_iops`
(each direction's I/Os issued no faster than its rate, `rate_process` linear or poisson).

fio's rules, kept here:
- Rate: the I/O after B bytes of one direction is due B / bps seconds after the job's
  start (bps = rate, or rate_iops x the direction's smallest block); with poisson, after
  the sum of exponential gaps of mean 1/iops; with rate_iops and bssplit, k / iops.
  An I/O that is not due yet waits - unless the job is mixed and the other direction is
  due, then that direction goes instead (and when both wait, the one due first). Before
  waiting, every I/O in flight completes (fio's quiesce). A wait never runs past the
  job's runtime.
- Think time: once thinktime_blocks I/Os have been done since the last pause (or
  thinktime_iotime has passed, with thinktime_blocks then only counting when given), the
  I/O in flight completes, the job spins thinktime_spin and sleeps the rest of thinktime
  (never past the runtime).
- At the end of ramp_time both start again from the measuring start (fio resets its
  counters there).
- Where fio changed these rules after 3.33 the current ones are kept: rate_iops with
  bssplit spaces I/Os by count (3.33: by bytes), and a pause never runs past the runtime
  (3.33 sleeps the whole thinktime).

How it differs: the runner issues a batch of the I/Os that are due, and that batch
completes before the next one is admitted. fio admits each I/O while the others are in
flight, so near the device's own speed it keeps the depth fuller; under the rate (each
I/O waiting) and with think time (fio quiesces) they are the same. With
thinktime_blocks_type=complete fio counts completed I/Os, so at depth N it may issue up
to N-1 more before pausing; here exactly thinktime_blocks are issued per pause.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from cxlhm_apps.fio.options import READ, WRITE


class Pacer:
    needs = "thinktime and rate"  # (what the model clock cannot give, where it is refused)

    def __init__(self, job, min_bs: tuple[int, int], same_sizes: bool, seed: int, stop: threading.Event,
                 sleep=time.sleep):
        v = job.values
        self.stop, self.sleep = stop, sleep
        self.think_ns = v["thinktime"]
        self.spin_ns = min(v["thinktime_spin"], self.think_ns)
        self.think_blocks = v["thinktime_blocks"]
        self.think_blocks_given = "thinktime_blocks" in job.given
        self.think_iotime_ns = v["thinktime_iotime"]
        rw = v["rw"]
        self.active = (rw.reads, rw.writes)
        self.mixed = rw.reads and rw.writes
        mix = (v["rwmixread"], 100 - v["rwmixread"])
        self.can_switch = self.mixed and same_sizes
        self.switch_to = [self.can_switch and mix[1 - d] > 0 for d in (READ, WRITE)]
        self.bps = [0, 0]
        self.per_io_ns = [0, 0]  # rate_iops with bssplit: fixed gaps (fio's rule)
        for d in (READ, WRITE):
            rate, iops = v["rate"][d] or 0, v["rate_iops"][d] or 0
            self.bps[d] = rate or iops * min_bs[d]
            if not rate and iops and v["bssplit"][d] is not None:
                self.per_io_ns[d] = 10**9 // iops
        self.poisson = v["rate_process"] == "poisson"
        self.min_bs = min_bs
        self.rng = np.random.default_rng(seed ^ 0x5EED)
        self.rated = any(self.bps)
        self.paced = self.rated or self.think_ns > 0
        self.restart(0)

    def restart(self, epoch_ns: int) -> None:
        """The job (or, after ramp_time, its measured part) starts at epoch_ns."""
        self.epoch = epoch_ns
        self.issued_bytes = [0, 0]
        self.next_due = [0, 0]  # ns after epoch
        self.last_gap_sum = [0, 0]
        self.since_think = 0
        self.last_think = epoch_ns
        self._after: list = []

    # ---------------------------------------------------------------- rate
    def _due_after(self, d: int, nbytes: int) -> int:
        """fio's usec_for_io: when the next I/O of direction d is due, after one of nbytes."""
        self.issued_bytes[d] += nbytes
        if self.poisson:
            iops = self.bps[d] // self.min_bs[d]
            if iops:
                self.last_gap_sum[d] += int(10**9 / iops * -np.log(1.0 - self.rng.random()))
            return self.last_gap_sum[d]
        if not self.bps[d]:
            return 0
        if self.per_io_ns[d]:
            self.last_gap_sum[d] += self.per_io_ns[d]
            return self.last_gap_sum[d]
        return self.issued_bytes[d] * 10**9 // self.bps[d]

    def _sleep_until(self, t_ns: int, now_ns, end_ns: int) -> bool:
        """Sleep until t_ns (capped at end_ns); False when the job must end instead."""
        t_ns = min(t_ns, end_ns)
        while not self.stop.is_set():
            left = t_ns - now_ns()
            if left <= 0:
                break
            self.sleep(min(left, 100_000_000) / 1e9)  # (wakes to see a stop)
        return not self.stop.is_set() and now_ns() < end_ns

    def _think(self, now_ns, end_ns: int) -> bool:
        spin_end = now_ns() + self.spin_ns
        spin_end = min(spin_end, end_ns)
        while now_ns() < spin_end:
            pass
        ok = self._sleep_until(now_ns() + self.think_ns - self.spin_ns, now_ns, end_ns)
        self.since_think = 0
        self.last_think = now_ns()
        return ok

    def _think_due(self, now: int) -> bool:
        if not self.think_ns:
            return False
        if self.think_iotime_ns:
            if now - self.last_think >= self.think_iotime_ns:
                return True
            if not self.think_blocks_given:
                return False
        return self.since_think >= self.think_blocks

    def admit(self, chunk, now_ns, end_ns: int) -> int:
        """How many of the chunk's leading I/Os go now (it sleeps first where fio would,
        and may turn the first I/O's direction, as fio's rate switching does). 0: the
        job's time is over (or it was stopped) while waiting."""
        if self._think_due(now_ns()) and not self._think(now_ns, end_ns):
            return 0
        n = len(chunk)
        if self.think_ns and (not self.think_iotime_ns or self.think_blocks_given):
            n = min(n, max(1, self.think_blocks - self.since_think))
        if not self.rated:
            return n
        now = now_ns() - self.epoch
        d = int(chunk.direction[0])
        if self.next_due[d] > now:
            od = 1 - d
            if self.switch_to[d] and self.next_due[od] <= now:
                chunk.direction[0] = od
            else:
                if self.switch_to[d] and self.next_due[od] < self.next_due[d]:
                    d = od
                    chunk.direction[0] = od
                if not self._sleep_until(self.epoch + self.next_due[d], now_ns, end_ns):
                    return 0
                now = now_ns() - self.epoch
        # the leading I/Os that are due now (the first one is); the state after each is
        # kept for did(), which takes the one after the last I/O that ran
        saved = (list(self.next_due), list(self.issued_bytes), list(self.last_gap_sum))
        self._after = []
        for i in range(n):
            d = int(chunk.direction[i])
            if i and self.next_due[d] > now:
                if not (self.switch_to[d] and self.next_due[1 - d] <= now):
                    break
                d = 1 - d  # the other direction is due: it goes instead, as for the first I/O
                chunk.direction[i] = d
            self.next_due[d] = self._due_after(d, int(chunk.size[i]))
            self._after.append((list(self.next_due), list(self.issued_bytes), list(self.last_gap_sum)))
        self.next_due, self.issued_bytes, self.last_gap_sum = saved
        return len(self._after)

    def deadline(self) -> int:
        """When the next think time falls due by time (thinktime_iotime), else never."""
        if self.think_ns and self.think_iotime_ns:
            return self.last_think + self.think_iotime_ns
        return 2**62

    def did(self, chunk) -> None:
        """The I/Os the engine ran (a prefix of what admit let go)."""
        if self.rated and len(chunk):
            due, issued, gaps = self._after[len(chunk) - 1]
            self.next_due, self.issued_bytes, self.last_gap_sum = list(due), list(issued), list(gaps)
        self.since_think += len(chunk)
