"""One CXL-HM device shared by several host processes (a memory pool).

  service     PoolService: owns the device, serves hosts over a Unix socket and rings
  identity    one key per host, the grants bound to it, the attach proof
  port        HostPort: one host's window, hint translation and pin budget, behind its own mailbox
  mirror      the per-tenant blocks hosts load directly from shared memory; the service's life counter
  rings       the data plane: per-host submission/completion rings and a payload buffer
  hitlog      mirror hits, reported back to the firmware in batches
  layout      tenant partitions, host ids, the chunk ring allocator; saved across restarts,
              written outside the service's lock (LayoutSaver)
  tenants     each tenant's service-side state; a new one zero-filled outside the service's lock
  statefiles  the state folder: ownership checks, the one-service lock, atomic no-follow writes
  protocol    the request/reply format; wire: its framing on the socket
The host side is host_runtime/pool_client.py; docs/pool.md describes the whole.
"""
from cxlhm.pool.service import PoolService

__all__ = ["PoolService"]
