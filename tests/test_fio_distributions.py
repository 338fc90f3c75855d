"""random_distribution models produce the skew they should: chi-square goodness of fit
against the exact expected histogram (no scipy: the critical value comes from the
Wilson-Hilferty approximation of the chi-square quantile)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from cxlhm_apps.fio.distributions import (
    BlockPermutation, BlockSampler, DistSpec, normal_ranks, parse_distribution, pareto_ranks, zipf_pmf, zipf_ranks,
)

SAMPLES = 200_000
Z_999 = 3.0902  # standard normal quantile for p = 0.999


def chi2_critical(dof: int, z: float = Z_999) -> float:
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2(observed: np.ndarray, expected_p: np.ndarray) -> tuple[float, int]:
    expected = expected_p / expected_p.sum() * observed.sum()
    keep = expected >= 5  # the usual validity rule: merge thin bins into one
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def assert_fits(observed, expected_p):
    stat, dof = chi2(np.asarray(observed, np.float64), np.asarray(expected_p, np.float64))
    assert stat < chi2_critical(dof), f"chi2={stat:.1f} > {chi2_critical(dof):.1f} (dof={dof})"


def assert_misfits(observed, expected_p):
    stat, dof = chi2(np.asarray(observed, np.float64), np.asarray(expected_p, np.float64))
    assert stat > 10 * chi2_critical(dof)


@pytest.mark.parametrize("theta", [0.8, 1.2, 2.0])
def test_zipf_ranks_fit_the_zipf_law(theta):
    n = 5000
    ranks = zipf_ranks(n, theta, SAMPLES, np.random.default_rng(1))
    assert ranks.min() >= 1 and ranks.max() <= n
    assert_fits(np.bincount(ranks, minlength=n + 1)[1:], zipf_pmf(n, theta))


def test_chi_square_detects_the_wrong_skew():
    ranks = zipf_ranks(5000, 1.2, SAMPLES, np.random.default_rng(2))
    assert_misfits(np.bincount(ranks, minlength=5001)[1:], zipf_pmf(5000, 1.0))


def test_scattered_zipf_blocks_keep_the_rank_popularity():
    # the hot set is scattered over the region, but sorted block counts still follow the law
    n = 2000
    sampler = BlockSampler(DistSpec("zipf", 1.2), n, seed=3)
    counts = np.bincount(sampler.sample(SAMPLES), minlength=n)
    top = np.argsort(counts)[::-1][:10]
    assert np.ptp(top) > n // 10  # not one contiguous run
    assert_fits(np.sort(counts)[::-1][:50], zipf_pmf(n, 1.2)[:50])


def test_zipf_center_places_the_hottest_block():
    sampler = BlockSampler(parse_distribution("zipf:1.5:0.25"), 1000, seed=4)
    counts = np.bincount(sampler.sample(50_000), minlength=1000)
    assert int(np.argmax(counts)) == 250 and counts[251] > counts[260]


@pytest.mark.parametrize("h", [0.1, 0.3])
def test_pareto_ranks_fit_fios_power_law(h):
    n = 10_000
    ranks = pareto_ranks(n, h, SAMPLES, np.random.default_rng(5))
    power = math.log(h) / math.log(1 - h)
    edges = np.unique(np.geomspace(1, n - 1, 40).astype(np.int64))
    edges = np.concatenate(([0], edges, [n]))
    cdf = np.minimum((edges / (n - 1)) ** (1 / power), 1.0)  # P(rank < edge) = P(u < (edge/(n-1))^(1/power))
    observed = np.histogram(ranks, bins=edges)[0]
    assert_fits(observed, np.diff(cdf))


def _irwin_hall_cdf(x: np.ndarray, k: int = 12) -> np.ndarray:
    """P(sum of k uniforms on [0,1] <= x)."""
    x = np.clip(x, 0, k)
    total = np.zeros_like(x)
    for j in range(k + 1):
        total += (-1) ** j * math.comb(k, j) * np.where(x > j, (x - j) ** k, 0.0)
    return total / math.factorial(k)


@pytest.mark.parametrize("dev", [0.0, 10.0])
def test_normal_ranks_fit_fios_bell_curve(dev):
    n = 100_000
    ranks = normal_ranks(n, dev, SAMPLES, np.random.default_rng(6))
    edges = np.linspace(0, n, 41)
    width = min(math.ceil(n * dev / 100), n // 2)
    shifts = np.linspace(-width / 2, width / 2, 401) if width else np.zeros(1)
    # mean of 12 uniforms over [0, n] plus a uniform deviation: average the shifted CDFs
    cdf = np.mean([_irwin_hall_cdf(12 * (edges - s) / n) for s in shifts], axis=0)
    observed = np.histogram(ranks, bins=edges)[0]
    assert_fits(observed, np.diff(cdf))
    spread = ranks.std() / n
    assert (0.07 < spread < 0.1) if dev == 0 else (spread > 0.085)


def test_zoned_accesses_follow_the_zone_shares():
    n = 10_000
    sampler = BlockSampler(parse_distribution("zoned:60/10:30/20:8/30:2/40"), n, seed=7)
    blocks = sampler.sample(SAMPLES)
    observed = np.histogram(blocks, bins=[0, 1000, 3000, 6000, 10_000])[0]
    assert_fits(observed, np.array([60, 30, 8, 2]))
    within = np.bincount(blocks[blocks < 1000], minlength=1000)  # uniform inside a zone
    assert_fits(within, np.ones(1000))


def test_zoned_abs_uses_bytes():
    sampler = BlockSampler(parse_distribution("zoned_abs:90/4m:10/12m"), 4096, seed=8, block_bytes=4096)
    blocks = sampler.sample(50_000)
    assert abs((blocks < 1024).mean() - 0.9) < 0.01


def test_uniform_random_is_uniform():
    sampler = BlockSampler(None, 500, seed=9)
    assert_fits(np.bincount(sampler.sample(SAMPLES), minlength=500), np.ones(500))


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 4097])
def test_block_permutation_is_a_bijection(n):
    perm = BlockPermutation(n, seed=n)
    out = perm(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))
    assert n < 16 or not np.array_equal(out, np.arange(n))


def test_same_seed_same_sequence_other_seed_other_sequence():
    a = BlockSampler(DistSpec("zipf", 1.1), 10_000, seed=11).sample(1000)
    b = BlockSampler(DistSpec("zipf", 1.1), 10_000, seed=11).sample(1000)
    c = BlockSampler(DistSpec("zipf", 1.1), 10_000, seed=12).sample(1000)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
