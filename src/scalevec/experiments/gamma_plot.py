"""``scalevec plot RUN``: how each scale vector moves during training, and the same per strategy in ``report``
(DESIGN.md §3, §8).

The figure is rms(γ) of every scale vector over the steps of ``metrics.jsonl``, one panel per role (``input_scale``:
foldable, ``output_scale``: QK-norm, peri, DNP's gate scale; DESIGN.md §5), one line per vector coloured by its
layer (dark: first layer, light: last; the final norm, outside the layers, in red). rms(γ) is the
``telemetry.ScaleTelemetry`` row's ``rms``, or ``sqrt(mean² + std²)`` for a run logged before it existed (the
same number). ``report`` draws one row of panels per strategy of each cell (its first seed at the chosen lr):
``gamma_trajectories.png``.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from scalevec import outpath
from scalevec.training import rundir

_LAYER = re.compile(r"layers\.(\d+)\.")


def trajectories(rows: list[dict]) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """``{role: {vector: (steps, rms(γ))}}`` of the train rows of a ``metrics.jsonl`` (``rundir.read_metrics``).
    A vector without a logged role (older runs) is placed by its name: ``q_norm``/``k_norm``/``attn_out``/
    ``mlp_out``/DNP's gate ``out_scale`` are Output-Norm scales, the rest Input-Norm ones (DESIGN.md §1)."""
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for row in rows:
        if row.get("kind", "train") != "train" or not isinstance(row.get("scales"), dict):
            continue
        for name, s in row["scales"].items():
            rms = s.get("rms")
            if rms is None and "mean" in s and "std" in s:
                rms = math.sqrt(s["mean"] ** 2 + s["std"] ** 2)
            if rms is None:
                continue
            role = s.get("role") or _role_by_name(name)
            steps, values = out.setdefault(role, {}).setdefault(name, ([], []))
            steps.append(int(row["step"]))
            values.append(float(rms))
    return out


def _role_by_name(name: str) -> str:
    return "output_scale" if re.search(r"(q_norm|k_norm|attn_out|mlp_out|gate\.out_scale)", name) else "input_scale"


def layer_of(name: str) -> int | None:
    """The layer index in a vector's name (``layers.3.…`` -> 3), None outside the layers (the final norm)."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _draw(ax, series: dict[str, tuple[list[int], list[float]]], title: str) -> None:
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    layers = [i for i in (layer_of(n) for n in series) if i is not None]
    top = max(layers, default=0)
    labelled = set()
    for name, (steps, values) in sorted(series.items()):
        i = layer_of(name)
        color = "tab:red" if i is None else cmap(0.85 * i / max(top, 1))
        label = ("final norm" if i is None else f"layer {i}") if i not in labelled else None
        labelled.add(i)
        ax.plot(steps, values, color=color, linewidth=1, alpha=0.8, label=label)
    ax.set_title(title, fontsize=9)
    ax.set(xlabel="step", ylabel="rms(γ)")
    ax.grid(alpha=0.3)
    if labelled:
        ax.legend(fontsize=7, ncol=2)


def plot_runs(runs: list[tuple[str, list[dict]]], path: Path) -> bool:
    """One row of panels per ``(label, metrics rows)``, one panel per role (module docstring), written to ``path``
    (missing folders above it created). Returns False (nothing written, no folder created) when no run logged scale
    vectors."""
    data = [(label, trajectories(rows)) for label, rows in runs]
    data = [(label, t) for label, t in data if t]
    if not data:
        return False
    roles = sorted({role for _, t in data for role in t})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(data), len(roles), figsize=(5.5 * len(roles), 3.6 * len(data)), squeeze=False)
    try:
        for row_axes, (label, t) in zip(axes, data):
            for ax, role in zip(row_axes, roles):
                if role in t:
                    _draw(ax, t[role], f"{label}: {role} ({len(t[role])} vectors)" if label else
                          f"{role} ({len(t[role])} vectors)")
                else:
                    ax.axis("off")
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)  # as every --out: savefig would fail with "[Errno 2]"
        outpath.write_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)
    return True


def plot_cells(a, path: Path) -> bool:
    """``report``'s figure: for every cell of ``a`` (an ``analysis.Analysis``), one row per strategy (its first
    finished run at the chosen value). Returns False when no run logged scale vectors (nothing written)."""
    runs = []
    for cell in a.cells:
        for r in cell.results:
            if r.runs:
                run = sorted(r.runs, key=lambda x: x.seed)[0]
                label = f"{r.strategy}" if len(a.cells) == 1 else f"{cell.label} · {r.strategy}"
                runs.append((label, rundir.read_metrics(run.path, "train")))
    return plot_runs(runs, path)


FIGURE_SUFFIXES = {".png", ".pdf", ".svg"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="a scalevec run directory (its metrics.jsonl)")
    p.add_argument("--out", help="the figure to write, .png, .pdf or .svg; missing folders are created (default "
                                 "RUN/gamma_trajectories.png)")


def run(args: argparse.Namespace) -> int:
    """``scalevec plot RUN``: draw RUN's γ trajectories into ``--out`` (missing folders above it created). Raises
    ``FileNotFoundError`` for a RUN that is not a run directory or a symbolic link that leads nowhere or loops as
    ``--out`` or a folder above it and ``NotADirectoryError`` for an ``--out`` under a file
    (``outpath.check_out_path``), ``ValueError`` for an ``--out`` that is not a figure file (an existing folder
    included) or a run that logged no scale vectors, and what ``rundir.read_metrics`` raises; all before anything is
    drawn or written."""
    run_dir = Path(args.run_dir)
    if not rundir.has_config(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a scalevec run directory (no config.yaml); give RUN as train "
                                f"--out wrote it")
    rows = rundir.read_metrics(run_dir, "train")
    out = Path(args.out) if args.out else run_dir / "gamma_trajectories.png"
    outpath.check_out_path(out)  # savefig below a dangling link or a file was a bare errno, after the drawing
    if out.is_dir() or out.suffix.lower() not in FIGURE_SUFFIXES:  # matplotlib would write OUT.png and say OUT
        raise ValueError(f"--out {out} is not a figure file; give a path ending in one of "
                         f"{', '.join(sorted(FIGURE_SUFFIXES))} (e.g. {out.with_suffix('.png').name})")
    if not plot_runs([("", rows)], out):
        raise ValueError(f"{run_dir} logged no scale vectors (strategy none, or no train row yet); nothing to plot")
    t = trajectories(rows)
    print(f"plot: {out} ({', '.join(f'{role}: {len(v)} vectors' for role, v in sorted(t.items()))}, "
          f"{len({s for v in t.values() for steps, _ in v.values() for s in steps})} logged steps)")
    return 0


__all__ = ["add_arguments", "layer_of", "plot_cells", "plot_runs", "run", "trajectories"]
