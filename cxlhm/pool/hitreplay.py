"""Mirror hits reach the firmware: each host logs the blocks it loaded from its mirrors
(cxlhm/pool/hitlog.py), and the service replays them as device reads every
REPORT_INTERVAL_S, so the firmware counts and ranks them as any read.

The log is the host's to write, so nothing in it is trusted: only blocks the tenant's
mirror holds were hits (the rest are dropped and counted), and one pass replays at most a
budget of blocks per host (its mirrors' blocks once, plus a hit log's worth of repeats),
so a forged log costs the service no more than a host hitting that much would.
"""
from __future__ import annotations

import threading

import numpy as np

from cxlhm.pool.hitlog import ENTRIES as HIT_LOG_ENTRIES, HitLog
from cxlhm.pool.mirror import TAG


class HitReplay:
    """Replays hosts' hit logs as reads of `device`; counts into `counts["hit_blocks_reported"]`."""

    def __init__(self, device, block_size: int, partition_bytes: int, mirror_entries: int, counts: dict):
        self.device, self.block_size = device, block_size
        self.partition_bytes, self.mirror_entries, self.counts = partition_bytes, mirror_entries, counts
        self._scratch = np.empty(1 << 20, np.uint8)  # one buffer: the bytes are not wanted, only the access
        self._lock = threading.Lock()

    def budget(self, n_tenants: int) -> int:
        """The most blocks one pass replays for a host of `n_tenants` tenants."""
        return self.mirror_entries * n_tenants + HIT_LOG_ENTRIES

    def replay(self, hits: HitLog, tenants: list) -> int:
        """Replay one host's logged hits (`tenants`: its attached tenants, in the log's
        index order); returns the blocks reported."""
        bs = self.block_size
        tenant, block = hits.drain(len(tenants), self.partition_bytes // bs, self.budget(len(tenants)))
        if not block.shape[0]:
            return 0
        held = np.zeros(block.shape[0], np.bool_)  # only blocks the tenant's mirror holds were hits
        for k, t in enumerate(tenants):
            mine = np.flatnonzero(tenant == k)
            if mine.shape[0]:
                with t.lock:
                    headers = t.mirror.headers
                    if headers is not None:
                        b = block[mine]
                        held[mine] = headers[b % t.mirror.entries, TAG] == (b + 1).astype(np.uint64)
        hits.dropped += int(block.shape[0] - np.count_nonzero(held))
        tenant, block = tenant[held], block[held]
        if not block.shape[0]:
            return 0
        bases = np.array([t.partition.base for t in tenants], np.int64)
        hpa = bases[tenant] + block * bs
        length = np.full(hpa.shape[0], bs, np.int64)
        per_call = self._scratch.shape[0] // bs
        with self._lock:
            for start in range(0, hpa.shape[0], per_call):
                try:
                    self.device.access(hpa[start:start + per_call], length[start:start + per_call],
                                       self._scratch.ctypes.data, False)
                except OSError:
                    pass  # a poisoned block: the host's own read saw the mirror's bytes; nothing to report
        blocks = int(hpa.shape[0])
        self.counts["hit_blocks_reported"] += blocks
        return blocks
