"""A content directory inside one process: ``mem://NAME``. Every client that opens the same
name in the process shares one table (a dict under a lock), and the table goes when its
last client closes. For single-host runs and tests that want the directory's contract
without a shared-memory file or a Redis server.

Registered under the URL scheme `mem`, it is opened like the built-ins:
``open_directory("mem://kv")``.
"""
from __future__ import annotations

import threading
from urllib.parse import urlsplit

import numpy as np

from host_runtime.directory.base import ContentDirectory
from host_runtime.directory.location import SparseHits

_TABLES: dict[str, list] = {}  # name -> [lock, {key: words}, clients]
_TABLES_LOCK = threading.Lock()


class ProcessDirectory(ContentDirectory):
    def __init__(self, name: str):
        if not name:
            raise ValueError("a mem:// directory needs a name, e.g. mem://kv")
        self.name, self.url = name, f"mem://{name}"
        with _TABLES_LOCK:
            table = _TABLES.setdefault(name, [threading.Lock(), {}, 0])
            table[2] += 1
        self._lock, self._entries = table[0], table[1]
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> "ProcessDirectory":
        parts = urlsplit(url)
        if parts.scheme != "mem" or parts.query or parts.fragment:
            raise ValueError(f"directory {url!r}: expected mem://NAME")
        return cls(parts.netloc + parts.path)

    def publish_words(self, keys: np.ndarray, words: np.ndarray) -> int:
        with self._lock:
            for key, location in zip(map(tuple, keys.tolist()), map(tuple, words.tolist())):
                self._entries[key] = location
        return keys.shape[0]

    def lookup_words(self, keys: np.ndarray) -> SparseHits:
        hit = np.zeros(keys.shape[0], bool)
        words = np.zeros((keys.shape[0], 3), np.uint64)
        with self._lock:
            for i, key in enumerate(map(tuple, keys.tolist())):
                location = self._entries.get(key)
                if location is not None:
                    hit[i], words[i] = True, location
        return SparseHits(hit, words)

    def remove_words(self, keys: np.ndarray, expected: np.ndarray | None) -> int:
        removed = 0
        with self._lock:
            for i, key in enumerate(map(tuple, keys.tolist())):
                location = self._entries.get(key)
                if location is not None and (expected is None or location == tuple(expected[i].tolist())):
                    del self._entries[key]
                    removed += 1
        return removed

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def close(self) -> None:
        with _TABLES_LOCK:
            if self._closed:
                return
            self._closed = True
            table = _TABLES[self.name]
            table[2] -= 1
            if table[2] == 0:  # the last client: the table goes
                del _TABLES[self.name]
