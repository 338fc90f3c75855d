"""Prefill/decode disaggregation: the second topology.

Two GPUs with their own KV pools: GPU 0 only prefills, GPU 1 only decodes (1P1D, as
in DistServe/Mooncake). The KV of a prefilled request is handed over *through the
store*: the prefill side stores every chunk of the context (the usual prefix-cache
stores plus the chunks that exist only for the hand-over, such as the partial last one),
the decode side loads what its own pool lacks. Hand-over stores are never skipped (the
decode side needs them) and are pinned in DRAM tiers until read. `recompute` has no
store, so its hand-over goes through an unbounded host-DRAM buffer over PCIe.

TTFT is the prefill's first token; the hand-over delays the second token (TBT).
"""
from __future__ import annotations

import math

import numpy as np

from cxlhm_apps.serving.scheduler import HANDOVER_DONE, STORE_DONE, Engine, GpuInstance
from cxlhm_apps.serving.tiers import LruDramTier, gpu_links

PREFILL, DECODE = 0, 1


class DisaggEngine(Engine):
    topology = "disagg"
    n_gpus = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.tier.stores:
            self.handover = self.tier
        else:
            bw, lat = self.gpu.h2d_bandwidth, self.gpu.h2d_latency_s * 1e9
            self.handover = LruDramTier(math.inf, gpu_links(2, bw, lat, "pcie-h2d"), gpu_links(2, bw, lat, "pcie-d2h"),
                                        "handover", "host DRAM")
        self.handover_ids: dict[int, np.ndarray] = {}

    def prefill_gpu(self, i: int) -> GpuInstance:
        return self.gpus[PREFILL]

    def private_bytes(self, r) -> float:
        return 0.0  # the prefill side never decodes

    def try_admit(self, inst: GpuInstance, now: float) -> None:
        if inst.index == PREFILL:
            super().try_admit(inst, now)
            return
        self.admit_waiting(inst, now, self.admit_decode)

    # ------------------------------------------------------------ prefill side
    def prefilled(self, inst: GpuInstance, i: int, now: float) -> None:
        r = self.reqs[i]
        ids, nbytes, *_ = self.plan[i]
        self.record_prefill(inst, i, now)
        done = self.store(inst, i, now)  # prefix-cache stores (may be skipped under backlog)
        missing = ~self.handover.has_many(ids.tolist())
        # pinned before storing: the store's own eviction must not drop the chunks it hands over
        self.handover.pin(ids)
        if missing.any():  # the hand-over needs every chunk in the store
            done = max(done, self.handover.store(now, r.session, ids[missing], nbytes[missing], PREFILL))
        self.push(done, STORE_DONE, i)

    def on_store_done(self, now: float, i: int) -> None:
        prefill = self.gpus[PREFILL]
        ids, *_ = self.plan[i]
        prefill.pool.release(ids, 0.0)
        prefill.running -= 1
        decode = self.gpus[DECODE]
        decode.waiting.append(i)
        self.try_admit(prefill, now)
        self.try_admit(decode, now)
        self.kick(prefill, now)
        self.kick(decode, now)

    # ------------------------------------------------------------ decode side
    def admit_decode(self, inst: GpuInstance, i: int, now: float) -> bool:
        r = self.reqs[i]
        ids = r.chunk_ids
        nbytes = r.chunk_tokens.astype(np.float64) * self.bpt
        on_gpu = inst.pool.has_many(ids.tolist())
        if not inst.pool.reserve(ids, nbytes, float(r.output_tokens * self.bpt)):
            return False
        self.plan[i] = (ids, nbytes, float(r.output_tokens * self.bpt)) + self.plan[i][3:]
        need = ~on_gpu
        self.handover_ids[i] = ids
        if need.any():
            res = self.handover.load(now, r.session, ids[need], nbytes[need], DECODE)
            self.push(res.done_ns, HANDOVER_DONE, i)
        else:
            self.push(now, HANDOVER_DONE, i)
        return True

    def on_handover_done(self, now: float, i: int) -> None:
        decode = self.gpus[DECODE]
        ids = self.handover_ids.pop(i)
        decode.pool.materialize(ids)
        self.handover.unpin(ids)
        self.join_decode(decode, i, now)
        self.try_admit(decode, now)
        self.kick(decode, now)

    def on_gpu_free(self, now: float, payload) -> None:
        super().on_gpu_free(now, payload)
        for g in self.gpus:  # a finish on one side may let the other admit
            self.kick(g, now)
