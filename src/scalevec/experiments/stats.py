"""Pure statistics for comparisons, sweeps and scaling fits (DESIGN.md §9).

Numbers in, numbers out: no files, no plots, no torch. ``report.py`` feeds it values read from run
directories. What each function computes, and the choices made where the literature varies:

- ``mean_std``: mean and sample standard deviation (ddof 1) over seeds.
- ``paired_delta``: strategy − baseline, paired by seed (same seed ⇒ same data order, validation
  tokens and initial matrices, so the per-seed difference cancels most seed noise); a two-sided 95 %
  confidence interval from the t distribution with n − 1 degrees of freedom (``scipy.stats``). Our
  significance rule (after modded-nanogpt's: seed-averaged claims only): an effect is claimed only
  when that interval excludes 0, which needs at least 2 seeds.
- ``fit_power_law``: ``L(N) = E + A·N^(-α)`` by ``scipy.optimize.curve_fit`` with one-sigma parameter
  uncertainties from the covariance matrix (needs more points than parameters).
- ``compute_multiplier``: compute-equivalent gain of a strategy over a baseline fit. Definition (our
  choice): at a fixed number of tokens per parameter (D = r·N, as in every sweep here) training
  compute is C ≈ 6·N·D = 6·r·N², so if the baseline needs N_b parameters to reach the loss the
  strategy reaches with N, the strategy saves a compute factor ``(N_b / N)²``. > 1 means the strategy
  is better. It counts FLOPs, not wall time: per-step overhead is reported separately.
- ``tokens_to_reach``: the first point where a validation curve reaches a loss, linearly
  interpolated between evaluations (token efficiency).
- ``pick_lr``: the learning rate with the lowest mean final loss, flagging a winner at a grid edge.
- ``fit_line``: a weighted least-squares line with a t interval (the trend of Δ across model sizes).
- ``seeds_needed`` / ``seeds_for_halfwidth``: planning figures from the per-seed differences seen so far:
  seeds until the interval would exclude 0, or until its half-width reaches a target.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# scipy is imported inside the functions that use it: `scalevec` imports this module for every command
# (through report/compare), and scipy's import costs more than a second on a small CPU.


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1) of ``values``; std is nan for one value.

    Raises ``ValueError`` for an empty sequence.
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_std needs at least one value")
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else math.nan


@dataclass(frozen=True)
class PairedDelta:
    """Paired comparison of two samples: ``delta`` = mean(b − a) with its confidence interval."""

    delta: float
    lo: float
    hi: float
    n: int
    p_value: float  # two-sided paired t-test; nan when n < 2
    confidence: float = 0.95

    @property
    def significant(self) -> bool:
        """True when the confidence interval excludes 0 (needs n >= 2)."""
        return self.n >= 2 and (self.lo > 0 or self.hi < 0)


def paired_delta(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedDelta:
    """Mean paired difference ``b − a`` with a t-distribution confidence interval (DESIGN.md §9).

    ``a`` and ``b`` hold one value per seed, in the same seed order (e.g. final validation loss of
    the baseline and of a strategy, nats/token). With one pair the interval is (nan, nan). With
    zero spread in the differences the interval collapses to the point. Raises ``ValueError`` when
    the lengths differ or are 0.
    """
    from scipy import stats

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(f"paired_delta needs two equal-length non-empty samples, got {x.shape} and {y.shape}")
    d = y - x
    n, mean = d.size, float(d.mean())
    if n < 2:
        return PairedDelta(mean, math.nan, math.nan, n, math.nan, confidence)
    sem = float(d.std(ddof=1)) / math.sqrt(n)
    if sem == 0.0:
        return PairedDelta(mean, mean, mean, n, 0.0 if mean != 0 else 1.0, confidence)
    lo, hi = stats.t.interval(confidence, df=n - 1, loc=mean, scale=sem)
    p = float(2 * stats.t.sf(abs(mean) / sem, df=n - 1))
    return PairedDelta(mean, float(lo), float(hi), n, p, confidence)


@dataclass(frozen=True)
class PowerLawFit:
    """``L(N) = E + A·N^(-α)`` with one-sigma uncertainties (``*_err``) from the fit's covariance.

    The uncertainties are nan when the fit has no residual degrees of freedom (points <= 3).
    """

    E: float
    A: float
    alpha: float
    E_err: float
    A_err: float
    alpha_err: float
    n_points: int
    rmse: float

    def predict(self, n: float | np.ndarray) -> float | np.ndarray:
        """Loss at ``n`` parameters."""
        return self.E + self.A * np.asarray(n, dtype=float) ** (-self.alpha)

    def params_for_loss(self, loss: float) -> float:
        """Parameters ``N`` at which the curve reaches ``loss``; ``inf`` when ``loss <= E`` (never)."""
        if loss <= self.E:
            return math.inf
        return float((self.A / (loss - self.E)) ** (1.0 / self.alpha))


def fit_power_law(n: Sequence[float], loss: Sequence[float]) -> PowerLawFit:
    """Least-squares fit of ``L(N) = E + A·N^(-α)`` (DESIGN.md §9) with ``scipy.optimize.curve_fit``.

    ``n``: parameter counts (non-embedding, any positive unit); ``loss``: final validation losses,
    one point per run (several seeds per size are fine and give the fit its degrees of freedom).
    Internally the fit uses ``A·N^(-α) = exp(a − α·log(N/N0))`` with N0 the geometric mean of ``n``
    (well conditioned over many decades); ``A`` and its error come back by the delta method.
    Bounds: E >= 0, 0 <= α <= 5. Raises ``ValueError`` with fewer than 3 points, fewer than 2
    distinct sizes, or non-finite / non-positive input.
    """
    from scipy import optimize

    x, y = np.asarray(n, dtype=float), np.asarray(loss, dtype=float)
    if x.shape != y.shape or x.size < 3:
        raise ValueError(f"a power-law fit needs >= 3 (size, loss) points of equal length, got {x.size} and {y.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0)):
        raise ValueError("power-law fit: sizes must be positive and all values finite (drop diverged runs)")
    if np.unique(x).size < 2:
        raise ValueError("power-law fit: needs at least 2 distinct sizes")
    log_n0 = float(np.mean(np.log(x)))
    u = np.log(x) - log_n0

    def model(u_, E, a, alpha):
        return E + np.exp(a - alpha * u_)

    best = None
    for alpha0 in (0.1, 0.3, 0.6, 1.0):  # a few starts: the loss surface in α is flat and non-convex
        E0 = max(float(y.min()) - 0.5 * float(np.ptp(y)) - 1e-3, 0.0)
        a0 = math.log(max(float(np.mean(y)) - E0, 1e-6))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optimize.OptimizeWarning)
                p, cov = optimize.curve_fit(model, u, y, p0=(E0, a0, alpha0),
                                            bounds=([0.0, -np.inf, 0.0], [np.inf, np.inf, 5.0]), maxfev=20000)
        except RuntimeError:
            continue
        sse = float(np.sum((model(u, *p) - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, p, cov)
    if best is None:
        raise ValueError("power-law fit did not converge; check that loss falls with size")
    sse, (E, a, alpha), cov = best
    dof = x.size - 3
    if dof <= 0 or not np.all(np.isfinite(cov)):
        cov = np.full((3, 3), np.nan)
    # A = exp(a + α·log N0): d log A = da + log N0 · dα
    log_a = a + alpha * log_n0
    g = np.array([1.0, log_n0])
    var_log_a = float(g @ cov[1:, 1:] @ g)
    A = math.exp(log_a)
    return PowerLawFit(E=float(E), A=A, alpha=float(alpha), E_err=_sqrt(cov[0, 0]), A_err=A * _sqrt(var_log_a),
                       alpha_err=_sqrt(cov[2, 2]), n_points=int(x.size), rmse=math.sqrt(sse / x.size))


def _sqrt(v: float) -> float:
    return math.sqrt(v) if np.isfinite(v) and v >= 0 else math.nan


def compute_multiplier(base: PowerLawFit, loss: float, n: float) -> float:
    """Compute multiplier of a model with ``n`` parameters reaching ``loss`` against the ``base`` fit.

    ``(N_b / n)²`` where ``N_b = base.params_for_loss(loss)``: at fixed tokens per parameter
    compute ∝ N², so this is how much more compute the baseline needs for the same loss (see the
    module docstring). ``inf`` when the baseline's fit never reaches ``loss`` (below its E).
    ``loss`` can be a measured mean or another fit's prediction (extrapolation).
    """
    n_base = base.params_for_loss(loss)
    return math.inf if math.isinf(n_base) else (n_base / n) ** 2


@dataclass(frozen=True)
class SharedFit:
    """Joint fit of a baseline and a strategy sharing E and α: the strategy acts like ``m``× more parameters.

    ``multiplier = m²`` is the compute multiplier at every size (see ``fit_shared_power_law``);
    ``multiplier_err`` its one-sigma uncertainty (nan without residual degrees of freedom).
    """

    base: PowerLawFit
    m: float
    multiplier: float
    multiplier_err: float


def fit_shared_power_law(n_base: Sequence[float], loss_base: Sequence[float],
                         n: Sequence[float], loss: Sequence[float]) -> SharedFit:
    """Fit ``L_base(N) = E + A·N^(-α)`` and ``L(N) = E + A·(m·N)^(-α)`` jointly (curve_fit, DESIGN.md §9).

    The strategy's curve is the baseline's shifted along N by the factor ``m``: with shared E and α
    the compute multiplier ``m²`` (module docstring) is the same at every size by construction: it is a
    summary of the sizes fitted, and the report states it over that range only (no prediction beyond it).
    ``compute_multiplier`` on independent fits at each measured size shows whether the shared-exponent
    assumption holds. Inputs as in ``fit_power_law``; raises
    ``ValueError`` with fewer than 4 points in all or invalid values.
    """
    from scipy import optimize

    xb, yb = np.asarray(n_base, dtype=float), np.asarray(loss_base, dtype=float)
    xs, ys = np.asarray(n, dtype=float), np.asarray(loss, dtype=float)
    base = fit_power_law(xb, yb)
    if xs.shape != ys.shape or xs.size < 1 or not (np.all(np.isfinite(ys)) and np.all(xs > 0)):
        raise ValueError("shared power-law fit: the strategy needs >= 1 finite (size, loss) point")
    x, y = np.concatenate([xb, xs]), np.concatenate([yb, ys])
    is_s = np.concatenate([np.zeros(xb.size), np.ones(xs.size)])
    log_n0 = float(np.mean(np.log(x)))
    u = np.log(x) - log_n0

    def model(_, E, a, alpha, log_m):
        return E + np.exp(a - alpha * (u + is_s * log_m))

    a0 = math.log(base.A) - base.alpha * log_n0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optimize.OptimizeWarning)
        p, cov = optimize.curve_fit(model, u, y, p0=(base.E, a0, max(base.alpha, 1e-3), 0.0),
                                    bounds=([0.0, -np.inf, 0.0, -np.inf], [np.inf, np.inf, 5.0, np.inf]),
                                    maxfev=20000)
    log_m = float(p[3])
    err = _sqrt(cov[3, 3]) if x.size > 4 and np.all(np.isfinite(cov)) else math.nan
    mult = math.exp(2 * log_m)
    return SharedFit(base=base, m=math.exp(log_m), multiplier=mult, multiplier_err=2 * mult * err)


def tokens_to_reach(tokens: Sequence[float], loss: Sequence[float], target: float) -> float:
    """Tokens at which a validation curve first reaches ``target`` (token efficiency, DESIGN.md §9).

    ``tokens``: increasing token counts of the evaluations; ``loss``: validation loss at each. Linear
    interpolation between the last evaluation above ``target`` and the first at or below it; nan when
    the curve never reaches it. Raises ``ValueError`` for empty or unequal inputs.
    """
    t, y = np.asarray(tokens, dtype=float), np.asarray(loss, dtype=float)
    if t.shape != y.shape or t.size == 0:
        raise ValueError("tokens_to_reach needs equal-length non-empty curves")
    hit = np.flatnonzero(y <= target)
    if hit.size == 0:
        return math.nan
    i = int(hit[0])
    if i == 0:
        return float(t[0])
    frac = (y[i - 1] - target) / (y[i - 1] - y[i])
    return float(t[i - 1] + frac * (t[i] - t[i - 1]))


@dataclass(frozen=True)
class LrPick:
    """The chosen learning rate, the mean final loss at every lr, and a warning when it sits at a grid edge."""

    lr: float
    loss: float
    mean_loss: dict[float, float]
    at_edge: bool
    warning: str | None


def seeds_needed(differences: Sequence[float], confidence: float = 0.95, max_seeds: int = 1000) -> int | None:
    """Seeds a paired comparison needs before its interval would exclude 0, if the mean and spread of the
    per-seed ``differences`` seen so far held: the smallest n >= 2 with ``t_(1+c)/2,n-1 · sd / √n < |mean|``
    (a planning figure at about 50 % power, not a power analysis). None when the mean is 0 or
    more than ``max_seeds`` would be needed. Raises ``ValueError`` for fewer than 2 differences.
    """
    from scipy import stats as scipy_stats

    x = np.asarray(differences, dtype=float)
    if x.size < 2:
        raise ValueError("seeds_needed needs the differences of at least 2 seeds")
    mean, sd = abs(float(x.mean())), float(x.std(ddof=1))
    if mean == 0:
        return None
    if sd == 0:
        return 2
    for n in range(2, max_seeds + 1):
        if scipy_stats.t.ppf((1 + confidence) / 2, n - 1) * sd / math.sqrt(n) < mean:
            return n
    return None


@dataclass(frozen=True)
class LineFit:
    """``y = intercept + slope · x`` by weighted least squares, with the parameters' covariance ``cov``
    (2×2, order intercept, slope) and ``dof = points - 2``; ``t`` is the two-sided 95 % t quantile with those dof
    (nan with no dof: then no interval can be given)."""

    intercept: float
    slope: float
    cov: tuple[tuple[float, float], tuple[float, float]]
    dof: int
    t: float

    def predict(self, x: float) -> tuple[float, float, float]:
        """``(y, lo, hi)`` at ``x``: the line and its 95 % confidence interval (nan bounds without dof)."""
        y = self.intercept + self.slope * x
        var = self.cov[0][0] + 2 * x * self.cov[0][1] + x * x * self.cov[1][1]
        half = self.t * math.sqrt(max(var, 0.0))
        return y, y - half, y + half

    @property
    def slope_interval(self) -> tuple[float, float]:
        half = self.t * math.sqrt(max(self.cov[1][1], 0.0))
        return self.slope - half, self.slope + half


def fit_line(x: Sequence[float], y: Sequence[float], se: Sequence[float] | None = None) -> LineFit:
    """Weighted least squares of ``y`` on ``x`` (weights ``1/se²``; equal weights without ``se``).

    Our choice of interval (for the trend of Δ across a ladder): the covariance ``(XᵀWX)⁻¹`` is scaled by
    the reduced χ² when that exceeds 1 (points scattered more than their ``se`` say: a model that is not a line,
    or under-estimated errors), never shrunk below what the ``se`` give, and the interval uses t with
    points - 2 dof; without ``se`` it is ordinary least squares with the residual variance. Raises
    ``ValueError`` for fewer than 2 points, unequal lengths, a non-positive ``se`` or a single distinct x.
    """
    from scipy import stats as scipy_stats

    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.shape != ys.shape or xs.ndim != 1 or xs.size < 2:
        raise ValueError(f"fit_line needs two equal-length samples of >= 2 points, got {xs.shape} and {ys.shape}")
    if np.ptp(xs) == 0:
        raise ValueError("fit_line needs at least two distinct x values")
    if se is not None:
        w_se = np.asarray(se, dtype=float)
        if w_se.shape != xs.shape or not np.all(np.isfinite(w_se)) or np.any(w_se <= 0):
            raise ValueError("fit_line: every se must be a finite number > 0")
        w = 1.0 / w_se**2
    else:
        w = np.ones_like(xs)
    X = np.stack([np.ones_like(xs), xs], axis=1)
    xtwx = X.T @ (X * w[:, None])
    beta = np.linalg.solve(xtwx, X.T @ (w * ys))
    cov = np.linalg.inv(xtwx)
    dof = xs.size - 2
    if dof > 0:
        chi2 = float(np.sum(w * (ys - X @ beta) ** 2)) / dof
        cov = cov * (max(chi2, 1.0) if se is not None else chi2)
    t = float(scipy_stats.t.ppf(0.975, dof)) if dof > 0 else math.nan
    if se is not None and dof == 0:
        t = 1.959963984540054  # two points with known se: the normal quantile (the line passes through both)
    return LineFit(float(beta[0]), float(beta[1]), ((float(cov[0, 0]), float(cov[0, 1])),
                                                     (float(cov[1, 0]), float(cov[1, 1]))), dof, t)


def seeds_for_halfwidth(differences: Sequence[float], halfwidth: float, confidence: float = 0.95,
                        max_seeds: int = 1000) -> int | None:
    """Seeds a paired comparison needs for its interval's half-width ``t_(1+c)/2,n-1 · sd / √n`` to reach
    ``halfwidth`` (nats), if the spread of the per-seed ``differences`` seen so far held: the smallest n >= 2
    that does (e.g. a ladder's ±0.015 nats; a planning figure: the sd itself is estimated). None when more than
    ``max_seeds`` would be needed. Raises ``ValueError`` for fewer than 2 differences or ``halfwidth <= 0``.
    """
    from scipy import stats as scipy_stats

    x = np.asarray(differences, dtype=float)
    if x.size < 2:
        raise ValueError("seeds_for_halfwidth needs the differences of at least 2 seeds")
    if not halfwidth > 0:
        raise ValueError(f"halfwidth={halfwidth} must be > 0 (nats, e.g. 0.015)")
    sd = float(x.std(ddof=1))
    for n in range(2, max_seeds + 1):
        if scipy_stats.t.ppf((1 + confidence) / 2, n - 1) * sd / math.sqrt(n) <= halfwidth:
            return n
    return None


def pick_lr(results: dict[float, Sequence[float]]) -> LrPick:
    """Pick the lr with the lowest mean final loss over seeds (a well-tuned baseline, DESIGN.md §9).

    ``results``: ``{lr: [final loss per seed]}``; non-finite losses (diverged runs) count as ``inf``.
    With two or more lrs, a winner at the smallest or largest lr sets ``at_edge`` and a warning to
    widen the grid (the true optimum may lie outside). Raises ``ValueError`` when empty or when
    every run diverged.
    """
    if not results:
        raise ValueError("pick_lr needs at least one learning rate")
    mean_loss = {}
    for lr, losses in results.items():
        x = np.asarray(losses, dtype=float)
        mean_loss[float(lr)] = float(x.mean()) if x.size and np.all(np.isfinite(x)) else math.inf
    grid = sorted(mean_loss)
    best = min(grid, key=lambda lr: mean_loss[lr])
    if math.isinf(mean_loss[best]):
        raise ValueError(f"every lr in {grid} diverged; lower the lr grid")
    at_edge = len(grid) > 1 and best in (grid[0], grid[-1])
    warning = None
    if at_edge:
        side = "smallest" if best == grid[0] else "largest"
        warning = (f"best lr {best:g} is the {side} value of the grid {', '.join(f'{g:g}' for g in grid)}; "
                   f"widen the grid past it")
    return LrPick(best, mean_loss[best], mean_loss, at_edge, warning)


__all__ = [
    "LineFit",
    "LrPick",
    "PairedDelta",
    "PowerLawFit",
    "SharedFit",
    "compute_multiplier",
    "fit_line",
    "fit_power_law",
    "fit_shared_power_law",
    "mean_std",
    "paired_delta",
    "pick_lr",
    "seeds_for_halfwidth",
    "seeds_needed",
    "tokens_to_reach",
]
