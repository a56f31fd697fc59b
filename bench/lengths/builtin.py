"""The shipped length distributions (vLLM's random dataset is fixed or uniform)."""

from __future__ import annotations

import math

import numpy as np

from bench.lengths import LENGTHS


def _fixed(dist, n: int, rng: np.random.Generator) -> np.ndarray:
    return np.full(n, dist.mean, dtype=np.float64)


def _uniform(dist, n: int, rng: np.random.Generator) -> np.ndarray:
    lo = math.floor(dist.mean * (1 - dist.range_ratio))
    hi = math.ceil(dist.mean * (1 + dist.range_ratio))
    return rng.integers(lo, hi + 1, size=n).astype(np.float64)


def _normal(dist, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(dist.mean, dist.std, size=n)


def _lognormal(dist, n: int, rng: np.random.Generator) -> np.ndarray:
    # Parameterised by the mean, so `mean` means the same thing for every kind.
    mu = math.log(dist.mean) - dist.sigma**2 / 2
    return rng.lognormal(mu, dist.sigma, size=n)


LENGTHS.register("fixed", "every request exactly mean tokens", _fixed)
LENGTHS.register(
    "uniform", "uniform in mean x [1 - range_ratio, 1 + range_ratio] (vLLM's)", _uniform
)
LENGTHS.register("normal", "normal around mean with std", _normal)
LENGTHS.register("lognormal", "lognormal with this mean and sigma (long-tailed)", _lognormal)
