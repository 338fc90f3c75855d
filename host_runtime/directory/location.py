"""Where a chunk lives, as the content directory records it, and the answer of a
sparse lookup (a hit bitmap with a location per hit).

A location is three 64-bit words so every back end stores it the same way:
  w0 = kind << 56 | host << 32 | tenant      w1 = offset      w2 = length << 32 | generation
"""
from __future__ import annotations

import dataclasses
import enum
import struct

import numpy as np

KEY_BYTES = 16  # fingerprints are digests; the directory keys on their first 16 bytes
_WORDS = struct.Struct("<3Q")

LOCATION_DTYPE = np.dtype([("kind", np.uint8), ("host", np.uint16), ("tenant", np.uint32),
                           ("offset", np.uint64), ("length", np.uint32), ("generation", np.uint32)])


class LocationKind(enum.IntEnum):
    POOL = 1       # the pooled CXL-HM device (a tenant partition, byte offset in it)
    INSTANCE = 2   # another serving instance's local tier (host = that instance)


_LIMITS = {"host": 0xFFFF, "tenant": 0xFFFFFFFF, "offset": 0xFFFFFFFFFFFFFFFF,
           "length": 0xFFFFFFFF, "generation": 0xFFFFFFFF}


@dataclasses.dataclass(frozen=True)
class Location:
    kind: LocationKind
    host: int
    tenant: int
    offset: int
    length: int
    generation: int = 0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", LocationKind(self.kind))
        except ValueError:
            raise ValueError(f"location kind must be one of {[k.name for k in LocationKind]}, got {self.kind!r}") from None
        for name, top in _LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= top:
                raise ValueError(f"location {name} must be an integer 0..{top:#x}, got {value!r}")

    def words(self) -> tuple[int, int, int]:
        return (int(self.kind) << 56 | self.host << 32 | self.tenant, self.offset,
                self.length << 32 | self.generation)

    def pack(self) -> bytes:
        return _WORDS.pack(*self.words())

    @classmethod
    def from_words(cls, w0: int, w1: int, w2: int) -> "Location":
        return cls(LocationKind(w0 >> 56), (w0 >> 32) & 0xFFFF, w0 & 0xFFFFFFFF, w1, w2 >> 32, w2 & 0xFFFFFFFF)

    @classmethod
    def unpack(cls, raw: bytes) -> "Location":
        return cls.from_words(*_WORDS.unpack(raw))


def key_of(fingerprint) -> bytes:
    """The 16-byte directory key of a fingerprint (prefix key or segment key digest)."""
    if isinstance(fingerprint, (bytearray, memoryview)):
        fingerprint = bytes(fingerprint)
    if not isinstance(fingerprint, bytes):
        raise TypeError(f"a fingerprint must be bytes (a digest of >= {KEY_BYTES} bytes), got {type(fingerprint).__name__}")
    if len(fingerprint) < KEY_BYTES:
        raise ValueError(f"fingerprint {fingerprint.hex()!r} has {len(fingerprint)} bytes; "
                         f"the directory needs digests of >= {KEY_BYTES} bytes")
    return fingerprint[:KEY_BYTES]


def key_array(fingerprints) -> np.ndarray:
    """Fingerprints -> an (n, 2) uint64 array of directory keys. Accepts a list of
    bytes, or an (n, 2) uint64 array / (n,) array of >= 16-byte items as they are."""
    if isinstance(fingerprints, np.ndarray):
        if fingerprints.dtype == np.uint64 and fingerprints.ndim == 2 and fingerprints.shape[1] == 2:
            return np.ascontiguousarray(fingerprints)
        if fingerprints.ndim == 1 and fingerprints.dtype.kind in "SV" and fingerprints.dtype.itemsize >= KEY_BYTES:
            raw = np.ascontiguousarray(fingerprints).view(np.uint8).reshape(len(fingerprints), -1)[:, :KEY_BYTES]
            return np.ascontiguousarray(raw).view(np.uint64).reshape(-1, 2)
        raise ValueError(f"a key array must be (n, 2) uint64 or (n,) of >= {KEY_BYTES}-byte items, "
                         f"got shape {fingerprints.shape} dtype {fingerprints.dtype}")
    keys = [key_of(f) for f in fingerprints]
    if not keys:
        return np.zeros((0, 2), np.uint64)
    return np.frombuffer(b"".join(keys), np.uint64).reshape(-1, 2).copy()


def words_array(locations) -> np.ndarray:
    """Locations -> an (n, 3) uint64 array of their words."""
    out = np.zeros((len(locations), 3), np.uint64)
    for i, loc in enumerate(locations):
        if not isinstance(loc, Location):
            raise TypeError(f"location {i} must be a Location, got {type(loc).__name__}")
        out[i] = loc.words()
    return out


class SparseHits:
    """The answer of lookup_sparse: `hit[i]` says whether key i was found (any subset,
    with gaps), `location(i)` where. Best-effort: a hit may be stale; the reader
    verifies what it reads and counts a failed read as a miss."""

    def __init__(self, hit: np.ndarray, words: np.ndarray):
        self.hit = hit
        self.words = words

    def __len__(self) -> int:
        return self.hit.shape[0]

    @property
    def n_hits(self) -> int:
        return int(np.count_nonzero(self.hit))

    def prefix_length(self) -> int:
        """Leading hits (a prefix match stops at the first gap)."""
        misses = np.flatnonzero(~self.hit)
        return int(misses[0]) if misses.shape[0] else len(self)

    def location(self, i: int) -> Location | None:
        if not self.hit[i]:
            return None
        return Location.from_words(*(int(w) for w in self.words[i]))

    def locations(self) -> np.ndarray:
        """Every key's location as a LOCATION_DTYPE array (zeros where missed)."""
        out = np.zeros(len(self), LOCATION_DTYPE)
        w = self.words
        out["kind"], out["host"], out["tenant"] = w[:, 0] >> 56, (w[:, 0] >> 32) & 0xFFFF, w[:, 0] & 0xFFFFFFFF
        out["offset"], out["length"], out["generation"] = w[:, 1], w[:, 2] >> 32, w[:, 2] & 0xFFFFFFFF
        return out
