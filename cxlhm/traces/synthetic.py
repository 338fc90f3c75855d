"""Synthetic block traces for tests, benches and quick experiments."""
from __future__ import annotations

import numpy as np

from cxlhm.traces.blocktrace import BlockTrace


def zipf_trace(n_accesses: int, n_blocks: int, alpha: float = 1.0, *, write_fraction: float = 0.0,
               seed: int = 0, block_size: int = 4096) -> BlockTrace:
    """`n_accesses` draws from a Zipf(alpha) popularity over `n_blocks` blocks.

    Any alpha >= 0 works (numpy's zipf needs alpha > 1 and is unbounded): ranks are drawn
    by inverting the exact CDF, then mapped to block ids by a random permutation so that
    popularity is not correlated with block number."""
    if n_blocks < 1 or n_accesses < 0:
        raise ValueError("need n_blocks >= 1 and n_accesses >= 0")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, n_blocks + 1, dtype=np.float64) ** -alpha)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n_accesses), side="right"), n_blocks - 1)
    blocks = rng.permutation(n_blocks).astype(np.int64)[ranks]
    writes = rng.random(n_accesses) < write_fraction if write_fraction > 0 else np.zeros(n_accesses, np.bool_)
    return BlockTrace(blocks=blocks, writes=writes, block_size=block_size,
                      source=f"zipf(n={n_accesses}, blocks={n_blocks}, alpha={alpha}, seed={seed})")
