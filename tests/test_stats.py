"""Tests for scalevec.experiments.stats: paired comparison, power-law fits, compute multiplier, token efficiency,
lr picker."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from scalevec.experiments.stats import (
    compute_multiplier,
    fit_power_law,
    fit_shared_power_law,
    mean_std,
    paired_delta,
    pick_lr,
    tokens_to_reach,
)

E, A, ALPHA = 1.8, 40.0, 0.3  # a Chinchilla-like curve: 0.63 nats above E at 1M parameters
SIZES = np.repeat(np.geomspace(1e5, 1e8, 6), 3)  # 6 sizes × 3 seeds


def curve(n, k=1.0):
    """The true loss of a model that behaves like the reference one with ``k``× more parameters."""
    return E + A * (k * np.asarray(n, dtype=float)) ** (-ALPHA)


def test_mean_std_is_sample_std():
    """mean_std uses ddof=1 and gives nan spread for a single value."""
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    m, s = mean_std([4.0])
    assert m == 4.0 and math.isnan(s)


def test_paired_delta_matches_scipy_t_interval():
    """The paired CI is mean(b − a) ± t_{0.975, n−1}·sd/√n and the p-value equals scipy's ttest_rel."""
    a = np.array([1.70, 1.72, 1.69, 1.71])
    b = np.array([1.68, 1.71, 1.66, 1.70])
    d = b - a
    half = sps.t.ppf(0.975, df=3) * d.std(ddof=1) / 2.0
    r = paired_delta(a, b)
    assert r.delta == pytest.approx(d.mean(), abs=1e-12)
    assert (r.lo, r.hi) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-12)
    assert r.p_value == pytest.approx(sps.ttest_rel(b, a).pvalue, rel=1e-9)


def test_paired_delta_flags_planted_effect_not_null():
    """With seed noise shared by both arms, a planted −0.02 effect is significant and a null effect is not."""
    rng = np.random.default_rng(0)
    seed_noise = rng.normal(0, 0.03, 5)  # large between-seed noise, cancelled by pairing
    base = 1.70 + seed_noise + rng.normal(0, 0.003, 5)
    planted = 1.68 + seed_noise + rng.normal(0, 0.003, 5)
    null = 1.70 + seed_noise + rng.normal(0, 0.003, 5)
    effect, no_effect = paired_delta(base, planted), paired_delta(base, null)
    assert effect.significant and effect.hi < 0 and effect.lo < -0.02 < effect.hi
    assert not no_effect.significant and no_effect.lo < 0 < no_effect.hi


def test_paired_delta_single_seed_claims_nothing():
    """One seed gives the difference but no interval, so nothing is flagged."""
    r = paired_delta([1.7], [1.6])
    assert r.delta == pytest.approx(-0.1) and math.isnan(r.lo) and not r.significant


def test_power_law_fit_recovers_parameters_within_uncertainty():
    """Noisy synthetic L(N) = E + A·N^-α: every fitted parameter lies within 3 reported sigmas of the truth."""
    rng = np.random.default_rng(1)
    fit = fit_power_law(SIZES, curve(SIZES) + rng.normal(0, 0.005, SIZES.size))
    for est, err, true in ((fit.E, fit.E_err, E), (fit.A, fit.A_err, A), (fit.alpha, fit.alpha_err, ALPHA)):
        assert math.isfinite(err) and err > 0
        assert abs(est - true) <= 3 * err, (est, err, true)
    assert fit.rmse == pytest.approx(0.005, rel=0.5)


def test_power_law_fit_exact_data_and_inverse():
    """Noise-free data is fitted to 1e-4 and params_for_loss inverts predict."""
    fit = fit_power_law(SIZES, curve(SIZES))
    assert (fit.E, fit.A, fit.alpha) == pytest.approx((E, A, ALPHA), rel=1e-4)
    assert fit.params_for_loss(float(fit.predict(3e6))) == pytest.approx(3e6, rel=1e-8)
    assert fit.params_for_loss(E - 0.1) == math.inf


def test_power_law_fit_rejects_too_few_points():
    """Fewer than 3 points is a ValueError, not a silent fit."""
    with pytest.raises(ValueError, match=">= 3"):
        fit_power_law([1e6, 1e7], [2.0, 1.9])


def test_compute_multiplier_recovers_known_factor():
    """Curves differing by k in N (compute k²=1.25) give 1.25 within 2 %: shared fit and per-size on independent
    fits."""
    k = math.sqrt(1.25)
    rng = np.random.default_rng(0)
    base = curve(SIZES) + rng.normal(0, 0.002, SIZES.size)
    strat = curve(SIZES, k) + rng.normal(0, 0.002, SIZES.size)
    shared = fit_shared_power_law(SIZES, base, SIZES, strat)
    assert shared.multiplier == pytest.approx(1.25, rel=0.02)
    assert abs(shared.multiplier - 1.25) <= 3 * shared.multiplier_err
    fb, fs = fit_power_law(SIZES, base), fit_power_law(SIZES, strat)
    for n in (1e5, 1e6, 1e7):
        assert compute_multiplier(fb, float(fs.predict(n)), n) == pytest.approx(1.25, rel=0.02)


def test_compute_multiplier_definition():
    """The multiplier is (N_base / N)²: a loss the baseline reaches at 2N is worth 4× compute."""
    fit = fit_power_law(SIZES, curve(SIZES))
    assert compute_multiplier(fit, float(curve(2e6)), 1e6) == pytest.approx(4.0, rel=1e-3)
    assert compute_multiplier(fit, E - 0.01, 1e6) == math.inf


def test_tokens_to_reach_interpolates_first_crossing():
    """The first crossing is interpolated linearly between evaluations; never reached gives nan."""
    tokens = [100, 200, 300, 400]
    loss = [3.0, 2.0, 1.5, 1.6]
    assert tokens_to_reach(tokens, loss, 2.5) == pytest.approx(150.0)
    assert tokens_to_reach(tokens, loss, 1.6) == pytest.approx(280.0)
    assert tokens_to_reach(tokens, loss, 3.5) == 100.0
    assert math.isnan(tokens_to_reach(tokens, loss, 1.0))


def test_pick_lr_chooses_best_mean_and_no_warning_inside_grid():
    """The lr with the lowest mean loss wins; an interior winner gives no warning."""
    pick = pick_lr({1e-3: [1.80, 1.82], 3e-3: [1.70, 1.74], 1e-2: [1.75, 1.71], 3e-2: [1.9, 1.95]})
    assert pick.lr == 3e-3 and pick.loss == pytest.approx(1.72)
    assert not pick.at_edge and pick.warning is None


def test_pick_lr_warns_at_grid_edge_and_skips_diverged():
    """A winner at the largest lr warns to widen the grid; a diverged (nan) lr never wins."""
    pick = pick_lr({1e-3: [1.9], 3e-3: [1.8], 1e-2: [1.7]})
    assert pick.lr == 1e-2 and pick.at_edge and "largest" in pick.warning and "widen" in pick.warning
    pick = pick_lr({1e-3: [1.7, 1.72], 3e-3: [1.8, 1.8], 1e-2: [float("nan"), 1.0]})
    assert pick.lr == 1e-3 and pick.at_edge and "smallest" in pick.warning
    with pytest.raises(ValueError, match="diverged"):
        pick_lr({1e-2: [float("nan")]})


def test_seeds_needed_is_where_the_interval_first_excludes_zero():
    """seeds_needed(d) = the smallest n whose t interval with d's mean and sd excludes 0 (checked by hand)."""
    from scipy import stats as scipy_stats

    from scalevec.experiments.stats import seeds_needed

    d = [0.01, 0.03, -0.005, 0.02]  # mean 0.01375, sd ≈ 0.0149
    n = seeds_needed(d)
    mean, sd = np.mean(d), np.std(d, ddof=1)
    half = lambda k: scipy_stats.t.ppf(0.975, k - 1) * sd / np.sqrt(k)  # noqa: E731
    assert half(n) < mean <= half(n - 1)
    assert seeds_needed([0.02, 0.02]) == 2 and seeds_needed([0.01, -0.01]) is None
    with pytest.raises(ValueError):
        seeds_needed([0.1])
