"""The (N, D) regression of held-out Δ (reproduction.ndfit): it recovers planted slopes, scales its interval by the
lack of fit, reports the leave-one-cell-out spread, and refuses cells that cannot separate N from D."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reproduction import ndfit

SIZES = (9660, 24672, 83280)  # the ladder's non-embedding N at 10K-83K
BUDGETS = (41, 206, 824)  # tokens per non-embedding parameter at 20, 100 and 400 per total parameter


def cells(b_n, b_d, noise=0.0, se=0.005, corpora=("shakespeare", "prose"), rng_seed=0):
    """Cells at every N and budget of each corpus with Δ = a_corpus + b_n·log10 N + b_d·log10 D (+ noise)."""
    rng = np.random.default_rng(rng_seed)
    out = []
    for k, corpus in enumerate(corpora):
        for n in SIZES:
            for r in BUDGETS:
                delta = 0.1 * k + b_n * math.log10(n) + b_d * math.log10(n * r) + rng.normal(0, noise)
                out.append(ndfit.CellDelta(f"{corpus}-{n}-{r}", corpus, n, n * r, 1.0, delta, se))
    return out


def test_fit_recovers_planted_slopes_and_intercepts_exactly():
    """Noise-free cells: both slopes and each corpus's intercept come back to 1e-9 and χ² is 0."""
    f = ndfit.fit(cells(-0.018, -0.019))
    assert f.n_slope.value == pytest.approx(-0.018, abs=1e-9) and f.d_slope.value == pytest.approx(-0.019, abs=1e-9)
    assert f.intercepts == pytest.approx({"shakespeare": 0.0, "prose": 0.1}, abs=1e-9)
    assert f.chi2 == pytest.approx(0.0, abs=1e-12) and f.dof == 18 - 4


def test_interval_grows_with_the_lack_of_fit():
    """Cells scattered 4x their se get an interval about 4x wider than seed noise alone gives (reduced χ² ~ 16
    scales the covariance; 0.5x to 2x around the expected factor covers the χ² estimate's spread with 14 dof)."""
    quiet = ndfit.fit(cells(-0.018, -0.019, noise=0.0))
    loud = ndfit.fit(cells(-0.018, -0.019, noise=0.02, se=0.005))
    ratio = (loud.d_slope.hi - loud.d_slope.lo) / (quiet.d_slope.hi - quiet.d_slope.lo)
    assert loud.reduced_chi2 > 4 and 0.5 * math.sqrt(loud.reduced_chi2) < ratio < 2 * math.sqrt(loud.reduced_chi2)


def test_interval_is_never_narrower_than_the_seed_noise():
    """Cells closer to the plane than their se (reduced χ² < 1) keep the interval the se give: no shrinking."""
    exact = ndfit.fit(cells(0.0, -0.01, noise=0.0, se=0.01))
    assert exact.reduced_chi2 < 1e-12 and exact.d_slope.hi - exact.d_slope.lo > 0.005


def test_leave_one_out_range_shows_a_slope_that_one_cell_carries():
    """One cell moved far off the plane widens the slope's leave-one-out range to include the unmoved slope."""
    data = cells(0.0, -0.01)
    far = data[-1]
    data[-1] = ndfit.CellDelta(far.name, far.corpus, far.n, far.d, far.passes, far.delta - 0.2, far.se)
    f = ndfit.fit(data)
    assert f.d_slope.value < -0.015  # the moved cell (the largest D) pulls the slope down
    assert f.d_slope.loo_lo - 1e-9 <= -0.01 <= f.d_slope.loo_hi + 1e-9  # without it: the planted slope


def test_refuses_cells_at_one_budget_and_cells_without_an_interval():
    """D ∝ N (one budget) cannot separate the slopes, and a cell with se 0 or nan has no weight: ValueError each."""
    one_budget = [c for c in cells(0.0, -0.01) if c.d == c.n * 41]
    with pytest.raises(ValueError, match="do not separate N from D"):
        ndfit.fit(one_budget)
    bad = cells(0.0, -0.01)
    bad[0] = ndfit.CellDelta("x", "shakespeare", 1e4, 1e6, 1.0, 0.0, math.nan)
    with pytest.raises(ValueError, match="standard error"):
        ndfit.fit(bad)
    with pytest.raises(ValueError, match="cannot fit"):
        ndfit.fit(cells(0.0, -0.01)[:3])


def test_ranges_are_the_cells_own():
    """The N and D ranges the slopes hold between are the smallest and largest of the cells given."""
    f = ndfit.fit(cells(0.0, -0.01))
    assert f.n_range == (9660, 83280) and f.d_range == (9660 * 41, 83280 * 824)
