"""KV geometry: a model's KV-cache shape, and what one stored chunk of it looks like.

A chunk is the KV of `tokens_per_chunk` consecutive tokens across every layer; it is
the unit the KV store keys, allocates and moves. Its size is

    tokens_per_chunk x layers x (2 for K and V, or 1 for MLA's shared latent)
                     x kv_heads x head_dim x dtype bytes

Two byte layouts of a chunk are supported (SGLang calls them `layer_first` and
`page_first`):

* ``layer_first``: [layer][kv][token][head][dim] - one layer's K (or V) for the whole
  chunk is contiguous, so an engine can load or store layer by layer while the model
  runs (layer-wise pipelining), and a partial read of layers is one extent per layer.
* ``chunk_first``: [token][layer][kv][head][dim] - one token's KV for all layers is
  contiguous, so the first n tokens of a chunk are a byte prefix of it.

Presets (numbers from each model's published Hugging Face ``config.json``):

=====================  ======  ========  ========  =====  =============  =================
preset                 layers  kv heads  head dim  dtype  bytes / token  256-token chunk
=====================  ======  ========  ========  =====  =============  =================
llama-3-8b             32      8         128       bf16   128 KiB        32 MiB
llama-3-70b            80      8         128       bf16   320 KiB        80 MiB
qwen2.5-7b (GQA 28:4)  28      4         128       bf16   56 KiB         14 MiB
deepseek-v3 (MLA)      61      1 latent  576       bf16   68.6 KiB       17.2 MiB
=====================  ======  ========  ========  =====  =============  =================

* Llama-3-8B: meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32,
  num_key_value_heads 8, hidden_size 4096 / num_attention_heads 32 = head_dim 128, bfloat16.
* Llama-3-70B: meta-llama/Meta-Llama-3-70B config.json: num_hidden_layers 80,
  num_key_value_heads 8, hidden_size 8192 / num_attention_heads 64 = 128, bfloat16.
* Qwen2.5-7B: Qwen/Qwen2.5-7B config.json: num_hidden_layers 28, num_attention_heads 28,
  num_key_value_heads 4 (GQA 7:1), hidden_size 3584 / 28 = 128, bfloat16.
* DeepSeek-V3: deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, kv_lora_rank
  512, qk_rope_head_dim 64. MLA caches one compressed latent (512) plus the shared RoPE
  key (64) per token per layer, no separate V: 576 values (SGLang's and vLLM's MLA
  cache layout), bfloat16 here (the checkpoint's weights are FP8; its KV cache is not).
"""
from __future__ import annotations

import dataclasses

LAYOUTS = ("layer_first", "chunk_first")

DTYPE_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
}


@dataclasses.dataclass(frozen=True)
class KVGeometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    tokens_per_chunk: int = 256
    mla: bool = False
    layout: str = "layer_first"
    name: str = ""

    def __post_init__(self):
        for field in ("num_layers", "num_kv_heads", "head_dim", "tokens_per_chunk"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVGeometry.{field} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"KVGeometry.dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"KVGeometry.layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.mla and self.num_kv_heads != 1:
            raise ValueError("an MLA geometry caches one latent vector per token: num_kv_heads must be 1")

    # ------------------------------------------------------------ sizes
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_parts(self) -> int:
        """2 (K and V) for multi-head / GQA attention, 1 for MLA's shared latent."""
        return 1 if self.mla else 2

    @property
    def bytes_per_token_layer(self) -> int:
        return self.kv_parts * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.bytes_per_token_layer

    @property
    def bytes_per_chunk(self) -> int:
        return self.tokens_per_chunk * self.bytes_per_token

    # ------------------------------------------------------------ layout
    @property
    def chunk_shape(self) -> tuple[int, ...]:
        """The chunk as an array, in its byte order (element type: `dtype`)."""
        if self.layout == "layer_first":
            return (self.num_layers, self.kv_parts, self.tokens_per_chunk, self.num_kv_heads, self.head_dim)
        return (self.tokens_per_chunk, self.num_layers, self.kv_parts, self.num_kv_heads, self.head_dim)

    def offset(self, layer: int, kv: int, token: int) -> int:
        """Byte offset, inside a chunk, of (layer, kv part, token)'s heads x head_dim values."""
        if not (0 <= layer < self.num_layers and 0 <= kv < self.kv_parts and 0 <= token < self.tokens_per_chunk):
            raise IndexError(f"(layer {layer}, kv {kv}, token {token}) is outside {self.chunk_shape}")
        row = self.num_kv_heads * self.head_dim * self.dtype_bytes
        if self.layout == "layer_first":
            return ((layer * self.kv_parts + kv) * self.tokens_per_chunk + token) * row
        return ((token * self.num_layers + layer) * self.kv_parts + kv) * row

    def layer_extents(self, layer: int) -> list[tuple[int, int]]:
        """(offset, length) pieces of one layer's KV inside a chunk: one piece in the
        layer-first layout, one per token in the chunk-first layout."""
        if self.layout == "layer_first":
            return [(self.offset(layer, 0, 0), self.tokens_per_chunk * self.bytes_per_token_layer)]
        return [(self.offset(layer, 0, t), self.bytes_per_token_layer) for t in range(self.tokens_per_chunk)]

    def with_(self, **changes) -> "KVGeometry":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, KVGeometry] = {
    "llama-3-8b": KVGeometry(32, 8, 128, "bfloat16", name="llama-3-8b"),
    "llama-3-70b": KVGeometry(80, 8, 128, "bfloat16", name="llama-3-70b"),
    "qwen2.5-7b": KVGeometry(28, 4, 128, "bfloat16", name="qwen2.5-7b"),
    "deepseek-v3": KVGeometry(61, 1, 512 + 64, "bfloat16", mla=True, name="deepseek-v3"),
}


def preset(name: str, **changes) -> KVGeometry:
    """A preset by name, optionally changed (e.g. ``preset("llama-3-8b", tokens_per_chunk=64)``)."""
    try:
        geometry = PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown KV geometry preset {name!r}; presets: {', '.join(PRESETS)}") from None
    return geometry.with_(**changes) if changes else geometry


def from_hf_config(config, *, tokens_per_chunk: int = 256, dtype: str | None = None,
                   layout: str = "layer_first") -> KVGeometry:
    """The geometry of a Hugging Face transformers model config (Llama-style attention;
    DeepSeek-style configs with ``kv_lora_rank`` give an MLA geometry)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = text.num_hidden_layers
    if getattr(text, "kv_lora_rank", None):
        return KVGeometry(layers, 1, text.kv_lora_rank + text.qk_rope_head_dim, dtype or "bfloat16",
                          tokens_per_chunk, mla=True, layout=layout, name=getattr(text, "model_type", ""))
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    if dtype is None:
        dtype = str(getattr(text, "torch_dtype", None) or getattr(text, "dtype", None) or "float32").replace("torch.", "")
        dtype = dtype if dtype in DTYPE_BYTES else "float32"
    return KVGeometry(layers, kv_heads, head_dim, dtype, tokens_per_chunk, layout=layout,
                      name=getattr(text, "model_type", ""))
