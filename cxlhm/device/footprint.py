"""What a device needs of this machine's memory, checked before anything is allocated."""
from __future__ import annotations

import os

from cxlhm.config import ConfigError, DeviceConfig

METADATA_BYTES_PER_SLOT = 160  # block table (~73 B with its hash index and prefetch ghosts) + policy state (hymcache ~54 B)


def check_fits_in_memory(cfg: DeviceConfig) -> None:
    """Device DRAM (when data moves) and the per-slot metadata are real memory here:
    refuse what this machine cannot hold, before allocating any of it."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    needed = cfg.dram_slots * METADATA_BYTES_PER_SLOT + (cfg.dram_bytes if cfg.data == "real" else 0)
    if needed > physical * 0.8:
        raise ConfigError(cfg.source_of("dram_bytes"), "dram_bytes",
                          f"{cfg.dram_bytes} bytes of device DRAM need {needed} bytes of this machine's {physical} "
                          f"(DRAM when data moves, ~{METADATA_BYTES_PER_SLOT} B of metadata per block slot; at most "
                          f"80% may be used): lower dram_bytes, raise block_size, or use data: none")
