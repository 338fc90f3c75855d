"""A serving topology: two colocated GPUs behind a least-loaded router.

Each GPU prefills and decodes its own requests (data parallelism, two copies of the
model); a request goes to the GPU with the fewest requests waiting or running when the
router first sees it, ties to the lower index, as a load-balancing router in front of
two engine instances does. Both GPUs share the configuration's tier, each over its own
host link. `colocated` is the one-GPU case; `multi` (cxlhm_apps/serving/multi.py)
routes round-robin or by session instead.

Registered as `least-loaded`: ``cxlhm serve-bench --topology least-loaded``.
"""
from __future__ import annotations

from cxlhm_apps.serving.scheduler import Engine, GpuInstance


class LeastLoadedEngine(Engine):
    topology = "least-loaded"
    n_gpus = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.routed: dict[int, int] = {}  # request -> its GPU, fixed when first asked

    def prefill_gpu(self, i: int) -> GpuInstance:
        g = self.routed.get(i)
        if g is None:  # the scheduler asks again (when a load lands, when a hint is planned): same answer
            g = min(self.gpus, key=lambda inst: (len(inst.waiting) + inst.running, inst.index)).index
            self.routed[i] = g
        return self.gpus[g]
