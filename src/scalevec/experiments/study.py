"""``scalevec study``: learning-rate tuning a reviewer accepts, on top of ``sweep`` (issue 12, DESIGN.md §9).

A study file is a sweep file (``sweep.py``) whose grid has an ``lr`` axis and a ``seed`` axis (the
tuning seeds, usually ``[0]``), plus a ``study`` section::

    study:
      extend: 2.0          # factor of each step past a grid edge (the grid is spaced by this factor)
      max_extensions: 4    # per strategy and cell; the report warns if the best lr is still at an edge
      confirm_seeds: [1, 2]   # seeds added at each strategy's tuned lr, per cell
      target_halfwidth: 0.015 # optional: then add seeds until each Δ's 95 % interval is planned this narrow
      max_seeds: 20           # ... but never past this many seeds per strategy (with target_halfwidth)
      lr_grids: {baseline: [7e-3, 1e-2, 1.4e-2], unified: [2e-2, 2.8e-2, 4e-2]}  # optional: per strategy,
                              # phase 1 runs each strategy on its own lrs instead of the grid's lr axis

It runs in three phases (four with ``target_halfwidth``), each an ordinary sweep into the same folder
(finished runs are skipped, so rerunning the command resumes and makes the same decisions from the same
results):

1. the grid as written (every strategy × lr × tuning seed × the other axes), or with ``lr_grids`` each
   strategy × its own lrs × tuning seed (the ladder's top rungs: a grid around each one's predicted lr);
2. per cell (a combination of the other axes) and strategy: while the best lr on the tuning seeds
   is the smallest or largest value tried, add the next value past it (× or ÷ ``extend``); a
   diverged run counts as an infinitely bad lr, so a grid that diverges on one side grows the other;
3. the ``confirm_seeds`` at each strategy's tuned lr;
4. with ``target_halfwidth`` h: per cell, while some strategy's paired differences to the baseline (at each
   one's tuned lr, over the seeds run so far) say that more seeds are needed for a 95 % half-width of h
   (``stats.seeds_for_halfwidth``), every strategy gets the next seeds up to that count, at most ``max_seeds``
   (issue 23: a ladder whose rungs can resolve the paper's 0.015-0.03 nats).

The report (``report.py``) picks each strategy's lr on the tuning seeds (the seeds every lr value has)
and averages every seed at that lr, so the added seeds confirm the pick without re-choosing it.
The study's spec is stored as the folder's spec (``sweepdir``); the follow-up grids are not.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scalevec.config import load_yaml
from scalevec.experiments import stats, sweepdir
from scalevec.experiments.sweep import Run, SweepSpec, expand, run_sweep, spec_from_dict
from scalevec.training import rundir

STUDY_KEYS = ("extend", "max_extensions", "confirm_seeds", "target_halfwidth", "max_seeds", "lr_grids")
LR, SEED, STRATEGY = "optim.lr", "train.seed", "strategy"


@dataclass
class StudyPlan:
    """The parsed ``study`` section: step factor, extension limit, confirmation seeds, and the optional
    interval target (nats) with its seed cap."""

    extend: float = 2.0
    max_extensions: int = 4
    confirm_seeds: list[int] = field(default_factory=lambda: [1, 2])
    target_halfwidth: float | None = None
    max_seeds: int = 20
    lr_grids: dict[str, list[float]] | None = None  # strategy label -> its phase-1 lrs


def parse(data: dict, where: str = "study") -> tuple[SweepSpec, StudyPlan, dict]:
    """Split a study mapping into its sweep spec, its plan and the mapping to store. ``ValueError`` on a
    bad key, a missing ``lr``/``seed`` axis, or a factor <= 1."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping (a sweep file with a 'study' section)")
    plan_data = data.get("study") or {}
    if not isinstance(plan_data, dict) or set(plan_data) - set(STUDY_KEYS):
        raise ValueError(f"{where}.study must be a mapping with keys among {', '.join(STUDY_KEYS)}")
    spec = spec_from_dict({k: v for k, v in data.items() if k != "study"}, where)
    target = plan_data.get("target_halfwidth")
    plan = StudyPlan(float(plan_data.get("extend", 2.0)), int(plan_data.get("max_extensions", 4)),
                     [int(s) for s in plan_data.get("confirm_seeds", [1, 2])],
                     None if target is None else float(target), int(plan_data.get("max_seeds", 20)))
    if plan.target_halfwidth is not None and not plan.target_halfwidth > 0:
        raise ValueError(f"{where}.study.target_halfwidth={plan.target_halfwidth} must be > 0 (nats, e.g. 0.015)")
    if plan.max_seeds < 2:
        raise ValueError(f"{where}.study.max_seeds={plan.max_seeds} must be >= 2")
    grids = plan_data.get("lr_grids")
    if grids is not None:
        labels = [str(v.get("name") or v.get("strategy")) if isinstance(v, dict) else str(v)
                  for v in dict(spec.axes).get(STRATEGY, [])]
        if (not isinstance(grids, dict) or sorted(map(str, grids)) != sorted(labels)
                or not all(isinstance(v, list) and v and all(isinstance(x, (int, float)) and x > 0 for x in v)
                           for v in grids.values())):
            raise ValueError(f"{where}.study.lr_grids must map every strategy of the grid ({', '.join(labels)}) to a "
                             f"non-empty list of positive lrs")
        plan.lr_grids = {str(k): [float(x) for x in v] for k, v in grids.items()}
    if not plan.extend > 1:
        raise ValueError(f"{where}.study.extend={plan.extend} must be > 1 (e.g. 2)")
    if plan.max_extensions < 0:
        raise ValueError(f"{where}.study.max_extensions={plan.max_extensions} must be >= 0")
    keys = [k for k, _ in spec.axes]
    for key, alias in ((LR, "lr"), (SEED, "seed"), (STRATEGY, "strategy")):
        if key not in keys:
            raise ValueError(f"{where}.grid needs a '{alias}' axis for a study (e.g. {alias}: [...])")
    if spec.tune not in ([], [LR]) or (spec.tune == [] and len(dict(spec.axes)[LR]) > 1):
        raise ValueError(f"{where}.tune must be [optim.lr] for a study")
    tuning = set(dict(spec.axes)[SEED])
    if tuning & set(plan.confirm_seeds):
        raise ValueError(f"{where}.study.confirm_seeds {plan.confirm_seeds} overlap the grid's seeds; use other seeds")
    spec = replace(spec, tune=[LR])
    stored_plan = {"extend": plan.extend, "max_extensions": plan.max_extensions, "confirm_seeds": plan.confirm_seeds}
    if plan.target_halfwidth is not None:
        stored_plan |= {"target_halfwidth": plan.target_halfwidth, "max_seeds": plan.max_seeds}
    if plan.lr_grids is not None:
        stored_plan["lr_grids"] = plan.lr_grids
    stored = {**spec.to_dict(), "study": stored_plan}
    return spec, plan, stored


def _cell(run: Run) -> tuple:
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


def _final(runs_dir: Path, name: str) -> float | None:
    """A run's final validation loss; ``inf`` when it diverged, None when it has not finished."""
    d = runs_dir / name
    status = rundir.state(d)
    if status == "diverged":
        return math.inf
    if status != "done":
        return None
    return float(rundir.read_json(d / rundir.SUMMARY)["final_val_loss"])


def _grow(lrs: list[float], losses: dict[float, list[float | None]], factor: float) -> float | None:
    """The next lr to try past an edge winner, or None when the best lr is inside (or results are missing)."""
    if any(v is None for vs in losses.values() for v in vs):
        return None
    try:
        pick = stats.pick_lr({lr: vs for lr, vs in losses.items()})
    except ValueError:  # every lr diverged: go lower
        return min(lrs) / factor
    if not pick.at_edge:
        return None
    return min(lrs) / factor if pick.lr == min(lrs) else max(lrs) * factor


def run_study(spec: SweepSpec, plan: StudyPlan, stored: dict, out: str | Path, jobs: int = 1,
              dry_run: bool = False, train_cmd: tuple[str, ...] | None = None, quiet: bool = False) -> int:
    """Run the three phases of the module docstring into ``out``; returns 0, or 1 if a run failed."""
    out = Path(out)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    if dry_run:
        say("phase 1 (the grid); phases 2-3 depend on its results")
        return run_sweep(spec, out, jobs=jobs, dry_run=True, train_cmd=train_cmd)
    out.mkdir(parents=True, exist_ok=True)
    sweepdir.write_spec(out, stored)
    runs_dir = out / "runs"
    rc = 0
    if plan.lr_grids is None:
        rc = run_sweep(spec, out, jobs=jobs, train_cmd=train_cmd, report=False, quiet=quiet, record_spec=False)
    tuning = list(dict(spec.axes)[SEED])
    groups: dict[tuple, dict[str, list[float]]] = defaultdict(dict)
    examples: dict[tuple, Run] = {}
    axis_value: dict[str, Any] = {}  # a strategy's (or variant's) value on the strategy axis
    for run in expand(spec):
        cell, strategy = _cell(run), run.cfg.strategy
        examples.setdefault(cell, run)
        axis_value[strategy] = run.values[STRATEGY]
        groups[cell].setdefault(strategy, [])
        if run.values[LR] not in groups[cell][strategy]:
            groups[cell][strategy].append(run.values[LR])
    if plan.lr_grids is not None:  # phase 1, each strategy on its own lrs
        for cell, by_strategy in groups.items():
            for label in by_strategy:
                by_strategy[label] = list(plan.lr_grids[label])
                rc |= run_sweep(narrowed(spec, examples[cell], axis_value[label], by_strategy[label], tuning), out,
                                jobs=jobs, train_cmd=train_cmd, report=False, quiet=quiet, record_spec=False)
    tuned: dict[tuple, dict[str, float]] = defaultdict(dict)  # cell -> strategy label -> its tuned lr
    for cell, by_strategy in groups.items():
        for label, lrs in by_strategy.items():
            strategy = axis_value[label]
            for _ in range(plan.max_extensions):
                sub = narrowed(spec, examples[cell], strategy, lrs, tuning)
                losses = {lr: [] for lr in lrs}
                for run in expand(sub):
                    losses[run.values[LR]].append(_final(runs_dir, run.name))
                nxt = _grow(lrs, losses, plan.extend)
                if nxt is None:
                    break
                nxt = float(f"{nxt:.6g}")
                say(f"study: {label} in {dict(cell) or 'the cell'}: best lr at the edge of {sorted(lrs)}; adding "
                    f"{nxt:g}")
                lrs.append(nxt)
                rc |= run_sweep(narrowed(spec, examples[cell], strategy, [nxt], tuning), out, jobs=jobs,
                                train_cmd=train_cmd, report=False, quiet=quiet, record_spec=False)
            losses = {lr: [_final(runs_dir, r.name)
                           for r in expand(narrowed(spec, examples[cell], strategy, [lr], tuning))]
                      for lr in lrs}
            if any(v is None for vs in losses.values() for v in vs):
                continue
            try:
                best = stats.pick_lr(losses).lr
            except ValueError:
                continue
            tuned[cell][label] = best
            if plan.confirm_seeds:
                rc |= run_sweep(narrowed(spec, examples[cell], strategy, [best], plan.confirm_seeds), out,
                                jobs=jobs, train_cmd=train_cmd, report=False, quiet=quiet, record_spec=False)
    if plan.target_halfwidth is not None:
        seeds = list(dict.fromkeys(tuning + plan.confirm_seeds))
        for cell, lr_of in tuned.items():
            rc |= _add_seeds(spec, plan, out, examples[cell], lr_of, {k: axis_value[k] for k in lr_of}, seeds,
                             jobs, train_cmd, quiet, say)
    from scalevec.experiments.report import write_report

    try:
        write_report(out, quiet=quiet)
    except (ValueError, FileNotFoundError) as e:
        say(f"no report: {e}")
    return 1 if rc else 0


def _add_seeds(spec: SweepSpec, plan: StudyPlan, out: Path, example: Run, lr_of: dict[str, float],
               value_of: dict[str, Any], seeds: list[int], jobs: int, train_cmd, quiet: bool, say) -> int:
    """Phase 4 for one cell: grow every strategy's seeds (at its tuned lr ``lr_of``) until the paired
    differences to the baseline plan a half-width of ``plan.target_halfwidth`` or ``plan.max_seeds`` is reached.
    Deterministic from the results on disk, so a rerun makes the same decisions. Returns run_sweep's rc."""
    if spec.baseline not in lr_of or len(lr_of) < 2:
        return 0
    rc, runs_dir = 0, out / "runs"
    while len(seeds) < plan.max_seeds:
        finals = {}
        for label, lr in lr_of.items():
            finals[label] = [_final(runs_dir, r.name)
                             for r in expand(narrowed(spec, example, value_of[label], [lr], seeds))]
        if any(v is None or not math.isfinite(v) for vs in finals.values() for v in vs):
            return rc  # a run is missing or diverged: the report says so; no plan from it
        need = 2
        for label, vs in finals.items():
            if label != spec.baseline:
                diffs = [a - b for a, b in zip(vs, finals[spec.baseline])]
                need = max(need, stats.seeds_for_halfwidth(diffs, plan.target_halfwidth, max_seeds=plan.max_seeds)
                           or plan.max_seeds)
        if need <= len(seeds):
            return rc
        new = [max(seeds) + 1 + i for i in range(need - len(seeds))]
        say(f"study: {len(seeds)} seeds plan a half-width above {plan.target_halfwidth:g} nats; adding seeds "
            f"{new[0]}-{new[-1]} ({need} in all)")
        for label, lr in lr_of.items():
            rc |= run_sweep(narrowed(spec, example, value_of[label], [lr], new), out, jobs=jobs,
                            train_cmd=train_cmd, report=False, quiet=quiet, record_spec=False)
        seeds = seeds + new
    return rc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="study YAML file: a sweep file with a 'study' section (see sweeps/study-*.yaml)")
    p.add_argument("--out", help="output folder (default runs/<name>); rerun the command to resume")
    p.add_argument("--dry-run", action="store_true", help="print the first phase's runs, train nothing")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time")


def run(args: argparse.Namespace) -> int:
    spec, plan, stored = parse(load_yaml(args.spec), where=str(args.spec))
    return run_study(spec, plan, stored, args.out or f"runs/{spec.name}", jobs=args.jobs, dry_run=args.dry_run)


__all__ = ["StudyPlan", "narrowed", "parse", "run_study"]
