"""Measure what the serving model needs from a real GPU (issue 8, item 2):

  * prefill latency of a Llama-3-8B-shaped model (random bf16 weights built from a
    config: no download) for new-token counts 512..32k, without and with a cached prefix;
  * decode step latency at several batch sizes and context lengths;
  * pinned and pageable host -> GPU copy bandwidth.

Writes one JSON table (bench/data/gpu_h200_llama3_8b.json is the committed result) and
prints it. The serving model (bench/serving) reads that table by default.

    python bench/gpu/calibrate_gpu.py --output gpu.json            # on the GPU machine
    python bench/gpu/calibrate_gpu.py --tiny --device cpu --output /tmp/t.json  # smoke test
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0)
TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=8192)


def timed(fn, device, warmup=2, repeat=5):
    """Median seconds of fn() after warm-up, synchronised with CUDA events on a GPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def random_cache(cfg, batch, tokens, device, dtype):
    from transformers import DynamicCache
    cache = DynamicCache()
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(batch, cfg.num_key_value_heads, tokens, head_dim, device=device, dtype=dtype)
        cache.update(k, torch.randn_like(k), layer)
    return cache


def cache_clone(cache, cfg):
    from transformers import DynamicCache
    out = DynamicCache()
    for layer in range(cfg.num_hidden_layers):
        k, v = _layer_kv(cache, layer)
        out.update(k.clone(), v.clone(), layer)
    return out


def _layer_kv(cache, layer):
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and small sizes (smoke test)")
    args = parser.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else LLAMA3_8B
    cfg = LlamaConfig(**shape, torch_dtype=dtype)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(previous)
    build_s = time.perf_counter() - t0
    body = model.model  # the transformer without the LM head: prefill cost is all here
    print(f"model built in {build_s:.1f}s: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params", flush=True)

    news = [64, 128, 256] if args.tiny else [512, 1024, 2048, 4096, 8192, 16384, 32768]
    cached = [0, 256] if args.tiny else [0, 4096, 16384, 32768]
    prefill = []
    with torch.inference_mode():
        for c in cached:
            base = random_cache(cfg, 1, c, device, dtype) if c else None
            for n in news:
                if c + n > (8192 if args.tiny else 65536):
                    continue
                ids = torch.randint(0, cfg.vocab_size, (1, n), device=device)

                def run():
                    cache = cache_clone(base, cfg) if base is not None else None
                    body(input_ids=ids, past_key_values=cache, use_cache=True)
                seconds = timed(run, device)
                prefill.append({"new_tokens": n, "cached_tokens": c, "seconds": seconds})
                print(f"prefill new={n:6d} cached={c:6d}: {seconds * 1e3:9.2f} ms", flush=True)
            del base
            if device.type == "cuda":
                torch.cuda.empty_cache()

        batches = [1, 4] if args.tiny else [1, 8, 32, 64]
        contexts = [128, 512] if args.tiny else [1024, 4096, 16384]
        decode = []
        for b in batches:
            for ctx in contexts:
                if b * ctx > (4096 if args.tiny else 262144):  # keep the KV under ~32 GiB
                    continue
                base = random_cache(cfg, b, ctx, device, dtype)
                ids = torch.randint(0, cfg.vocab_size, (b, 1), device=device)
                def step():
                    body(input_ids=ids, past_key_values=base, use_cache=True)
                    for layer in range(cfg.num_hidden_layers):  # drop the appended token again
                        _truncate(base, layer, ctx)
                seconds = timed(step, device, warmup=3, repeat=10)
                decode.append({"batch": b, "context_tokens": ctx, "seconds": seconds})
                print(f"decode batch={b:3d} ctx={ctx:6d}: {seconds * 1e3:8.3f} ms", flush=True)
                del base
                if device.type == "cuda":
                    torch.cuda.empty_cache()

    copies = []
    if device.type == "cuda":
        for size in [2 << 20, 32 << 20, 256 << 20, 1 << 30]:
            dst = torch.empty(size, dtype=torch.uint8, device=device)
            for pinned in (True, False):
                src = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
                src.fill_(1)
                seconds = timed(lambda: dst.copy_(src, non_blocking=pinned), device, warmup=2, repeat=5)
                copies.append({"bytes": size, "pinned": pinned, "seconds": seconds, "GBps": size / seconds / 1e9})
                print(f"H2D {'pinned' if pinned else 'pageable'} {size >> 20:5d} MiB: {size / seconds / 1e9:6.1f} GB/s", flush=True)

    result = {
        "what": "Llama-3-8B-shaped model, random bf16 weights, SDPA attention, batch 1 prefill; decode steps; H2D copies",
        "model": shape, "dtype": str(dtype),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
        "prefill": prefill, "decode": decode, "h2d_copy": copies,
    }
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("prefill", "decode", "h2d_copy")}))
    return 0


def _truncate(cache, layer, length):
    if hasattr(cache, "layers"):
        lay = cache.layers[layer]
        lay.keys = lay.keys[:, :, :length]
        lay.values = lay.values[:, :, :length]
    else:
        cache.key_cache[layer] = cache.key_cache[layer][:, :, :length]
        cache.value_cache[layer] = cache.value_cache[layer][:, :, :length]


if __name__ == "__main__":
    sys.exit(main())
