"""Each measured prefill and decode figure of a calibration table against its roofline
bound (max(FLOPs / peak, bytes / bandwidth), the peaks measured in the same run; the
table stores both). A figure more than `LIMIT` x its bound is implausible unless a known
property of the step explains it; `check_table` returns every figure beyond the limit
with the explanation that applies, or none, so an unexplained one is visible.

The explanations are properties of the step's shape, each checked on the entry:

* a prefill of few new tokens: its matrix products have few rows and its attention few
  128-row query blocks, so neither fills the SMs (the serving model uses the measured
  time, not the bound);
* a prefill of few new tokens on a long cached prefix: each query block walks the whole
  prefix alone;
* a comparison kernel the serving model does not use (SDPA with a lower-right bias runs
  the memory-efficient kernel, not flash);
* a decode step of few sequences on long contexts: the flash kernel gives each (sequence,
  KV head) one thread block and does not split the keys across SMs.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

LIMIT = 2.0
QUERY_BLOCK = 128        # rows of a flash-attention query tile
H200_SMS = 132           # the GPU the committed tables were measured on

SECTIONS = ("prefill", "prefill_batched", "decode")


@dataclasses.dataclass(frozen=True)
class Explanation:
    name: str
    applies: Callable[[str, dict, dict], bool]   # (section, entry, model config) -> bool
    why: str


def _few_query_blocks(section: str, e: dict, model: dict) -> bool:
    if section != "prefill":
        return False
    blocks = -(-int(e["new_tokens"]) // QUERY_BLOCK) * int(model["num_attention_heads"])
    return blocks < H200_SMS


def _long_prefix_few_queries(section: str, e: dict, model: dict) -> bool:
    return section == "prefill" and e.get("cached_tokens", 0) >= 32 * e["new_tokens"]


def _comparison_kernel(section: str, e: dict, model: dict) -> bool:
    return section == "prefill" and e.get("kernel") == "sdpa-lr"


def _unsplit_decode(section: str, e: dict, model: dict) -> bool:
    return section == "decode" and int(e["batch"]) * int(model["num_key_value_heads"]) < H200_SMS


EXPLANATIONS = (  # the first that applies is printed
    Explanation("comparison kernel", _comparison_kernel,
                "SDPA with a lower-right causal bias runs the memory-efficient kernel, not flash; listed for "
                "comparison, the serving model does not use it"),
    Explanation("few query blocks", _few_query_blocks,
                f"fewer {QUERY_BLOCK}-row query blocks than SMs (new/{QUERY_BLOCK} x query heads < {H200_SMS}): "
                "the step's attention and its few-row matrix products leave SMs idle"),
    Explanation("long prefix, few queries", _long_prefix_few_queries,
                "a cached prefix >= 32x the new tokens: each of the few query blocks walks the whole prefix alone"),
    Explanation("unsplit decode", _unsplit_decode,
                f"batch x KV heads < {H200_SMS} SMs: the flash kernel gives each (sequence, KV head) one thread "
                "block and does not split the keys across SMs"),
)


@dataclasses.dataclass(frozen=True)
class Finding:
    section: str
    entry: dict
    ratio: float                 # measured / roofline bound
    reason: str | None           # None: beyond the limit and unexplained

    def label(self) -> str:
        e = self.entry
        if self.section == "decode":
            return f"decode batch {e['batch']}, {e['context_tokens']} tokens each"
        new, cached = e["new_tokens"], e["cached_tokens"]
        if self.section == "prefill_batched":
            return f"batched prefill new={new} cached={cached}"
        return f"prefill {new} new on {cached} cached ({e.get('kernel', '?')})"


def check_table(table: dict, limit: float = LIMIT) -> tuple[int, list[Finding]]:
    """(figures within `limit` x their bound, the figures beyond it with their reason)."""
    model = table["model"]
    within, beyond = 0, []
    for section in SECTIONS:
        for e in table.get(section, []):
            if "seconds" not in e or not e.get("bound_s"):
                continue
            ratio = e["seconds"] / e["bound_s"]
            if ratio <= limit:
                within += 1
                continue
            reason = next((x.why for x in EXPLANATIONS if x.applies(section, e, model)), None)
            beyond.append(Finding(section, e, ratio, reason))
    return within, beyond


def report(paths: list[Path], limit: float = LIMIT) -> tuple[str, int]:
    """The printed check of each table, and the number of unexplained figures."""
    lines, unexplained = [], 0
    for path in paths:
        within, beyond = check_table(json.loads(Path(path).read_text()), limit)
        lines.append(f"{Path(path).name}: {within} figures within {limit:g}x of their roofline bound, "
                     f"{len(beyond)} beyond")
        for f in beyond:
            unexplained += f.reason is None
            lines.append(f"  {f.label():<48} {f.ratio:5.2f}x  {f.reason or 'UNEXPLAINED'}")
    return "\n".join(lines), unexplained
