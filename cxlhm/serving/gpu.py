"""GPU cost model: prefill time f(new tokens, cached tokens) for a batch, decode-step time
f(batch, total context), and host -> GPU copy time.

Default: the table measured on an NVIDIA H200 for a Llama-3-8B-shaped model
(bench/data/gpu_h200_llama3_8b.json, produced by bench/gpu/calibrate_gpu.py; caveats in
bench/data/README.md). How each part uses it:

* Prefill without a cached prefix: piecewise-linear interpolation of the measured
  points (512..32k new tokens). Below 512 tokens the 512-token time is the floor (the
  eager model is kernel-launch bound there: 38 ms for 512 and 40 ms for 1024 tokens).
  Above 32k: the quadratic a + b*n + c*n^2 fitted to the points >= 2048 tokens, joined
  continuously at 32k.
* Attention against a cached prefix: the measured "cached" runs use SDPA without its
  flash kernel (rectangular causal mask) and overstate this cost 2-3x against engines
  with FlashAttention prefix support. We therefore charge each (new token, cached token)
  pair the attention cost per pair that the no-cache curve itself shows: its quadratic
  coefficient c covers n^2/2 causal pairs, so one pair costs 2c (about 0.9 ns on the
  H200 table, i.e. ~590 TFLOP/s at 4*layers*heads*head_dim FLOPs per pair).
  `prefill="measured-cached"` interpolates the measured cached runs instead.
* A batch of prefills: T0(sum of new) minus the cross-request pairs T0's quadratic term
  counts (attention never crosses requests), plus each request's cached-pair cost; never
  more than the requests one by one (the measured curve is slightly superlinear at 4-8k).
* Decode: the measured steps are eager PyTorch without CUDA graphs (31-35 ms per step at
  batch 1: launch bound, ~10x an engine with CUDA graphs). Serving engines decode with
  CUDA graphs, so the default decode model is analytic (memory roofline, constants
  below); `decode="measured"` uses the measured table (max(floor, a + k*batch*context)).
* Host -> GPU: latency + bytes / bandwidth fitted to the measured pinned copies
  (~52.6 GB/s, PCIe 5.0 x16). GPU -> host is assumed symmetric (not measured).

Analytic fallback (other model shapes, or `prefill="analytic"`): FLOPs / (peak x
efficiency), with the efficiency taken from the measured table's 32k no-cache point when
a table is loaded, else ANALYTIC_FLOP_EFFICIENCY.
"""
from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "bench" / "data" / "gpu_h200_llama3_8b.json"


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama-style, GQA)."""
    layers: int = 32
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 128256
    dtype_bytes: int = 2
    name: str = "llama-3-8b"  # meta-llama/Meta-Llama-3-8B config.json

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + 2 * self.vocab * self.hidden  # + embeddings and LM head

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes  # 128 KiB for Llama-3-8B

    @property
    def linear_flops_per_token(self) -> float:
        return 2.0 * (self.params - self.vocab * self.hidden)  # every weight but the embedding table: one MAC

    @property
    def attention_flops_per_pair(self) -> float:
        return 4.0 * self.layers * self.heads * self.head_dim  # QK^T and PV, 2 FLOPs per MAC each

    def table_key(self) -> dict:
        return {"hidden_size": self.hidden, "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "vocab_size": self.vocab}


LLAMA3_8B = ModelShape()


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    name: str
    hbm_bytes: float
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float     # dense FLOP/s


# NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS dense BF16 (1,979 with sparsity).
H200 = GpuSpec("NVIDIA H200", 141e9, 4.8e12, 989e12)

# Assumptions for the analytic decode model (not measured here; see docs/serving.md):
DECODE_HBM_EFFICIENCY = 0.70   # decode kernels reach ~60-80% of peak HBM bandwidth in tuned engines
DECODE_STEP_OVERHEAD_S = 1.0e-3  # CUDA-graph replay, sampling and scheduling per step
ANALYTIC_FLOP_EFFICIENCY = 0.55  # used only when no table is loaded (the H200 table gives ~0.6)
ANALYTIC_PREFILL_FLOOR_S = 0.010  # smallest prefill step when no table is loaded


class GpuModel:
    """prefill_s / decode_s / h2d_s for one GPU. Build with `gpu_model(...)`."""

    def __init__(self, shape: ModelShape, spec: GpuSpec, table: dict | None, *, prefill: str, decode: str):
        if prefill not in ("measured", "measured-cached", "analytic"):
            raise ValueError(f"prefill model must be measured, measured-cached or analytic, got {prefill!r}")
        if decode not in ("measured", "analytic"):
            raise ValueError(f"decode model must be measured or analytic, got {decode!r}")
        if table is None and (prefill != "analytic" or decode == "measured"):
            raise ValueError("a measured GPU model needs a calibration table")
        self.shape, self.spec = shape, spec
        self.prefill_kind, self.decode_kind = prefill, decode
        self.kv_bytes_per_token = shape.kv_bytes_per_token
        self.flop_efficiency = ANALYTIC_FLOP_EFFICIENCY
        self.h2d_latency_s, self.h2d_bandwidth = 5e-6, 50e9  # replaced by the table's fit
        self.floor_s = ANALYTIC_PREFILL_FLOOR_S
        if table is not None:
            self._fit(table)

    # ------------------------------------------------------------ calibration
    def _fit(self, table: dict) -> None:
        pts = sorted((p["new_tokens"], p["seconds"]) for p in table["prefill"] if p["cached_tokens"] == 0)
        self._n = np.array([n for n, _ in pts], np.float64)
        self._t = np.array([t for _, t in pts], np.float64)
        big = self._n >= 2048  # below that the eager model is launch bound, not compute bound
        a, b, c = np.linalg.lstsq(np.vstack([np.ones(big.sum()), self._n[big], self._n[big] ** 2]).T,
                                  self._t[big], rcond=None)[0]
        if c <= 0:
            raise ValueError("the no-cache prefill points show no quadratic (attention) term")
        self.quad = (float(a), float(b), float(c))
        self.pair_s = 2.0 * c  # seconds per (query, key) attention pair
        self.floor_s = float(self._t[0])
        n_max, t_max = self._n[-1], self._t[-1]
        flops = self.shape.linear_flops_per_token * n_max + self.shape.attention_flops_per_pair * n_max * n_max / 2
        self.flop_efficiency = flops / t_max / self.spec.bf16_flops
        # measured cached runs, for prefill="measured-cached": a grid over (new, cached)
        cached = sorted({p["cached_tokens"] for p in table["prefill"]})
        news = sorted({p["new_tokens"] for p in table["prefill"]})
        grid = {(p["new_tokens"], p["cached_tokens"]): p["seconds"] for p in table["prefill"]}
        self._grid_new, self._grid_cached = np.array(news, float), np.array(cached, float)
        self._grid = np.array([[grid.get((n, c), np.nan) for c in cached] for n in news])
        # decode: max(floor, a + k * batch * context) over the points above the launch floor
        dec = [(p["batch"], p["context_tokens"], p["seconds"]) for p in table["decode"]]
        floor = float(np.median([s for b, c, s in dec if b * c <= 8192]))
        above = [(b * c, s) for b, c, s in dec if s > 1.2 * floor]
        if len(above) >= 2:
            x, y = np.array([v[0] for v in above], float), np.array([v[1] for v in above], float)
            k, a0 = np.polyfit(x, y, 1)
        else:
            k, a0 = 0.0, floor
        self._decode_fit = (floor, float(a0), float(max(k, 0.0)))
        pinned = sorted((p["bytes"], p["seconds"]) for p in table["h2d_copy"] if p["pinned"])
        (b0, s0), (b1, s1) = pinned[0], pinned[-1]
        self.h2d_bandwidth = (b1 - b0) / (s1 - s0)
        self.h2d_latency_s = max(0.0, s0 - b0 / self.h2d_bandwidth)

    # ------------------------------------------------------------ prefill
    def _t0(self, n: float) -> float:
        """Measured no-cache prefill of n new tokens."""
        if n <= self._n[0]:
            return float(self._t[0])
        if n <= self._n[-1]:
            return float(np.interp(n, self._n, self._t))
        a, b, c = self.quad
        q = lambda x: a + b * x + c * x * x  # noqa: E731
        return float(self._t[-1] + q(n) - q(self._n[-1]))

    def _measured_cached(self, n: float, cached: float) -> float:
        """Bilinear interpolation of the measured (new, cached) grid, extrapolated with the
        flash pair cost beyond it."""
        gn, gc = self._grid_new, self._grid_cached
        cn = min(max(n, gn[0]), gn[-1])
        cc = min(cached, gc[-1])
        col = [float(np.interp(cn, gn, self._grid[:, j])) for j in range(gc.size)]
        t = float(np.interp(cc, gc, col))
        t += self._t0(n) - self._t0(cn)  # more new tokens than measured: the no-cache slope
        t += self.pair_s * n * max(0.0, cached - gc[-1])
        return t

    def prefill_s(self, news, cacheds) -> float:
        """One prefill iteration over requests with `news[i]` new tokens on top of
        `cacheds[i]` cached (loaded or GPU-resident) tokens."""
        news = np.asarray(news, np.float64)
        cacheds = np.asarray(cacheds, np.float64)
        total = float(news.sum())
        if total <= 0:
            return 0.0
        if self.prefill_kind == "analytic":
            s = self.shape
            flops = (s.linear_flops_per_token * total
                     + s.attention_flops_per_pair * float((news * news / 2 + news * cacheds).sum()))
            return max(self.floor_s, flops / (self.spec.bf16_flops * self.flop_efficiency))
        if self.prefill_kind == "measured-cached":
            if news.size == 1:
                return max(self.floor_s, self._measured_cached(float(news[0]), float(cacheds[0])))
            return max(self.floor_s, sum(self._measured_cached(n, c) - self.floor_s for n, c in zip(news, cacheds))
                       + self.floor_s)
        cross = total * total - float((news * news).sum())  # T0(total) counts pairs across requests
        t = self._t0(total) - self.quad[2] * cross + self.pair_s * float((news * cacheds).sum())
        if news.size > 1:  # never worse than running them one after the other
            t = min(t, float(self.prefill_alone_s(news, cacheds).sum()))
        return max(self.floor_s, t)

    def prefill_alone_s(self, news: np.ndarray, cacheds: np.ndarray) -> np.ndarray:
        """prefill_s of each (new, cached) pair as its own batch, vectorised (the
        scheduler's load-or-recompute estimate evaluates every cut point at once)."""
        news = np.asarray(news, np.float64)
        cacheds = np.asarray(cacheds, np.float64)
        if self.prefill_kind == "measured":
            t0 = np.interp(news, self._n, self._t)
            beyond = news > self._n[-1]
            if beyond.any():
                a, b, c = self.quad
                q = lambda x: a + b * x + c * x * x  # noqa: E731
                t0[beyond] = self._t[-1] + q(news[beyond]) - q(self._n[-1])
            return np.maximum(self.floor_s, t0 + self.pair_s * news * cacheds)
        return np.array([self.prefill_s([n], [c]) for n, c in zip(news, cacheds)])

    # ------------------------------------------------------------ decode
    def decode_s(self, batch: int, context_tokens: float) -> float:
        """One decode step for `batch` requests holding `context_tokens` tokens of KV in all."""
        if batch <= 0:
            return 0.0
        if self.decode_kind == "measured":
            floor, a, k = self._decode_fit
            return max(floor, a + k * context_tokens)
        s = self.shape
        bytes_moved = s.weight_bytes + context_tokens * s.kv_bytes_per_token
        flops = s.linear_flops_per_token * batch + s.attention_flops_per_pair * context_tokens / 2
        return DECODE_STEP_OVERHEAD_S + max(bytes_moved / (self.spec.hbm_bandwidth * DECODE_HBM_EFFICIENCY),
                                            flops / (self.spec.bf16_flops * self.flop_efficiency))

    def decode_steps_s(self, batch: int, context_tokens: float, steps: int) -> np.ndarray:
        """Durations of `steps` consecutive steps (each adds `batch` tokens of context)."""
        ctx = context_tokens + batch * np.arange(steps, dtype=np.float64)
        if self.decode_kind == "measured":
            floor, a, k = self._decode_fit
            return np.maximum(floor, a + k * ctx)
        s = self.shape
        mem = (s.weight_bytes + ctx * s.kv_bytes_per_token) / (self.spec.hbm_bandwidth * DECODE_HBM_EFFICIENCY)
        comp = (s.linear_flops_per_token * batch + s.attention_flops_per_pair * ctx / 2) / (
            self.spec.bf16_flops * self.flop_efficiency)
        return DECODE_STEP_OVERHEAD_S + np.maximum(mem, comp)

    # ------------------------------------------------------------ copies
    def h2d_s(self, nbytes: float) -> float:
        return self.h2d_latency_s + nbytes / self.h2d_bandwidth

    def describe(self) -> str:
        return (f"{self.spec.name}, {self.shape.name}: prefill {self.prefill_kind} (floor {self.floor_s * 1e3:.1f} ms, "
                f"attention pair {self.pair_s * 1e9 if hasattr(self, 'pair_s') else float('nan'):.2f} ns, "
                f"{self.flop_efficiency:.0%} of peak at 32k), decode {self.decode_kind}, "
                f"H2D {self.h2d_bandwidth / 1e9:.1f} GB/s")


@lru_cache(maxsize=8)
def _load_table(path: str) -> dict:
    return json.loads(Path(path).read_text())


def gpu_model(shape: ModelShape = LLAMA3_8B, spec: GpuSpec = H200, table: str | Path | None = DEFAULT_TABLE,
              *, prefill: str = "measured", decode: str = "analytic") -> GpuModel:
    """The cost model for `shape` on `spec`. The measured table is used when its model
    matches `shape`; other shapes fall back to the analytic model."""
    data = _load_table(str(table)) if table is not None else None
    if data is not None and {k: data["model"].get(k) for k in shape.table_key()} != shape.table_key():
        data = None  # another shape: the table does not apply
    if data is None:
        prefill = "analytic"
        decode = "analytic"
    return GpuModel(shape, spec, data, prefill=prefill, decode=decode)
