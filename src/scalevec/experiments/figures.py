"""The report's figures: loss curves per cell, final loss against the tuned lr, scaling fits (DESIGN.md §9).

``loss_curves.png`` (seed mean with a min–max band; a branched run's parent dashed up to the branch
point), ``lr_sweep.png`` (when an axis is tuned) and ``scaling.png`` (when cells span 3 or more sizes).
matplotlib is imported inside ``panels`` (Agg backend), so importing this module stays cheap.
"""

from __future__ import annotations

import math
import textwrap
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from scalevec.experiments.analysis import Analysis, mean_curve
from scalevec.experiments.records import RunRecord


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
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def parent_curves(runs: list[RunRecord]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(label, tokens, val_loss)`` of the parent of every branched run (``train --init-from RUN``, recorded
    in ``meta.json``) up to the branch point, placed so that the branch continues it: at the parent's own
    tokens under ``--schedule-from continue``, shifted to end at 0 under ``restart`` (the branch starts there)."""
    import json

    out, seen = [], set()
    for run in runs:
        try:
            info = json.loads((run.path / "meta.json").read_text()).get("init_from") or {}
        except (OSError, ValueError):
            continue
        parent = Path(info.get("run_dir", ""))
        if (info.get("kind") != "run" or (str(parent), info.get("step")) in seen
                or not (parent / "metrics.jsonl").is_file()):
            continue
        seen.add((str(parent), info["step"]))
        rows = []
        for ln in (parent / "metrics.jsonl").read_text().splitlines():
            try:
                rows.append(json.loads(ln))
            except ValueError:
                continue  # a cut-off last line
        evals = [r for r in rows if r.get("kind") == "eval" and r["step"] <= info["step"]]
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


def plot_lr_sweep(a: Analysis, path: Path) -> None:
    """Mean final loss vs the tuned value (log x) per strategy, one panel per cell; the pick is circled."""
    cells = [c for c in a.cells if c.tune_key]
    with panels(len(cells), path) as axes:
        for ax, cell in zip(axes, cells):
            for r in cell.results:
                pts = sorted((lr, m) for lr, m in r.pick.mean_loss.items() if math.isfinite(m))
                if not pts:
                    continue
                line, = ax.plot(*zip(*pts), marker="o", label=r.strategy)
                ax.plot([r.pick.lr], [r.pick.loss], "o", ms=12, mfc="none", color=line.get_color())
            ax.set_xscale("log")
            ax.set_title(_wrap(cell.label), fontsize=9)
            ax.set(xlabel=cell.tune_key, ylabel="final validation loss (mean over seeds)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)


def plot_scaling(a: Analysis, path: Path) -> None:
    """Final loss vs non-embedding parameters (log x): every run as a point, each strategy's fit as a line."""
    with panels(len(a.scaling), path) as axes:
        for ax, s in zip(axes, a.scaling):
            n_all = [r.non_embedding_params for _, c in s.sizes for r in c.results]
            grid = np.geomspace(min(n_all) / 1.5, s.n_extrapolated, 200)
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


__all__ = ["parent_curves", "plot_loss_curves", "plot_lr_sweep", "plot_scaling"]
