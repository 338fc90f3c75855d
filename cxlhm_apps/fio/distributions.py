"""Where random I/O goes: fio's random_distribution models, drawn in bulk with numpy.

Every sampler returns block indices in [0, nblocks) of the job's region. Following
fio, the skewed models first draw a *popularity rank* and then scatter ranks over the
region (fio hashes them), so the hot set is not one contiguous run; with a CENTER
argument (``zipf:1.2:0.25``) fio stops scattering and places the hottest rank at that
fraction of the region, with colder ranks after it. cxlhm scatters with a seeded
bijection (`BlockPermutation`) instead of fio's hash, so every rank owns exactly one
block and the hot set has exactly the size the model says.

- zipf:THETA   rank k has probability proportional to 1/k^THETA. Drawn exactly by
               rejection-inversion (Hörmann & Derflinger 1996); fio uses Gray et al.'s
               approximation of the same law.
- pareto:H     fio's power law: rank = (n-1) * u^(log H / log(1-H)), u uniform.
- normal:DEV   fio's bell curve: the mean of 12 uniform draws over the region, plus a
               uniform deviation DEV% of the region wide, folded back inside it.
- zoned:A/S:.. A% of accesses fall uniformly in the next S% of the region.
- zoned_abs    the same with absolute zone sizes.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from cxlhm_apps.fio import values as V

FIO_DEFAULT_ZIPF = 1.1
FIO_DEFAULT_PARETO = 0.2
# Beyond this every draw is rank 1 to the last bit of a double; larger values only risk overflow.
MAX_ZIPF_THETA = 1000.0
KINDS = ("random", "zipf", "pareto", "normal", "zoned", "zoned_abs")

Zones = tuple[tuple[float, float], ...]  # (access percent, size: percent or bytes)


@dataclasses.dataclass(frozen=True)
class DistSpec:
    kind: str
    value: float = 0.0
    center: float | None = None
    zones: tuple[Zones, Zones] | None = None  # per direction (read, write), zoned kinds only


def _parse_zones(text: str, kind: str, kb_base: int) -> Zones:
    zones = []
    for item in text.split(":"):
        access_text, sep, size_text = item.strip().partition("/")
        if not sep:
            raise ValueError(f"zone {item!r} must be ACCESS%/SIZE")
        access = V.parse_float(access_text)
        if kind == "zoned":
            size = V.parse_float(size_text) if size_text.strip() else None  # blank: a share of the rest
        else:
            size = float(V.parse_size(size_text, kb_base=kb_base))
        if access < 0 or (size is not None and size < 0):
            raise ValueError(f"zone {item!r} has a negative value")
        zones.append((access, size))
    if not zones or len(zones) > 256:
        raise ValueError("between 1 and 256 zones are allowed")
    blanks = sum(size is None for _, size in zones)
    if blanks:  # fio shares what the given sizes leave evenly between the blank ones (whole percents)
        given = sum(size for _, size in zones if size is not None)
        if given > 100.0 + 1e-6:
            raise ValueError(f"zone sizes add up to {given:g}% of the region, more than 100%")
        rest = 100.0 if blanks == len(zones) == 1 else float(int(100 - given) // blanks)
        zones = [(access, rest if size is None else size) for access, size in zones]
    total_access = sum(a for a, _ in zones)
    if abs(total_access - 100.0) > 1e-6:
        raise ValueError(f"zone access percentages add up to {total_access:g}, not 100")
    if kind == "zoned" and sum(s for _, s in zones) > 100.0 + 1e-6:
        raise ValueError(f"zone sizes add up to {sum(s for _, s in zones):g}% of the region, more than 100%")
    return tuple(zones)


def parse_distribution(text: str, *, kb_base: int = 1024) -> DistSpec:
    """Parse a random_distribution value (see the module docstring for the forms)."""
    s = text.strip()
    kind, sep, rest = s.partition(":")
    if "=" in kind:  # fio's HOWTO also shows zoned_abs=...
        kind, sep, rest = s.partition("=")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise ValueError(f"unknown distribution {kind!r}; accepted: {', '.join(KINDS)}")
    if kind == "random":
        if sep:
            raise ValueError("random takes no parameters")
        return DistSpec("random")
    if kind in ("zoned", "zoned_abs"):
        if not rest.strip():
            raise ValueError(f"{kind} needs zones, e.g. {kind}:60/10:30/20:10/70")
        per_dir = V.split_directions(rest)[:2]
        zones = tuple(_parse_zones(p, kind, kb_base) if p is not None else None for p in per_dir)
        if zones[0] is None:
            raise ValueError(f"{kind}: the read zones may not be empty")
        return DistSpec(kind, zones=(zones[0], zones[1] or zones[0]))
    parts = [p.strip() for p in rest.split(":")] if sep else []
    if len(parts) > 2:
        raise ValueError(f"{kind} takes at most a value and a center, got {text!r}")
    default = {"zipf": FIO_DEFAULT_ZIPF, "pareto": FIO_DEFAULT_PARETO, "normal": 0.0}[kind]
    value = V.parse_float(parts[0]) if parts and parts[0] else default
    center = V.parse_float(parts[1]) if len(parts) == 2 else None
    if not math.isfinite(value) or (center is not None and not math.isfinite(center)):
        raise ValueError(f"{kind} takes finite numbers, got {text!r}")
    if kind == "zipf" and not 0 < value <= MAX_ZIPF_THETA:
        raise ValueError(f"zipf theta must be positive and at most {MAX_ZIPF_THETA:g}, got {value:g}")
    if kind == "pareto" and not 0 < value < 1:
        raise ValueError(f"pareto H must be between 0 and 1 (exclusive), got {value:g}")
    if kind == "normal" and not 0 <= value <= 100:
        raise ValueError(f"normal deviation must be a percentage from 0 to 100, got {value:g}")
    if center is not None and not 0 <= center <= 1:
        raise ValueError(f"the center must be within 0-1, got {center:g}")
    return DistSpec(kind, value, center)


# ---------------------------------------------------------------- a seeded bijection

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-mixing 64-bit hash (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class BlockPermutation:
    """A pseudo-random bijection of [0, n): a 4-round Feistel network over the smallest
    even-width power of two >= n, with cycle-walking back into range. O(1) memory, so a
    random map over a TB-scale region costs nothing (fio keeps a bitmap instead)."""

    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ValueError("a permutation needs at least one element")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits & 1
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        keys = np.random.default_rng(seed).integers(0, 2**63, size=4, dtype=np.int64)
        self._keys = keys.astype(np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        with np.errstate(over="ignore"):
            for key in self._keys:
                left, right = right, left ^ (_mix64(right ^ key) & self._mask)
        return (left << self._half) | right

    def __call__(self, index: np.ndarray) -> np.ndarray:
        x = np.asarray(index, np.int64).astype(np.uint64) % np.uint64(self.n)
        if self.n == 1:
            return np.zeros(x.shape, np.int64)
        out = self._encrypt(x)
        bad = out >= np.uint64(self.n)
        while bad.any():  # cycle-walk: the domain is < 4n, so ~2 extra rounds at most on average
            out[bad] = self._encrypt(out[bad])
            bad = out >= np.uint64(self.n)
        return out.astype(np.int64)


# ---------------------------------------------------------------- rank samplers

def _expm1_over(x: np.ndarray) -> np.ndarray:
    """(e^x - 1) / x, continuous at 0."""
    x = np.asarray(x, np.float64)
    small = np.abs(x) < 1e-8
    safe = np.where(small, 1.0, x)
    return np.where(small, 1.0 + x / 2.0 + x * x / 6.0, np.expm1(safe) / safe)


def _log1p_over(x: np.ndarray) -> np.ndarray:
    """log(1 + x) / x, continuous at 0."""
    x = np.asarray(x, np.float64)
    small = np.abs(x) < 1e-8
    safe = np.where(small, 1.0, x)
    return np.where(small, 1.0 - x / 2.0 + x * x / 3.0, np.log1p(safe) / safe)


def zipf_ranks(n: int, theta: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` ranks in [1, n] with P(k) proportional to k^-theta (exact)."""
    if n == 1:
        return np.ones(count, np.int64)
    s = float(theta)

    def h(x):
        return np.exp(-s * np.log(x))

    def h_integral(x):
        log_x = np.log(x)
        return _expm1_over((1.0 - s) * log_x) * log_x

    def h_integral_inverse(x):
        t = np.maximum(x * (1.0 - s), -1.0)
        return np.exp(_log1p_over(t) * x)

    lo = float(h_integral(np.float64(1.5))) - 1.0
    hi = float(h_integral(np.float64(n + 0.5)))
    squeeze = 2.0 - float(h_integral_inverse(h_integral(np.float64(2.5)) - h(np.float64(2.0))))
    out = np.empty(count, np.int64)
    todo = np.arange(count)
    while todo.size:
        u = hi + rng.random(todo.size) * (lo - hi)
        x = h_integral_inverse(u)
        k = np.clip(np.floor(x + 0.5), 1, n)
        accept = (k - x <= squeeze) | (u >= h_integral(k + 0.5) - h(k))
        out[todo[accept]] = k[accept].astype(np.int64)
        todo = todo[~accept]
    return out


def pareto_ranks(n: int, h: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """fio's pareto: 0-based ranks (n-1) * u^(log h / log(1-h))."""
    power = np.log(h) / np.log(1.0 - h)
    return np.floor((n - 1) * rng.random(count) ** power).astype(np.int64)


def normal_ranks(n: int, dev_percent: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """fio's bell curve: ceil(mean of 12 uniform draws over [0, n]) plus a uniform
    deviation of width ceil(n * dev / 100) (at most n/2), halved until inside [0, n)."""
    total = rng.integers(0, n + 1, size=(count, 12), dtype=np.int64).sum(axis=1)
    center = (total + 11) // 12
    width = min(int(np.ceil(n * dev_percent / 100.0)), n // 2) if dev_percent else 0
    if width:
        dev = (width * rng.random(count)).astype(np.int64) - width // 2
        out = center + dev
        bad = (out < 0) | (out >= n)
        while bad.any():
            dev[bad] = (dev[bad] / 2).astype(np.int64)  # C-style: truncate toward zero
            out = center + dev
            bad = (out < 0) | (out >= n)
        center = out
    return np.minimum(center, n - 1)


# ---------------------------------------------------------------- block samplers

class BlockSampler:
    """Draws block indices in [0, nblocks) for one job clone. `block_bytes` converts
    zoned_abs sizes to blocks."""

    def __init__(self, spec: DistSpec | None, nblocks: int, seed: int, *, block_bytes: int = 4096):
        self.spec = spec or DistSpec("random")
        self.nblocks = nblocks
        self.rng = np.random.default_rng(seed)
        self.scatter = BlockPermutation(nblocks, seed ^ 0x5CA77E5)
        self._zones = None
        if self.spec.kind in ("zoned", "zoned_abs"):
            self._zones = tuple(self._zone_table(z, block_bytes) for z in self.spec.zones)

    def _zone_table(self, zones: Zones, block_bytes: int):
        n = self.nblocks
        starts, ends, probs = [], [], []
        pos = 0
        for access, size in zones:
            blocks = int(n * size / 100.0) if self.spec.kind == "zoned" else int(size // block_bytes)
            start = min(pos, n - 1)
            end = min(max(start + 1, pos + blocks), n)  # a zone always owns at least one block
            starts.append(start)
            ends.append(end)
            probs.append(access / 100.0)
            pos = end
        probs = np.array(probs) / sum(probs)
        return np.array(starts, np.int64), np.array(ends, np.int64), probs

    def ranks_to_blocks(self, ranks0: np.ndarray) -> np.ndarray:
        """Place 0-based popularity ranks on blocks: scattered, or from the center on."""
        if self.spec.center is None:
            return self.scatter(ranks0)
        shift = self.spec.center if self.spec.kind != "normal" else self.spec.center - 0.5
        return (ranks0 + int(self.nblocks * shift)) % self.nblocks

    def sample(self, count: int, direction: int = 0) -> np.ndarray:
        kind, n = self.spec.kind, self.nblocks
        if kind == "random":
            return self.rng.integers(0, n, size=count, dtype=np.int64)
        if kind == "zipf":
            return self.ranks_to_blocks(zipf_ranks(n, self.spec.value, count, self.rng) - 1)
        if kind == "pareto":
            return self.ranks_to_blocks(pareto_ranks(n, self.spec.value, count, self.rng))
        if kind == "normal":
            return self.ranks_to_blocks(normal_ranks(n, self.spec.value, count, self.rng))
        starts, ends, probs = self._zones[min(direction, 1)]
        zone = self.rng.choice(len(probs), size=count, p=probs)
        return starts[zone] + (self.rng.random(count) * (ends[zone] - starts[zone])).astype(np.int64)


def zipf_pmf(n: int, theta: float) -> np.ndarray:
    """P(rank = k) for k = 1..n (for tests and docs)."""
    weights = np.arange(1, n + 1, dtype=np.float64) ** -theta
    return weights / weights.sum()
