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
)
(HOST_READS, HOST_WRITES, HOST_READ_BYTES, HOST_WRITE_BYTES, HITS, MISSES, FILL_READS,
 EVICTIONS, WRITEBACKS, SSD_READS, SSD_WRITES, SSD_READ_BYTES, SSD_WRITE_BYTES) = range(len(NAMES))


def new_counters() -> np.ndarray:
    return np.zeros(len(NAMES), np.int64)


def as_dict(counters: np.ndarray) -> dict[str, int]:
    out = {name: int(counters[i]) for i, name in enumerate(NAMES)}
    accesses = out["hits"] + out["misses"]
    out["hit_ratio"] = out["hits"] / accesses if accesses else 0.0
    return out
