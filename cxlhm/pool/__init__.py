"""One CXL-HM device shared by several host processes (a memory pool).

  service    PoolService: owns the device, serves hosts over a Unix socket
  port       HostPort: one host's window and hint translation, behind its own mailbox
  mirror     the per-tenant blocks hosts load directly from shared memory
  layout     tenant partitions, host ids, the chunk ring allocator (saved across restarts)
  protocol   the request/reply format
The host side is host_runtime/pool_client.py; docs/pool.md describes the whole.
"""
from cxlhm.pool.service import PoolService

__all__ = ["PoolService"]
