"""Prefill/decode disaggregation: the second topology.

Two GPUs with their own KV pools: GPU 0 only prefills, GPU 1 only decodes (1P1D, as
in DistServe/Mooncake). The KV of a prefilled request goes from the prefill GPU's HBM
straight to the decode GPU's (`handover="gpu"`, the default: vLLM's NIXL connector and
Mooncake's transfer engine read GPU memory over RDMA, GPUDirect), over one link at
`handover_bandwidth` (one 400 Gb/s NIC per GPU at 85% by default); only the chunks the
decode GPU's pool lacks are sent, and the prefill GPU keeps the request's KV pinned
until they are. The tier below serves reuse only: the prefill side stores and loads
prefixes exactly as a colocated engine does.

`handover="tier"` hands the KV over through the store instead (the prefill side stores
every chunk, pinned in DRAM tiers until read; the decode side loads what its pool lacks),
as a deployment without a GPU-to-GPU path would; `recompute` has no store, so there it
goes through an unbounded host-DRAM buffer over PCIe.

TTFT is the prefill's first token; the hand-over delays the second token (TBT).

The hand-over's parameters are the topology's options (`DisaggOptions`): serve-bench's
`--disagg.handover tier`, `--disagg.handover_bandwidth`, `--disagg.handover_latency_ns`.
"""
from __future__ import annotations

import dataclasses
import math
import typing

import numpy as np

from cxlhm_apps.serving.scheduler import HANDOVER_DONE, STORE_DONE, Engine, GpuInstance
from cxlhm_apps.serving.tiers import Link, LruDramTier, gpu_links

PREFILL, DECODE = 0, 1


@dataclasses.dataclass(frozen=True)
class DisaggOptions:
    # gpu: prefill GPU to decode GPU over RDMA (NIXL, Mooncake's transfer engine); tier: through the store
    handover: typing.Literal["gpu", "tier"] = "gpu"
    handover_bandwidth: float = 400e9 / 8 * 0.85   # bytes/s of the GPU-to-GPU link: a 400 Gb/s NIC per GPU at 85%
    handover_latency_ns: float = 5_000.0           # the GPU-to-GPU link's latency


class DisaggEngine(Engine):
    topology = "disagg"
    n_gpus = 2
    Options = DisaggOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.direct = self.options.handover == "gpu"
        if self.direct:
            self.link = Link(self.options.handover_bandwidth, self.options.handover_latency_ns, "handover")
            self.handover = None
        elif self.tier.stores:
            self.handover = self.tier
        else:
            bw, lat = self.gpu.h2d_bandwidth, self.gpu.h2d_latency_s * 1e9
            self.handover = LruDramTier(math.inf, gpu_links(2, bw, lat, "pcie-h2d"), gpu_links(2, bw, lat, "pcie-d2h"),
                                        "handover", "host DRAM")
        self.handover_ids: dict[int, np.ndarray] = {}
        self.handover_bytes = 0.0

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
        if self.direct:
            # the decode side reads the KV out of the prefill GPU when it admits the request
            self.push(now, STORE_DONE, i)
            return
        missing = ~self.handover.has_many(ids.tolist())
        # pinned before storing: the store's own eviction must not drop the chunks it hands over
        self.handover.pin(ids)
        if missing.any():  # the hand-over needs every chunk in the store
            done = max(done, self.handover.store(now, r.session, ids[missing], nbytes[missing], PREFILL))
        self.push(done, STORE_DONE, i)

    def on_store_done(self, now: float, i: int) -> None:
        prefill = self.gpus[PREFILL]
        if not self.direct:  # the KV is in the store: the prefill GPU lets it go
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
        prefill_ids = self.plan[i][0]
        self.plan[i] = (ids, nbytes, float(r.output_tokens * self.bpt)) + self.plan[i][3:]
        need = ~on_gpu
        self.handover_ids[i] = (ids, prefill_ids)
        if not need.any():
            self.push(now, HANDOVER_DONE, i)
        elif self.direct:
            sent = float(nbytes[need].sum())
            self.handover_bytes += sent
            self.push(self.link.transfer(now, sent), HANDOVER_DONE, i)
        else:
            res = self.handover.load(now, r.session, ids[need], nbytes[need], DECODE)
            self.push(res.done_ns, HANDOVER_DONE, i)
        return True

    def on_handover_done(self, now: float, i: int) -> None:
        decode = self.gpus[DECODE]
        ids, prefill_ids = self.handover_ids.pop(i)
        decode.pool.materialize(ids)
        if self.direct:  # sent: the prefill GPU's copy becomes its prefix cache
            prefill = self.gpus[PREFILL]
            prefill.pool.release(prefill_ids, 0.0)
            prefill.running -= 1
            self.try_admit(prefill, now)
            self.kick(prefill, now)
        else:
            self.handover.unpin(ids)
        self.join_decode(decode, i, now)
        self.try_admit(decode, now)
        self.kick(decode, now)

    def on_gpu_free(self, now: float, payload) -> None:
        super().on_gpu_free(now, payload)
        for g in self.gpus:  # a finish on one side may let the other admit
            self.kick(g, now)
