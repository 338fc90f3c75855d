"""How an engine forms one GPU iteration out of waiting prefills and running decodes.

Three presets, each with the defaults of the installed engine it names (read from the
wheels' own code, cited per field):

* `vllm-v1` - vLLM's V1 scheduler (vllm 0.33): chunked prefill always on, one token
  budget per iteration (`max_num_batched_tokens`) shared by decodes and prefill chunks.
  Running requests are scheduled first (every decode takes one token of the budget),
  then waiting prefills FIFO, the last one cut to what is left of the budget: prefill
  chunks and decodes run in the *same* iteration. Defaults
  (vllm/engine/arg_utils.py `get_batch_defaults`, OpenAI API server): 8192 tokens and
  1024 sequences on GPUs with >= 70 GiB that are not A100 (H100, H200), 2048 and 256
  below; B200-class (>= 160 GiB) 16384.
* `sglang` - SGLang's scheduler (sglang 0.5.23): prefill first; a prefill batch takes
  up to `chunked_prefill_size` new tokens (the last request cut into a chunk; the
  chunked request continues in the next prefill batch) and runs *without* the decodes
  (`enable_mixed_chunk` is off by default), which run only when no prefill is waiting.
  Defaults (sglang/srt/arg_groups/memory_hook.py `_handle_gpu_memory_settings`): 8192
  tokens on H100 / H200 (60-160 GiB), 4096 on 35-60 GiB (L40S, A100-40G), 16384 above.
* `whole-prompt` - prefill first with no chunking: a batch of whole prompts up to
  16384 tokens (a longer prompt runs alone, whole), decodes stall meanwhile. vLLM's V0
  scheduler without chunked prefill; kept to show what chunking changes.

`plan_iteration` is the pure rule (tested against hand-computed schedules); the event
loop (scheduler.Engine) charges the iteration it returns.
"""
from __future__ import annotations

import dataclasses

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Batching:
    name: str
    chunked: bool        # a prompt longer than what is left of the budget is cut into chunks
    mixed: bool          # prefill chunks and decodes share one iteration
    budgets: tuple       # ((min HBM bytes per GPU, tokens), ...) largest first
    max_seqs: tuple      # ((min HBM bytes per GPU, sequences), ...) largest first
    source: str

    def budget(self, hbm_bytes: float) -> int:
        return next(t for floor, t in self.budgets if hbm_bytes >= floor)

    def max_running(self, hbm_bytes: float) -> int:
        return next(n for floor, n in self.max_seqs if hbm_bytes >= floor)


# HBM thresholds in the engines' own units: vLLM compares bytes with GiB_bytes, SGLang MiB.
PRESETS = {
    "vllm-v1": Batching("vllm-v1", True, True, ((160 * GiB, 16384), (70 * GiB, 8192), (0, 2048)),
                        ((70 * GiB, 1024), (0, 256)),
                        "vllm 0.33 engine/arg_utils.py get_batch_defaults (OpenAI server)"),
    "sglang": Batching("sglang", True, False, ((160 * GiB, 16384), (60 * GiB, 8192), (35 * GiB, 4096), (20 * GiB, 4096),
                                               (0, 2048)),
                       ((0, 1024),),
                       "sglang 0.5.23 srt/arg_groups/memory_hook.py _handle_gpu_memory_settings"),
    "whole-prompt": Batching("whole-prompt", False, False, ((0, 16384),), ((0, 256),),
                             "vLLM V0 without chunked prefill (max_num_batched_tokens 16384 assumed)"),
}


def preset(name: str) -> Batching:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown batching {name!r}; known: {', '.join(PRESETS)}") from None


def plan_iteration(b: Batching, budget: int, waiting: list[float], decodes: int) -> tuple[list[float], int]:
    """One iteration: `waiting` holds the new tokens each ready request still has to
    prefill, in FIFO order; `decodes` requests are decoding. Returns (tokens of each
    scheduled prefill, in order - a prefix of `waiting`, the last possibly cut - and the
    number of decodes in the iteration). With nothing to prefill, every decode runs."""
    if not waiting:
        return [], decodes
    run_decodes = min(decodes, budget) if b.mixed else 0
    left = budget - run_decodes
    chunks: list[float] = []
    for need in waiting:
        if left <= 0:
            break
        if b.chunked:
            take = min(need, left)
        else:
            if chunks and need > left:
                break
            take = need  # whole; a prompt over the budget runs alone
        chunks.append(take)
        left -= take
    if not chunks and not b.mixed:
        chunks = [min(waiting[0], budget) if b.chunked else waiting[0]]
    return chunks, run_decodes
