"""The KV store: content-addressed KV chunks in the HDM window of a cxlhm device.

    store = KVStore(handle)                        # handle = host_runtime.open_device(...)
    alice = store.tenant("alice")                  # a namespace with its own salt
    keys = alice.prefix_keys(tokens, 256)          # chained SHA-256 keys (kvkeys)
    n = alice.lookup_prefix(keys)                  # leading chunks already stored
    alice.put_from(keys[n], chunk_bytes)           # store one chunk (zero-copy from the buffer)
    alice.get_into(keys[0], out)                   # read it back (numpy / torch CPU / any buffer)

    s = alice.open_session()                       # a serving session: hints flow automatically
    s.resume(keys[:n]); s.append(key, data); s.pause(5_000_000); s.end()

Modules: store (the index and the data paths), tenant (Tenant, Session, Reservation,
PrefetchTicket), eviction, persistence + journal (the index on disk), hints (sinks),
entries (index entries, errors).

What it owns:
* an index key -> extent per tenant, an extent allocator over the window (allocator.py),
  and store-level eviction when the window (or a tenant's quota) is full: ended or
  session-less chunks first, then paused sessions', then active sessions', least
  recently used first; never pinned chunks, never chunks being read or written;
* sessions whose lifecycle emits the request-lifecycle hints (SESSION_RESUME with the
  prefix's extents in prefix order, NEXT_PREFIX, APPEND before writing new KV,
  SESSION_PAUSE, SESSION_END, PIN/UNPIN) through a `HintSink` - the mailbox's
  `HintClient` in production, a recorder in tests - and tags every access with the
  session, so hint-aware firmware (hymcache) can prefetch and buffer;
* a persistent index (an append-only journal next to the device image), so a
  restarted server finds its KV. The crash guarantee (docs/reliability.md): commit()
  publishes a chunk, a later flush() or close() makes it durable. After an unclean
  shutdown, chunks committed after the last completed flush are dropped, and every
  other chunk is checked against the fingerprint taken at its flush (from the device's
  crash-consistent block checksums) and dropped if its blocks changed (principle 4: a
  miss, never wrong bytes); `check()` verifies index and allocator agree;
* tenants: every call goes through a `Tenant`, which only ever sees its own namespace,
  its own sessions and its own pins; keys computed by a tenant carry its salt.
  Pins are plain (held until unpin) or leased (`lease_pins`: released by their holder
  or at a deadline, for engines that pin at lookup and never unpin; pinleases.py),
  both within the tenant's pin budget (`max_pinned_bytes`).
  Capacity pressure evicts by the global policy above, but never below a tenant's
  `reserved_bytes`, and a tenant over its `quota_bytes` evicts only its own chunks.

Metadata work is proportional to the keys a call touches (plus the number of tenants
for a global eviction choice), never to capacity: dicts and LRU lists over live
entries, an O(1) journal append per change, compaction amortised over changes.

Errors: bad input (wrong sizes, unknown keys in remove, oversized keys) raises
ValueError/TypeError with a message; a device media error on a read turns the chunk
into a miss (it is dropped); hint delivery failures are counted, never raised (hints
are advisory).
"""
from host_runtime.kvstore.entries import ACTIVE, COLD, INDEX_FORMAT, PAUSED, IndexCorrupt, PutStatus, StoreFull
from host_runtime.kvstore.hints import DeviceHints, HintSink, NullHints, RecordingHints, hints_for
from host_runtime.kvstore.journal import Journal, chunk_fingerprint
from host_runtime.kvstore.pinleases import PinLease
from host_runtime.kvstore.store import KVStore
from host_runtime.kvstore.tenant import PrefetchTicket, Reservation, Session, Tenant

_Journal = Journal  # the crash test instruments the journal's appends under this name

__all__ = ["ACTIVE", "COLD", "INDEX_FORMAT", "PAUSED", "DeviceHints", "HintSink", "IndexCorrupt", "Journal",
           "KVStore", "NullHints", "PinLease", "PrefetchTicket", "PutStatus", "RecordingHints", "Reservation", "Session",
           "StoreFull", "Tenant", "chunk_fingerprint", "hints_for"]
