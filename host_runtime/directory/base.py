"""The content directory interface: fingerprint -> location, shared by every host.

Best-effort by contract: a lookup may return an entry whose chunk was since evicted
or overwritten, and an entry may vanish (a full directory drops publishes). Callers
read through a verifying path (the chunk carries its fingerprint and checksum), so a
stale entry costs a miss and a recompute, never wrong bytes.

Every implementation keeps these promises, checked by host_runtime.testing.directory:
  * publish then lookup on any client of the same directory finds the location;
  * lookup_sparse answers every key independently (any subset may hit, with gaps);
  * a later publish of a key replaces its location; remove drops it, and
    remove(key, expected) drops it only while it still points at `expected`;
  * bad input (short fingerprints, out-of-range location fields) is one clear error.
"""
from __future__ import annotations

import abc

import numpy as np

from host_runtime.directory.location import Location, SparseHits, key_array, key_of, words_array


class DirectoryUnavailable(OSError):
    """The directory's back end could not answer (a Redis server down or unreachable,
    a table truncated under its users): callers treat it as misses and count it."""


class ContentDirectory(abc.ABC):
    """Abstract content directory; see the module docstring for the contract."""

    # ------------------------------------------------------------ batch primitives (implemented per back end)
    @abc.abstractmethod
    def publish_words(self, keys: np.ndarray, words: np.ndarray) -> int:
        """Publish (n, 2) uint64 keys with (n, 3) uint64 location words; returns how many
        were stored (a full directory may drop some)."""

    @abc.abstractmethod
    def lookup_words(self, keys: np.ndarray) -> SparseHits:
        """Look (n, 2) uint64 keys up."""

    @abc.abstractmethod
    def remove_words(self, keys: np.ndarray, expected: np.ndarray | None) -> int:
        """Remove keys (only where the entry's words equal `expected`, when given);
        returns how many were removed."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Drop every entry."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ the public API
    def publish(self, fingerprint: bytes, location: Location) -> bool:
        return self.publish_many([fingerprint], [location]) == 1

    def publish_many(self, fingerprints, locations) -> int:
        keys = key_array(fingerprints)
        words = words_array(locations)
        if keys.shape[0] != words.shape[0]:
            raise ValueError(f"{keys.shape[0]} fingerprints but {words.shape[0]} locations")
        return self.publish_words(keys, words) if keys.shape[0] else 0

    def lookup(self, fingerprint: bytes) -> Location | None:
        return self.lookup_sparse([fingerprint]).location(0)

    def lookup_sparse(self, fingerprints) -> SparseHits:
        """Per-key hit bitmap and location; keys are independent (sparse, with gaps)."""
        keys = key_array(fingerprints)
        if not keys.shape[0]:
            return SparseHits(np.zeros(0, bool), np.zeros((0, 3), np.uint64))
        return self.lookup_words(keys)

    def remove(self, fingerprint: bytes, expected: Location | None = None) -> bool:
        return self.remove_many([fingerprint], None if expected is None else [expected]) == 1

    def remove_many(self, fingerprints, expected=None) -> int:
        keys = key_array(fingerprints)
        exp = None if expected is None else words_array(expected)
        if exp is not None and exp.shape[0] != keys.shape[0]:
            raise ValueError(f"{keys.shape[0]} fingerprints but {exp.shape[0]} expected locations")
        return self.remove_words(keys, exp) if keys.shape[0] else 0


__all__ = ["ContentDirectory", "DirectoryUnavailable", "Location", "SparseHits", "key_of"]
