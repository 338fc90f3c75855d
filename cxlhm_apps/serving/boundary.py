"""Where loading a prefix's KV beats recomputing it, for a model on a GPU.

Recomputing a chunk of c tokens that sits after P tokens of context costs the marginal
prefill time of those c tokens (linear layers per token plus attention to everything
before them): r(P) per token. Loading it costs a fixed latency L plus c x (KV bytes per
token) / B over the path's bandwidth B. Loading wins for every chunk when B exceeds
B* = KV bytes per token / r(P) (the bandwidth boundary), and at bandwidth B > B* for
chunks longer than c* = L / (r(P) - bytes/B) tokens (the chunk-size boundary).
"""
from __future__ import annotations

import dataclasses
import math

from cxlhm_apps.serving.gpu import GpuModel
from cxlhm_apps.serving.params import ServingParams, device_timing


@dataclasses.dataclass(frozen=True)
class Path:
    name: str
    bandwidth: float   # bytes/s
    latency_s: float


def recompute_per_token_s(gpu: GpuModel, context: int, chunk: int = 512) -> float:
    """Marginal prefill time per token of a `chunk`-token piece after `context` tokens,
    inside a larger prefill (the scheduler batches it with other work)."""
    base = 4096  # a prefill this large already pays the fixed per-iteration cost
    return (gpu.prefill_s([chunk + base], [context]) - gpu.prefill_s([base], [context])) / chunk


def device_ssd_path(params: ServingParams) -> Path:
    """The CXL-HM device's cold path: NAND channels, capped by the CXL link; one page read
    of latency (tR) before data flows."""
    from cxlhm.timing.params import parse_timing
    t = parse_timing(device_timing(params), params.device_profile)
    return Path("CXL-HM SSD (cold)", min(t.nand_channels * t.nand_channel_rate, t.link_bandwidth),
                t.nand_read_latency / 1e9 + 2 * t.link_latency / 1e9)


def paths(gpu: GpuModel, params: ServingParams) -> list[Path]:
    ssd = device_ssd_path(params)
    pcie = Path("host DRAM / device DRAM over PCIe", gpu.h2d_bandwidth, gpu.h2d_latency_s)
    rdma = Path("DRAM pool over RDMA", params.rdma_bandwidth * gpu.spec.tp, params.rdma_latency_ns / 1e9)
    # the device's data still crosses PCIe to the GPU: the slower of the two links
    ssd = Path(ssd.name, min(ssd.bandwidth, gpu.h2d_bandwidth), ssd.latency_s + gpu.h2d_latency_s)
    return [pcie, rdma, ssd]


@dataclasses.dataclass(frozen=True)
class Boundary:
    context: int
    recompute_us_per_token: float
    bandwidth_gbs: float          # B*: above it loading beats recomputing for long chunks
    min_chunk_tokens: dict        # path name -> c* (inf: never at that bandwidth)
    load_over_recompute: dict     # path name -> load time / recompute time of a 512-token chunk


def boundary(gpu: GpuModel, params: ServingParams, context: int, chunk: int = 512) -> Boundary:
    r = recompute_per_token_s(gpu, context, chunk)
    bpt = gpu.kv_bytes_per_token
    mins, ratio = {}, {}
    for p in paths(gpu, params):
        gain = r - bpt / p.bandwidth
        mins[p.name] = p.latency_s / gain if gain > 0 else math.inf
        ratio[p.name] = (p.latency_s + chunk * bpt / p.bandwidth) / (r * chunk)
    return Boundary(context, r * 1e6, bpt / r / 1e9, mins, ratio)


def boundary_lines(gpu: GpuModel, params: ServingParams, contexts=(0, 8192, 32768)) -> list[str]:
    out = [f"  {gpu.shape.name} on {gpu.spec.name}{f' x{gpu.spec.tp} TP' if gpu.spec.tp > 1 else ''} "
           f"[{gpu.source}], KV {gpu.kv_bytes_per_token // 1024} KiB/token:"]
    for c in contexts:
        b = boundary(gpu, params, c)
        out.append(f"    after {c:>5} tokens: recompute {b.recompute_us_per_token:6.1f} us/token -> loading wins above "
                   f"{b.bandwidth_gbs:6.1f} GB/s")
        for name, n in b.min_chunk_tokens.items():
            bw = next(p.bandwidth for p in paths(gpu, params) if p.name == name)
            when = f"chunks >= {math.ceil(n):>5} tokens" if math.isfinite(n) else "never (too slow)"
            out.append(f"      {name:<34} {bw / 1e9:6.1f} GB/s: {when}; a 512-token chunk loads in "
                       f"{b.load_over_recompute[name]:5.2f}x its recompute time")
    return out
