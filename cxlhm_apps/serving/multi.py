"""Several serving instances (one GPU each) behind a router, with their KV tiers shared
or not: the multi-instance rows of the serving comparison.

Routing (a request goes to one instance, which prefills and decodes it):
  round-robin        requests in arrival order go to instances in turn, so a session's
                     turns land on different instances (its GPU prefix cache is elsewhere)
  session-affinity   every turn of a session goes to the same instance (session id mod N)

Tiers, at equal DRAM D in total (ServingParams.dram_bytes):
  cxlhm-hymcache / cxlhm-lru   one pooled CXL-HM device (D of device DRAM before an SSD
                     holding every chunk) shared by all instances, each over its own link
  lmcache-local-n    LMCache's local CPU backend on every instance, D / N of host DRAM
                     each, LRU; an instance sees only its own
  lmcache-p2p        the same, plus LMCache's P2P sharing: a global lookup finds a chunk
                     in another instance's DRAM and it is read over the two instances'
                     RDMA NICs (the owner's out, the reader's in)
  mooncake-dram      Mooncake Store's DRAM pool, run with pool_factor = 1 here (D in total)
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np

from cxlhm_apps.serving.configs import SYSTEMS, Meta, TierContext, fixed, meta
from cxlhm_apps.serving.gpu import GpuModel
from cxlhm_apps.serving.params import ServingParams
from cxlhm_apps.serving.scheduler import Engine, GpuInstance, ReplayResult
from cxlhm_apps.serving.tiers import LoadResult, Tier, gpu_links
from cxlhm_apps.serving.workloads import Workload

ROUTINGS = ("round-robin", "session-affinity")

def multi_configs() -> list[str]:
    """The configurations of the multi-instance rows: a shared device or pool, and the
    per-instance LMCache tiers (registry metadata: role device, pool or multi)."""
    names = SYSTEMS.builtin_names()
    return sorted((n for n in names if meta(n).role in ("device", "pool", "multi")), key=lambda n: (meta(n).order, n))


class PerInstanceDramTier(Tier):
    """Host DRAM of `capacity_each` bytes on each of N instances (LRU by bytes); with
    `p2p`, a chunk held by another instance is read from it over RDMA."""
    dram_label = "host DRAM"

    def __init__(self, n: int, capacity_each: float, ctx: TierContext, *, p2p: bool):
        p = ctx.params
        self.name = "lmcache-p2p" if p2p else "lmcache-local-n"
        self.capacity_each, self.p2p = float(capacity_each), p2p
        self.stores_at: list[OrderedDict[int, float]] = [OrderedDict() for _ in range(n)]
        self.used = [0.0] * n
        self.where: dict[int, int] = {}  # the global directory: chunk -> instance holding it
        self.down = gpu_links(n, ctx.pcie_bandwidth, ctx.pcie_latency_ns, "pcie-h2d")
        self.up = gpu_links(n, ctx.pcie_bandwidth, ctx.pcie_latency_ns, "pcie-d2h")
        self.nic_in = gpu_links(n, p.rdma_bandwidth, p.rdma_latency_ns, "rdma-in")
        self.nic_out = gpu_links(n, p.rdma_bandwidth, p.rdma_latency_ns, "rdma-out")
        self.counts = {"stored_bytes": 0.0, "loaded_bytes": 0.0, "remote_loaded_bytes": 0.0, "evicted_bytes": 0.0,
                       "local_chunks": 0, "remote_chunks": 0}

    # the engine asks per instance (has_many_at); the instance-less form answers for the pool
    def has(self, cid: int) -> bool:
        return cid in self.where

    def has_many(self, ids: list) -> np.ndarray:
        where = self.where
        return np.fromiter((c in where for c in ids), bool, len(ids))

    def has_many_at(self, ids: list, gpu: int) -> np.ndarray:
        if self.p2p:
            return self.has_many(ids)
        mine = self.stores_at[gpu]
        return np.fromiter((c in mine for c in ids), bool, len(ids))

    def load(self, now, session, ids, nbytes, gpu=0):
        done = now
        for cid, b in zip(ids.tolist(), nbytes.tolist()):
            owner = self.where[cid]
            self.stores_at[owner].move_to_end(cid)
            if owner == gpu:
                done = max(done, self.down[gpu].transfer(now, b))
                self.counts["local_chunks"] += 1
            else:  # P2P: cut-through over the owner's NIC and the reader's (GPUDirect into the GPU)
                done = max(done, self.nic_out[owner].transfer(now, b), self.nic_in[gpu].transfer(now, b))
                self.counts["remote_chunks"] += 1
                self.counts["remote_loaded_bytes"] += b
            self.counts["loaded_bytes"] += b
        return LoadResult(done, dram_chunks=float(len(ids)))

    def store(self, now, session, ids, nbytes, gpu=0):
        done = now
        mine = self.stores_at[gpu]
        for cid, b in zip(ids.tolist(), nbytes.tolist()):
            if cid in mine or b > self.capacity_each:
                continue
            if cid in self.where:  # another instance's copy moves here (its directory entry follows)
                self._drop(self.where[cid], cid)
            done = max(done, self.up[gpu].transfer(now, b))
            mine[cid] = b
            self.used[gpu] += b
            self.where[cid] = gpu
            self.counts["stored_bytes"] += b
        while self.used[gpu] > self.capacity_each and mine:
            cid, b = mine.popitem(last=False)
            self.used[gpu] -= b
            self.where.pop(cid, None)
            self.counts["evicted_bytes"] += b
        return done

    def _drop(self, owner: int, cid: int) -> None:
        b = self.stores_at[owner].pop(cid)
        self.used[owner] -= b

    def estimate_load_ns(self, now, nbytes, gpu=0):
        return self.down[gpu].estimate(now, nbytes)

    def write_backlog_ns(self, now, gpu=0):
        return max(0.0, self.up[gpu].busy_until - now)

    def stats(self):
        local, remote = self.counts["local_chunks"], self.counts["remote_chunks"]
        return dict(self.counts, resident_bytes=sum(self.used),
                    remote_hit_share=remote / (local + remote) if local + remote else 0.0)


@dataclasses.dataclass(frozen=True)
class PerInstanceDram:
    p2p: bool = fixed(False)
    paper: str = fixed("")
    meta: Meta = fixed(Meta(order=15, role="multi"))

    def make_tier(self, ctx: TierContext) -> Tier:
        return PerInstanceDramTier(ctx.n_gpus, ctx.params.dram_bytes / ctx.n_gpus, ctx, p2p=self.p2p)


# registered in configs.py (loaded from here on first use)
LMCACHE_LOCAL_N = PerInstanceDram(False, "LMCache local CPU backend per instance (D/N each)")
LMCACHE_P2P = PerInstanceDram(True, "LMCache per instance (D/N each) + P2P over RDMA")


class MultiInstanceEngine(Engine):
    """N colocated instances behind a router; one tier object serves them all (a shared
    tier is shared; a per-instance tier answers per instance)."""
    topology = "multi"

    def __init__(self, workload: Workload, config: str, params: ServingParams = ServingParams(),
                 speed: float = 1.0, gpu: GpuModel | None = None, fail_fast: bool = False, *,
                 instances: int = 4, routing: str = "round-robin"):
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; use one of {', '.join(ROUTINGS)}")
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        self.n_gpus, self.routing = instances, routing
        self._route: dict[int, int] = {}
        self._turns = 0
        super().__init__(workload, config, params, speed, gpu, fail_fast)
        self.topology = f"{instances}x {routing}"

    def prefill_gpu(self, i: int) -> GpuInstance:
        g = self._route.get(i)
        if g is None:
            if self.routing == "round-robin":
                g, self._turns = self._turns % self.n_gpus, self._turns + 1
            else:
                g = self.reqs[i].session % self.n_gpus
            self._route[i] = g
        return self.gpus[g]

    def _instance_of(self, pool) -> int:
        return next(g.index for g in self.gpus if g.pool is pool)

    def _lookup(self, r, pool):
        at = getattr(self.tier, "has_many_at", None)
        if at is None:
            return super()._lookup(r, pool)
        ids = r.chunk_ids.tolist()
        on_gpu = pool.has_many(ids)
        in_tier = at(ids, self._instance_of(pool))
        usable = on_gpu | in_tier
        prefix = len(ids) if usable.all() else int(np.argmin(usable))
        return on_gpu, in_tier, prefix


def replay_multi(workload: Workload, config: str, params: ServingParams = ServingParams(), speed: float = 1.0,
                 *, instances: int = 4, routing: str = "round-robin") -> ReplayResult:
    return MultiInstanceEngine(workload, config, params, speed, instances=instances, routing=routing).run()
