"""Device counters: one int64 array updated by compiled code, named here."""
import numpy as np

NAMES = (
    "host_reads",        # host read operations (one per extent)
    "host_writes",       # host write operations
    "host_read_bytes",
    "host_write_bytes",
    "hits",              # block accesses served from device DRAM
    "misses",            # block accesses that had to allocate a slot
    "fill_reads",        # misses that read the block from the SSD (full-block writes skip it)
    "evictions",
    "writebacks",        # dirty blocks written to the SSD on eviction, flush or write-through
    "ssd_reads",
    "ssd_writes",
    "ssd_read_bytes",
    "ssd_write_bytes",
    "prefetch_issued",   # blocks read SSD -> DRAM ahead of use by background work
    "prefetch_useful",   # prefetched blocks the host then read (or wrote) before eviction
    "prefetch_unused",   # prefetched blocks evicted without a host access (wasted)
    "prefetch_redundant",  # prefetch jobs for blocks already resident (no I/O)
    "prefetch_dropped",  # prefetch jobs abandoned: no slot the policy would give up
    "bg_flushes",        # dirty blocks written back by background work (write buffering)
    "prefetch_late",     # host hits on prefetched blocks still in flight (model clock)
    "prefetch_late_ns",  # total time hosts waited for them
    "media_retries",     # SSD ops resubmitted after an error or a short transfer
    "poisoned_blocks",   # blocks whose bytes the device could no longer produce
    "checksum_mismatches",  # SSD reads whose bytes did not match the checksum written
    "prefetch_pollution",  # blocks evicted to make room for a prefetch that a host access then missed on
    "fg_writebacks",     # dirty victims written back on a host access's path (it waited for them)
    "write_coalesced_bytes",  # host write bytes onto a block still dirty in DRAM: the earlier bytes never reach the SSD
    "buffer_read_hits",  # host block reads served from a dirty (not yet written back) block
)
(HOST_READS, HOST_WRITES, HOST_READ_BYTES, HOST_WRITE_BYTES, HITS, MISSES, FILL_READS,
 EVICTIONS, WRITEBACKS, SSD_READS, SSD_WRITES, SSD_READ_BYTES, SSD_WRITE_BYTES,
 PREFETCH_ISSUED, PREFETCH_USEFUL, PREFETCH_UNUSED, PREFETCH_REDUNDANT, PREFETCH_DROPPED,
 BG_FLUSHES, PREFETCH_LATE, PREFETCH_LATE_NS, MEDIA_RETRIES, POISONED_BLOCKS,
 CHECKSUM_MISMATCHES, PREFETCH_POLLUTION, FG_WRITEBACKS, WRITE_COALESCED_BYTES,
 BUFFER_READ_HITS) = range(len(NAMES))


def new_counters() -> np.ndarray:
    return np.zeros(len(NAMES), np.int64)


def as_dict(counters: np.ndarray) -> dict[str, int]:
    out = {name: int(counters[i]) for i, name in enumerate(NAMES)}
    accesses = out["hits"] + out["misses"]
    out["hit_ratio"] = out["hits"] / accesses if accesses else 0.0
    # MQSim-CXL's prefetch metrics. Coverage: the share of would-be misses that prefetch
    # turned into hits (every useful prefetch is a miss avoided).
    issued, useful = out["prefetch_issued"], out["prefetch_useful"]
    out["prefetch_accuracy"] = useful / issued if issued else 0.0
    out["prefetch_coverage"] = useful / (useful + out["misses"]) if useful + out["misses"] else 0.0
    # Pollution: host misses caused by prefetch evictions, per prefetch issued.
    out["prefetch_pollution_rate"] = out["prefetch_pollution"] / issued if issued else 0.0
    return out
