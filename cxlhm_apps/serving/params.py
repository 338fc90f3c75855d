"""The serving model's parameters: one frozen dataclass, every default with its source.
A workload file's `serving:` mapping or command-line flags override them."""
from __future__ import annotations

import dataclasses

from cxlhm.units import parse_size
from cxlhm_apps.serving.yamlspec import Spec

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class ServingParams:
    # The DRAM budget D every configuration gets (host DRAM, device DRAM; the pool 16 x D).
    # Paper: Mooncake on 1 TB of DRAM vs 16x less for HyMCache -> D = 1 TB / 16 ~ 64 GiB.
    dram_bytes: int = 64 * GiB
    pool_factor: float = 16.0
    # The served model and GPU (cxlhm_apps.serving.gpu: MODELS, GPUS): the cost model, and the
    # KV bytes per token.
    model: str = "llama3-8b"
    gpu: str = "h200"
    # The GPU's KV memory; 0: derived from the model and GPU as vLLM sizes it (HBM x 0.9 -
    # weights - ~8 GB activations/workspace per GPU: 95 GiB for Llama-3-8B on an H200).
    # Running requests pin their KV in it; the rest is the GPU prefix cache (present in
    # every configuration).
    gpu_kv_bytes: int = 0
    # How an iteration is formed (batching.PRESETS: vllm-v1 | sglang | whole-prompt), with
    # that engine's defaults for the GPU: token budget per iteration (vLLM's
    # max_num_batched_tokens, SGLang's chunked_prefill_size) and running sequences.
    batching: str = "vllm-v1"
    max_batched_tokens: int = 0       # 0: the preset's default for the GPU (vLLM 8192 on H100/H200)
    max_running: int = 0              # 0: the preset's default (vLLM max_num_seqs 1024 on H100/H200)
    # How a tier's loads and stores meet the GPU's iterations; "" = each system's own
    # (configs.py: LMCache's local backend blocks the iteration on both, as its vLLM
    # connector does by default; the DRAM pool and the device run asynchronously).
    # load_mode: async (the request waits, the GPU works on others) | blocking (the
    # iteration that schedules the request waits for the load) | layerwise (the
    # iteration waits per layer: load and prefill pipelined over the model's layers).
    load_mode: str = ""
    # store_mode: async | blocking (the iteration that finishes a prefill waits for the
    # copy of its new KV out of HBM). Applies to host-DRAM stores.
    store_mode: str = ""
    # SLO for "max QPS": p90 TTFT <= 2 s (assumed: interactive chat; a parameter).
    slo_ttft_s: float = 2.0
    # ... and p90 TBT <= 100 ms (assumed: ~10 tokens/s, faster than reading). Without it a
    # prefill-first scheduler keeps TTFT low by starving decode, and "max QPS" would not
    # be a throughput the service can deliver.
    slo_tbt_ms: float = 100.0
    slo_percentile: float = 90.0
    prefill_model: str = "measured"   # gpu.py: measured (engine-like calibration) | analytic (roofline)
    decode_model: str = "measured"    # gpu.py: measured (CUDA-graph steps) | analytic (roofline)
    # Hints: agent tool calls have an expected duration; the store announces the next
    # prefix this long before the tool is expected back (NEXT_PREFIX with a deadline).
    prefetch_lead_s: float = 1.0
    # The generated command-line options of serving systems and topologies (options.py):
    # ((family, name, ((field, value), ...)), ...); read with options_for. Not a YAML key.
    options: tuple = ()
    # A chat with no new turn for this long is over: SESSION_END (assumed chat timeout).
    session_timeout_s: float = 600.0
    # Mooncake-store's pool is read over RDMA with GPUDirect: one 400 Gb/s ConnectX-7 per
    # GPU (DGX H200 reference design) at ~85% of line rate for large transfers (assumed).
    rdma_bandwidth: float = 400e9 / 8 * 0.85
    rdma_latency_ns: float = 5_000.0
    # The KV store skips a store when the tier already has this much write work queued
    # (a bounded write queue: KV can always be recomputed, while loads stuck behind an
    # unbounded NAND program backlog would not be). Assumed; docs/serving.md.
    max_store_backlog_s: float = 0.1
    device_profile: str = "cmm-h"     # cxlhm/profiles: CMM-H-like hybrid device
    # The device firmware's write mode; "" = the policy's own (lru: write-back, hymcache:
    # write-buffer). write-through keeps device DRAM clean: no dirty victim ever lands on
    # a read's path (docs/serving.md, section 9).
    device_write_mode: str = ""
    nand_coarsening: int = 16         # tiers.NAND_COARSENING (docs/serving.md: within 5%)
    # Overrides of the device profile's timing, (key, value) pairs as in a profile's
    # `timing:` (e.g. (("nand_channel_rate", "2.4GB/s"),)): the sensitivity sweep varies
    # the SSD's read bandwidth, and so its load/recompute ratio, alone.
    device_timing: tuple = ()
    # Firmware parameters per policy on the serving device, (policy, ((key, value), ...))
    # pairs; in a workload file `firmware_params: {hymcache: {fill_ns: 1000000}}`. The
    # hymcache firmware's fill_ns (expected SSD read of one block, used to drop prefetches
    # that cannot meet a NEXT_PREFIX deadline) defaults to 60 us for 64 KiB blocks; a lone
    # 2 MiB block takes ~1.1 ms on the serving device model (measured).
    firmware_params: tuple = (("hymcache", (("fill_ns", 1_000_000),)),)

    def replace(self, **changes) -> ServingParams:
        return dataclasses.replace(self, **changes)

    @property
    def kv_pool_bytes(self) -> int:
        """The GPU KV pool in effect: gpu_kv_bytes, or the model and GPU's derived size."""
        if self.gpu_kv_bytes:
            return self.gpu_kv_bytes
        from cxlhm_apps.serving.gpu import kv_pool_bytes, shape_named, spec_named
        return kv_pool_bytes(shape_named(self.model), spec_named(self.gpu))

    def batching_preset(self):
        from cxlhm_apps.serving.batching import preset
        return preset(self.batching)

    def with_options(self, family: str, name: str, **values) -> ServingParams:
        """These parameters with options of implementation `name` of `family` (system,
        topology) set, as its generated flags would: e.g. with_options("topology",
        "disagg", handover="tier")."""
        merged = {**self.options_for(family, name), **values}
        rest = tuple(o for o in self.options if (o[0], o[1]) != (family, name))
        return self.replace(options=tuple(sorted(rest + ((family, name, tuple(sorted(merged.items()))),))))

    def options_for(self, family: str, name: str) -> dict:
        """{field: value} given for implementation `name` of `family` (system, topology)."""
        for fam, impl, values in self.options:
            if fam == family and impl == name:
                return dict(values)
        return {}

    @property
    def token_budget(self) -> int:
        """Tokens per iteration in effect (max_batched_tokens or the preset's default)."""
        if self.max_batched_tokens:
            return self.max_batched_tokens
        from cxlhm_apps.serving.gpu import spec_named
        return self.batching_preset().budget(spec_named(self.gpu).hbm_bytes)

    @property
    def running_limit(self) -> int:
        if self.max_running:
            return self.max_running
        from cxlhm_apps.serving.gpu import spec_named
        return self.batching_preset().max_running(spec_named(self.gpu).hbm_bytes)

    def gpu_cost_model(self):
        from cxlhm_apps.serving.gpu import gpu_model
        return gpu_model(self.model, self.gpu, prefill=self.prefill_model, decode=self.decode_model)


def device_timing(params: ServingParams) -> dict:
    """The device profile's `timing:` with params.device_timing on top (ValueError naming
    a wrong key or value)."""
    from cxlhm.config import ConfigError, load_config
    from cxlhm.timing.params import parse_timing
    timing = {**load_config(params.device_profile).timing, **dict(params.device_timing)}
    try:
        parse_timing(timing, "serving.device_timing")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return timing


SIZE_KEYS = ("dram_bytes", "gpu_kv_bytes")
WRITE_MODES = ("", "write-back", "write-through", "write-buffer")
CHOICES = {"load_mode": ("", "async", "blocking", "layerwise"), "store_mode": ("", "async", "blocking")}


def params_from(spec_items: tuple, base: ServingParams | None = None, spec: Spec | None = None) -> ServingParams:
    """Apply (key, value) pairs (from a workload file's `serving:` mapping)."""
    base = base or ServingParams()
    fields = {f.name: f for f in dataclasses.fields(ServingParams) if f.name != "options"}
    changes = {}
    for key, value in spec_items:
        if key not in fields:
            msg = f"unknown serving parameter; accepted: {', '.join(fields)}"
            raise spec.error(f"serving.{key}", msg) if spec else ValueError(f"{key}: {msg}")
        try:
            if key in SIZE_KEYS:
                value = parse_size(value)
            elif key == "firmware_params":  # per policy, over the defaults of the others
                value = tuple(sorted({**dict(base.firmware_params), **dict(_firmware_params(value))}.items()))
            elif key == "device_timing":
                value = tuple(sorted(dict(value).items()))
                device_timing(base.replace(device_timing=value))  # keys and values checked now
            elif isinstance(getattr(base, key), float):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"must be a number, got {value!r}")
                value = float(value)
            elif isinstance(getattr(base, key), int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"must be an integer, got {value!r}")
            elif isinstance(getattr(base, key), str) and not isinstance(value, str):
                raise ValueError(f"must be a string, got {value!r}")
            if key == "model":
                from cxlhm_apps.serving.gpu import shape_named
                shape_named(value)
            if key == "gpu":
                from cxlhm_apps.serving.gpu import spec_named
                spec_named(value)
            if key in CHOICES and value not in CHOICES[key]:
                raise ValueError(f"must be one of {', '.join(repr(m) for m in CHOICES[key])}, got {value!r}")
            if key == "batching":
                from cxlhm_apps.serving.batching import preset
                preset(value)
            if key == "device_write_mode" and value not in WRITE_MODES:
                raise ValueError(f"must be one of {', '.join(repr(m) for m in WRITE_MODES)}, got {value!r}")
        except (ValueError, TypeError) as exc:
            raise spec.error(f"serving.{key}", str(exc)) if spec else ValueError(f"{key}: {exc}") from None
        changes[key] = value
    return base.replace(**changes)


def _firmware_params(value) -> tuple:
    """{policy: {key: value}} -> ((policy, ((key, value), ...)), ...), each policy's
    parameters checked by the policy itself (its error lists what it accepts)."""
    from cxlhm import policies
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"must be a mapping of policy: {{parameter: value}}, got {value!r}")
    out = []
    for policy, given in value.items():
        try:
            policies.get(policy).resolve_params(given)
        except (LookupError, policies.PolicyParamError) as exc:
            raise ValueError(str(exc)) from None
        out.append((policy, tuple(sorted(given.items()))))
    return tuple(sorted(out))


SERVING_KEYS = tuple(f.name for f in dataclasses.fields(ServingParams) if f.name != "options")
