"""The compared systems, each at the same DRAM budget D (ServingParams.dram_bytes):

  recompute       GPU prefix cache only; everything else is recomputed (vLLM, no offload)
  lmcache-local   + host-DRAM store of D, LRU, over PCIe (LMCache's local CPU backend)
  cxlhm-lru       + CXL-HM: D of device DRAM before an SSD holding every chunk, LRU
                  firmware, no hints (a CMM-H-like device with generic firmware)
  cxlhm-hymcache  the same device with the hymcache firmware and the KV store's
                  session-lifecycle hints (HyMCache)
  mooncake-dram   + a distributed DRAM pool of pool_factor x D (16 x D: the paper's 1 TB),
                  LRU, over RDMA (Mooncake Store)
  ideal           + unbounded host DRAM over PCIe (every reusable chunk is found)

Any registered firmware policy joins as `cxlhm:<policy>` (the CXL-HM device with that
firmware, no hints) or `cxlhm:<policy>+hints` (with the KV store's lifecycle hints):
cxlhm-lru is cxlhm:lru, cxlhm-hymcache is cxlhm:hymcache+hints; an outside package's
policy (entry point group cxlhm.firmware_policies) is named the same way.
"""
from __future__ import annotations

import dataclasses
import math
import typing

from cxlhm_apps.serving.params import ServingParams, device_timing
from cxlhm.registry import Registry, RegistryError, UnknownName
from cxlhm_apps.serving.tiers import CxlHmTier, LruDramTier, NoTier, Tier, gpu_links

def _as_system(obj):
    if isinstance(obj, type):  # a configuration class: its defaults
        obj = obj()
    if not callable(getattr(obj, "make_tier", None)):
        raise TypeError(f"{type(obj).__name__} has no make_tier(ctx): not a serving configuration")
    return obj


# Built-ins below; outside packages add configurations under the entry-point group
# cxlhm.serving_systems (an object, or a zero-argument factory of one, with make_tier(ctx)).
# What reports, sweeps and the grid need to know about a configuration is metadata on the
# object itself (`Meta` below, read with `meta(name)`), so no list of names is kept elsewhere.
SYSTEMS: Registry = Registry("serving configuration", "cxlhm.serving_systems", check=_as_system)


@dataclasses.dataclass(frozen=True)
class Meta:
    """A configuration's place in reports and sweeps.

    order      position in tables and in `--configs all` (lower first)
    role       recompute | store | device | pool | bound | multi (multi-instance only)
    baseline   the ratio column it is the baseline of ("lmc": x lmc, "moon": x moon), or ""
    in_all     part of `--configs all`
    dram       its figures depend on the DRAM budget D (swept by --budgets)
    slow       cells to start first (the emulated device)"""
    order: int = 50
    role: str = "store"
    baseline: str = ""
    in_all: bool = False
    dram: bool = True
    slow: bool = False


def meta(name: str) -> Meta:
    """The metadata of configuration `name` (an outside one without any: the defaults)."""
    return getattr(make_system(name), "meta", None) or Meta()


def all_names() -> list[str]:
    """`--configs all`: the registered configurations marked in_all, in order."""
    return ordered(n for n in SYSTEMS.builtin_names() + sorted(SYSTEMS.entry_points()) if meta(n).in_all)


def ordered(names) -> list[str]:
    """`names` in report order (registry order, then by name)."""
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda n: (meta(n).order, names.index(n)))


def baselines() -> dict[str, str]:
    """Ratio column -> the configuration it divides by, from the registry's metadata."""
    out = {}
    for n in SYSTEMS.builtin_names():
        b = meta(n).baseline
        if b:
            out[b] = n
    return dict(sorted(out.items(), key=lambda kv: meta(kv[1]).order))


@dataclasses.dataclass(frozen=True)
class TierContext:
    """What a configuration needs to build its tier."""
    params: ServingParams
    n_chunks: int            # chunk ids are 0 .. n_chunks-1
    chunk_stride: int        # bytes between chunk addresses on the device (a full chunk)
    n_gpus: int
    pcie_bandwidth: float    # measured host <-> GPU (bench/data)
    pcie_latency_ns: float


def _pcie(ctx: TierContext):
    return (gpu_links(ctx.n_gpus, ctx.pcie_bandwidth, ctx.pcie_latency_ns, "pcie-h2d"),
            gpu_links(ctx.n_gpus, ctx.pcie_bandwidth, ctx.pcie_latency_ns, "pcie-d2h"))


# How each system's loads and stores meet the GPU's iterations (params.load_mode /
# store_mode override them): LMCache's vLLM connector (lmcache 0.5.6,
# integration/vllm/vllm_v1_adapter.py) retrieves in start_load_kv before the forward and
# stores in wait_for_save after it, both synchronously, unless enable_async_loading or
# use_layerwise is set (both default False in lmcache/v1/config.py). Mooncake's store and
# the CXL-HM device are written and read asynchronously (the request waits, not the GPU).
ASYNC, BLOCKING, LAYERWISE = "async", "blocking", "layerwise"
LoadMode = typing.Literal["async", "blocking", "layerwise"]
StoreMode = typing.Literal["async", "blocking"]


def fixed(default):
    """A field that is part of what a configuration is (its description, its metadata, the
    policy a named device runs), not an option: no command-line flag is generated for it."""
    return dataclasses.field(default=default, metadata={"cli": False})


def load_mode_field(default: str):
    return dataclasses.field(default=default, metadata={
        "help": "async: the request waits, the GPU works on others; blocking: the iteration waits for the load; "
                "layerwise: it waits per layer, load and prefill pipelined"})


def store_mode_field(default: str):
    return dataclasses.field(default=default, metadata={
        "help": "async, or blocking: the iteration that finishes a prefill waits for the copy of its new KV"})


@dataclasses.dataclass(frozen=True)
class Recompute:
    paper: str = fixed("vLLM with its GPU prefix cache only")
    load_mode: str = fixed(ASYNC)   # no tier: nothing is loaded or stored
    store_mode: str = fixed(ASYNC)
    meta: Meta = fixed(Meta(order=0, role="recompute", in_all=True, dram=False))

    def make_tier(self, ctx: TierContext) -> Tier:
        return NoTier()


@dataclasses.dataclass(frozen=True)
class LmcacheLocal:
    paper: str = fixed("LMCache, local CPU-DRAM backend (D of host DRAM, LRU)")
    load_mode: LoadMode = load_mode_field(BLOCKING)
    store_mode: StoreMode = store_mode_field(BLOCKING)
    meta: Meta = fixed(Meta(order=10, role="store", baseline="lmc", in_all=True))

    def make_tier(self, ctx: TierContext) -> Tier:
        down, up = _pcie(ctx)
        return LruDramTier(ctx.params.dram_bytes, down, up, "lmcache-local", "host DRAM")


@dataclasses.dataclass(frozen=True)
class CxlHm:
    policy: str = fixed("lru")
    hints: bool = fixed(False)
    paper: str = fixed("")
    load_mode: LoadMode = load_mode_field(ASYNC)
    store_mode: StoreMode = store_mode_field(ASYNC)
    meta: Meta = fixed(Meta(order=30, role="device", slow=True))

    def make_tier(self, ctx: TierContext) -> Tier:
        p = ctx.params
        params = dict(dict(p.firmware_params).get(self.policy, ()))
        down, up = _pcie(ctx)
        return CxlHmTier(p.dram_bytes, self.policy, ctx.n_chunks, ctx.chunk_stride, down, up, params=params,
                         hints=self.hints, profile=p.device_profile, coarsen=p.nand_coarsening,
                         write_mode=p.device_write_mode or None, timing=device_timing(p))




@dataclasses.dataclass(frozen=True)
class MooncakeDram:
    paper: str = fixed("Mooncake Store: distributed DRAM pool (16 x D, the paper's 1 TB) over RDMA")
    load_mode: LoadMode = load_mode_field(ASYNC)
    store_mode: StoreMode = store_mode_field(ASYNC)
    meta: Meta = fixed(Meta(order=40, role="pool", baseline="moon", in_all=True))

    def make_tier(self, ctx: TierContext) -> Tier:
        p = ctx.params
        down = gpu_links(ctx.n_gpus, p.rdma_bandwidth, p.rdma_latency_ns, "rdma-in")
        up = gpu_links(ctx.n_gpus, p.rdma_bandwidth, p.rdma_latency_ns, "rdma-out")
        return LruDramTier(p.dram_bytes * p.pool_factor, down, up, "mooncake-dram", "pool DRAM")


@dataclasses.dataclass(frozen=True)
class Ideal:
    paper: str = fixed("upper bound: unbounded host DRAM, asynchronous loads and stores")
    load_mode: LoadMode = load_mode_field(ASYNC)
    store_mode: StoreMode = store_mode_field(ASYNC)
    meta: Meta = fixed(Meta(order=90, role="bound", in_all=True, dram=False))

    def make_tier(self, ctx: TierContext) -> Tier:
        down, up = _pcie(ctx)
        return LruDramTier(math.inf, down, up, "ideal", "host DRAM")


DEVICE_PREFIX = "cxlhm:"
HINTS_SUFFIX = "+hints"


def device_system(name: str) -> CxlHm:
    """`cxlhm:<policy>[+hints]`: the CXL-HM device with any registered firmware policy."""
    import firmware_policies
    policy = name[len(DEVICE_PREFIX):]
    hints = policy.endswith(HINTS_SUFFIX)
    if hints:
        policy = policy[:-len(HINTS_SUFFIX)]
    if not policy or "+" in policy:
        raise UnknownName(f"configuration {name!r}: write cxlhm:<policy> or cxlhm:<policy>+hints with one of "
                          f"the firmware policies {', '.join(firmware_policies.available())}")
    try:
        firmware_policies.get(policy)
    except firmware_policies.UnknownPolicy as exc:  # unknown, or a broken outside package (named)
        raise UnknownName(f"configuration {name!r}: {exc}") from None
    return CxlHm(policy, hints, f"CXL-HM with the {policy} firmware, {'with' if hints else 'no'} lifecycle hints")


def modes(system, params: ServingParams) -> tuple[str, str]:
    """(load mode, store mode) a replay uses for `system`: params' override, else the
    system's own (an outside system without the fields: asynchronous)."""
    return (params.load_mode or getattr(system, "load_mode", ASYNC),
            params.store_mode or getattr(system, "store_mode", ASYNC))


SYSTEMS.register("recompute", Recompute)
SYSTEMS.register("lmcache-local", LmcacheLocal)
SYSTEMS.register("cxlhm-lru", lambda: CxlHm("lru", False, "CXL-HM (CMM-H-like) with generic LRU firmware",
                                            meta=Meta(order=20, role="device", in_all=True, slow=True)))
SYSTEMS.register("cxlhm-hymcache", lambda: CxlHm("hymcache", True, "HyMCache: CXL-HM + hint-driven firmware",
                                                 meta=Meta(order=25, role="device", in_all=True, slow=True)))
SYSTEMS.register("mooncake-dram", MooncakeDram)
SYSTEMS.register("ideal", Ideal)
# the multi-instance rows' per-instance tiers (multi.py imports the scheduler: loaded on first use)
SYSTEMS.register("lmcache-local-n", "cxlhm_apps.serving.multi:LMCACHE_LOCAL_N")
SYSTEMS.register("lmcache-p2p", "cxlhm_apps.serving.multi:LMCACHE_P2P")


def make_system(name: str, params: ServingParams | None = None):
    """The configuration registered as `name` (or a `cxlhm:<policy>[+hints]` device), with
    the options params carries for it (its generated command-line flags) applied."""
    if name.startswith(DEVICE_PREFIX):
        system = device_system(name)
    else:
        try:
            system = SYSTEMS.get(name)
        except RegistryError as exc:
            raise UnknownName(f"{exc}; or cxlhm:<policy>[+hints] for any firmware policy") from None
    changes = params.options_for("system", name) if params is not None else {}
    return dataclasses.replace(system, **changes) if changes else system


def parse_configs(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()] if text != "all" else all_names()
    if not names:
        raise UnknownName(f"no configuration given; known: {', '.join(SYSTEMS.names())}, or cxlhm:<policy>[+hints]")
    for n in names:
        make_system(n)  # raises UnknownName naming the configuration (and a broken entry point)
    return names
