"""The (N, D) analysis of the ladder: a weighted regression of each cell's held-out Δ on log10 N and log10 D.

    Δ_i = a_corpus(i) + b_N · log10 N_i + b_D · log10 D_i + ε_i,   weight 1 / se_i²

Δ_i is a cell's held-out Δ (strategy − baseline, nats/token, protocol v3), se_i its standard error (the half-width
of its 95 % t interval over t), N non-embedding parameters, D training tokens; one intercept per corpus, since
the corpora differ in how hard they are but the question is how Δ moves with N and D. ``b_N`` and ``b_D`` are
nats per decade; negative means the strategy's deficit shrinks (or its gain grows) along that axis.

Why not a scaling law: the earlier fit L = E + A·N^(-α) + B·D^(-β) per strategy left E at its bound on every
corpus, and its compute multipliers at 0.12B moved by factors of 10 to 40 when one cell was left out: the curve
said nothing the cells do not. This regression asks only for the direction of Δ inside the measured cells and
prints nothing beyond them.

Lack of fit: the cells scatter about the plane by more than their seed noise (different lr picks, CPU kinds,
corpora), so the covariance ``(XᵀWX)⁻¹`` is scaled by the reduced χ² when it exceeds 1 (as ``stats.fit_line``;
never shrunk below what the seeds give) and intervals use t with cells − parameters dof. The leave-one-cell-out
range of each slope is reported beside its interval: a slope that one cell carries shows there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_DOF = 1  # a fit needs more cells than parameters: without a residual there is no lack of fit to measure


@dataclass(frozen=True)
class CellDelta:
    """One cell's held-out Δ of one strategy: ``delta`` and its standard error ``se`` (nats/token), the cell's
    ``corpus``, non-embedding ``n``, training tokens ``d``, ``passes`` over its corpus's training tokens, ``name``."""

    name: str
    corpus: str
    n: float
    d: float
    passes: float
    delta: float
    se: float


@dataclass(frozen=True)
class Slope:
    """A fitted slope (nats per decade) with its 95 % interval and the range of the slope over the fits that
    leave one cell out (``loo_lo``, ``loo_hi``; nan when no such fit is possible)."""

    value: float
    lo: float
    hi: float
    loo_lo: float
    loo_hi: float

    @property
    def excludes_zero(self) -> bool:
        """True when the 95 % interval excludes 0 (our significance rule)."""
        return self.lo > 0 or self.hi < 0


@dataclass(frozen=True)
class DeltaFit:
    """The regression over ``cells``: ``n_slope`` (per decade of N), ``d_slope`` (per decade of D), the corpus
    intercepts, ``chi2`` / ``dof`` (reduced χ² = lack of fit; the covariance is scaled by it when above 1)."""

    cells: tuple[CellDelta, ...]
    n_slope: Slope
    d_slope: Slope
    intercepts: dict[str, float]
    chi2: float
    dof: int

    @property
    def reduced_chi2(self) -> float:
        return self.chi2 / self.dof

    @property
    def n_range(self) -> tuple[float, float]:
        """The smallest and largest N among the cells (the slopes hold between them only)."""
        return min(c.n for c in self.cells), max(c.n for c in self.cells)

    @property
    def d_range(self) -> tuple[float, float]:
        """The smallest and largest D among the cells."""
        return min(c.d for c in self.cells), max(c.d for c in self.cells)


def _design(cells: list[CellDelta]) -> tuple[np.ndarray, list[str]]:
    corpora = sorted({c.corpus for c in cells})
    x = np.array([[math.log10(c.n), math.log10(c.d)] + [float(c.corpus == k) for k in corpora] for c in cells])
    return x, corpora


def _solve(cells: list[CellDelta]) -> tuple[np.ndarray, np.ndarray, float, int, list[str]]:
    """``(coefficients, scaled covariance, χ², dof, corpora)``; coefficients are (b_N, b_D, a_corpus...)."""
    x, corpora = _design(cells)
    y = np.array([c.delta for c in cells])
    w = np.array([1.0 / c.se**2 for c in cells])
    xtwx = x.T @ (w[:, None] * x)
    if np.linalg.matrix_rank(xtwx) < x.shape[1]:
        raise ValueError("the cells do not separate N from D (every corpus's cells at one D/N, or one N): "
                         "add a cell at another budget")
    inv = np.linalg.inv(xtwx)
    beta = inv @ (x.T @ (w * y))
    chi2 = float(np.sum(w * (y - x @ beta) ** 2))
    dof = len(cells) - x.shape[1]
    return beta, inv * max(1.0, chi2 / dof), chi2, dof, corpora


def fit(cells: list[CellDelta]) -> DeltaFit:
    """The weighted regression of ``cells``' Δ on (log10 N, log10 D) with one intercept per corpus (see the module
    docstring), with each slope's 95 % t interval and leave-one-cell-out range. Raises ``ValueError`` when a
    ``se`` is not a finite number > 0, when there are no more cells than parameters (``MIN_DOF``), or when the
    cells cannot separate N from D."""
    cells = list(cells)
    if any(not (math.isfinite(c.se) and c.se > 0) for c in cells):
        raise ValueError("every cell needs a finite standard error > 0 (a cell with < 2 held-out seeds has none)")
    if len(cells) < len({c.corpus for c in cells}) + 2 + MIN_DOF:
        raise ValueError(f"{len(cells)} cells cannot fit 2 slopes and {len({c.corpus for c in cells})} "
                         f"intercept(s) with a residual; add cells")
    from scipy import stats as scipy_stats

    beta, cov, chi2, dof, corpora = _solve(cells)
    t = float(scipy_stats.t.ppf(0.975, dof))
    loo: list[np.ndarray] = []
    for i in range(len(cells)):
        rest = cells[:i] + cells[i + 1:]
        if len(rest) < len({c.corpus for c in rest}) + 2 + MIN_DOF:
            continue
        try:
            loo.append(_solve(rest)[0][:2])
        except ValueError:  # without this cell N and D are not separated: no slope to compare
            continue

    def slope(k: int) -> Slope:
        half = t * math.sqrt(cov[k, k])
        spread = [b[k] for b in loo]
        return Slope(float(beta[k]), float(beta[k] - half), float(beta[k] + half),
                     min(spread) if spread else math.nan, max(spread) if spread else math.nan)

    return DeltaFit(tuple(cells), slope(0), slope(1), {k: float(beta[2 + i]) for i, k in enumerate(corpora)},
                    chi2, dof)


__all__ = ["CellDelta", "DeltaFit", "MIN_DOF", "Slope", "fit"]
