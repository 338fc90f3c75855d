"""The global content directory: fingerprint -> where the chunk lives, shared by every
host, best-effort (a stale entry costs a miss, never wrong bytes).

  base        the ContentDirectory interface (publish, lookup_sparse, remove)
  location    Location, SparseHits and the key/word encodings every back end shares
  shm         the embedded directory: a compiled table in a shared-memory file
  redis       the same interface on a Redis server (across machines)
  metrics     the figures of merit a directory's users count
  registry    back ends by URL scheme (open_directory), entry points for more
"""
from host_runtime.directory.base import ContentDirectory, DirectoryUnavailable
from host_runtime.directory.location import Location, LocationKind, SparseHits, key_of
from host_runtime.directory.metrics import DirectoryMetrics
from host_runtime.directory.registry import DIRECTORIES, open_directory
from host_runtime.directory.shm import SharedMemoryDirectory

__all__ = ["DIRECTORIES", "ContentDirectory", "DirectoryUnavailable", "DirectoryMetrics", "open_directory", "Location", "LocationKind", "SharedMemoryDirectory",
           "SparseHits", "key_of"]
