"""The content directory on a Redis server, for hosts on several machines.

One Redis string per entry: key `<namespace>:<16-byte key>`, value the 24-byte packed
location. Batches are one pipeline (publish: SET per key; lookup: MGET), conditional
removes are a server-side script (delete only while the value is the expected one),
so no client ever removes an entry another host republished meanwhile.
"""
from __future__ import annotations

import functools

import numpy as np

from host_runtime.directory.base import ContentDirectory, DirectoryUnavailable
from host_runtime.directory.location import SparseHits

_REMOVE_IF = """
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then n = n + redis.call('DEL', key) end
end
return n
"""
BATCH = 4096  # keys per round trip
_EMPTY = bytes(24)


def _import_redis():
    try:
        import redis
    except ImportError:  # an optional dependency (the `redis` extra)
        raise ImportError("the Redis directory needs the redis client: pip install 'cxlhm[redis]' or pip install redis") from None
    return redis


def _unavailable(method):
    """The server's and the connection's errors as DirectoryUnavailable (an OSError),
    which callers of any directory handle the same way."""
    @functools.wraps(method)
    def call(self, *args, **kw):
        try:
            return method(self, *args, **kw)
        except self._errors as exc:
            raise DirectoryUnavailable(f"redis directory {self.namespace.decode()[:-1]!r}: "
                                       f"{type(exc).__name__}: {exc}") from exc
    return call


class RedisDirectory(ContentDirectory):
    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, namespace: str = "cxlhm:dir", client=None):
        redis = _import_redis()
        self._errors = (redis.exceptions.RedisError, OSError)
        self.namespace = namespace.encode() + b":"
        self.client = client if client is not None else redis.Redis.from_url(url)
        self._remove_if = self.client.register_script(_REMOVE_IF)

    @classmethod
    def from_url(cls, url: str) -> "RedisDirectory":
        return cls(url)

    def _names(self, keys: np.ndarray) -> list[bytes]:
        raw = np.ascontiguousarray(keys, np.uint64).tobytes()
        ns = self.namespace
        return [ns + raw[i:i + 16] for i in range(0, len(raw), 16)]

    @_unavailable
    def publish_words(self, keys, words) -> int:
        names = self._names(keys)
        raw = np.ascontiguousarray(words, "<u8").tobytes()
        for start in range(0, len(names), BATCH):
            pipe = self.client.pipeline(transaction=False)
            pipe.mset({names[i]: raw[24 * i:24 * i + 24] for i in range(start, min(start + BATCH, len(names)))})
            pipe.execute()
        return len(names)

    @_unavailable
    def lookup_words(self, keys) -> SparseHits:
        names = self._names(keys)
        hit = np.zeros(len(names), np.bool_)
        words = np.zeros((len(names), 3), np.uint64)
        for start in range(0, len(names), BATCH):
            values = self.client.mget(names[start:start + BATCH])
            ok = [v is not None and len(v) == 24 for v in values]  # anything else under our name: a miss
            stop = start + len(values)
            hit[start:stop] = ok
            words[start:stop] = np.frombuffer(b"".join(v if good else _EMPTY for v, good in zip(values, ok)),
                                              "<u8").reshape(-1, 3)
        return SparseHits(hit, words)

    @_unavailable
    def remove_words(self, keys, expected) -> int:
        names = self._names(keys)
        removed = 0
        for start in range(0, len(names), BATCH):
            chunk = names[start:start + BATCH]
            if expected is None:
                removed += int(self.client.delete(*chunk))
            else:
                exp = np.ascontiguousarray(expected[start:start + BATCH], "<u8").tobytes()
                removed += int(self._remove_if(keys=chunk, args=[exp[24 * i:24 * i + 24] for i in range(len(chunk))]))
        return removed

    @_unavailable
    def clear(self) -> None:
        batch = []
        for name in self.client.scan_iter(match=self.namespace + b"*", count=10000):
            batch.append(name)
            if len(batch) >= BATCH:
                self.client.delete(*batch)
                batch = []
        if batch:
            self.client.delete(*batch)

    def close(self) -> None:
        self.client.close()
