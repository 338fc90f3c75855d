"""Measure what the serving model needs from a real GPU, the way a serving engine runs it.

A Llama-style decoder (RMSNorm, fused QKV with GQA, RoPE, SwiGLU MLP; random bf16 weights
built from the shape alone, no download) written out in plain PyTorch so that every
kernel is one an engine would run:

  * prefill: flash attention through `flex_attention` with one mask for every case (causal
    within a request, lower-right against a cached prefix, no attention across requests
    of a batch), and SDPA's flash kernel for prefills with no cached prefix as the
    reference kernel; small prefills are replayed from CUDA graphs (launch overhead is
    what an engine avoids), large ones run eagerly (their kernels are long);
  * batched prefill of several requests (packed tokens, one attention call);
  * decode: one CUDA graph per (batch, context) step, KV read in place (flash kernel,
    the query heads of a KV group packed as the query length);
  * host <-> GPU copies of pinned and pageable memory, both directions;
  * the GPU's own ceilings in the same run: a large bf16 matrix product and a large
    device-to-device copy. Every figure is printed beside its roofline bound
    (FLOPs / measured matrix rate, bytes / measured copy bandwidth, the larger of the two)
    so an implausible one is visible.

Writes one JSON table per shape and prints every figure as it is measured.

    python bench/gpu/calibrate_gpu.py --shape llama3-8b --output gpu_h200_llama3_8b.json   # on the GPU
    python bench/gpu/calibrate_gpu.py --shape tiny --device cpu --output /tmp/t.json       # smoke test
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

# Shapes from each model's config.json (Meta-Llama-3-8B, Qwen2.5-32B). Qwen2.5's QKV bias
# is left out: a bias add is elementwise work far below the matrix products beside it.
SHAPES = {
    "llama3-8b": dict(name="llama-3-8b", layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8,
                      vocab=128256),
    "qwen2.5-32b": dict(name="qwen2.5-32b", layers=64, hidden=5120, intermediate=27648, heads=40, kv_heads=8,
                        vocab=152064),
    "tiny": dict(name="tiny", layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, vocab=1000),
}
GRAPH_MAX_TOKENS = 2048  # prefills up to this many new tokens are replayed from a CUDA graph


class Clock:
    """Median seconds of fn() after warm-up: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn, warmup: int = 1, repeat: int = 5) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(repeat):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times)


class Shape:
    """The shape's sizes and roofline counts. The same arithmetic as cxlhm_apps.serving.gpu.ModelShape,
    written out again on purpose: this script runs alone on the GPU machine, where cxlhm and
    its dependencies are not installed."""

    def __init__(self, name, layers, hidden, intermediate, heads, kv_heads, vocab):
        self.name, self.layers, self.hidden, self.intermediate = name, layers, hidden, intermediate
        self.heads, self.kv_heads, self.vocab = heads, kv_heads, vocab
        self.head_dim = hidden // heads

    @property
    def layer_params(self) -> int:
        d = self.head_dim
        return self.hidden * (self.heads + 2 * self.kv_heads) * d + self.heads * d * self.hidden \
            + 3 * self.hidden * self.intermediate

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 2

    def weight_bytes(self) -> int:  # what a step reads: every layer and the LM head (bf16)
        return 2 * (self.layers * self.layer_params + self.hidden * self.vocab)

    def linear_flops(self, tokens: float, logits: float) -> float:
        return 2.0 * (self.layers * self.layer_params * tokens + self.hidden * self.vocab * logits)

    def attention_flops(self, pairs: float) -> float:
        return 4.0 * self.layers * self.heads * self.head_dim * pairs

    def table_key(self) -> dict:  # the keys cxlhm_apps.serving.gpu matches a table by
        return {"hidden_size": self.hidden, "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "vocab_size": self.vocab}


class Decoder:
    """The weights of a Llama-style decoder and its forward pass over packed tokens."""

    def __init__(self, s: Shape, device, dtype):
        self.s, self.device, self.dtype = s, device, dtype
        d = s.head_dim

        def w(*shape):
            return torch.randn(*shape, device=device, dtype=dtype) * (1.0 / math.sqrt(shape[0]))

        self.embed = torch.randn(s.vocab, s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.hidden, s.vocab)
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.layers = [dict(ln1=torch.ones(s.hidden, device=device, dtype=dtype),
                            ln2=torch.ones(s.hidden, device=device, dtype=dtype),
                            qkv=w(s.hidden, (s.heads + 2 * s.kv_heads) * d), o=w(s.heads * d, s.hidden),
                            gu=w(s.hidden, 2 * s.intermediate), down=w(s.intermediate, s.hidden))
                       for _ in range(s.layers)]
        self.inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))

    def rope(self, positions):
        f = positions.float()[:, None] * self.inv_freq[None]
        emb = torch.cat([f, f], -1)
        return emb.cos().to(self.dtype)[:, None], emb.sin().to(self.dtype)[:, None]

    @staticmethod
    def _rotate(x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

    def forward(self, ids, cos, sin, write_kv, attend, last):
        """ids [N]; write_kv(layer, k [N,Hkv,D], v) stores the new KV; attend(layer, q [N,H,D])
        -> [N, H*D]; logits for the rows `last` (a request's last token) only."""
        s = self.s
        d = s.head_dim
        x = self.embed[ids]
        for i, L in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden,), L["ln1"])
            qkv = h @ L["qkv"]
            q = qkv[:, :s.heads * d].view(-1, s.heads, d)
            k = qkv[:, s.heads * d:(s.heads + s.kv_heads) * d].view(-1, s.kv_heads, d)
            v = qkv[:, (s.heads + s.kv_heads) * d:].view(-1, s.kv_heads, d)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            write_kv(i, k, v)
            x = x + attend(i, q) @ L["o"]
            h = F.rms_norm(x, (s.hidden,), L["ln2"])
            g, u = (h @ L["gu"]).chunk(2, -1)
            x = x + (F.silu(g) * u) @ L["down"]
        x = F.rms_norm(x[last], (s.hidden,), self.norm)
        return (x @ self.lm_head).argmax(-1)


def packed_block_mask(q_doc, q_abs, kv_doc, kv_pos, block: int = 128):
    """flex_attention's BlockMask for packed requests: query i may see key j when both
    belong to one request and key j's position is at most query i's (lower-right causal
    against the request's cached prefix). Built at block granularity from per-block
    ranges (create_block_mask would evaluate every (query, key) pair: 2G of them at 32k
    new tokens on 32k cached)."""
    from torch.nn.attention.flex_attention import BlockMask

    def ranges(x, n):
        pad = (-n) % block
        lo = F.pad(x, (0, pad), value=int(x[-1])).view(-1, block)
        return lo.min(1).values, lo.max(1).values
    nq, nk = q_doc.numel(), kv_doc.numel()
    qd_lo, qd_hi = ranges(q_doc, nq)
    qa_lo, qa_hi = ranges(q_abs, nq)
    kd_lo, kd_hi = ranges(kv_doc, nk)
    kp_lo, kp_hi = ranges(kv_pos, nk)
    overlap = (qd_lo[:, None] <= kd_hi[None]) & (kd_lo[None] <= qd_hi[:, None])
    one_doc = (qd_lo == qd_hi)[:, None] & (kd_lo == kd_hi)[None] & (qd_lo[:, None] == kd_lo[None])
    # a block pair is empty when no request spans both, or (one request) every key is ahead
    possible = overlap & ~(one_doc & (kp_lo[None] > qa_hi[:, None]))
    full = one_doc & (kp_hi[None] <= qa_lo[:, None])
    # blocks cut by the sequence ends are never full: the kernel masks their padding
    if nq % block:
        full[-1] = False
    if nk % block:
        full[:, -1] = False
    partial = possible & ~full

    def listed(m):
        num = m.sum(-1).to(torch.int32)[None, None]
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None, None]
        return num, idx

    def mask(b, h, q, kv):
        return (q_doc[q] == kv_doc[kv]) & (kv_pos[kv] <= q_abs[q])
    (pn, pi), (fn, fi) = listed(partial), listed(full)
    return BlockMask.from_kv_blocks(pn, pi, fn, fi, BLOCK_SIZE=block, mask_mod=mask, seq_lengths=(nq, nk))


class PackedPrefill:
    """One prefill iteration over requests i with news[i] new tokens on cacheds[i] cached
    ones, tokens packed: the KV of request i occupies [start_i, start_i + c_i + n_i) of one
    KV axis. Cached KV is random (its values do not change the time)."""

    def __init__(self, model: Decoder, news, cacheds, kernel: str, flex):
        s, dev = model.s, model.device
        self.model, self.kernel, self.flex = model, kernel, flex
        q_doc, q_abs, kv_doc, kv_pos, slots, pos, last = [], [], [], [], [], [], []
        start = n_total = 0
        for r, (n, c) in enumerate(zip(news, cacheds)):
            q_doc += [r] * n
            q_abs += range(c, c + n)
            kv_doc += [r] * (c + n)
            kv_pos += range(c + n)
            slots += range(start + c, start + c + n)
            start += c + n
            n_total += n
            last.append(n_total - 1)
        t = lambda v: torch.tensor(v, device=dev, dtype=torch.int64)  # noqa: E731
        self.ids = torch.randint(0, s.vocab, (n_total,), device=dev)
        self.slots, self.last = t(slots), t(last)
        self.cos, self.sin = model.rope(t(q_abs))
        self.k = [torch.randn(1, s.kv_heads, start, s.head_dim, device=dev, dtype=model.dtype) for _ in model.layers]
        self.v = [torch.randn_like(k) for k in self.k]
        self.block_mask = None
        if kernel == "flex":
            self.block_mask = packed_block_mask(t(q_doc), t(q_abs), t(kv_doc), t(kv_pos))

    def write(self, i, k, v):
        self.k[i].index_copy_(2, self.slots, k.transpose(0, 1)[None])
        self.v[i].index_copy_(2, self.slots, v.transpose(0, 1)[None])

    def attend(self, i, q):
        q = q.transpose(0, 1)[None]  # [1, H, N, D]
        if self.kernel == "flex":
            o = self.flex(q, self.k[i], self.v[i], block_mask=self.block_mask, enable_gqa=True)
        elif self.kernel == "sdpa-lr":  # one request on a cached prefix: SDPA's lower-right causal bias
            from torch.nn.attention.bias import causal_lower_right
            g = q.shape[1] // self.k[i].shape[1]
            k, v = self.k[i].repeat_interleave(g, 1), self.v[i].repeat_interleave(g, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]))
        else:  # SDPA, one request without a cached prefix: plain causal
            o = F.scaled_dot_product_attention(q, self.k[i], self.v[i], is_causal=True, enable_gqa=True)
        return o[0].transpose(0, 1).reshape(q.shape[2], -1)

    def __call__(self):
        return self.model.forward(self.ids, self.cos, self.sin, self.write, self.attend, self.last)


class DecodeStep:
    """One decode step of `batch` requests with `context` tokens each: the new token's KV
    is written at position context-1 and attention reads all `context` positions."""

    def __init__(self, model: Decoder, batch: int, context: int, k_pool, v_pool):
        s, dev = model.s, model.device
        self.model, self.batch, self.context = model, batch, context
        self.k = [p[:batch * s.kv_heads * context * s.head_dim].view(batch, s.kv_heads, context, s.head_dim)
                  for p in k_pool]
        self.v = [p[:batch * s.kv_heads * context * s.head_dim].view(batch, s.kv_heads, context, s.head_dim)
                  for p in v_pool]
        self.ids = torch.randint(0, s.vocab, (batch,), device=dev)
        self.cos, self.sin = model.rope(torch.full((batch,), context - 1, device=dev))
        self.last = torch.arange(batch, device=dev)
        self.group = s.heads // s.kv_heads

    def write(self, i, k, v):
        self.k[i][:, :, self.context - 1] = k
        self.v[i][:, :, self.context - 1] = v

    def attend(self, i, q):
        s = self.model.s
        q = q.view(self.batch, s.kv_heads, self.group, s.head_dim)  # a group's query heads as the query length
        o = F.scaled_dot_product_attention(q, self.k[i], self.v[i])
        return o.reshape(self.batch, s.heads * s.head_dim)

    def __call__(self):
        return self.model.forward(self.ids, self.cos, self.sin, self.write, self.attend, self.last)


def check_attention(model, flex):
    """The packed flex mask computes what per-request attention with an explicit
    lower-right causal mask computes (fresh random q and KV, float32 reference)."""
    s, dev = model.s, model.device
    news, cacheds = [5, 130, 64], [0, 70, 200]
    step = PackedPrefill(model, news, cacheds, "flex", flex)
    q = torch.randn(sum(news), s.heads, s.head_dim, device=dev, dtype=model.dtype)
    got = step.attend(0, q).float()
    want, qs, ks = [], 0, 0
    for n, c in zip(news, cacheds):
        qq = q[qs:qs + n].transpose(0, 1).float()
        kk = step.k[0][0, :, ks:ks + c + n].float().repeat_interleave(s.heads // s.kv_heads, 0)
        vv = step.v[0][0, :, ks:ks + c + n].float().repeat_interleave(s.heads // s.kv_heads, 0)
        allowed = torch.arange(c + n, device=dev)[None] <= (c + torch.arange(n, device=dev))[:, None]
        o = F.scaled_dot_product_attention(qq[None], kk[None], vv[None], attn_mask=allowed)
        want.append(o[0].transpose(0, 1).reshape(n, -1))
        qs, ks = qs + n, ks + c + n
    want = torch.cat(want)
    err = float((got - want).norm() / want.norm())
    print(f"attention check (packed flex vs per-request reference): relative error {err:.2e}", flush=True)
    if not err < 2e-2:
        raise SystemExit(f"flex attention mask is wrong: relative error {err}")


def graphed(fn, device):
    """fn captured in a CUDA graph (after warm-up on a side stream); fn itself on a CPU."""
    if device.type != "cuda":
        return fn, None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay, graph


def bound(flops, nbytes, peak_flops, peak_bw):
    """Roofline: the larger of compute time and memory time."""
    return max(flops / peak_flops, nbytes / peak_bw), flops / peak_flops, nbytes / peak_bw


def fmt_ms(t):
    return f"{t * 1e3:9.2f} ms"


def measure_peaks(device, clock, tiny):
    if device.type != "cuda":
        a = torch.randn(512, 512)
        tm = clock.time(lambda: a @ a, 1, 5)
        x = torch.empty(32 << 20, dtype=torch.uint8)
        y = torch.empty_like(x)
        tc = clock.time(lambda: y.copy_(x), 1, 5)
        return {"bf16_flops": 2 * 512 ** 3 / tm, "hbm_bytes_per_s": 2 * x.numel() / tc, "note": "cpu"}
    n = 8192
    mats = [(torch.randn(n, n, device=device, dtype=torch.bfloat16),
             torch.randn(n, n, device=device, dtype=torch.bfloat16)) for _ in range(3)]
    idx = [0]

    def mm():  # rotate inputs so that no repeat finds its operands in L2
        a, b = mats[idx[0] % 3]
        idx[0] += 1
        return a @ b
    tm = clock.time(mm, 3, 10)
    x = torch.empty(4 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    x.random_(0, 255)
    tc = clock.time(lambda: y.copy_(x), 2, 10)
    del mats, x, y
    torch.cuda.empty_cache()
    return {"bf16_flops": 2 * n ** 3 / tm, "hbm_bytes_per_s": 2 * (4 << 30) / tc,
            "how": "8192^3 bf16 matrix product on random data (median of 10, 3 operand sets); "
                   "4 GiB device-to-device copy counting bytes read + written (median of 10)"}


def run_prefill(model, points, kernel, flex, peaks, clock, device, deadline, out, label="prefill"):
    s = model.s
    for news, cacheds in points:
        if time.time() > deadline:
            print(f"{label} {news} on {cacheds}: skipped (time budget)", flush=True)
            continue
        pairs = sum(n * n / 2 + n * c for n, c in zip(news, cacheds))
        flops = s.linear_flops(sum(news), len(news)) + s.attention_flops(pairs)
        nbytes = s.weight_bytes() + s.kv_bytes_per_token * sum(news) + s.kv_bytes_per_token * sum(cacheds)
        b, bc, bm = bound(flops, nbytes, peaks["bf16_flops"], peaks["hbm_bytes_per_s"])
        try:
            step = PackedPrefill(model, news, cacheds, kernel, flex)
            use_graph = device.type == "cuda" and sum(news) <= GRAPH_MAX_TOKENS
            fn, graph = graphed(step, device) if use_graph else (step, None)
            heavy = b > 0.3
            seconds = clock.time(fn, 1, 3 if heavy else 10)
            del graph, fn, step
        except Exception as exc:  # recorded, and the run goes on with the next point
            print(f"{label} {news} on {cacheds} [{kernel}]: FAILED {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            out.append({"new_tokens": news, "cached_tokens": cacheds, "kernel": kernel, "error": str(exc)[:300]})
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rec = {"new_tokens": news[0] if len(news) == 1 else news, "cached_tokens": cacheds[0] if len(news) == 1
               else cacheds, "seconds": seconds, "kernel": kernel, "cuda_graph": use_graph,
               "bound_s": b, "compute_bound_s": bc, "memory_bound_s": bm, "flops": flops}
        out.append(rec)
        print(f"{label} new={str(news if len(news) > 1 else news[0]):>14} cached="
              f"{str(cacheds if len(news) > 1 else cacheds[0]):>14} {kernel:<5}{' graph' if use_graph else ' eager'}:"
              f"{fmt_ms(seconds)}  bound{fmt_ms(b)} (compute{fmt_ms(bc)}, memory{fmt_ms(bm)})  "
              f"x{seconds / b:5.2f} of bound, {flops / seconds / 1e12:6.1f} TFLOP/s", flush=True)


def run_decode(model, grid, peaks, clock, device, deadline, out, token_budget):
    s = model.s
    per_layer = token_budget * s.kv_heads * s.head_dim
    k_pool = [torch.randn(per_layer, device=device, dtype=model.dtype) for _ in model.layers]
    v_pool = [torch.randn(per_layer, device=device, dtype=model.dtype) for _ in model.layers]
    print(f"decode KV pool: {token_budget} tokens ({token_budget * s.kv_bytes_per_token / 2**30:.1f} GiB)", flush=True)
    for batch, ctx in grid:
        if batch * ctx > token_budget:
            print(f"decode batch={batch} ctx={ctx}: skipped (KV of {batch * ctx} tokens over the pool)", flush=True)
            continue
        if time.time() > deadline:
            print(f"decode batch={batch} ctx={ctx}: skipped (time budget)", flush=True)
            continue
        flops = s.linear_flops(batch, batch) + s.attention_flops(batch * ctx)
        nbytes = s.weight_bytes() + batch * ctx * s.kv_bytes_per_token
        b, bc, bm = bound(flops, nbytes, peaks["bf16_flops"], peaks["hbm_bytes_per_s"])
        try:
            step = DecodeStep(model, batch, ctx, k_pool, v_pool)
            fn, graph = graphed(step, device)
            seconds = clock.time(fn, 2, 20)
            del graph, fn, step
        except Exception as exc:
            print(f"decode batch={batch} ctx={ctx}: FAILED {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            out.append({"batch": batch, "context_tokens": ctx, "error": str(exc)[:300]})
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        out.append({"batch": batch, "context_tokens": ctx, "seconds": seconds, "cuda_graph": device.type == "cuda",
                    "bound_s": b, "compute_bound_s": bc, "memory_bound_s": bm, "bytes": nbytes})
        print(f"decode batch={batch:4d} ctx={ctx:6d} graph:{fmt_ms(seconds)}  bound{fmt_ms(b)} (compute{fmt_ms(bc)}, "
              f"memory{fmt_ms(bm)})  x{seconds / b:5.2f} of bound, {nbytes / seconds / 1e12:5.2f} TB/s", flush=True)
    del k_pool, v_pool


def run_copies(device, clock, out, sizes):
    for size in sizes:
        gpu = torch.empty(size, dtype=torch.uint8, device=device)
        for pinned in (True, False):
            host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
            host.fill_(1)
            gpu.fill_(2)
            for direction, fn in (("h2d", lambda: gpu.copy_(host, non_blocking=pinned)),
                                  ("d2h", lambda: host.copy_(gpu, non_blocking=pinned))):
                seconds = clock.time(fn, 2, 5)
                out.append({"bytes": size, "pinned": pinned, "direction": direction, "seconds": seconds,
                            "GBps": size / seconds / 1e9})
                print(f"{direction.upper()} {'pinned  ' if pinned else 'pageable'} {size >> 20:5d} MiB: "
                      f"{fmt_ms(seconds)} {size / seconds / 1e9:6.1f} GB/s", flush=True)
            del host
        del gpu


def grids(tiny: bool):
    if tiny:
        news, cacheds, limit = [16, 64, 128], [0, 64], 512
        decode = [(1, 64), (4, 128), (8, 256)]
        batched = [([32] * 4, [0] * 4), ([16] * 4, [64] * 4), ([8, 32, 64], [0, 64, 128])]
    else:
        news, cacheds, limit = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768], [0, 2048, 8192, 32768], 65536
        decode = [(b, c) for c in (1024, 4096, 16384, 32768) for b in (1, 8, 32, 64, 128, 256)]
        batched = [([512] * 8, [0] * 8), ([512] * 8, [4096] * 8), ([256] * 16, [8192] * 16),
                   ([2048] * 4, [8192] * 4), ([128] * 32, [4096] * 32), ([1024, 256, 4096, 512], [0, 8192, 2048, 16384])]
    single = [([n], [c]) for c in cacheds for n in news if n + c <= limit]
    return single, [([n], [0]) for n in news], batched, decode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True)
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=480.0, help="skip what is left after this long")
    parser.add_argument("--decode-tokens", type=int, default=524288, help="most KV tokens a decode grid point holds")
    parser.add_argument("--no-compile", action="store_true", help="flex_attention uncompiled (CPU smoke test)")
    args = parser.parse_args()

    start = time.time()
    deadline = start + args.budget_s
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    s = Shape(**SHAPES[args.shape])
    tiny = args.shape == "tiny"
    clock = Clock(device)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu'}, "
          f"shape {args.shape}: {s.layers} layers, hidden {s.hidden}, {s.heads}/{s.kv_heads} heads, MLP "
          f"{s.intermediate}, vocab {s.vocab}", flush=True)

    peaks = measure_peaks(device, clock, tiny)
    print(f"peaks: bf16 matrix {peaks['bf16_flops'] / 1e12:.0f} TFLOP/s, device copy "
          f"{peaks['hbm_bytes_per_s'] / 1e12:.2f} TB/s", flush=True)

    from torch.nn.attention.flex_attention import flex_attention
    if args.no_compile:
        flex = flex_attention
    else:
        import torch._dynamo.config as dynamo_config
        dynamo_config.cache_size_limit = 256
        flex = torch.compile(flex_attention, dynamic=True)

    model = Decoder(s, device, dtype)
    try:
        check_attention(model, flex)
        flex_ok = True
    except Exception as exc:  # fall back to SDPA's lower-right kernel for cached prefixes
        print(f"flex_attention unusable here ({type(exc).__name__}: {exc}); cached prefills use sdpa-lr", flush=True)
        traceback.print_exc()
        flex_ok = False
    print(f"model built: {(s.layers * s.layer_params + 2 * s.vocab * s.hidden) / 1e9:.2f} B params, "
          f"KV {s.kv_bytes_per_token // 1024} KiB/token, {time.time() - start:.0f} s in", flush=True)
    single, nocache, batched, decode_grid = grids(tiny)
    prefill, batched_out, decode, copies = [], [], [], []
    with torch.inference_mode():
        run_prefill(model, nocache, "sdpa", flex, peaks, clock, device, deadline, prefill)
        if flex_ok:
            run_prefill(model, single, "flex", flex, peaks, clock, device, deadline, prefill)
            run_prefill(model, batched, "flex", flex, peaks, clock, device, deadline, batched_out, "batched prefill")
        lower_right = [p for p in single if p[1][0] > 0]
        run_prefill(model, lower_right if not flex_ok else [p for p in lower_right if p[0][0] in (512, 4096)],
                    "sdpa-lr", flex, peaks, clock, device, deadline, prefill)
        budget = args.decode_tokens
        if device.type == "cuda":
            free = torch.cuda.mem_get_info()[0]
            budget = min(budget, int((free - (10 << 30)) / s.kv_bytes_per_token))
        run_decode(model, decode_grid, peaks, clock, device, deadline + 60, decode, budget)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
        run_copies(device, clock, copies, [2 << 20, 32 << 20, 256 << 20, 1 << 30])

    result = {
        "what": "Llama-style decoder, random bf16 weights, engine-like: flex_attention (flash, lower-right causal "
                "against a cached prefix, packed batches) and SDPA flash for no-cache prefill; CUDA graphs for "
                f"prefills up to {GRAPH_MAX_TOKENS} tokens and every decode step; host<->GPU copies both ways",
        "shape": s.name, "model": s.table_key(), "kv_bytes_per_token": s.kv_bytes_per_token, "dtype": str(dtype),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__, "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
        "peaks": peaks, "prefill": prefill, "prefill_batched": batched_out, "decode": decode, "h2d_copy": copies,
        "wall_s": time.time() - start,
    }
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.output} after {time.time() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
