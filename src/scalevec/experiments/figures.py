"""The report's figures: loss curves per cell, final loss against the tuned lr, scaling fits (DESIGN.md §9).

``loss_curves.png`` (seed mean with a min–max band; a branched run's parent dashed up to the branch
point), ``lr_sweep.png`` (when a strategy ran two or more values of the tuned axis) and ``scaling.png`` (when
cells span 3 or more sizes).
matplotlib is imported inside ``panels`` (Agg backend), so importing this module stays cheap.
"""

from __future__ import annotations

import math
import textwrap
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from scalevec.experiments.analysis import Analysis, Cell, mean_curve
from scalevec.experiments.records import RunRecord
from scalevec.outpath import write_figure
from scalevec.training import rundir


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, 60))


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 3)
    return math.ceil(n / cols), cols


@contextmanager
def panels(n: int, path: Path):
    """One figure of ``n`` panels (``_grid`` layout, 5.5 × 4 inches each) for the ``with`` body to draw on;
    on exit the unused panels are blanked and the figure is written to ``path`` and closed. Yields the axes
    in order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = _grid(n)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    try:
        yield list(axes.flat)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        write_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)


def parent_curves(runs: list[RunRecord]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(label, tokens, val_loss)`` of the parent of every branched run (``train --init-from RUN``, recorded
    in ``meta.json``) up to the branch point, placed so that the branch continues it: at the parent's own
    tokens under ``--schedule-from continue``, shifted to end at 0 under ``restart`` (the branch starts there).
    A parent whose metrics.jsonl is damaged (``rundir.read_metrics``) is left out of the figure."""
    out, seen = [], set()
    for run in runs:
        info = rundir.read_meta(run.path).get("init_from") or {}
        parent = Path(info.get("run_dir", ""))
        if info.get("kind") != "run" or (str(parent), info.get("step")) in seen:
            continue
        seen.add((str(parent), info["step"]))
        try:
            rows = rundir.read_metrics(parent, kind="eval")  # [] when the parent has no metrics.jsonl
        except rundir.RunDirError:
            continue
        evals = [r for r in rows if r["step"] <= info["step"]]
        if not evals:
            continue
        tokens = np.array([r["tokens"] for r in evals], dtype=float)
        if info.get("schedule_from") != "continue":
            tokens -= info["step"] * (tokens[-1] / evals[-1]["step"])
        out.append((f"parent {parent.name} ({info.get('strategy')}) to step {info['step']}", tokens,
                    np.array([r["val_loss"] for r in evals])))
    return out


def plot_loss_curves(a: Analysis, path: Path) -> None:
    """Validation loss vs tokens, one panel per cell; mean over seeds with a min–max band. A branched run's
    parent is drawn dashed up to the branch point (``parent_curves``)."""
    with panels(len(a.cells), path) as axes:
        for ax, cell in zip(axes, a.cells):
            tail = []
            for r in cell.results:
                tokens, loss = mean_curve(r.runs)
                if not tokens.size:
                    continue
                curves = np.array([[e["val_loss"] for e in run.evals if e["tokens"] in set(tokens)] for run in r.runs])
                line, = ax.plot(tokens, loss, marker=".", label=r.strategy)
                if len(r.runs) > 1 and curves.shape[1] == tokens.size:
                    ax.fill_between(tokens, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.15)
                tail.extend(loss[tokens >= 0.3 * tokens.max()])
            for name, tokens, loss in parent_curves([run for r in cell.results for run in r.runs]):
                ax.plot(tokens, loss, color="0.5", linestyle="--", linewidth=1, label=name)
                ax.plot(tokens[-1:], loss[-1:], color="0.5", marker="o")  # the branch point
            if tail:  # zoom on the second part of training, where the strategies separate
                lo, hi = min(tail), max(tail)
                ax.set_ylim(lo - 0.1 * (hi - lo + 1e-3), hi + 0.1 * (hi - lo + 1e-3))
            ax.set_title(_wrap(cell.label), fontsize=9)
            ax.set(xlabel="tokens", ylabel="validation loss (nats/token)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)


def seeds_text(seeds: list[int]) -> str:
    """``seed 0``, ``seeds 0-2``, ``seeds 0, 3``: a list of seeds as a label says it."""
    seeds = sorted(seeds)
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def lr_sweep_series(cell: Cell) -> tuple[str, list[dict]]:
    """What ``lr_sweep.png`` draws for one cell: the y-axis label and, per strategy, ``points`` (tuned value,
    mean final loss over its tuning seeds, the seeds every value has: what picked it; diverged values left
    out), ``pick`` (value, that mean) and ``confirmed`` (value, the mean over all its seeds there, the number
    the table reports; None when no seed was added at the pick) and the legend ``label``."""
    results = [r for r in cell.results if r.pick]
    seed_sets = {tuple(r.tune_seeds) for r in results}
    shared = len(seed_sets) == 1
    ylabel = (f"final validation loss\n(mean over {seeds_text(list(next(iter(seed_sets))))}, the tuning seeds)"
              if shared else "final validation loss\n(mean over each strategy's tuning seeds)")
    series = []
    for r in results:
        pts = sorted((lr, m) for lr, m in r.pick.mean_loss.items() if math.isfinite(m))
        confirmed = (r.pick.lr, r.loss_mean) if len(r.runs) > len(r.tune_seeds) else None
        series.append({"strategy": r.strategy, "points": pts, "pick": (r.pick.lr, r.pick.loss),
                       "confirmed": confirmed, "n_seeds": len(r.runs),
                       "label": r.strategy if shared else f"{r.strategy} ({seeds_text(r.tune_seeds)})"})
    return ylabel, series


def swept_cells(a: Analysis) -> list[Cell]:
    """The cells where some strategy ran two or more values of the tuned key: the ones ``lr_sweep.png`` has a
    curve for. A compare at the study's tuned lrs (one value per strategy, ``--lr tuned``) has none."""
    return [c for c in a.cells if c.tune_key and any(r.pick and len(r.pick.mean_loss) >= 2 for r in c.results)]


def plot_lr_sweep(a: Analysis, path: Path) -> None:
    """Final loss vs the tuned value (log x) per strategy, one panel per cell of ``swept_cells``
    (``lr_sweep_series``): the mean over the tuning seeds at every value, the pick circled, and a star for the
    mean over all seeds at the pick when confirmation seeds were added there."""
    cells = swept_cells(a)
    with panels(len(cells), path) as axes:
        for ax, cell in zip(axes, cells):
            ylabel, series = lr_sweep_series(cell)
            for s in series:
                if not s["points"]:
                    continue
                line, = ax.plot(*zip(*s["points"]), marker="o", label=s["label"])
                ax.plot(*s["pick"], "o", ms=12, mfc="none", color=line.get_color())
                if s["confirmed"]:
                    ax.plot(*s["confirmed"], "*", ms=10, color=line.get_color(),
                            label=f"{s['strategy']}: mean of its {s['n_seeds']} seeds at the pick")
            ax.set_xscale("log")
            ax.set_title(_wrap(cell.label), fontsize=9)
            ax.set(xlabel=cell.tune_key, ylabel=ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)


def plot_scaling(a: Analysis, path: Path) -> None:
    """Final loss vs non-embedding parameters (log x): every run as a point, each strategy's fit as a line drawn
    over the measured sizes only (a fit says nothing beyond them)."""
    with panels(len(a.scaling), path) as axes:
        for ax, s in zip(axes, a.scaling):
            grid = np.geomspace(s.n_min, s.n_max, 200)
            for strategy in s.fits:
                n = [r.non_embedding_params for _, c in s.sizes for r in c.results if r.strategy == strategy
                     for _ in r.runs]
                y = [x for _, c in s.sizes for r in c.results if r.strategy == strategy for x in r.losses]
                pts = ax.scatter(n, y, s=14, label=strategy)
                fit = s.fits[strategy]
                ax.plot(grid, fit.predict(grid), color=pts.get_facecolor()[0], lw=1,
                        label=f"{strategy}: {fit.E:.2f} + {fit.A:.3g}·N^-{fit.alpha:.2f}")
            ax.set_xscale("log")
            ax.set_title(_wrap(s.label), fontsize=9)
            ax.set(xlabel="non-embedding parameters", ylabel="final validation loss (nats/token)")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)


__all__ = ["lr_sweep_series", "parent_curves", "plot_loss_curves", "plot_lr_sweep", "plot_scaling",
           "seeds_text"]
