"""Pearson's chi-square goodness-of-fit test, with the p-value from the regularised upper incomplete gamma function
(scipy is not a dependency)."""

from __future__ import annotations

import math

import numpy as np


def _upper_gamma_q(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a): a series below a + 1, a continued fraction above (Numerical Recipes)."""
    if x <= 0:
        return 1.0
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return 1.0 - total * math.exp(log_prefix)
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = 1 / (an * d + b) if an * d + b else 1e300
        c = b + an / c if c else 1e-300
        step = d * c
        h *= step
        if abs(step - 1) < 1e-15:
            break
    return math.exp(log_prefix) * h


def chi_square_pvalue(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """p-value of observed counts against expected probabilities (cells with expected probability 0 must be empty)."""
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(expected_probs, dtype=np.float64)
    assert np.all(observed[probs == 0] == 0), "a count where the expected probability is 0"
    keep = probs > 0
    expected = probs[keep] / probs[keep].sum() * observed.sum()
    assert expected.min() >= 5, "too few expected counts per cell for the chi-square approximation"
    statistic = float(((observed[keep] - expected) ** 2 / expected).sum())
    dof = int(keep.sum()) - 1
    return _upper_gamma_q(dof / 2, statistic / 2)
