"""The (N, D) fit of issue 35: ``L(N, D) = E + A·N^(-α) + B·D^(-β)`` per strategy, its seed-bootstrap intervals,
which parameters the data identify, and the compute multipliers it implies.

N is non-embedding parameters, D training tokens, L the final validation loss (nats/token). The fit is least
squares over every seed's loss (equivalently: each cell's mean weighted by its seeds). For fixed (α, β) the model is
linear and non-negative in (E, A, B), so it is solved exactly by non-negative least squares (variable projection);
(α, β) is searched on a grid of starting values (``ALPHAS`` × ``BETAS``: the "grid over initial values" of
OLMo-core's ladder fits) and the best few are refined by Nelder–Mead inside the bounds. N and D enter scaled
(``N_UNIT``, ``D_UNIT``) so that A and B are of order one; reported A and B are in those units.

Intervals: seeds are resampled with replacement within each cell (the same draw for every strategy of a cell, so a
strategy and the baseline stay paired) and everything is refitted; 2.5 and 97.5 percentiles. A parameter is *not
identified* (our rule) when its bootstrap interval reaches a bound of the search (α or β at ``BOUNDS``, E, A or B at
0) or spans more than a factor ``MAX_RATIO`` (hi/lo): the data then do not fix it, and a number quoted for it would
be the search's edge or one of many equally good fits.

The compute multiplier of a strategy at (N, D): the baseline's compute, along the same D/N, to reach the
strategy's fitted loss there, over the strategy's compute (compute ∝ N·D, so at fixed D/N it is (N'/N)²); > 1 means
the strategy is more compute-efficient. Outside the fitted cells' N and D it is an extrapolation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

N_UNIT, D_UNIT = 1e4, 1e6
BOUNDS = (0.02, 2.0)  # α and β are searched in this interval
MAX_RATIO = 4.0  # an interval wider than this factor (hi/lo) leaves its parameter not identified
CLAMP = 1e6  # multipliers are reported within [1/CLAMP, CLAMP] (beyond: the fit says "never" or "at once")
ALPHAS = BETAS = tuple(np.round(np.geomspace(0.03, 1.8, 14), 4))  # the grid of starting values


@dataclass(frozen=True)
class Point:
    """One cell of one strategy: non-embedding ``n``, tokens ``d``, and ``losses`` per seed (``seeds`` alike)."""

    n: float
    d: float
    seeds: tuple[int, ...]
    losses: tuple[float, ...]


@dataclass(frozen=True)
class NDFit:
    """``E + A·(N/N_UNIT)^(-alpha) + B·(D/D_UNIT)^(-beta)`` with its weighted residual sum of squares ``sse``
    over ``n_points`` seed losses in ``cells`` cells."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    sse: float
    n_points: int
    cells: int

    def predict(self, n, d):
        """The fitted loss at ``n`` non-embedding parameters and ``d`` tokens (scalars or arrays)."""
        return (self.E + self.A * (np.asarray(n, float) / N_UNIT) ** -self.alpha
                + self.B * (np.asarray(d, float) / D_UNIT) ** -self.beta)

    def params(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha, "B": self.B, "beta": self.beta}


def _design(n: np.ndarray, d: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.stack([np.ones_like(n), (n / N_UNIT) ** -alpha, (d / D_UNIT) ** -beta], axis=1)


def _solve(n, d, y, w, alpha, beta) -> tuple[float, np.ndarray]:
    from scipy.optimize import nnls

    sw = np.sqrt(w)
    coef, rnorm = nnls(_design(n, d, alpha, beta) * sw[:, None], y * sw)
    return float(rnorm ** 2), coef


def _arrays(points: list[Point]):
    n = np.array([p.n for p in points], float)
    d = np.array([p.d for p in points], float)
    y = np.array([np.mean(p.losses) for p in points], float)
    w = np.array([len(p.losses) for p in points], float)
    within = float(sum(np.sum((np.asarray(p.losses) - np.mean(p.losses)) ** 2) for p in points))
    return n, d, y, w, within


def fit(points: list[Point], refine: int = 3) -> NDFit:
    """The least-squares fit over every seed of ``points`` (cells with at least one loss). ``ValueError`` with
    fewer than 3 cells or a non-finite loss. ``refine``: how many of the best grid starts Nelder–Mead refines."""
    from scipy.optimize import minimize

    pts = [p for p in points if p.losses]
    if len(pts) < 3:
        raise ValueError(f"the (N, D) fit needs at least 3 cells, got {len(pts)}")
    if not all(math.isfinite(v) for p in pts for v in p.losses):
        raise ValueError("the (N, D) fit got a non-finite loss (a diverged run)")
    n, d, y, w, within = _arrays(pts)
    starts = sorted((_solve(n, d, y, w, a, b)[0], a, b) for a in ALPHAS for b in BETAS)
    lo, hi = BOUNDS

    def obj(x):
        a, b = float(np.clip(x[0], lo, hi)), float(np.clip(x[1], lo, hi))
        return _solve(n, d, y, w, a, b)[0]

    best = (starts[0][0], starts[0][1], starts[0][2])
    for _, a, b in starts[:refine]:
        r = minimize(obj, [a, b], method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-12, "maxiter": 400})
        if r.fun < best[0]:
            best = (float(r.fun), float(np.clip(r.x[0], lo, hi)), float(np.clip(r.x[1], lo, hi)))
    sse, coef = _solve(n, d, y, w, best[1], best[2])
    return NDFit(float(coef[0]), float(coef[1]), best[1], float(coef[2]), best[2], sse + within,
                 int(w.sum()), len(pts))


@dataclass(frozen=True)
class Interval:
    """A parameter's point value, its bootstrap 95 % interval and whether the data identify it."""

    value: float
    lo: float
    hi: float
    identified: bool


def resample(points_by_strategy: dict[str, list[Point]], rng: np.random.Generator) -> dict[str, list[Point]]:
    """One seed-bootstrap draw: per cell (the points of all strategies at one (N, D)), seeds drawn with
    replacement from the union of the strategies' seeds there, the same draw for every strategy (a strategy keeps
    the drawn seeds it has; a cell where it has none of them is left out of its fit)."""
    cells: dict[tuple[float, float], set[int]] = {}
    for pts in points_by_strategy.values():
        for p in pts:
            cells.setdefault((p.n, p.d), set()).update(p.seeds)
    draw = {k: rng.choice(sorted(v), size=len(v), replace=True) for k, v in cells.items()}
    out = {}
    for s, pts in points_by_strategy.items():
        new = []
        for p in pts:
            by_seed = dict(zip(p.seeds, p.losses))
            got = [by_seed[k] for k in draw[(p.n, p.d)] if k in by_seed]
            if got:
                new.append(Point(p.n, p.d, tuple(k for k in draw[(p.n, p.d)] if k in by_seed), tuple(got)))
        out[s] = new
    return out


def _identified(name: str, values: np.ndarray, scale: float) -> bool:
    lo, hi = np.percentile(values, [2.5, 97.5])
    if name in ("alpha", "beta") and (lo <= BOUNDS[0] * 1.05 or hi >= BOUNDS[1] * 0.95):
        return False
    if lo <= 1e-6 * max(scale, 1e-12):  # the interval reaches 0
        return False
    return hi / lo <= MAX_RATIO


def bootstrap(points_by_strategy: dict[str, list[Point]], draws: int = 200, seed: int = 0,
              refine: int = 1) -> tuple[dict[str, NDFit], dict[str, list[NDFit]]]:
    """The fit of every strategy and ``draws`` seed-bootstrap refits (``resample``); a draw whose fit fails (a
    strategy left with < 3 cells) is skipped for that strategy. Deterministic for a given ``seed``."""
    rng = np.random.default_rng(seed)
    fits = {s: fit(p) for s, p in points_by_strategy.items()}
    boots: dict[str, list[NDFit]] = {s: [] for s in points_by_strategy}
    for _ in range(draws):
        sample = resample(points_by_strategy, rng)
        for s, pts in sample.items():
            try:
                boots[s].append(fit(pts, refine=refine))
            except ValueError:
                pass
    return fits, boots


def intervals(point: NDFit, boots: list[NDFit]) -> dict[str, Interval]:
    """Each parameter's value, 95 % bootstrap interval and identification (see the module's docstring)."""
    out = {}
    for name, value in point.params().items():
        vals = np.array([b.params()[name] for b in boots], float)
        if vals.size < 10:
            out[name] = Interval(value, math.nan, math.nan, False)
            continue
        lo, hi = np.percentile(vals, [2.5, 97.5])
        out[name] = Interval(value, float(lo), float(hi), _identified(name, vals, abs(value)))
    return out


def baseline_n_for(base: NDFit, loss: float, ratio: float, n0: float) -> float:
    """The N' at which the baseline fit, trained at D = ``ratio``·N', reaches ``loss`` (bisection in log N over
    1e-8…1e8 × ``n0``); ``inf`` when it never does (``loss`` at or below what the baseline reaches as N → ∞),
    0 when it already does at the smallest N."""
    f = lambda logn: float(base.predict(math.exp(logn), ratio * math.exp(logn))) - loss  # noqa: E731
    lo, hi = math.log(n0) - 18.4, math.log(n0) + 18.4
    if f(hi) > 0:
        return math.inf
    if f(lo) < 0:
        return 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return math.exp((lo + hi) / 2)


def multiplier(base: NDFit, arm: NDFit, n: float, d: float) -> float:
    """The compute multiplier of ``arm`` against ``base`` at ``n`` non-embedding parameters and ``d`` tokens:
    (N'/n)², N' from ``baseline_n_for`` at the same D/N (> 1: the arm needs less compute), clamped to
    [1/``CLAMP``, ``CLAMP``] (the baseline never reaching the arm's loss gives ``CLAMP``)."""
    n2 = baseline_n_for(base, float(arm.predict(n, d)), d / n, n)
    m = (n2 / n) ** 2 if math.isfinite(n2) else math.inf
    return float(min(max(m, 1 / CLAMP), CLAMP))


__all__ = ["ALPHAS", "BETAS", "BOUNDS", "CLAMP", "D_UNIT", "MAX_RATIO", "Interval", "N_UNIT", "NDFit", "Point",
           "baseline_n_for", "bootstrap", "fit", "intervals", "multiplier", "resample"]
