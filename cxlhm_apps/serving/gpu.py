"""GPU cost model: prefill time f(new tokens, cached tokens) for a batch, decode-step time
f(batch, total context), and host <-> GPU copy time, for a model shape on a GPU.

Where the numbers come from (`GpuModel.source` says which applies):

* **measured** - a table written by bench/gpu/calibrate_gpu.py on that GPU for that shape
  (bench/data/gpu_h200_*.json: an H200, Llama-3-8B and Qwen2.5-32B shapes). The engine-like
  runs there (CUDA graphs for small prefills and every decode step, flash attention with
  a lower-right causal mask against a cached prefix, packed batches) are fitted by
    prefill  t = a + b * sum(new) + p * sum(new^2 / 2 + new * cached)
  (fixed cost, linear layers per token, attention per (query, key) pair; one fit covers
  single and batched prefills: it predicts the measured packed batches within 4%), with
  the measured single-request times as the floor below 512 new tokens (there the GPU is
  not full and the fit would undercharge: 128 new tokens take 8 ms on the H200 for 8B,
  the fit says 4.7);
    decode   t = c0 + c1 * batch + c2 * context + c3 * context / batch
  (weights, per-sequence work, KV read, and the long single sequence whose attention
  occupies only a few SMs), fitted to the CUDA-graph steps.
* **derived** - another GPU: the measured model of the same shape on the H200, each
  time multiplied by the ratio of the two GPUs' roofline bounds for that very step (the
  target's FLOP rate and HBM bandwidth from its datasheet, scaled by what the H200 run
  measured against the H200 datasheet), so the efficiency measured on the H200 carries
  over. PCIe likewise: the H200's measured share of its link's nominal rate.
* **analytic projection** - a shape on GPUs nobody measured (a 70B model over 2 GPUs with
  tensor parallelism): the measured model of the nearest measured shape, scaled by the
  ratio of roofline bounds (the step's FLOPs and bytes split over the GPUs), plus two
  all-reduces of the activations per layer over NVLink.

`prefill="analytic"` / `decode="analytic"` use the plain roofline with fixed
efficiencies instead (ANALYTIC_* below), for comparison.
"""
from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "bench" / "data"


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
    def layer_params(self) -> int:
        d = self.head_dim
        return self.hidden * (self.heads + 2 * self.kv_heads) * d + self.heads * d * self.hidden \
            + 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden  # + embeddings and LM head

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def step_weight_bytes(self) -> int:
        """Weights one forward step reads (every layer and the LM head, not the embedding table)."""
        return (self.layers * self.layer_params + self.vocab * self.hidden) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes  # 128 KiB for Llama-3-8B

    @property
    def linear_flops_per_token(self) -> float:
        return 2.0 * self.layers * self.layer_params

    @property
    def attention_flops_per_pair(self) -> float:
        return 4.0 * self.layers * self.heads * self.head_dim  # QK^T and PV, 2 FLOPs per MAC each

    def table_key(self) -> dict:
        return {"hidden_size": self.hidden, "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "vocab_size": self.vocab}


LLAMA3_8B = ModelShape()
# Qwen/Qwen2.5-32B config.json (its QKV bias is left out: elementwise, negligible)
QWEN25_32B = ModelShape(64, 5120, 27648, 40, 8, 152064, name="qwen2.5-32b")
# meta-llama/Meta-Llama-3-70B config.json
LLAMA3_70B = ModelShape(80, 8192, 28672, 64, 8, 128256, name="llama-3-70b")
MODELS = {"llama3-8b": LLAMA3_8B, "qwen2.5-32b": QWEN25_32B, "llama3-70b": LLAMA3_70B}


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One serving instance: `tp` GPUs of one kind (datasheet figures per GPU)."""
    name: str
    hbm_bytes: float
    hbm_bandwidth: float      # bytes/s
    bf16_flops: float         # dense FLOP/s
    pcie_bandwidth: float     # nominal host link, bytes/s per direction
    tp: int = 1
    nvlink_bandwidth: float = 0.0  # per direction, bytes/s (tensor parallelism only)


# Datasheets: H200 SXM 141 GB HBM3e 4.8 TB/s, 989 TFLOPS dense BF16, PCIe 5.0 x16 (64 GB/s),
# NVLink 900 GB/s (450 per direction); H100 SXM 80 GB HBM3 3.35 TB/s, 989 TFLOPS, PCIe 5.0
# x16; L40S 48 GB GDDR6 864 GB/s, 362 TFLOPS dense BF16, PCIe 4.0 x16 (32 GB/s).
H200 = GpuSpec("NVIDIA H200", 141e9, 4.8e12, 989e12, 64e9)
GPUS = {
    "h200": H200,
    "h100-80g": GpuSpec("NVIDIA H100 SXM 80GB", 80e9, 3.35e12, 989e12, 64e9),
    "l40s-48g": GpuSpec("NVIDIA L40S 48GB", 48e9, 0.864e12, 362e12, 32e9),
    "2xh200-tp2": GpuSpec("2x NVIDIA H200, tensor parallel", 141e9, 4.8e12, 989e12, 64e9, tp=2,
                          nvlink_bandwidth=450e9),
}
MEASURED_ON = "h200"  # the GPU the committed tables were measured on
TABLES = {"llama3-8b": DATA / "gpu_h200_llama3_8b.json", "qwen2.5-32b": DATA / "gpu_h200_qwen2.5_32b.json"}
DEFAULT_TABLE = TABLES["llama3-8b"]

# vLLM-style KV pool: gpu_memory_utilization 0.9 of HBM, minus the weights (split over the
# TP group) and an activation/workspace reserve per GPU (assumed; ~8 GB at 16k batched tokens).
GPU_MEMORY_UTILIZATION = 0.9
ACTIVATION_RESERVE_BYTES = 8e9
PREFILL_FIT_MIN_TOKENS = 512  # below this the measured single-request times are the floor

# Plain roofline (prefill="analytic" / decode="analytic"; not measured, see docs/serving.md):
DECODE_HBM_EFFICIENCY = 0.70
DECODE_STEP_OVERHEAD_S = 1.0e-3
ANALYTIC_FLOP_EFFICIENCY = 0.55
ANALYTIC_PREFILL_FLOOR_S = 0.010


def kv_pool_bytes(shape: ModelShape, spec: GpuSpec) -> int:
    """The GPU KV pool of one instance (bytes, whole GiB); 0 when the weights do not fit."""
    per_gpu = spec.hbm_bytes * GPU_MEMORY_UTILIZATION - shape.weight_bytes / spec.tp - ACTIVATION_RESERVE_BYTES
    return max(0, int(per_gpu * spec.tp) >> 30 << 30)


def roofline_s(shape: ModelShape, spec: GpuSpec, flops, nbytes, peak_flops: float | None = None,
               peak_bw: float | None = None):
    """max(FLOPs / rate, bytes / bandwidth) over the instance's GPUs (arrays welcome)."""
    f = (peak_flops or spec.bf16_flops) * spec.tp
    b = (peak_bw or spec.hbm_bandwidth) * spec.tp
    return np.maximum(np.asarray(flops, np.float64) / f, np.asarray(nbytes, np.float64) / b)


@dataclasses.dataclass(frozen=True)
class Fitted:
    """The measured model of one shape on the GPU it was measured on."""
    shape: ModelShape
    prefill: tuple            # a, b, p
    small_n: np.ndarray       # new tokens of the measured small single prefills
    small_c: np.ndarray       # their cached tokens (grid)
    small_t: np.ndarray       # [len(small_n), len(small_c)] seconds
    decode: tuple             # c0, c1, c2, c3
    h2d_bandwidth: float
    h2d_latency_s: float
    d2h_bandwidth: float
    peak_flops: float         # measured in the same run
    peak_bw: float
    decode_points: list       # (batch, context per request, seconds) as measured
    table: dict


def fit_table(table: dict, shape: ModelShape) -> Fitted:
    """Fit the measured model to a calibrate_gpu.py table (relative least squares)."""
    pts = np.array([(p["new_tokens"], p["cached_tokens"], p["seconds"]) for p in table["prefill"]
                    if p.get("kernel") == "flex" and "seconds" in p], np.float64)
    if pts.size == 0:
        raise ValueError("the table has no flex prefill points (written by an older calibrate_gpu.py?)")
    big = pts[:, 0] >= PREFILL_FIT_MIN_TOKENS
    n, c, t = pts[big, 0], pts[big, 1], pts[big, 2]
    a = np.vstack([np.ones_like(n), n, n * n / 2 + n * c]).T / t[:, None]
    prefill = tuple(float(x) for x in np.linalg.lstsq(a, np.ones_like(t), rcond=None)[0])
    small_n = np.array(sorted({x for x in pts[:, 0] if x <= PREFILL_FIT_MIN_TOKENS}))
    small_c = np.array(sorted({x for x in pts[:, 1]}))
    grid = {(x[0], x[1]): x[2] for x in pts}
    small_t = np.array([[grid[(nn, cc)] for cc in small_c] for nn in small_n])
    dec = np.array([(p["batch"], p["context_tokens"], p["seconds"]) for p in table["decode"] if "seconds" in p],
                   np.float64)
    b, ctx, ts = dec[:, 0], dec[:, 1], dec[:, 2]
    total = b * ctx
    a = np.vstack([np.ones_like(b), b, total, ctx]).T / ts[:, None]
    decode = tuple(float(x) for x in np.linalg.lstsq(a, np.ones_like(ts), rcond=None)[0])

    def link(direction):
        pinned = sorted((p["bytes"], p["seconds"]) for p in table["h2d_copy"]
                        if p["pinned"] and p.get("direction", "h2d") == direction)
        (b0, s0), (b1, s1) = pinned[0], pinned[-1]
        bw = (b1 - b0) / (s1 - s0)
        return bw, max(0.0, s0 - b0 / bw)
    h2d_bw, h2d_lat = link("h2d")
    d2h_bw = link("d2h")[0] if any(p.get("direction") == "d2h" for p in table["h2d_copy"]) else h2d_bw
    peaks = table.get("peaks", {})
    return Fitted(shape, prefill, small_n, small_c, small_t, decode, h2d_bw, h2d_lat, d2h_bw,
                  float(peaks.get("bf16_flops", H200.bf16_flops)), float(peaks.get("hbm_bytes_per_s", H200.hbm_bandwidth)),
                  [tuple(x) for x in dec.tolist()], table)


class GpuModel:
    """prefill_s / decode_s / h2d_s for one serving instance. Build with `gpu_model(...)`."""

    def __init__(self, shape: ModelShape, spec: GpuSpec, base: Fitted | None, *, prefill: str = "measured",
                 decode: str = "measured", source: str = "measured"):
        if prefill not in ("measured", "analytic"):
            raise ValueError(f"prefill model must be measured or analytic, got {prefill!r}")
        if decode not in ("measured", "analytic"):
            raise ValueError(f"decode model must be measured or analytic, got {decode!r}")
        if base is None and (prefill != "analytic" or decode != "analytic"):
            raise ValueError("a measured GPU model needs a calibration table")
        self.shape, self.spec, self.base, self.source = shape, spec, base, source
        self.prefill_kind, self.decode_kind = prefill, decode
        self.kv_bytes_per_token = shape.kv_bytes_per_token
        self.kv_pool_bytes = kv_pool_bytes(shape, spec)
        self.scaled = base is not None and (base.shape != shape or spec != H200)
        if base is not None:
            # the target's ceilings, as the measured run relates to the H200 datasheet
            self.peak_flops = spec.bf16_flops * base.peak_flops / H200.bf16_flops
            self.peak_bw = spec.hbm_bandwidth * base.peak_bw / H200.hbm_bandwidth
            link_share = base.h2d_bandwidth / H200.pcie_bandwidth
            # TP: each GPU moves its share of the KV heads over its own link
            self.h2d_bandwidth = spec.pcie_bandwidth * link_share * spec.tp
            self.h2d_latency_s = base.h2d_latency_s
            self.floor_s = float(base.small_t[0, 0]) * float(self._ratio([base.small_n[0]], [0])[0])
        else:
            self.peak_flops, self.peak_bw = spec.bf16_flops, spec.hbm_bandwidth
            self.h2d_bandwidth, self.h2d_latency_s = spec.pcie_bandwidth * 0.85 * spec.tp, 5e-6
            self.floor_s = ANALYTIC_PREFILL_FLOOR_S

    # ------------------------------------------------------------ scaling
    def _bound(self, shape, spec, peak_f, peak_b, tokens, logits, pairs, kv_tokens):
        flops = shape.linear_flops_per_token * tokens + 2.0 * shape.hidden * shape.vocab * logits \
            + shape.attention_flops_per_pair * pairs
        nbytes = shape.step_weight_bytes + shape.kv_bytes_per_token * kv_tokens
        return roofline_s(shape, spec, flops, nbytes, peak_f, peak_b)

    def _ratio(self, tokens, pairs, logits=None, kv_tokens=None):
        """target bound / measured bound for the same step (1 where nothing is scaled)."""
        tokens = np.asarray(tokens, np.float64)
        pairs = np.asarray(pairs, np.float64)
        logits = np.ones_like(tokens) if logits is None else np.asarray(logits, np.float64)
        kv_tokens = tokens if kv_tokens is None else np.asarray(kv_tokens, np.float64)
        b = self.base
        if not self.scaled:
            return np.ones_like(tokens)
        mine = self._bound(self.shape, self.spec, self.peak_flops, self.peak_bw, tokens, logits, pairs, kv_tokens)
        theirs = self._bound(b.shape, H200, b.peak_flops, b.peak_bw, tokens, logits, pairs, kv_tokens)
        return mine / theirs

    def _allreduce_s(self, tokens):
        """Tensor parallelism: two all-reduces of the activations per layer (ring; for 2
        GPUs each moves its half out and the other half in)."""
        s = self.spec
        if s.tp <= 1:
            return np.zeros_like(np.asarray(tokens, np.float64))
        nbytes = np.asarray(tokens, np.float64) * self.shape.hidden * self.shape.dtype_bytes
        return 2 * self.shape.layers * nbytes * 2 * (s.tp - 1) / s.tp / s.nvlink_bandwidth

    # ------------------------------------------------------------ prefill
    def _measured_prefill(self, total_new, pairs, mean_cached):
        """The base shape's measured prefill time (vectorised over steps)."""
        b = self.base
        a, lin, p = b.prefill
        t = a + lin * total_new + p * pairs
        small = total_new < PREFILL_FIT_MIN_TOKENS
        if np.any(small):
            raw = total_new[small]
            n = np.clip(raw, b.small_n[0], b.small_n[-1])
            c = mean_cached[small]
            cc = np.clip(c, b.small_c[0], b.small_c[-1])
            cols = np.array([np.interp(n, b.small_n, b.small_t[:, j]) for j in range(b.small_c.size)])
            floor = np.array([np.interp(cc[i], b.small_c, cols[:, i]) for i in range(n.size)])
            floor += p * n * np.maximum(0.0, c - b.small_c[-1])  # longer prefixes than measured: the pair cost
            # Below the smallest measured prefill (128 new tokens) the cost comes from the
            # model, not the floor: one new token on a cached prefix is one decode step of a
            # batch of one over that context (measured CUDA-graph steps), and between 1 and
            # 128 tokens it grows linearly to the measured 128-token time.
            below = raw < b.small_n[0]
            if np.any(below):
                c0, c1, c2, c3 = b.decode
                ctx = c[below] + 1.0
                one = np.minimum(c0 + c1 + (c2 + c3) * ctx, floor[below])
                share = (np.maximum(raw[below], 1.0) - 1.0) / (b.small_n[0] - 1.0)
                floor[below] = one + share * (floor[below] - one)
                t_small = t[small]
                t_small[below] = floor[below]
                t[small] = np.maximum(t_small, floor)
            else:
                t[small] = np.maximum(t[small], floor)
        return t

    def _prefill_many(self, total_new, pairs, mean_cached, requests):
        total_new = np.asarray(total_new, np.float64)
        pairs = np.asarray(pairs, np.float64)
        if self.prefill_kind == "analytic":
            s = self.shape
            flops = s.linear_flops_per_token * total_new + s.attention_flops_per_pair * pairs
            return np.maximum(self.floor_s, flops / (self.peak_flops * self.spec.tp * ANALYTIC_FLOP_EFFICIENCY))
        t = self._measured_prefill(total_new, pairs, np.asarray(mean_cached, np.float64))
        kv = total_new + np.asarray(mean_cached, np.float64) * np.asarray(requests, np.float64)
        return t * self._ratio(total_new, pairs, requests, kv) + self._allreduce_s(total_new)

    def prefill_s(self, news, cacheds) -> float:
        """One prefill iteration over requests with `news[i]` new tokens on top of
        `cacheds[i]` cached (loaded or GPU-resident) tokens."""
        news = np.asarray(news, np.float64)
        cacheds = np.asarray(cacheds, np.float64)
        total = float(news.sum())
        if total <= 0:
            return 0.0
        pairs = float((news * news / 2 + news * cacheds).sum())
        mean_cached = float((news * cacheds).sum() / total)
        return float(self._prefill_many([total], [pairs], [mean_cached], [news.size])[0])

    def prefill_alone_s(self, news, cacheds) -> np.ndarray:
        """prefill_s of each (new, cached) pair as its own batch, vectorised (the
        scheduler's load-or-recompute estimate evaluates every cut point at once)."""
        news = np.asarray(news, np.float64)
        cacheds = np.asarray(cacheds, np.float64)
        out = self._prefill_many(news, news * news / 2 + news * cacheds, cacheds, np.ones_like(news))
        return np.where(news > 0, out, 0.0)

    def iteration_s(self, news, cacheds, batch: int, context_tokens: float) -> float:
        """One mixed iteration (vLLM V1): prefill chunks `news` on `cacheds` plus one decode
        token for each of `batch` requests holding `context_tokens` of KV. The step's
        weight read and launch cost (a decode step of one request on no context) is paid
        once; the decodes add their per-sequence and KV-reading cost on top (assumed
        additive: the chunk's matmuls are compute-bound, the decodes' attention reads
        memory)."""
        t = self.prefill_s(news, cacheds)
        if batch > 0:
            t += max(0.0, self.decode_s(batch, context_tokens) - self.decode_s(1, 0.0))
        return t

    @property
    def layers(self) -> int:
        return self.shape.layers

    # ------------------------------------------------------------ decode
    def decode_steps_s(self, batch: int, context_tokens: float, steps: int) -> np.ndarray:
        """Durations of `steps` consecutive steps (each adds `batch` tokens of context)."""
        ctx = context_tokens + batch * np.arange(steps, dtype=np.float64)
        s = self.shape
        if self.decode_kind == "analytic":
            mem = (s.step_weight_bytes + ctx * s.kv_bytes_per_token) / (self.peak_bw * self.spec.tp * DECODE_HBM_EFFICIENCY)
            comp = (s.linear_flops_per_token * batch + s.attention_flops_per_pair * ctx) / (
                self.peak_flops * self.spec.tp * ANALYTIC_FLOP_EFFICIENCY)
            return DECODE_STEP_OVERHEAD_S + np.maximum(mem, comp) + self._allreduce_s(np.full_like(ctx, batch))
        c0, c1, c2, c3 = self.base.decode
        t = c0 + c1 * batch + c2 * ctx + c3 * ctx / batch
        ones = np.full_like(ctx, float(batch))
        return t * self._ratio(ones, ctx, ones, ctx) + self._allreduce_s(ones)

    def decode_s(self, batch: int, context_tokens: float) -> float:
        """One decode step for `batch` requests holding `context_tokens` tokens of KV in all."""
        if batch <= 0:
            return 0.0
        return float(self.decode_steps_s(batch, context_tokens, 1)[0])

    # ------------------------------------------------------------ copies
    def h2d_s(self, nbytes: float) -> float:
        return self.h2d_latency_s + nbytes / self.h2d_bandwidth

    def describe(self) -> str:
        tp = f" x{self.spec.tp} (TP)" if self.spec.tp > 1 else ""
        return (f"{self.shape.name} on {self.spec.name}{tp} [{self.source}]: prefill {self.prefill_kind}, decode "
                f"{self.decode_kind}; 512 new tokens {self.prefill_s([512], [0]) * 1e3:.1f} ms, on 8k cached "
                f"{self.prefill_s([512], [8192]) * 1e3:.1f} ms; decode step (batch 32, 4k each) "
                f"{self.decode_s(32, 32 * 4096) * 1e3:.1f} ms; H2D {self.h2d_bandwidth / 1e9:.1f} GB/s; KV pool "
                f"{self.kv_pool_bytes / 2**30:.0f} GiB")


@lru_cache(maxsize=8)
def _load_fit(path: str, shape: ModelShape) -> Fitted:
    table = json.loads(Path(path).read_text())
    if {k: table["model"].get(k) for k in shape.table_key()} != shape.table_key():
        raise ValueError(f"{path} was measured for another model shape")
    return fit_table(table, shape)


def shape_named(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def spec_named(name: str) -> GpuSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None


def model_key(shape: ModelShape) -> str | None:
    return next((k for k, v in MODELS.items() if v == shape), None)


def gpu_model(shape: ModelShape | str = LLAMA3_8B, spec: GpuSpec | str = H200, table: str | Path | None = None,
              *, prefill: str = "measured", decode: str = "measured") -> GpuModel:
    """The cost model for `shape` on `spec` (objects or preset names). Measured where a
    table for this shape on this GPU exists, derived from the H200 table of the same
    shape on another GPU, an analytic projection from the nearest measured shape
    otherwise. `table` forces a table (measured for `shape`)."""
    shape = shape_named(shape) if isinstance(shape, str) else shape
    spec = spec_named(spec) if isinstance(spec, str) else spec
    if table is not None:
        return GpuModel(shape, spec, _load_fit(str(table), shape), prefill=prefill, decode=decode,
                        source="measured" if spec == H200 else "derived")
    key = model_key(shape)
    if key in TABLES and TABLES[key].exists():
        base = _load_fit(str(TABLES[key]), shape)
        source = "measured" if spec == H200 else "derived from the H200 measurement"
        return GpuModel(shape, spec, base, prefill=prefill, decode=decode, source=source)
    measured = [MODELS[k] for k in TABLES if TABLES[k].exists()]
    if not measured:
        return GpuModel(shape, spec, None, prefill="analytic", decode="analytic", source="analytic (no table)")
    nearest = min(measured, key=lambda m: abs(np.log(m.params / shape.params)))
    base = _load_fit(str(TABLES[model_key(nearest)]), nearest)
    return GpuModel(shape, spec, base, prefill=prefill, decode=decode,
                    source=f"analytic projection from the {nearest.name} H200 measurement")


# The (model, GPU) pairs the reproduction runs; pairs whose weights leave no room for a
# long context's KV are listed with the reason instead.
PAIRS = (("llama3-8b", "h200"), ("qwen2.5-32b", "h200"), ("llama3-8b", "h100-80g"), ("llama3-8b", "l40s-48g"),
         ("llama3-70b", "2xh200-tp2"))
