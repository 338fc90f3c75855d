"""The figures of merit a content directory's users count (per host; sum hosts with +).

  remote hit ratio         verified hits served from a chunk another host stored, over lookups
  staleness rate           entries the directory returned whose read then failed verification,
                           over entries returned
  wasted transfer bytes    bytes moved for those failed reads
  metadata ops per useful token
                           directory operations (keys published, looked up, removed) per token
                           whose KV was actually reused
  prefetch accuracy across hosts
                           prefetched chunks (hinted to the device) that a host then read, over
                           prefetched chunks; counted separately for chunks stored by another host
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class DirectoryMetrics:
    keys_looked_up: int = 0
    entries_returned: int = 0      # directory hits
    verified_hits: int = 0         # entries whose read verified
    remote_hits: int = 0           # verified hits on chunks another host stored
    stale_entries: int = 0         # entries returned whose read failed (evicted, overwritten, torn)
    wasted_bytes: int = 0          # bytes read for stale entries
    useful_bytes: int = 0          # bytes read for verified hits
    useful_tokens: int = 0         # tokens whose KV a verified hit provided
    metadata_ops: int = 0          # keys published + looked up + removed
    prefetched: int = 0            # chunks hinted for prefetch
    prefetched_used: int = 0       # of those, read afterwards
    prefetched_remote: int = 0     # prefetched chunks another host stored
    prefetched_remote_used: int = 0
    bad_entries: int = 0           # entries no reader can use (unknown kind, outside the partition): misses
    directory_errors: int = 0      # directory calls that failed (back end down): misses, publishes lost

    def __add__(self, other: "DirectoryMetrics") -> "DirectoryMetrics":
        return DirectoryMetrics(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                                   for f in dataclasses.fields(self)})

    @staticmethod
    def _ratio(a: int, b: int) -> float:
        return a / b if b else 0.0

    @property
    def remote_hit_ratio(self) -> float:
        return self._ratio(self.remote_hits, self.keys_looked_up)

    @property
    def hit_ratio(self) -> float:
        return self._ratio(self.verified_hits, self.keys_looked_up)

    @property
    def staleness_rate(self) -> float:
        return self._ratio(self.stale_entries, self.entries_returned)

    @property
    def metadata_ops_per_useful_token(self) -> float:
        return self._ratio(self.metadata_ops, self.useful_tokens) if self.useful_tokens else float("inf") if self.metadata_ops else 0.0

    @property
    def prefetch_accuracy(self) -> float:
        return self._ratio(self.prefetched_used, self.prefetched)

    @property
    def remote_prefetch_accuracy(self) -> float:
        return self._ratio(self.prefetched_remote_used, self.prefetched_remote)

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(hit_ratio=self.hit_ratio, remote_hit_ratio=self.remote_hit_ratio,
                   staleness_rate=self.staleness_rate,
                   metadata_ops_per_useful_token=self.metadata_ops_per_useful_token,
                   prefetch_accuracy=self.prefetch_accuracy, remote_prefetch_accuracy=self.remote_prefetch_accuracy)
        return out

    def table(self) -> str:
        """The five figures of merit, one per line."""
        return "\n".join([
            f"remote (cross-host) hit ratio      {self.remote_hit_ratio:8.3f}  ({self.remote_hits}/{self.keys_looked_up} keys)",
            f"directory staleness rate           {self.staleness_rate:8.3f}  ({self.stale_entries}/{self.entries_returned} entries)",
            f"wasted transfer bytes              {self.wasted_bytes:8d}  (useful {self.useful_bytes})",
            f"metadata ops per useful token      {self.metadata_ops_per_useful_token:8.3f}  ({self.metadata_ops}/{self.useful_tokens})",
            f"prefetch accuracy (remote chunks)  {self.prefetch_accuracy:8.3f}  ({self.remote_prefetch_accuracy:.3f})",
        ])
