"""How the pooled device's HDM range is cut: one partition per tenant, `partition_bytes`
each, numbered in order of first use; hosts and tenants get stable small ids. A ring
allocator per partition hands out chunk space (oldest chunks are overwritten first,
which a best-effort cache may do: the directory entries of an overwritten chunk then
fail verification and read as misses).

The layout is saved (atomically) at every flush and whenever a tenant or host is added,
so a restarted service reopens the same partitions; a cursor older than the last flush
only means space written since then is handed out again.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from cxlhm.pool import statefiles


# 65535 host names of up to 64 characters, and the tenants: what the layout can hold
MAX_LAYOUT_BYTES = 16 << 20


class LayoutError(ValueError):
    pass


@dataclasses.dataclass
class TenantPartition:
    name: str
    id: int
    base: int          # device HPA of the partition
    cursor: int = 0    # next free offset in the ring
    allocations: int = 0

    def allocate(self, nbytes: int, size: int, block: int) -> tuple[int, int]:
        """(offset, generation) of `nbytes` rounded up to whole blocks."""
        need = -(-nbytes // block) * block
        if need > size:
            raise LayoutError(f"a {nbytes}-byte chunk does not fit a {size}-byte partition")
        if self.cursor + need > size:
            self.cursor = 0
        offset = self.cursor
        self.cursor += need
        self.allocations += 1
        return offset, self.allocations & 0xFFFFFFFF


class Layout:
    def __init__(self, capacity: int, block_size: int, partition_bytes: int, path: Path | None):
        if partition_bytes <= 0 or partition_bytes % block_size:
            raise LayoutError(f"partition_bytes must be a positive multiple of the block size ({block_size}), "
                              f"got {partition_bytes}")
        if partition_bytes > capacity:
            raise LayoutError(f"partition_bytes {partition_bytes} exceeds the device capacity {capacity}")
        self.capacity, self.block_size, self.partition_bytes = capacity, block_size, partition_bytes
        self.max_tenants = capacity // partition_bytes
        self.path = path
        self.tenants: dict[str, TenantPartition] = {}
        self.hosts: dict[str, int] = {}
        if path is not None and path.exists():
            self._load()

    def _load(self) -> None:
        try:
            state = json.loads(statefiles.read_file(self.path, MAX_LAYOUT_BYTES))
            if state["partition_bytes"] != self.partition_bytes or state["block_size"] != self.block_size:
                raise LayoutError(f"{self.path}: saved with partition_bytes={state['partition_bytes']}, "
                                  f"block_size={state['block_size']}; this service has {self.partition_bytes}, "
                                  f"{self.block_size}")
            self.tenants = {t["name"]: TenantPartition(**t) for t in state["tenants"]}
            self.hosts = {str(k): int(v) for k, v in state["hosts"].items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"{self.path}: unreadable pool layout ({exc})") from None

    def save(self) -> None:
        if self.path is None:
            return
        state = {"partition_bytes": self.partition_bytes, "block_size": self.block_size,
                 "tenants": [dataclasses.asdict(t) for t in self.tenants.values()], "hosts": self.hosts}
        statefiles.write_atomic(self.path, json.dumps(state).encode())  # never through a planted link

    def tenant(self, name: str, prepare=None) -> TenantPartition:
        """The tenant's partition; a new one is numbered next, `prepare(partition)`d,
        and only then recorded (a start interrupted while preparing prepares again)."""
        found = self.tenants.get(name)
        if found is None:
            if len(self.tenants) >= self.max_tenants:
                raise LayoutError(f"tenant {name!r}: the device holds {self.max_tenants} partitions of "
                                  f"{self.partition_bytes} bytes, all taken")
            tid = len(self.tenants)
            found = TenantPartition(name, tid, tid * self.partition_bytes)
            if prepare is not None:
                prepare(found)
            self.tenants[name] = found
            try:
                self.save()
            except BaseException:
                del self.tenants[name]
                raise
        return found

    def host_id(self, name: str) -> int:
        if name not in self.hosts:
            if len(self.hosts) >= 0xFFFF:
                raise LayoutError("65535 hosts attached already")
            self.hosts[name] = len(self.hosts) + 1
            self.save()
        return self.hosts[name]
