"""What a stored KV value's bytes mean, bound to its key: a reader never gets bytes laid
out differently from what it expects.

An engine's page or chunk is a few arrays laid end to end (K then V of every layer, or
K0 V0 K1 V1, a Mamba state's temporal and conv parts ...). A ``ValueFormat`` names
them: a family tag (engine, pool kind, model/format version), the page size in
tokens, the byte order, and per part its name, dtype and axes in memory order::

    fmt = ValueFormat("sglang-mha", page_tokens=64, parts=(
        Part("kv", "bfloat16", 2, (("kv", 2), ("layer", 32), ("token", 64), ("head", 8), ("dim", 128))),))
    view = FormattedValues(shim, fmt, readable=[other_layout_fmt, ...])
    view.put(key, buffers)            # stored under view.key(key): key + b"#" + fmt.digest
    view.lookup_prefix(keys)          # leading keys readable in fmt or any convertible format
    view.get_into(key, buffers)       # True: buffers hold the value in fmt's layout
    raw_format("engine-value", nbytes)        # an opaque value, read back only as written
    geometry_format(kvgeometry, "family")     # a KVGeometry chunk (layer_first / chunk_first)
    base_key(stored_key)                      # the engine's key of a stored key (eviction events)

Tenant names of adapters using formats end in ``FORMAT_SCHEME`` (":kvfmt1").

Where the description lives. It is bound into the key (``key#<16 hex digits of the
format's hash>``), not written as a header inside the value:
  - a reader can only address values stored in a format it asked for, so a layout,
    dtype, page-size or model change can never hand it another layout's bytes, and
    values stored before formats existed (plain keys) are simply never found;
  - values keep their size: a header would push a page of whole device blocks into
    one more block, and a zero-copy read would need a second call or a bounce
    buffer to check it before the engine's memory is touched;
  - the cost is 17 bytes more per index entry, and a read in another format probes
    one more key per convertible format, only after the reader's own format missed.

Conversion. ``fmt.convertible_from(other)`` is true when every part of ``fmt`` exists
in ``other`` under the same name, dtype and axis sizes, the family and page size
agree, and only the axis order and/or byte order differ: the conversion is then a
pure permutation of elements (and a reversal of each element's bytes), so it is
exact. Anything else (another dtype, head count, page size, model) is a miss.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from host_runtime.buffers import byte_view
from host_runtime.kvkeys import normalize_key

log = logging.getLogger("cxlhm.shim.format")

SEPARATOR = b"#"
FORMAT_SCHEME = "kvfmt1"  # ends every adapter's tenant name: how its keys' formats are bound
NATIVE = "little" if sys.byteorder == "little" else "big"


@dataclass(frozen=True)
class Part:
    """One array of a value: its name, element dtype (a name, e.g. "bfloat16"), element
    size in bytes, and axes as (name, size) in memory order (the last varies fastest)."""
    name: str
    dtype: str
    itemsize: int
    axes: tuple[tuple[str, int], ...]

    @property
    def nbytes(self) -> int:
        return self.itemsize * int(np.prod([n for _, n in self.axes], dtype=np.int64))

    def same_elements(self, other: "Part") -> bool:
        return (self.name == other.name and self.dtype == other.dtype and self.itemsize == other.itemsize
                and sorted(self.axes) == sorted(other.axes) and len({a for a, _ in self.axes}) == len(self.axes))


@dataclass(frozen=True)
class ValueFormat:
    """A stored value's description (see the module docstring). ``attrs`` are further
    (name, value) pairs that must match exactly (an engine version, a layer list's hash)."""
    family: str
    parts: tuple[Part, ...]
    page_tokens: int = 0
    byte_order: str = NATIVE
    attrs: tuple[tuple[str, str], ...] = field(default=())

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @functools.cached_property
    def text(self) -> str:
        """The canonical description (what the digest hashes)."""
        parts = ";".join(f"{p.name}:{p.dtype}/{p.itemsize}:" + ",".join(f"{a}={n}" for a, n in p.axes) for p in self.parts)
        attrs = ",".join(f"{k}={v}" for k, v in sorted(self.attrs))
        return f"{self.family}|p{self.page_tokens}|{self.byte_order}|{parts}|{attrs}"

    @functools.cached_property
    def digest(self) -> bytes:
        return hashlib.blake2b(self.text.encode(), digest_size=8).hexdigest().encode()

    def key(self, key: Any) -> bytes:
        """`key` bound to this format: the key the value is stored under."""
        return normalize_key(key) + SEPARATOR + self.digest

    def convertible_from(self, other: "ValueFormat") -> bool:
        if other == self:
            return True
        if (other.family, other.page_tokens, sorted(other.attrs)) != (self.family, self.page_tokens, sorted(self.attrs)):
            return False
        theirs = {p.name: p for p in other.parts}
        return (len(theirs) == len(other.parts) and len(self.parts) == len(other.parts)
                and all(p.name in theirs and p.same_elements(theirs[p.name]) for p in self.parts))

    def convert(self, data: np.ndarray, source: "ValueFormat") -> np.ndarray:
        """`data` (a value stored in `source`) laid out in this format: a new uint8 array.
        ValueError when the conversion would not be exact."""
        if not self.convertible_from(source):
            raise ValueError(f"cannot convert {source.text} to {self.text} exactly")
        data = np.asarray(data, np.uint8).reshape(-1)
        if data.nbytes != source.nbytes:
            raise ValueError(f"a {source.family} value is {source.nbytes} bytes, got {data.nbytes}")
        offsets, at = {}, 0
        for p in source.parts:
            offsets[p.name] = at
            at += p.nbytes
        theirs = {p.name: p for p in source.parts}
        out = np.empty(self.nbytes, np.uint8)
        at = 0
        for p in self.parts:
            src = theirs[p.name]
            names = [a for a, _ in src.axes]
            arr = data[offsets[p.name]:offsets[p.name] + p.nbytes].reshape(*[n for _, n in src.axes], p.itemsize)
            arr = arr.transpose(*[names.index(a) for a, _ in p.axes], len(names))
            if source.byte_order != self.byte_order:
                arr = arr[..., ::-1]
            out[at:at + p.nbytes].reshape(arr.shape)[...] = arr
            at += p.nbytes
        return out


def raw_format(family: str, nbytes: int, **attrs: Any) -> ValueFormat:
    """An opaque value of `nbytes` bytes: readable only in exactly this format."""
    return ValueFormat(family, (Part("bytes", "uint8", 1, (("byte", int(nbytes)),)),),
                       attrs=tuple(sorted((k, str(v)) for k, v in attrs.items())))


_GEOMETRY_AXES = {"layer_first": ("layer", "kv", "token", "head", "dim"),
                  "chunk_first": ("token", "layer", "kv", "head", "dim")}


def geometry_format(geometry: Any, family: str) -> ValueFormat:
    """A chunk laid out as a host_runtime.kvgeometry.KVGeometry says (its two layouts
    convert into each other exactly)."""
    axes = _GEOMETRY_AXES[geometry.layout]
    sizes = dict(zip(axes, geometry.chunk_shape))
    return ValueFormat(family, (Part("kv", geometry.dtype, geometry.dtype_bytes, tuple((a, int(sizes[a])) for a in axes)),),
                       page_tokens=geometry.tokens_per_chunk, attrs=(("mla", str(bool(geometry.mla))),))


class FormattedValues:
    """A KVShim's values in one format, readable also from the `readable` formats it
    converts from exactly (others given there are ignored). Keys are the engine's;
    what is stored is always ``fmt.key(key)``."""

    def __init__(self, shim: Any, fmt: ValueFormat, readable: Sequence[ValueFormat] = ()):
        self.shim, self.fmt = shim, fmt
        self.others = [f for f in dict.fromkeys(readable) if f != fmt and fmt.convertible_from(f)]

    def key(self, key: Any) -> bytes:
        return self.fmt.key(key)

    def where(self, keys: Sequence[Any]) -> list[ValueFormat | None]:
        """Per key, the format it is readable in (this one first), or None."""
        found: list[ValueFormat | None] = [self.fmt if hit else None for hit in self.shim.exists([self.fmt.key(k) for k in keys])]
        for other in self.others:
            missing = [i for i, f in enumerate(found) if f is None]
            if not missing:
                break
            for i, hit in zip(missing, self.shim.exists([other.key(keys[i]) for i in missing])):
                if hit:
                    found[i] = other
        return found

    def exists(self, keys: Sequence[Any]) -> list[bool]:
        return [f is not None for f in self.where(keys)]

    def contains(self, key: Any) -> bool:
        return self.exists([key])[0]

    def lookup_prefix(self, keys: Sequence[Any]) -> int:
        n = self.shim.lookup_prefix([self.fmt.key(k) for k in keys])
        if n == len(keys) or not self.others:
            return n
        rest = self.exists(keys[n:])
        return n + (rest.index(False) if False in rest else len(rest))

    def put(self, key: Any, buf: Any, *, session: Any = None) -> Any:
        """Store `buf` (a buffer or a gather list laid out in this format) unless the key
        is readable already; returns the shim's PutStatus (EXISTS when readable)."""
        from host_runtime.kvstore import PutStatus
        if self.contains(key):
            return PutStatus.EXISTS
        return self.shim.put_from(self.fmt.key(key), buf, session=session)

    def get_into(self, key: Any, buf: Any, *, session: Any = None) -> bool:
        """Fill `buf` (a buffer or a scatter list of this format's size) with the value,
        converted when it was stored in another readable format. False on a miss; a
        value whose size does not match its format, or that the medium cannot return
        intact, is a miss too, never bytes."""
        try:
            if self.shim.get_into(self.fmt.key(key), buf, session=session) is not None:
                return True
        except (ValueError, OSError) as exc:  # a wrong size, a media error: a miss, never bytes
            log.error("value %r in %s: %s", key, self.fmt.family, exc)
            return False
        for other in self.others:
            staged = np.empty(other.nbytes, np.uint8)
            try:
                if self.shim.get_into(other.key(key), staged, session=session) is None:
                    continue
            except (ValueError, OSError) as exc:
                log.error("value %r in %s: %s", key, other.text, exc)
                continue
            scatter(self.fmt.convert(staged, other), buf)
            return True
        return False

    def remove(self, keys: Sequence[Any]) -> int:
        return sum(self.shim.remove([f.key(k) for f in (self.fmt, *self.others)]) for k in keys)


def scatter(data: np.ndarray, buf: Any) -> None:
    """Copy `data` into a buffer or a list of buffers laid end to end."""
    views = [byte_view(b, writable=True) for b in (buf if isinstance(buf, (list, tuple)) else [buf])]
    if sum(v.nbytes for v in views) != data.nbytes:
        raise ValueError(f"the buffers hold {sum(v.nbytes for v in views)} bytes, the value {data.nbytes}")
    at = 0
    for v in views:
        v[:] = data[at:at + v.nbytes]
        at += v.nbytes


def base_key(stored: bytes) -> bytes:
    """The engine's key of a stored (format-bound) key."""
    return stored.rsplit(SEPARATOR, 1)[0] if SEPARATOR in stored else stored


__all__ = ["FORMAT_SCHEME", "FormattedValues", "Part", "ValueFormat", "base_key", "geometry_format", "raw_format", "scatter"]
