"""How the pooled device's HDM range is cut: one partition per tenant, `partition_bytes`
each, at the lowest free slot at first use; hosts and tenants get stable small ids. A
ring allocator per partition hands out chunk space (oldest chunks are overwritten first,
which a best-effort cache may do: the directory entries of an overwritten chunk then
fail verification and read as misses).

A new tenant's partition is first *reserved* (counted taken, not saved), then prepared by
its owner, then *recorded*, or *released* if preparing failed: a reservation never
reaches pool.json, so a start interrupted while preparing prepares again.

The layout is saved (atomically) at every flush and before a host is answered with a
tenant or host id it added, so a restarted service reopens the same partitions and gives
the same ids; a cursor older than the last flush only means space written since then is
handed out again. The tables change under their owner's lock; `LayoutSaver` copies them
under it and writes the file outside it.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import threading
from pathlib import Path

from cxlhm.pool import statefiles


# 65535 host names of up to 64 characters, and the tenants: what the layout can hold
MAX_LAYOUT_BYTES = 16 << 20
MAX_HOST_IDS = 0xFFFF  # host ids are 16-bit in the content directory's locations


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
    """The tables; not thread-safe: its owner changes and snapshots them under one lock."""

    def __init__(self, capacity: int, block_size: int, partition_bytes: int, path: Path | None,
                 max_host_names: int = MAX_HOST_IDS):
        if not 1 <= max_host_names <= MAX_HOST_IDS:
            raise LayoutError(f"max_host_names must be 1..{MAX_HOST_IDS}, got {max_host_names}")
        self.max_host_names = max_host_names
        if partition_bytes <= 0 or partition_bytes % block_size:
            raise LayoutError(f"partition_bytes must be a positive multiple of the block size ({block_size}), "
                              f"got {partition_bytes}")
        if partition_bytes > capacity:
            raise LayoutError(f"partition_bytes {partition_bytes} exceeds the device capacity {capacity}")
        self.capacity, self.block_size, self.partition_bytes = capacity, block_size, partition_bytes
        self.max_tenants = capacity // partition_bytes
        self.path = path
        self.tenants: dict[str, TenantPartition] = {}
        self.reserved: dict[str, TenantPartition] = {}  # being prepared: taken, not recorded
        self.hosts: dict[str, int] = {}
        self.version = 0  # bumped by every change a save must carry
        self.saved = 0    # the version pool.json holds
        self._added: dict[tuple[str, str], int] = {}  # ("host"|"tenant", name) -> version, until saved
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

    # ------------------------------------------------------------ changes (under the owner's lock)
    def reserve(self, name: str) -> TenantPartition:
        """A partition for new tenant `name`, at the lowest free slot: taken from now on,
        recorded only by `record`."""
        if name in self.tenants or name in self.reserved:
            raise LayoutError(f"tenant {name!r} has a partition already")
        if len(self.tenants) + len(self.reserved) >= self.max_tenants:
            raise LayoutError(f"tenant {name!r}: the device holds {self.max_tenants} partitions of "
                              f"{self.partition_bytes} bytes, all taken")
        used = {t.id for t in self.tenants.values()} | {t.id for t in self.reserved.values()}
        tid = next(i for i in itertools.count() if i not in used)
        found = self.reserved[name] = TenantPartition(name, tid, tid * self.partition_bytes)
        return found

    def release(self, name: str) -> None:
        """Give a reserved partition back (preparing it failed)."""
        del self.reserved[name]

    def record(self, name: str) -> TenantPartition:
        """The reserved partition, prepared: recorded (saved with the next save)."""
        found = self.tenants[name] = self.reserved.pop(name)
        self._add("tenant", name)
        return found

    def host_id(self, name: str) -> int:
        if name not in self.hosts:
            if len(self.hosts) >= self.max_host_names:
                raise LayoutError(f"host {name!r}: the pool has recorded {len(self.hosts)} host names, its "
                                  f"max_host_names; names stay recorded (their ids are in the content "
                                  "directory): attach under a name used before, or raise the limit "
                                  f"(at most {MAX_HOST_IDS})")
            self.hosts[name] = len(self.hosts) + 1
            self._add("host", name)
        return self.hosts[name]

    def _add(self, kind: str, name: str) -> None:
        self.version += 1
        self._added[kind, name] = self.version

    def unsaved(self, host: str, tenants: list[str]) -> int:
        """The version a save must reach before `host` may be told its id and its tenants'
        (0: saved already)."""
        return max([self._added.get(("host", host), 0)] + [self._added.get(("tenant", t), 0) for t in tenants])

    def snapshot(self) -> tuple[int, dict]:
        """(version, a copy of what pool.json holds): cheap, for under the owner's lock."""
        return self.version, {"partition_bytes": self.partition_bytes, "block_size": self.block_size,
                              "tenants": [dataclasses.asdict(t) for t in self.tenants.values()],
                              "hosts": dict(self.hosts)}

    def mark_saved(self, version: int) -> None:
        self.saved = max(self.saved, version)
        self._added = {k: v for k, v in self._added.items() if v > self.saved}

    # ------------------------------------------------------------ the file (no lock needed)
    def write(self, state: dict) -> None:
        if self.path is not None:
            statefiles.write_atomic(self.path, json.dumps(state).encode())  # never through a planted link

    def save(self) -> None:
        """Snapshot and write at once (for a caller that is the layout's only user)."""
        version, state = self.snapshot()
        self.write(state)
        self.mark_saved(version)


class LayoutSaver:
    """Saves a layout that other threads change under `lock`, without holding `lock`
    over the write: the tables are copied under it, written and fsynced outside, one
    write at a time (each a later copy than the one before: the last copy wins). A caller
    that finds a save in progress waits for it, and writes only if that save did not
    carry what it needs: a host that records names in a loop costs the others at most a
    write's wait, and its own attaches a write each."""

    def __init__(self, layout: Layout, lock: threading.Lock):
        self.layout, self._lock = layout, lock
        self._write_lock = threading.Lock()
        self.writes = 0

    def save(self, need: int | None = None) -> None:
        """Make version `need` of the layout durable (None: the layout as it is now, its
        cursors included). OSError if the file cannot be written."""
        if need is not None:
            with self._lock:
                if self.layout.saved >= need:
                    return  # (without waiting for a write in progress)
        with self._write_lock:
            with self._lock:
                if need is None:
                    self.layout.version += 1  # the cursors move without a version: this save carries them
                    need = self.layout.version
                if self.layout.saved >= need:
                    return
                version, state = self.layout.snapshot()
            self.layout.write(state)
            self.writes += 1
            with self._lock:
                self.layout.mark_saved(version)

    def save_for(self, host: str, tenants: list[str]) -> None:
        """Make durable what `host` is about to be told: its id and its tenants'."""
        with self._lock:
            need = self.layout.unsaved(host, tenants)
        if need:
            self.save(need)
