"""KV tiers: where a serving engine finds a prefix's KV, and what moving it costs.

* `GpuKvPool` - the GPU's KV memory (present in every configuration). Chunks that
  running requests use are pinned; what finished requests leave behind is the GPU
  prefix cache, evicted LRU when a new request needs room.
* `LruDramTier` - KV in DRAM with LRU eviction at chunk granularity, moved to the GPU
  over a `Link`: the host-DRAM store of LMCache's local backend (PCIe), the
  Mooncake-store DRAM pool (RDMA, GPUDirect), or unbounded DRAM (`ideal`).
* `CxlHmTier` - the emulated CXL-HM device on its model clock (cxlhm.device): every load
  and store is a device access whose latency the device's timing model gives (CXL link,
  device DRAM, NAND channels and dies); the hymcache firmware also receives the
  session-lifecycle hints a KV store emits. Data from the device then crosses PCIe to
  the GPU, pipelined chunk by chunk.

All times are model-clock ns; calls come in non-decreasing time order (the event loop
guarantees it), as the device's model clock requires.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np

from cxlhm.mailbox.hints import HintKind
from cxlhm.timing.kernels import S_LAST_PROGRAM_END

MiB, GiB = 1 << 20, 1 << 30


class Link:
    """A FIFO transfer resource: bytes at `bandwidth` (bytes/s) after `latency_ns`."""

    def __init__(self, bandwidth: float, latency_ns: float, name: str = ""):
        self.ns_per_byte = 1e9 / bandwidth
        self.latency_ns = latency_ns
        self.busy_until = 0.0
        self.name = name
        self.bytes = 0

    def transfer(self, ready_ns: float, nbytes: float) -> float:
        start = max(ready_ns, self.busy_until)
        self.busy_until = start + nbytes * self.ns_per_byte
        self.bytes += nbytes
        return self.busy_until + self.latency_ns

    def estimate(self, now: float, nbytes):
        """When a transfer of `nbytes` (scalar or array) issued now would be done."""
        return max(now, self.busy_until) - now + np.asarray(nbytes, np.float64) * self.ns_per_byte + self.latency_ns


@dataclasses.dataclass
class LoadResult:
    done_ns: float
    dram_chunks: float = 0.0   # served from the tier's DRAM (host, device or pool)
    ssd_chunks: float = 0.0    # served from the device's SSD


# ---------------------------------------------------------------- the GPU
class GpuKvPool:
    """The GPU's KV memory: pinned chunks (in use), cached chunks (LRU), and private
    bytes (running requests' decode KV). Chunks being computed or loaded are reserved
    but not yet hits."""

    def __init__(self, capacity_bytes: float):
        self.capacity = float(capacity_bytes)
        self.cached: OrderedDict[int, float] = OrderedDict()  # evictable, LRU first
        self.pinned: dict[int, list] = {}                      # id -> [refcount, bytes, ready]
        self.cached_bytes = self.pinned_bytes = self.private_bytes = 0.0
        self.releases = 0  # bumped whenever room is freed (a failed admission may retry then)

    @property
    def used(self) -> float:
        return self.cached_bytes + self.pinned_bytes + self.private_bytes

    def has(self, cid: int) -> bool:
        """A usable copy: cached, or pinned and already computed/loaded."""
        if cid in self.cached:
            return True
        entry = self.pinned.get(cid)
        return entry is not None and entry[2]

    def has_many(self, ids: list) -> np.ndarray:
        cached, pinned = self.cached, self.pinned
        return np.fromiter((c in cached or (c in pinned and pinned[c][2]) for c in ids), bool, len(ids))

    def reserve(self, ids, nbytes, private: float) -> bool:
        """Pin every chunk of `ids` (reserving room for the ones not resident) plus
        `private` bytes, evicting cached chunks LRU. False, with nothing changed, when
        even evicting every other cached chunk would not make room."""
        chunks = dict(zip(ids.tolist(), nbytes.tolist()))
        mine_cached = new_bytes = 0.0
        for c, b in chunks.items():
            if c in self.cached:
                mine_cached += self.cached[c]
            elif c not in self.pinned:
                new_bytes += b
        if self.pinned_bytes + self.private_bytes + mine_cached + new_bytes + private > self.capacity:
            return False
        for cid, b in chunks.items():
            if cid in self.cached:
                self.cached_bytes -= self.cached.pop(cid)
                self.pinned[cid] = [1, b, True]
                self.pinned_bytes += b
            elif cid in self.pinned:
                self.pinned[cid][0] += 1
            else:
                self.pinned[cid] = [1, b, False]
                self.pinned_bytes += b
        self.private_bytes += private
        while self.used > self.capacity:
            _, b = self.cached.popitem(last=False)
            self.cached_bytes -= b
        return True

    def materialize(self, ids) -> None:
        for cid in ids:
            entry = self.pinned.get(int(cid))
            if entry is not None:
                entry[2] = True

    def release(self, ids, private: float) -> None:
        """The request is done with its chunks: they become cached (most recent)."""
        self.releases += 1
        for cid in dict.fromkeys(int(c) for c in ids):
            entry = self.pinned.get(cid)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] == 0:
                del self.pinned[cid]
                self.pinned_bytes -= entry[1]
                if entry[2]:
                    self.cached[cid] = entry[1]
                    self.cached_bytes += entry[1]
        self.private_bytes -= private
        while self.used > self.capacity + 1e-6 and self.cached:
            _, b = self.cached.popitem(last=False)
            self.cached_bytes -= b


# ---------------------------------------------------------------- KV stores
class Tier:
    """A KV store below the GPU. Defaults: no hints, nothing stored."""
    name = "none"
    dram_label = "DRAM"
    stores = True

    def has(self, cid: int) -> bool:
        return False

    def has_many(self, ids: list) -> np.ndarray:
        return np.fromiter((self.has(c) for c in ids), bool, len(ids))

    def load(self, now: float, session: int, ids: np.ndarray, nbytes: np.ndarray, gpu: int = 0) -> LoadResult:
        return LoadResult(now)

    def store(self, now: float, session: int, ids: np.ndarray, nbytes: np.ndarray, gpu: int = 0) -> float:
        return now

    def estimate_load_ns(self, now: float, nbytes, gpu: int = 0):
        return np.full(np.shape(nbytes), np.inf)

    def write_backlog_ns(self, now: float, gpu: int = 0) -> float:
        """How much already-accepted write work is still ahead (the store's queue)."""
        return 0.0

    def pin(self, ids) -> None:     # keep until a handover has read them (disaggregation)
        pass

    def unpin(self, ids) -> None:
        pass

    def advance(self, now: float) -> None:
        pass

    def hint_resume(self, now: float, session: int, ids, nbytes, deadline_ns: int = 0) -> None:
        pass

    def hint_pause(self, now: float, session: int, expected_ns: int) -> None:
        pass

    def hint_end(self, now: float, session: int) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class NoTier(Tier):
    """recompute: nothing below the GPU."""
    stores = False


def gpu_links(n_gpus: int, bandwidth: float, latency_ns: float, name: str) -> list[Link]:
    return [Link(bandwidth, latency_ns, f"{name}{i}") for i in range(n_gpus)]


class LruDramTier(Tier):
    """DRAM with LRU eviction by bytes. Each GPU reaches it over its own link, one per
    direction (`down`: to the GPU, `up`: from it)."""

    def __init__(self, capacity_bytes: float, down: list[Link], up: list[Link], name: str, dram_label: str = "DRAM"):
        self.capacity = float(capacity_bytes)
        self.down, self.up = down, up
        self.name, self.dram_label = name, dram_label
        self.entries: OrderedDict[int, float] = OrderedDict()
        self.used = 0.0
        self.pins: dict[int, int] = {}
        self.counts = {"stored_bytes": 0.0, "loaded_bytes": 0.0, "evicted_bytes": 0.0}

    def has(self, cid: int) -> bool:
        return cid in self.entries

    def has_many(self, ids: list) -> np.ndarray:
        entries = self.entries
        return np.fromiter((c in entries for c in ids), bool, len(ids))

    def load(self, now, session, ids, nbytes, gpu=0):
        done = now
        for cid, b in zip(ids.tolist(), nbytes.tolist()):
            self.entries.move_to_end(cid)
            done = max(done, self.down[gpu].transfer(now, b))
            self.counts["loaded_bytes"] += b
        return LoadResult(done, dram_chunks=float(len(ids)))

    def store(self, now, session, ids, nbytes, gpu=0):
        done = now
        for cid, b in zip(ids.tolist(), nbytes.tolist()):
            if cid in self.entries or b > self.capacity:
                continue
            done = max(done, self.up[gpu].transfer(now, b))
            self.entries[cid] = b
            self.used += b
            self.counts["stored_bytes"] += b
        self._evict()
        return done

    def _evict(self) -> None:
        skipped = []
        while self.used > self.capacity and self.entries:
            cid, b = self.entries.popitem(last=False)
            if cid in self.pins:  # a handover still needs it
                skipped.append((cid, b))
                continue
            self.used -= b
            self.counts["evicted_bytes"] += b
        for cid, b in reversed(skipped):
            self.entries[cid] = b
            self.entries.move_to_end(cid, last=False)

    def pin(self, ids):
        for cid in ids:
            self.pins[int(cid)] = self.pins.get(int(cid), 0) + 1

    def unpin(self, ids):
        for cid in ids:
            cid = int(cid)
            if self.pins.get(cid, 0) <= 1:
                self.pins.pop(cid, None)
            else:
                self.pins[cid] -= 1
        self._evict()

    def estimate_load_ns(self, now, nbytes, gpu=0):
        return self.down[gpu].estimate(now, nbytes)

    def write_backlog_ns(self, now, gpu=0):
        return max(0.0, self.up[gpu].busy_until - now)

    def stats(self):
        return dict(self.counts, resident_bytes=self.used)


# The device's NAND is coarsened for the serving replay: 256 KiB "superpages" with tR and
# tPROG scaled x16 keep every die's and channel's bandwidth, and a 64 MiB chunk's read
# time within 5% (12.7 vs 13.3 ms cold; 24 chunks: 302.8 vs 303.5 ms; measured with
# cxlhm's timing model, docs/serving.md), while charging 16x fewer pages. KV chunks are
# >= 2 MiB, so the only latency that changes (a lone sub-page read) never occurs here.
NAND_COARSENING = 16
DEVICE_BLOCK = 2 * MiB  # the largest device block: a 512-token chunk is 32 of them


def coarse_timing(base: dict, factor: int = NAND_COARSENING) -> dict:
    from cxlhm.timing.params import parse_timing
    p = parse_timing(base, "serving")
    return {"nand_page_size": p.nand_page_size * factor,
            "nand_read_latency": f"{round(p.nand_read_latency * factor)}ns",
            "nand_program_latency": f"{round(p.nand_program_latency * factor)}ns",
            "write_buffer_bytes": p.write_buffer_bytes * factor}


class CxlHmTier(Tier):
    """The CXL-HM device (cxlhm.device on the model clock, timing-only) with `dram_bytes`
    of device DRAM in front of an SSD large enough for every chunk. Chunk `c` lives at
    HPA c x `stride`; a chunk of b bytes is ceil(b / block) device blocks."""
    dram_label = "device DRAM"
    # The device's model clock takes accesses in time order, so a store cannot be charged
    # ahead at the end of an iteration still to run: its stores are always asynchronous.
    blocking_stores = False

    def __init__(self, dram_bytes: int, policy: str, n_chunks: int, stride: int, pcie_down: list[Link],
                 pcie_up: list[Link],
                 *, params: dict | None = None, hints: bool = True, profile: str = "cmm-h",
                 coarsen: int = NAND_COARSENING, write_mode: str | None = None, timing: dict | None = None):
        from cxlhm.config import load_config
        from cxlhm.device import Device
        self.name = f"cxlhm-{policy}"
        self.block = DEVICE_BLOCK
        self.stride = stride
        dram = max(2, int(dram_bytes) // self.block) * self.block
        capacity = -(-max(n_chunks * stride, dram) // GiB) * GiB  # sparse: unused capacity costs nothing
        timing = dict(load_config(profile).timing if timing is None else timing)
        if coarsen > 1:
            timing.update(coarse_timing(timing, coarsen))
        firmware = {"policy": policy, "background": "manual", "params": dict(params or {})}
        if write_mode:
            firmware["write_mode"] = write_mode
        # The tier drives the device's own model (its timing state, counters, hints), not a
        # host's view of it: it opens the Device itself rather than a host_runtime handle.
        self.dev = self.d = Device(load_config(profile, dict(
            capacity=capacity, block_size=self.block, dram_bytes=dram, clock="model", data="none",
            firmware=firmware, timing=timing)))
        self.hints = hints
        self.pcie_down, self.pcie_up = pcie_down, pcie_up
        self.stored = np.zeros(n_chunks, bool)
        # The host cannot see what is resident in device DRAM, so it plans every load as
        # a cold read: the SSD path at its nominal bandwidth (NAND channels, capped by the
        # CXL link), behind the NAND programs already queued (reads wait for them: no
        # program suspend). An earlier version learned the bandwidth from its own loads
        # (EWMA) and locked itself out: one slow load made the scheduler recompute, so
        # no later load ever corrected the estimate.
        p = self.d.timing_model.settings
        ssd_bw = min(p.nand_channels * p.nand_channel_rate, p.link_bandwidth)
        self.ns_per_byte = 1e9 / ssd_bw
        self.counts = {"stored_bytes": 0.0, "loaded_bytes": 0.0, "hints": 0}

    def _blocks(self, cid: int, nbytes: float) -> tuple[int, int]:
        return cid * self.stride // self.block, max(1, -(-int(nbytes) // self.block))

    def has(self, cid: int) -> bool:
        return bool(self.stored[cid])

    def has_many(self, ids: list) -> np.ndarray:
        return self.stored[np.asarray(ids, np.int64)]

    def advance(self, now: float) -> None:
        if now > self.d.now_ns():
            self.d.advance_to(now)

    def load(self, now, session, ids, nbytes, gpu=0):
        self.advance(now)
        before = self.d.counters.copy()
        done = now
        for cid, b in zip(ids.tolist(), nbytes.tolist()):
            latency = self.d.access_one(cid * self.stride, int(b), 0, False, session, issue_ns=now)
            done = max(done, self.pcie_down[gpu].transfer(now + latency, b))
        hits, misses = (self.d.counters[i] - before[i] for i in (4, 5))  # counters.HITS, MISSES
        total = hits + misses
        n = float(len(ids))
        self.counts["loaded_bytes"] += float(nbytes.sum())
        return LoadResult(done, dram_chunks=n * hits / total if total else n, ssd_chunks=n * misses / total if total else 0.0)

    def store(self, now, session, ids, nbytes, gpu=0):
        self.advance(now)
        done = now
        fresh = ~self.stored[ids]
        ids, nbytes = ids[fresh], nbytes[fresh]
        if self.hints and ids.size:
            self._hint_ranges(HintKind.APPEND, session, ids, nbytes)
        for cid, b in zip(ids.tolist(), nbytes.tolist()):
            latency = self.d.access_one(cid * self.stride, int(b), 0, True, session, issue_ns=now)
            done = max(done, now + latency, self.pcie_up[gpu].transfer(now, b))
            self.stored[cid] = True
            self.counts["stored_bytes"] += b
        return done

    def estimate_load_ns(self, now, nbytes, gpu=0):
        nbytes = np.asarray(nbytes, np.float64)
        return nbytes * self.ns_per_byte + self.write_backlog_ns(now) + self.pcie_down[gpu].estimate(now, 0.0)

    def write_backlog_ns(self, now, gpu=0):
        """NAND programs already queued: when every write charged so far is durable
        (the device's `durable_ns`; firmware knows its write-back queue)."""
        return max(0.0, float(self.d.timing_model.state[S_LAST_PROGRAM_END]) - now)

    def _hint_ranges(self, kind, session, ids, nbytes, arg=0):
        runs: list[list[int]] = []
        for cid, b in zip(ids, nbytes):
            first, n = self._blocks(int(cid), b)
            if runs and runs[-1][0] + runs[-1][1] == first:
                runs[-1][1] += n
            else:
                runs.append([first, n])
        for first, n in runs:
            self.d.hint(kind, session, first, n, arg)
            self.counts["hints"] += 1

    def hint_resume(self, now, session, ids, nbytes, deadline_ns=0):
        if not self.hints or not len(ids):
            return
        self.advance(now)
        if deadline_ns > 0:
            self._hint_ranges(HintKind.NEXT_PREFIX, session, ids, nbytes, int(deadline_ns))
        else:
            self._hint_ranges(HintKind.SESSION_RESUME, session, ids, nbytes)

    def hint_pause(self, now, session, expected_ns):
        if self.hints:
            self.advance(now)
            self.d.hint(HintKind.SESSION_PAUSE, session, 0, 0, int(expected_ns))
            self.counts["hints"] += 1

    def hint_end(self, now, session):
        if self.hints:
            self.advance(now)
            self.d.hint(HintKind.SESSION_END, session, 0, 0)
            self.counts["hints"] += 1

    def stats(self):
        out = dict(self.counts)
        out.update({k: v for k, v in self.dev.stats().items() if isinstance(v, (int, float))})
        return out

    def close(self):
        self.dev.close()
