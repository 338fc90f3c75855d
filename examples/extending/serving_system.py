"""A serving system for `cxlhm serve-bench`: LMCache's local CPU backend with the KV
compressed, as a KV codec would store it (CacheGen-style encoding, or quantisation).

    lmcache-compressed   D of host DRAM, LRU, over PCIe, holding KV compressed `ratio`:1;
                         a chunk crosses PCIe compressed and the GPU (de)compresses it at
                         `codec_gbps` (GB/s of uncompressed KV); loads and stores block
                         the iteration, as LMCache's vLLM connector does by default

What differs from a real codec: the ratio is one number for every chunk (a real codec's
depends on the content), compressing and moving are pipelined chunk by chunk (so the
slower of PCIe x ratio and the codec sets the speed), and the codec's GPU time does not
take compute from the iterations.

A configuration is an object with make_tier(ctx) -> Tier; as a frozen dataclass its
fields are serve-bench's flags (`--lmcache-compressed.ratio 8`), except those marked
`configs.fixed` (what the configuration is, not an option); `meta` places it in tables
and sweeps. Register it under the entry-point group ``cxlhm.serving_systems``:

    [project.entry-points."cxlhm.serving_systems"]
    lmcache-compressed = "examples.extending.serving_system:LmcacheCompressed"

or, in a test,
``configs.SYSTEMS.register("lmcache-compressed", "examples.extending.serving_system:LmcacheCompressed")``.
Then ``cxlhm serve-bench --configs lmcache-local,lmcache-compressed --lmcache-compressed.ratio 4``.
"""
from __future__ import annotations

import dataclasses

from cxlhm_apps.serving.configs import (BLOCKING, LoadMode, Meta, StoreMode, TierContext, fixed, load_mode_field,
                                        store_mode_field)
from cxlhm_apps.serving.tiers import LruDramTier, Tier, gpu_links


@dataclasses.dataclass(frozen=True)
class LmcacheCompressed:
    ratio: float = 4.0                  # uncompressed : stored bytes of KV (1: no compression)
    codec_gbps: float = 200.0           # GB/s of uncompressed KV the GPU compresses and decompresses
    load_mode: LoadMode = load_mode_field(BLOCKING)
    store_mode: StoreMode = store_mode_field(BLOCKING)
    paper: str = fixed("LMCache local CPU backend with compressed KV (D of host DRAM holds ratio x D of KV)")
    meta: Meta = fixed(Meta(order=12, role="store"))   # after lmcache-local in tables; not in --configs all

    def __post_init__(self):
        if not self.ratio >= 1.0:
            raise ValueError(f"ratio must be >= 1 (uncompressed : stored bytes), got {self.ratio!r}")
        if not self.codec_gbps > 0:
            raise ValueError(f"codec_gbps must be > 0, got {self.codec_gbps!r}")

    def make_tier(self, ctx: TierContext) -> Tier:
        # A chunk of b bytes of KV occupies b / ratio of DRAM and of PCIe: the same LRU store
        # holds ratio x D of KV, over links ratio x faster, but no faster than the codec.
        bandwidth = min(ctx.pcie_bandwidth * self.ratio, self.codec_gbps * 1e9)
        down = gpu_links(ctx.n_gpus, bandwidth, ctx.pcie_latency_ns, "pcie-h2d")
        up = gpu_links(ctx.n_gpus, bandwidth, ctx.pcie_latency_ns, "pcie-d2h")
        return LruDramTier(ctx.params.dram_bytes * self.ratio, down, up, "lmcache-compressed", "host DRAM")
