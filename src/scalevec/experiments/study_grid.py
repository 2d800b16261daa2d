"""The runs a sweep or a study plans before any result is in (a study's phase 1: its grid, or each strategy on its
own ``lr_grids``), read off its spec: the study trains them, and the report checks that each has a folder (a
run that never started, or one deleted to retrain it, holds back its strategy's lr pick as an unfinished one
does). Shared by ``study.py`` and ``report.py`` below both (DESIGN.md §9)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from scalevec.config.files import load_yaml
from scalevec.experiments.sweep_grid import Run, expand
from scalevec.experiments.sweep_spec import SweepSpec, spec_from_dict

LR, SEED, STRATEGY = "optim.lr", "train.seed", "strategy"


def cell_of(run: Run) -> tuple:
    """A run's cell: its values on every axis but strategy, lr and seed."""
    return tuple((k, repr(v)) for k, v in run.values.items() if k not in (STRATEGY, LR, SEED))


def narrowed(spec: SweepSpec, example: Run, strategy: Any, lrs: list[float], seeds: list[int]) -> SweepSpec:
    """``spec`` with every other axis fixed at ``example``'s value: the same run names as the full grid.
    ``strategy`` is a value of the strategy axis (a name, or a variant's bundle)."""
    axes = []
    for key, _ in spec.axes:
        if key == STRATEGY:
            axes.append((key, [strategy]))
        elif key == LR:
            axes.append((key, list(lrs)))
        elif key == SEED:
            axes.append((key, list(seeds)))
        else:
            axes.append((key, [example.values[key]]))
    return replace(spec, axes=axes)


def grid_cells(spec: SweepSpec) -> tuple[dict[tuple, dict[str, list[float]]], dict[tuple, Run], dict[str, Any]]:
    """The study's cells read off its grid: ``(lrs, examples, axis_value)`` where ``lrs[cell][label]`` is the
    grid's lrs of strategy ``label`` in ``cell``, ``examples[cell]`` a run of that cell (``narrowed`` fixes
    the other axes from it) and ``axis_value[label]`` the strategy's value on the strategy axis."""
    groups: dict[tuple, dict[str, list[float]]] = defaultdict(dict)
    examples: dict[tuple, Run] = {}
    axis_value: dict[str, Any] = {}  # a strategy's (or variant's) value on the strategy axis
    for run in expand(spec):
        cell, strategy = cell_of(run), run.cfg.strategy
        examples.setdefault(cell, run)
        axis_value[strategy] = run.values[STRATEGY]
        groups[cell].setdefault(strategy, [])
        if run.values[LR] not in groups[cell][strategy]:
            groups[cell][strategy].append(run.values[LR])
    return groups, examples, axis_value


def phase1_runs(spec: SweepSpec, lr_grids: dict[str, list[float]] | None) -> list[Run]:
    """The runs of phase 1: the grid, or with ``lr_grids`` (strategy label -> lrs, a study's ``lr_grids``) each
    strategy of each cell on its own lrs."""
    if lr_grids is None:
        return expand(spec)
    groups, examples, axis_value = grid_cells(spec)
    tuning = list(dict(spec.axes)[SEED])
    return [r for cell, by_strategy in groups.items() for label in by_strategy
            for r in expand(narrowed(spec, examples[cell], axis_value[label], lr_grids[label], tuning))]


def planned_runs(spec_files: list[Path]) -> list[Run]:
    """The runs that the sweeps and studies stored as ``spec_files`` (a folder's ``sweep.yaml`` and
    ``sweeps/*.yaml``, ``sweepdir.spec_files``) plan before any result: a sweep's whole grid, a study's phase 1.
    A study's later runs (lr extensions, confirmation seeds) depend on results and are not planned here.
    Raises ``ValueError`` (``spec_from_dict``) for a stored spec that is not valid."""
    out: dict[str, Run] = {}
    for f in spec_files:
        data = load_yaml(f)
        study = data.get("study") if isinstance(data, dict) else None
        spec = spec_from_dict({k: v for k, v in data.items() if k != "study"}, str(f))
        grids = study.get("lr_grids") if isinstance(study, dict) else None
        for r in phase1_runs(spec, grids):
            out.setdefault(r.name, r)
    return list(out.values())


__all__ = ["LR", "SEED", "STRATEGY", "cell_of", "grid_cells", "narrowed", "phase1_runs", "planned_runs"]
