"""cxlhm_apps.serving: a deterministic LLM-serving model that replays multi-turn workloads
through KV-cache tiers - the GPU prefix cache, a host-DRAM store, the emulated CXL-HM
device on its model clock, a DRAM pool - and measures TTFT, TBT and throughput.

It owns the serving side of the HyMCache evaluation: the GPU cost model
calibrated on an H200 (gpu), the workloads (workloads), the tiers (tiers), the compared
systems (configs), the event loop (scheduler, disagg), the figures (metrics, report)
and the grid runner (sweep). docs/serving.md explains every assumption.

Every family that can be swapped (workloads, tiers, configurations) has a registry and
a config dataclass per implementation, as in vidur.
"""
