"""vLLM KV offloading manager on cxlhm.

vLLM's interface (vllm/v1/kv_offload/abstract.py, ``OffloadingManager``), run in the
scheduler:
  lookup(block_hashes) -> int          leading blocks offloaded
  prepare_load(block_hashes) -> LoadStoreSpec   blocks protected from eviction until
  complete_load(block_hashes)                   ... this
  touch(block_hashes)                  mark recently used
  prepare_store(block_hashes) -> PrepareStoreOutput | None
        (block_hashes_to_store, store_spec, block_hashes_evicted); None: cannot store
  complete_store(block_hashes, success=True)    stored blocks become loadable
  take_events() -> OffloadingEvents (stored / removed)
Block hashes are bytes (ints in older vLLM; both work).

The LoadStoreSpec here (`CxlhmLoadStoreSpec`, medium "CXLHM") carries each block's HPA
in the device window; a worker moves the bytes with `write_blocks` / `read_blocks`
(or through the load/store window). Evictions reported by prepare_store and
take_events are this tenant's blocks only: another tenant's evictions are never
visible here.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

from host_runtime import kvkeys
from host_runtime.kvstore import PutStatus, Reservation
from host_runtime.shim.api import KVShim, byte_view

log = logging.getLogger("cxlhm.shim.vllm")

try:
    from vllm.v1.kv_offload.abstract import LoadStoreSpec as _SpecBase
    from vllm.v1.kv_offload.abstract import OffloadingEvent, OffloadingManager as _Base, PrepareStoreOutput
except Exception:  # noqa: BLE001 - no vLLM here: the same shapes, locally
    _SpecBase = object
    _Base = object

    @dataclasses.dataclass
    class PrepareStoreOutput:  # type: ignore[no-redef]
        block_hashes_to_store: list
        store_spec: Any
        block_hashes_evicted: list

    @dataclasses.dataclass
    class OffloadingEvent:  # type: ignore[no-redef]
        block_hashes: list
        block_size: int
        medium: str
        removed: bool


class CxlhmLoadStoreSpec(_SpecBase):
    """Where blocks live in the device window: one (hpa, nbytes) per block hash."""

    def __init__(self, block_hashes: list, hpas: np.ndarray, nbytes: np.ndarray):
        self.block_hashes, self.hpas, self.nbytes = block_hashes, hpas, nbytes

    @staticmethod
    def medium() -> str:
        return "CXLHM"

    def __len__(self) -> int:
        return len(self.block_hashes)


class CxlhmOffloadingManager(_Base):
    """`block_bytes`: bytes of one offloaded block (all layers); `block_size`: tokens
    per block (reported in events)."""

    def __init__(self, shim: KVShim, block_bytes: int, *, block_size: int = 16):
        self.shim, self.block_bytes, self.block_size = shim, block_bytes, block_size
        self._loads: dict[bytes, list[_Load]] = {}     # key -> prepared loads covering it
        self._storing: dict[bytes, Reservation] = {}
        self._events: list[OffloadingEvent] = []

    # ------------------------------------------------------------ lookups
    def lookup(self, block_hashes: Iterable) -> int:
        return self.shim.lookup_prefix([_key(h) for h in block_hashes])

    def touch(self, block_hashes: Iterable) -> None:
        self.shim.touch([_key(h) for h in block_hashes])

    # ------------------------------------------------------------ loads
    def prepare_load(self, block_hashes: Iterable) -> CxlhmLoadStoreSpec:
        hashes = list(block_hashes)
        keys = [_key(h) for h in hashes]
        ticket = self.shim.prefetch(keys)  # protects them from eviction, hints NEXT_PREFIX
        if ticket.ready != len(keys):
            self.shim.wait(ticket)
            raise KeyError(f"prepare_load: block {hashes[ticket.ready]!r} is not offloaded")
        load = _Load(ticket, len(keys))
        for key in keys:
            self._loads.setdefault(key, []).append(load)
        extents = [self.shim.tenant.extent_of(k) for k in keys]
        return CxlhmLoadStoreSpec(hashes, np.array([e[0] for e in extents], np.int64),
                                  np.array([e[1] for e in extents], np.int64))

    def complete_load(self, block_hashes: Iterable) -> None:
        for h in block_hashes:
            key = _key(h)
            loads = self._loads.get(key)
            if not loads:
                continue
            load = loads.pop(0)
            if not loads:
                del self._loads[key]
            load.remaining -= 1
            if load.remaining == 0:  # the eviction protection ends with its last block
                self.shim.wait(load.ticket)

    # ------------------------------------------------------------ stores
    def prepare_store(self, block_hashes: Iterable) -> PrepareStoreOutput | None:
        hashes = list(block_hashes)
        to_store, reservations, evicted = [], [], []
        for h in hashes:
            key = _key(h)
            if key in self._storing:
                continue
            res = self.shim.allocate(key, self.block_bytes)
            if res is PutStatus.NO_SPACE:
                for r in reservations:  # all or nothing, as vLLM's CPU manager
                    r.abort()
                return None
            if isinstance(res, PutStatus):  # already stored / being stored by someone else
                continue
            reservations.append(res)
            to_store.append(h)
            evicted += res.evicted
        for h, res in zip(to_store, reservations):
            self._storing[_key(h)] = res
        ordered_evicted = list(dict.fromkeys(evicted))  # this tenant's blocks only
        if ordered_evicted:
            self._events.append(OffloadingEvent(ordered_evicted, self.block_size, "CXLHM", True))
        spec = CxlhmLoadStoreSpec(to_store, np.array([r.hpa for r in reservations], np.int64),
                                  np.array([r.nbytes for r in reservations], np.int64))
        return PrepareStoreOutput(block_hashes_to_store=to_store, store_spec=spec,
                                  block_hashes_evicted=ordered_evicted)

    def complete_store(self, block_hashes: Iterable, success: bool = True) -> None:
        stored = []
        for h in block_hashes:
            res = self._storing.pop(_key(h), None)
            if res is None:
                continue
            if success:
                res.commit()
                stored.append(h)
            else:
                res.abort()
        if stored:
            self._events.append(OffloadingEvent(stored, self.block_size, "CXLHM", False))

    def take_events(self) -> Iterable[OffloadingEvent]:
        # Evictions forced by other tenants' stores show up in the tenant's eviction log.
        reported = {k for e in self._events if e.removed for k in e.block_hashes}
        foreign = []
        log_ = self.shim.tenant.evicted_keys
        while log_:
            key = log_.popleft()
            if key not in reported:
                foreign.append(key)
        events, self._events = self._events, []
        if foreign:
            events.append(OffloadingEvent(foreign, self.block_size, "CXLHM", True))
        yield from events

    # ------------------------------------------------------------ worker side: moving bytes
    def write_blocks(self, spec: CxlhmLoadStoreSpec, buffers: list) -> None:
        """Write each block's bytes (one buffer per block) to where prepare_store put it."""
        for h, buf in zip(spec.block_hashes, buffers):
            res = self._storing.get(_key(h))
            if res is None:
                raise KeyError(f"block {h!r} is not being stored")
            view = byte_view(buf, writable=False)
            if view.nbytes != self.block_bytes:
                raise ValueError(f"block {h!r}: {view.nbytes} bytes given, blocks are {self.block_bytes}")
            res.write(view)

    def read_blocks(self, spec: CxlhmLoadStoreSpec, buffers: list) -> list[bool]:
        """Read each prepared block into its buffer; False for a block that failed."""
        return [self.shim.get_into(_key(h), buf) is not None for h, buf in zip(spec.block_hashes, buffers)]


@dataclasses.dataclass
class _Load:
    ticket: Any
    remaining: int


def _key(block_hash: Any) -> bytes:
    return kvkeys.normalize_key(block_hash)


__all__ = ["CxlhmLoadStoreSpec", "CxlhmOffloadingManager", "OffloadingEvent", "PrepareStoreOutput"]
