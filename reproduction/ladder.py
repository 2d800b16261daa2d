"""The model ladder: rungs in one init regime (the 0.12B model's, DESIGN.md §2), lrs predicted up the ladder,
the trend of Δ with N.

A ladder is the CPU presets ``RUNGS`` (each initialized as the 0.12B model is, ``presets.LADDER_INIT_WIDTH``)
trained by ``scalevec study`` into ``results/ladder-RUNG-CORPUS/``. This module reads what those studies
committed (``results.csv``) and answers three questions; it trains nothing and draws nothing:

- ``predict_lr`` / ``lr_grid``: a rung's tuned lr predicted from the smaller rungs' (a line in log lr against
  log N fitted over three or more rungs, else of slope -1/2 through them), and the ×√2 grid around it that the next
  rung's study starts from (``study.lr_grids``; the study grows it at an edge);
- ``trend``: Δ(N) (strategy − baseline, nats) against log10 N, weighted by each rung's interval
  (``stats.fit_line``), with the slope per decade of N and its 95 % interval, between the rungs measured.

The horizon axis (the rungs at 100 and 400 tokens per parameter): ``horizon_name``, ``horizon_exponent``
(how a tuned lr moves with the horizon, measured on the first protocol's 20- and 100-token cells),
``horizon_centre``, and the data arithmetic ``total_params`` / ``run_tokens`` / ``passes`` (``TRAIN_TOKENS``).
Its corpora (``HORIZON_CORPORA``) add ``prose`` (``data/corpora/gutenberg-sotu.txt``) to the bundled two, for the
cells that would repeat the bundled text (``SOURCES``: what a study file names as ``data.source``).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from scalevec.experiments import stats
from scalevec.experiments.compare import LADDER_WARMUP_FRAC

CPU_RUNGS = ("cpu-10k", "cpu-25k", "cpu-80k", "cpu-200k", "cpu-550k")  # scripts/study.sh ladder
GPU_RUNGS = ("cpu-1m", "gpu-3m", "gpu-6m", "gpu-14m", "gpu-30m")  # scripts/gpu_ladder.sh
RUNGS = CPU_RUNGS + GPU_RUNGS  # by N
CORPORA = ("shakespeare", "kjv")  # the 20-token ladder's: the two bundled corpora
GRID_FACTOR = math.sqrt(2)
WARMUP_FRAC = LADDER_WARMUP_FRAC  # every rung warms up over 5 % of its steps, as `scalevec compare` pins it


def folder(results: Path, rung: str, corpus: str) -> Path:
    """Where a rung's study writes: ``results/ladder-RUNG-CORPUS``."""
    return Path(results) / f"ladder-{rung}-{corpus}"


def non_embedding_params(preset: str, strategy: str = "baseline") -> int:
    """Non-embedding parameters of ``preset`` (built on the meta device: instant at 0.12B)."""
    from scalevec.config import ScaleConfig
    from scalevec.config.presets import get_preset
    from scalevec.model.params import count_params
    from scalevec.model.transformer import build_model

    return count_params(build_model(get_preset(preset), ScaleConfig.preset(strategy), device="meta"))[
        "non_embedding_params"]


@dataclass(frozen=True)
class RungResult:
    """One strategy on one rung, as the rung's ``results.csv`` says: tuned lr (``at_edge`` when the best lr sat
    at the grid's edge), seeds, Δ against the baseline with its 95 % interval (None for the baseline)."""

    rung: str
    corpus: str
    strategy: str
    n: int  # the baseline's non-embedding parameters (the rung's N)
    lr: float
    at_edge: bool
    seeds: int
    loss: float
    loss_std: float
    delta: float | None
    lo: float | None
    hi: float | None

    @property
    def se(self) -> float | None:
        """The standard error of Δ behind its interval (half-width / t with seeds - 1 dof)."""
        if self.delta is None or self.lo is None or self.seeds < 2 or not math.isfinite(self.hi - self.lo):
            return None
        from scipy import stats as scipy_stats

        return (self.hi - self.lo) / 2 / float(scipy_stats.t.ppf(0.975, self.seeds - 1))


def _num(text: str) -> float | None:
    return float(text) if text not in ("", "nan", "None") else None


def read_rung(path: Path, rung: str, corpus: str) -> dict[str, RungResult]:
    """The strategies of one rung's ``results.csv`` (an empty dict when the study has not reported yet, or its
    file has a header only). ``ValueError`` naming the file when it is not a study's results.csv (a column
    missing, a row cut short, a value not a number, an lr that is not finite and > 0)."""
    f = Path(path) / "results.csv"
    if not f.is_file():
        return {}
    try:
        with f.open() as fh:
            rows = list(csv.DictReader(fh))
        if not rows:
            return {}
        base_n = {r["strategy"]: int(r["non_embedding_params"]) for r in rows}
        n = base_n.get("baseline") or min(base_n.values())
        out = {r["strategy"]: RungResult(rung, corpus, r["strategy"], n, float(r["best_value"]),
                                         r["at_grid_edge"] == "True", int(r["seeds"]), float(r["val_loss_mean"]),
                                         float(r["val_loss_std"] or "nan"), _num(r["delta"]), _num(r["ci_lo"]),
                                         _num(r["ci_hi"])) for r in rows}
    except (KeyError, TypeError, ValueError, csv.Error) as e:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"{f} is not a study's results.csv ({type(e).__name__}: {e}); rerun `scalevec report "
                         f"{f.parent}`") from None
    bad = [r.strategy for r in out.values() if not (math.isfinite(r.lr) and r.lr > 0)]
    if bad:
        raise ValueError(f"{f}: the tuned lr of {', '.join(bad)} is not a finite number > 0; rerun `scalevec report "
                         f"{f.parent}`")
    return out


def read_ladder(results: Path) -> list[RungResult]:
    """Every reported rung × corpus × strategy under ``results``, in rung order."""
    out = []
    for rung in RUNGS:
        for corpus in CORPORA:
            out.extend(read_rung(folder(results, rung, corpus), rung, corpus).values())
    return out


PRIOR_SLOPE = -0.5  # lr ∝ N^-1/2 ∝ 1/d_model at a fixed aspect ratio: Adam's rule under standard parameterization
MIN_FIT_RUNGS = 3  # fewer distinct rungs: the prior slope through their geometric mean (two noisy picks can give
# any slope: the ladder's first two Shakespeare rungs gave -1.5 for the baseline, an lr 5x below its neighbours')


def predict_lr(points: list[tuple[int, float]], n: int) -> float:
    """The lr at ``n`` parameters from ``points = [(N, tuned lr), ...]`` of smaller rungs: with at least
    ``MIN_FIT_RUNGS`` distinct N, the least-squares line of log lr on log N at ``n``; with fewer, a line of slope
    ``PRIOR_SLOPE`` through the points' geometric mean (our choice). ``ValueError`` if ``points`` is empty."""
    if not points:
        raise ValueError("predict_lr needs at least one rung's tuned lr")
    xs = [math.log10(p[0]) for p in points]
    ys = [math.log10(p[1]) for p in points]
    if len(set(xs)) < MIN_FIT_RUNGS:
        x0, y0 = sum(xs) / len(xs), sum(ys) / len(ys)
        return 10 ** (y0 + PRIOR_SLOPE * (math.log10(n) - x0))
    fit = stats.fit_line(xs, ys)
    return 10 ** (fit.intercept + fit.slope * math.log10(n))


def lr_grid(center: float, steps: int = 1, factor: float = GRID_FACTOR) -> list[float]:
    """``2·steps + 1`` lrs spaced by ``factor`` around ``center`` (6 significant digits, as the study writes them)."""
    return [float(f"{center * factor ** k:.6g}") for k in range(-steps, steps + 1)]


SAME_LR_REL = 1e-4  # lrs closer than this (relative) are one lr written twice: 6-digit rounding of two products


def share_lrs(grids: dict[str, list[float]]) -> dict[str, list[float]]:
    """``grids`` (strategy -> lrs) with every lr that lies within ``SAME_LR_REL`` of one already seen (strategies in
    order) replaced by it: two centres reached by different products (0.04 × 0.891 and 0.0283 × 0.891 × √2) round
    to 0.0356359 and 0.035636, which would read as two lrs in every table and make two run names for one lr. Only
    lrs of different strategies are merged: a strategy's own grid keeps every value it has (two of its values so
    close are a grid factor too near 1, which ``scripts/ladder_plan.py`` refuses)."""
    seen: list[float] = []
    out = {}
    for strategy, lrs in grids.items():
        out[strategy] = [next((x for x in seen if abs(lr - x) <= SAME_LR_REL * x), lr) for lr in lrs]
        seen += [lr for lr in out[strategy] if lr not in seen]
    return out


@dataclass(frozen=True)
class Trend:
    """Δ(N) = intercept + slope · log10 N for one strategy on one corpus, from the rungs ``points``
    ``[(N, Δ, se)]``; it holds between the rungs' smallest and largest N only (nothing beyond is computed)."""

    strategy: str
    corpus: str
    points: list[tuple[int, float, float]]
    fit: stats.LineFit

    @property
    def slope_interval(self) -> tuple[float, float]:
        return self.fit.slope_interval


def trend(rows: list[RungResult], strategy: str, corpus: str) -> Trend | None:
    """The weighted line of ``strategy``'s Δ across the rungs of ``corpus`` (None with fewer than 2 rungs that
    have an interval)."""
    pts = [(r.n, r.delta, r.se) for r in rows if r.strategy == strategy and r.corpus == corpus
           and r.delta is not None and r.se is not None and r.se > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    fit = stats.fit_line([math.log10(p[0]) for p in pts], [p[1] for p in pts], [p[2] for p in pts])
    return Trend(strategy, corpus, pts, fit)


__all__ = ["CORPORA", "CPU_RUNGS", "GPU_RUNGS", "HORIZONS", "HORIZON_CORPORA", "RUNGS", "RungResult", "SOURCES",
           "TRAIN_TOKENS", "Trend", "folder", "horizon_centre", "horizon_exponent", "horizon_name",
           "lr_grid", "non_embedding_params", "passes", "predict_lr", "read_ladder", "read_rung", "run_tokens",
           "share_lrs", "total_params", "trend"]


# ---- the horizon axis: the ladder's rungs at more tokens per parameter -------------------------------------------

HORIZONS = (100, 400)  # tokens per *total* parameter, as the ladder's 20 (DESIGN.md §9; the paper's "100 tokens per
# parameter" is read the same way). What that is per non-embedding parameter: ``tokens_per_nonembedding``.
# Training tokens of the bundled corpora under the default split (tail, val_frac 0.1, bytes tokenizer), as
# `scalevec prepare-data CORPUS` writes them in its manifest (train.tokens; separators included).
TRAIN_TOKENS = {"shakespeare": 4_527_497, "kjv": 3_626_064, "prose": 16_917_603}
# The horizon's corpora: the bundled two, and "prose", data/corpora/gutenberg-sotu.txt (public-domain books and the
# State of the Union addresses; built by data/corpora/build_gutenberg_sotu.py, not committed), 3.7x Shakespeare's
# training tokens, so that the cells that repeat the bundled corpora (cpu-80k at 100, every cell at 400) make under
# one pass over it. SOURCES: each one's data.source as a study file in sweeps/ writes it (a path resolves beside
# the file).
HORIZON_CORPORA = (*CORPORA, "prose")
SOURCES = {"shakespeare": "shakespeare", "kjv": "kjv", "prose": "../data/corpora/gutenberg-sotu.txt"}
# The first protocol's cells at 20 and at 100 tokens per parameter (the same lr grid ×2, lr picked on seed 0):
# the only measured evidence here of how a tuned lr moves with the horizon (``horizon_exponent``).
HORIZON_EVIDENCE = (("cpu-10k-shakespeare", "cpu-10k-shakespeare-tpp100", 20, 100),
                    ("cpu-25k-shakespeare", "cpu-25k-shakespeare-tpp100", 20, 100))
HORIZON_STRATEGIES = ("baseline", "none", "unified")


def horizon_name(rung: str, corpus: str, tokens_per_param: float) -> str:
    """``ladder-RUNG-CORPUS`` at 20 tokens per parameter, ``ladder-RUNG-CORPUS-tppD`` at D (the study's name, its
    file ``sweeps/study-NAME.yaml`` and its folder ``results/NAME``)."""
    base = f"ladder-{rung}-{corpus}"
    return base if tokens_per_param == 20 else f"{base}-tpp{tokens_per_param:g}"


def horizon_exponent(results: Path) -> tuple[float, list[tuple[str, str, float]]]:
    """The exponent s of ``lr*(D) ∝ D^s`` measured on ``HORIZON_EVIDENCE``: the mean over cells and strategies
    (``HORIZON_STRATEGIES``) of log(lr at the long horizon / lr at 20) / log(horizon ratio), with the per-pair
    ratios ``[(cell, strategy, ratio)]``. The first protocol's picks at 20 and 100 tokens per parameter: 4 of 6
    unchanged, `unified` ×2 at cpu-10k and ×1/4 at cpu-25k, so s ≈ -0.07 (a grid of ×2 cannot resolve more:
    one grid step over a ×5 horizon is s = ±0.43). ``ValueError`` when a cell of the evidence is missing."""
    logs, pairs = [], []
    for short, long, d0, d1 in HORIZON_EVIDENCE:
        a, b = _picks(Path(results) / short), _picks(Path(results) / long)
        for s in HORIZON_STRATEGIES:
            if s not in a or s not in b:
                raise ValueError(f"horizon evidence: {s} missing in results/{short} or results/{long}")
            pairs.append((short.removesuffix("-shakespeare"), s, b[s] / a[s]))
            logs.append(math.log(b[s] / a[s]) / math.log(d1 / d0))
    return sum(logs) / len(logs), pairs


def _picks(cell: Path) -> dict[str, float]:
    """``{strategy: tuned lr}`` of a cell's ``results.csv`` (empty when it has not reported). ``ValueError`` naming
    the file when it is damaged or an lr is not finite and > 0."""
    f = cell / "results.csv"
    if not f.is_file():
        return {}
    try:
        with f.open() as fh:
            out = {r["strategy"]: float(r["best_value"]) for r in csv.DictReader(fh)}
    except (KeyError, TypeError, ValueError, csv.Error) as e:
        raise ValueError(f"{f} is not a study's results.csv ({type(e).__name__}: {e}); rerun `scalevec report "
                         f"{cell}`") from None
    if not all(math.isfinite(v) and v > 0 for v in out.values()):
        raise ValueError(f"{f}: a tuned lr is not a finite number > 0; rerun `scalevec report {cell}`")
    return out


def horizon_centre(pick20: float, tokens_per_param: float, exponent: float) -> float:
    """The centre of a horizon cell's grid: the 20-token pick of the same rung, corpus and strategy times
    ``(tokens_per_param / 20) ** exponent`` (``horizon_exponent``). ``ValueError`` for a non-positive pick or
    horizon."""
    if not (pick20 > 0 and tokens_per_param > 0):
        raise ValueError(f"pick {pick20} and tokens per parameter {tokens_per_param} must be > 0")
    return pick20 * (tokens_per_param / 20) ** exponent


def total_params(preset: str, strategy: str = "baseline") -> int:
    """Total parameters of ``preset`` (embedding and head included: what ``tokens_per_param`` counts)."""
    from scalevec.config import ScaleConfig
    from scalevec.config.presets import get_preset
    from scalevec.model.params import count_params
    from scalevec.model.transformer import build_model

    return count_params(build_model(get_preset(preset), ScaleConfig.preset(strategy), device="meta"))["params"]


def run_tokens(params: int, tokens_per_param: float, batch_tokens: int = 16 * 128) -> int:
    """Training tokens of a run at ``tokens_per_param`` × ``params``, rounded up to whole steps of
    ``batch_tokens`` (as ``run_budget`` does)."""
    return math.ceil(params * tokens_per_param / batch_tokens) * batch_tokens


def passes(tokens: int, corpus: str) -> float:
    """Passes over ``corpus``'s training tokens that ``tokens`` make (> 1: data repeats)."""
    return tokens / TRAIN_TOKENS[corpus]
