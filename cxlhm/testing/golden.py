"""Any registered policy beside libCacheSim's policy of the same name, on one trace.

    from cxlhm.testing.golden import compare, format_rows
    rows = compare("lecar", trace, [100, 1000])      # a BlockTrace, DRAM sizes in blocks
    print(format_rows(rows))                          # ours, libCacheSim's, the difference

    python -m cxlhm.testing.golden --trace T --policies lru,lecar --sizes 1%,5%

Both replay the same requests: ours through the policy's compiled firmware
(`cxlhm.sim`), libCacheSim's C simulator (the `libcachesim` package, in cxlhm's `test`
extra) from an oracleGeneral file written from the same trace with unit object sizes, so
its cache size counts objects as ours counts blocks. The namesake is libCacheSim's cache
class whose name matches the policy's ignoring case and punctuation (lecar -> LeCaR,
s3fifo -> S3FIFO, twoq -> TwoQ), or the one given. Differences that are on purpose for
the built-ins are in docs/policies.md; for a policy of your own the difference says how
close it is to the reference implementation.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from cxlhm import policies as firmware_policies
from cxlhm.sim import simulate
from cxlhm.traces.blocktrace import BlockTrace
from cxlhm.traces.oracle_general import write_oracle_general


@dataclasses.dataclass(frozen=True)
class GoldenRow:
    policy: str
    libcachesim: str  # the libCacheSim class it ran against
    slots: int
    ours: float  # miss ratio
    theirs: float

    @property
    def difference_points(self) -> float:
        """Ours minus libCacheSim's, in percentage points of miss ratio."""
        return (self.ours - self.theirs) * 100


def _normalized(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def libcachesim_classes() -> dict[str, type]:
    """libCacheSim's cache classes by name (its eviction algorithms)."""
    import libcachesim as lcs
    base = getattr(lcs, "CacheBase", None)
    return {name: obj for name, obj in vars(lcs).items()
            if isinstance(obj, type) and base is not None and issubclass(obj, base) and obj is not base
            and name not in ("PluginCache",)}


def namesake(policy: str) -> str | None:
    """The libCacheSim class named like `policy` (case and punctuation ignored), or None."""
    wanted = _normalized(policy)
    return next((name for name in libcachesim_classes() if _normalized(name) == wanted), None)


def compare(policy: str, trace: BlockTrace, sizes: Sequence[int], *, params: Mapping | None = None,
            libcachesim: str | None = None, libcachesim_params: Mapping | None = None) -> list[GoldenRow]:
    """Miss ratios of `policy` (a registered name) and of libCacheSim's `libcachesim`
    class (default: its namesake) at each size in blocks. LookupError when libCacheSim
    has no such class; ImportError (naming the extra) without the package."""
    try:
        import libcachesim as lcs
    except ImportError as exc:
        raise ImportError("the libCacheSim comparison needs the libcachesim package: pip install 'cxlhm[test]'") from exc
    firmware_policies.get(policy)  # an unknown name fails here, listing the known ones
    cls_name = libcachesim or namesake(policy)
    classes = libcachesim_classes()
    if cls_name not in classes:
        raise LookupError((f"libCacheSim has no policy named like {policy!r}" if cls_name is None else
                           f"libCacheSim has no policy {cls_name!r}") + f"; its policies: {', '.join(sorted(classes))}")
    theirs = libcachesim_miss_ratios(cls_name, trace, sizes, params=libcachesim_params)
    rows = []
    for slots in sizes:
        ours = simulate(policy, trace.blocks, int(slots), writes=trace.writes, params=params,
                        next_use=trace.next_use() if firmware_policies.get(policy).needs_future else None)
        rows.append(GoldenRow(policy, cls_name, int(slots), ours.miss_ratio, theirs[int(slots)]))
    return rows


def libcachesim_miss_ratios(cls_name: str, trace: BlockTrace, sizes: Sequence[int], *,
                            params: Mapping | None = None) -> dict[int, float]:
    """{size: miss ratio} of libCacheSim's `cls_name` on `trace` (objects = blocks)."""
    import libcachesim as lcs
    cls = libcachesim_classes()[cls_name]
    with tempfile.TemporaryDirectory(prefix="cxlhm-golden-") as folder:
        path = Path(folder) / "trace.oracleGeneral.bin"
        write_oracle_general(path, trace, obj_size=1)  # unit sizes: cache sizes count objects
        out = {}
        for slots in sizes:
            reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
            ratio, _ = cls(int(slots), **dict(params or {})).process_trace(reader)
            out[int(slots)] = float(ratio)
    return out


def format_rows(rows: Sequence[GoldenRow]) -> str:
    table = [["policy", "libCacheSim", "blocks", "ours", "theirs", "diff (points)"]]
    table += [[r.policy, r.libcachesim, str(r.slots), f"{r.ours:.4f}", f"{r.theirs:.4f}",
               f"{r.difference_points:+.2f}"] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in table)


def main(argv: list[str] | None = None) -> int:
    from cxlhm.mrc import parse_cache_sizes
    from cxlhm.traces.formats import load_trace
    parser = argparse.ArgumentParser(prog="python -m cxlhm.testing.golden",
                                     description="miss ratios of cxlhm policies beside libCacheSim's namesakes")
    parser.add_argument("--trace", required=True)
    parser.add_argument("--format", default=None, help="trace format (default: guessed from the name)")
    parser.add_argument("--policies", required=True, help="comma-separated registered policy names")
    parser.add_argument("--sizes", default="1%,5%,10%", help="DRAM sizes: blocks, bytes or N%% of the distinct blocks")
    parser.add_argument("--limit", type=int, default=None, help="the first N accesses only")
    args = parser.parse_args(argv)
    try:
        trace = load_trace(args.trace, args.format, limit=args.limit)
        sizes = parse_cache_sizes(args.sizes, trace.block_size, trace.unique_blocks)
        rows = [row for name in args.policies.split(",") if name.strip() for row in compare(name.strip(), trace, sizes)]
    except (ValueError, LookupError, ImportError, OSError) as exc:
        print(f"golden: error: {exc}", file=sys.stderr)
        return 2
    print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
