"""``scalevec study``: learning-rate tuning a reviewer accepts, on top of ``sweep`` (DESIGN.md §9).

A study file is a sweep file (``sweep_spec.py``) whose grid has an ``lr`` axis and a ``seed`` axis (the
tuning seeds, usually ``[0]``), plus a ``study`` section::

    study:
      extend: 2.0          # factor of each step past a grid edge (the grid is spaced by this factor)
      max_extensions: 4    # per strategy and cell; the report warns if the best lr is still at an edge
      confirm_seeds: [1, 2]   # seeds added at each strategy's tuned lr, per cell
      target_halfwidth: 0.015 # optional: then add seeds until each Δ's 95 % interval is planned this narrow
      max_seeds: 20           # ... but never past this many seeds per strategy (with target_halfwidth)
      halfwidth_on: held-out  # optional: the target is for Δ on the seeds after the tuning seeds (protocol v3)
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
   (a ladder whose rungs can resolve the paper's 0.015-0.03 nats); with ``halfwidth_on: held-out``
   the differences and the count are those of the held-out seeds, the seeds after the tuning seeds, on
   which protocol v3 reports Δ (the tuning seeds' Δ carries the winner's curse); the default,
   ``all``, plans over every seed.

The report (``report.py``) picks each strategy's lr on the tuning seeds (the seeds every lr value has)
and averages every seed at that lr, so the added seeds confirm the pick without re-choosing it.
The study's spec is stored as the folder's spec (``sweepdir``); the follow-up grids are not.

The corpus is the ``base`` config's ``data.source``, as in ``scalevec train --data`` (a relative path is read
beside the study file); ``sweeps/examples/study-own-corpus.yaml`` is a complete study on a small text file
(``HELP`` below is what ``scalevec study --help`` adds). ``--dry-run`` prints the whole plan (``plan_text``):
phase 1's runs, and phases 2-4 at their worst case, with run counts and a time estimate.
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scalevec.config import SEED_LIMIT
from scalevec.config.files import load_yaml
from scalevec.config.run_budget import run_tokens, total_steps
from scalevec.config.typed import Fields, bad_input, is_number, read_number, short, yaml_number
from scalevec.experiments import stats, sweepdir
from scalevec.experiments.progress import StudyScope, format_seconds
from scalevec.experiments.study_grid import LR, SEED, STRATEGY, cell_of, grid_cells, narrowed, phase1_runs
from scalevec.experiments.sweep import check_jobs, check_sources, dry_run_text, measured_rate, run_sweep
from scalevec.experiments.sweep_grid import Run, expand, run_params, run_status
from scalevec.experiments.sweep_spec import SweepSpec, spec_from_dict, strategy_label
from scalevec.training import rundir

STUDY_KEYS = ("extend", "max_extensions", "confirm_seeds", "target_halfwidth", "max_seeds", "halfwidth_on",
              "lr_grids")
HALFWIDTH_ON = ("all", "held-out")  # which seeds' Δ target_halfwidth plans (phase 4)


@dataclass
class StudyPlan:
    """The parsed ``study`` section: step factor, extension limit, confirmation seeds, and the optional
    interval target (nats) with its seed cap."""

    extend: float = 2.0
    max_extensions: int = 4
    confirm_seeds: list[int] = field(default_factory=lambda: [1, 2])
    target_halfwidth: float | None = None
    max_seeds: int = 20
    halfwidth_on: str = "all"  # or "held-out": plan the interval of Δ on the seeds after the tuning seeds
    lr_grids: dict[str, list[float]] | None = None  # strategy label -> its phase-1 lrs


EXTEND_MOST = 100.0  # study.extend: a factor past 100 leaves the lr range any run trains at in one extension


def _lr_grids(grids: Any, labels: list[str], where: str) -> dict[str, list[float]]:
    """``lr_grids``: every strategy label of the grid to a non-empty list of distinct finite lrs > 0."""
    like = "{" + ", ".join(f"{s}: [1.0e-3, 2.0e-3]" for s in labels) + "}"
    named = sorted(map(str, grids)) if isinstance(grids, dict) else []
    missing, extra = sorted(set(labels) - set(named)), sorted(set(named) - set(labels))
    if not isinstance(grids, dict) or missing or extra:
        got = (f"got {short(grids)}" if not isinstance(grids, dict) else f"missing {', '.join(missing)}" if missing
               else f"{', '.join(extra)} not a strategy of the grid")
        raise ValueError(f"{where}.study.lr_grids must map every strategy of the grid ({', '.join(labels)}) and no "
                         f"other to its lrs, like {like}; {got}")
    out = {}
    for k, lrs in grids.items():
        values = [yaml_number(x) for x in lrs] if isinstance(lrs, list) else []
        if not values or not all(is_number(x, above=0) for x in values) or len(set(values)) < len(values):
            raise bad_input(f"{where}.study.lr_grids.{k}", "a non-empty list of distinct finite lrs > 0", lrs,
                            like="[1.0e-3, 2.0e-3]")
        out[str(k)] = [float(x) for x in values]
    return out


def parse(data: dict, where: str = "study") -> tuple[SweepSpec, StudyPlan, dict]:
    """Split a study mapping into its sweep spec, its plan and the mapping to store. ``ValueError`` (one line naming
    ``study.KEY``, the value and what it must be) on an unknown key, a value of the wrong kind or out of range, a
    missing ``lr``/``seed``/``strategy`` axis, or confirmation seeds among the tuning seeds."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping (a sweep file with a 'study' section)")
    plan_data = data.get("study")
    plan_data = {} if plan_data is None else plan_data
    if not isinstance(plan_data, dict):
        raise ValueError(f"{where}.study must be a mapping with keys among {', '.join(STUDY_KEYS)}; "
                         f"got {short(plan_data)}")
    unknown = sorted(map(str, set(plan_data) - set(STUDY_KEYS)))
    if unknown:
        raise ValueError(f"{where}.study has unknown key(s) {', '.join(unknown)}; use keys among "
                         f"{', '.join(STUDY_KEYS)}")
    spec = spec_from_dict({k: v for k, v in data.items() if k != "study"}, where)
    fields = Fields(plan_data, f"{where}.study.")
    plan = StudyPlan(fields.number("extend", 2.0, above=1, most=EXTEND_MOST, text=True, like="2.0"),
                     fields.int("max_extensions", 4, least=0),
                     fields.ints("confirm_seeds", [1, 2], least=0, most=SEED_LIMIT - 1, distinct=True,
                                 rule="a list of distinct seeds >= 0 and below 2**63", like="[1, 2] (or [])"),
                     None if plan_data.get("target_halfwidth") is None  # null: no target, as when absent
                     else fields.number("target_halfwidth", above=0, text=True, like="0.015 nats"),
                     fields.int("max_seeds", 20, least=2))
    on = fields.choice("halfwidth_on", HALFWIDTH_ON, "all")
    if on != "all" and plan.target_halfwidth is None:
        raise ValueError(f"{where}.study.halfwidth_on plans target_halfwidth's seeds: add target_halfwidth "
                         f"(like 0.015) or remove halfwidth_on")
    plan.halfwidth_on = on
    grids = plan_data.get("lr_grids")
    if grids is not None:
        plan.lr_grids = _lr_grids(grids, [strategy_label(v) for v in dict(spec.axes).get(STRATEGY, [])], where)
    keys = [k for k, _ in spec.axes]
    for key, alias in ((LR, "lr"), (SEED, "seed"), (STRATEGY, "strategy")):
        if key not in keys:
            raise ValueError(f"{where}.grid needs a '{alias}' axis for a study (e.g. {alias}: [...])")
    if spec.tune not in ([], [LR]) or (spec.tune == [] and len(dict(spec.axes)[LR]) > 1):
        raise ValueError(f"{where}.tune must be [optim.lr] for a study")
    tuning = list(dict(spec.axes)[SEED])
    if set(tuning) & set(plan.confirm_seeds):
        raise ValueError(f"{where}.study.confirm_seeds {plan.confirm_seeds} overlap the grid's seeds; use other seeds")
    n_seeds = len(tuning) + len(plan.confirm_seeds)
    if plan.target_halfwidth is not None and plan.max_seeds < n_seeds:
        raise ValueError(f"{where}.study.max_seeds must be >= the {n_seeds} seeds the study runs anyway (grid seeds "
                         f"{tuning} + confirm_seeds {plan.confirm_seeds}), like 20; got {plan.max_seeds}")
    spec = replace(spec, tune=[LR])
    stored_plan = {"extend": plan.extend, "max_extensions": plan.max_extensions, "confirm_seeds": plan.confirm_seeds}
    if plan.target_halfwidth is not None:
        stored_plan |= {"target_halfwidth": plan.target_halfwidth, "max_seeds": plan.max_seeds}
        if plan.halfwidth_on != "all":
            stored_plan["halfwidth_on"] = plan.halfwidth_on
    if plan.lr_grids is not None:
        stored_plan["lr_grids"] = plan.lr_grids
    stored = {**spec.to_dict(), "study": stored_plan}
    return spec, plan, stored


def _final(runs_dir: Path, name: str) -> float | None:
    """A run's final validation loss; ``inf`` when it diverged, None when it has not finished."""
    d = runs_dir / name
    status = rundir.state(d)
    if status == "diverged":
        return math.inf
    if status != "done":
        return None
    return float(rundir.read_summary(d, fix="retrain the run, or delete its DONE to train it again")["final_val_loss"])


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


def _phases(spec: SweepSpec, plan: StudyPlan, runs_dir: Path):
    """``(phase 1's runs, their statuses on disk, phases, cells)`` where each phase is ``(label, runs to train at
    most, FLOPs at 6·N·D, is an upper bound)``: phase 1 as it stands on disk, later phases at their worst case
    counted from scratch (``plan_text``)."""
    first = phase1_runs(spec, plan.lr_grids)
    statuses = [run_status(r, runs_dir) for r in first]
    tuning = list(dict(spec.axes)[SEED])
    work = {(cell_of(r), r.cfg.strategy): 6.0 * run_params(r.cfg) * run_tokens(r.cfg) for r in first}  # one run's
    n_pairs = len(work)  # (cell, strategy) pairs; lr and seed change neither N nor D
    seeds0 = len(dict.fromkeys(tuning + plan.confirm_seeds))
    # phase 4 adds seeds in cells with the baseline and another strategy, to each of them, up to max_seeds
    cells = {c for c, _ in work}
    p4_pairs = [(c, s) for c, s in work if spec.baseline in {x for cc, x in work if cc == c}
                and sum(cc == c for cc, _ in work) > 1] if plan.target_halfwidth is not None else []
    p4_each = max(0, plan.max_seeds - seeds0)
    todo1 = [r for r, s in zip(first, statuses) if s not in ("done", "diverged")]
    phases = [
        ("phase 1, the grid" + (" (each strategy on its lr_grids)" if plan.lr_grids else ""), len(todo1),
         sum(work[(cell_of(r), r.cfg.strategy)] for r in todo1), False),
        (f"phase 2, lr extensions (up to {plan.max_extensions} per strategy and cell, × {len(tuning)} tuning "
         f"seed(s), only while a best lr sits at a grid edge)", plan.max_extensions * len(tuning) * n_pairs,
         plan.max_extensions * len(tuning) * sum(work.values()), True),
        (f"phase 3, confirmation seeds {plan.confirm_seeds} at each strategy's tuned lr",
         len(plan.confirm_seeds) * n_pairs, len(plan.confirm_seeds) * sum(work.values()), True),
    ]
    if plan.target_halfwidth is not None:
        phases.append((f"phase 4, seeds until a ±{plan.target_halfwidth:g}-nat interval (up to {plan.max_seeds} "
                       f"per strategy and cell, {p4_each} past the first {seeds0})", p4_each * len(p4_pairs),
                       p4_each * sum(work[k] for k in p4_pairs), True))
    return first, statuses, phases, cells


def study_scope(spec: SweepSpec, plan: StudyPlan, out: str | Path, jobs: int = 1) -> StudyScope:
    """The whole study's bound for the live progress line (``progress.StudyScope``): the FLOPs ``plan_text``
    counts, and the folder's measured rate shared by ``jobs`` (NaN when no run has finished)."""
    runs_dir = Path(out) / "runs"
    flops = sum(p[2] for p in _phases(spec, plan, runs_dir)[2])
    rate, n = measured_rate(runs_dir)
    return StudyScope(left=flops, rate=rate / jobs if n else math.nan)


def plan_text(spec: SweepSpec, plan: StudyPlan, out: str | Path, step_time: float | None = None,
              jobs: int = 1) -> str:
    """The whole study before it runs (``study --dry-run``): phase 1's runs with their status on disk, then
    phases 2-4 at their worst case (every lr grown ``max_extensions`` times, confirmation seeds at one lr,
    seeds up to ``max_seeds``), each with run counts and FLOPs (6·N·D), and a time estimate. Later phases
    are counted from scratch: any of their runs already on disk is skipped, so the work left is at most this.

    Time: every run's FLOPs at the seconds per FLOP of the folder's finished runs (``measured_rate``), or,
    with ``step_time`` (seconds per optimizer step of phase 1's first run, e.g. from a short ``scalevec
    train``), at the rate that implies; without either, no time. Raises ``ValueError`` like ``run_sweep``
    (an invalid grid, a run on disk made with another config)."""
    out = Path(out)
    runs_dir = out / "runs"
    first, statuses, phases, cells = _phases(spec, plan, runs_dir)
    rate, source = math.nan, ""
    if step_time is not None and first:
        r0 = first[0]
        rate = step_time / (6.0 * run_params(r0.cfg) * run_tokens(r0.cfg) / total_steps(r0.cfg))
        source = f"--step-time {step_time:g} s per step of {r0.name}"
    else:
        measured, n = measured_rate(runs_dir)
        if n:
            rate, source = measured, f"the rate of the {n} finished run(s) in {runs_dir}"
    n_runs, n_flops = sum(p[1] for p in phases), sum(p[2] for p in phases)
    names = {r.name for r in first}
    n_other = sum(d.is_dir() and d.name not in names and rundir.state(d) in ("done", "diverged")
                  for d in (runs_dir.iterdir() if runs_dir.is_dir() else []))
    bound = "at most " if any(p[1] for p in phases if p[3]) else ""

    def when(flops: float, most: str = "") -> str:
        return f", {most}about {format_seconds(flops * rate)}" if math.isfinite(rate) else ""

    lines = [f"study {spec.name}: the whole plan; phase 1 is known now, later phases depend on its results and are "
             f"counted at their worst case (an upper bound)", "",
             f"{phases[0][0]}: {len(first)} runs, {phases[0][1]} to train{when(phases[0][2])}",
             dry_run_text(first, statuses), ""]
    lines += [f"{label}: at most {n} runs{when(f, 'at most ')}" for label, n, f, _ in phases[1:]]
    timing = (f" one run at a time, at {source}" + (f" (--jobs {jobs}: up to {jobs}x less)" if jobs > 1 else "")
              if math.isfinite(rate) else
              f"; no time estimate (no finished run in {runs_dir} to measure a rate from: pass --step-time SECONDS)")
    lines += ["", f"whole study: {bound}{n_runs} runs to train in {len(cells)} cell(s), {n_flops:.2e} FLOP at "
              f"6·N·D{when(n_flops, bound)}{timing}"
              + (f"; {n_other} finished run(s) in the folder besides phase 1's are not subtracted: later phases reuse "
                 f"those they need, so the work left is at most this" if bound and n_other else "")]
    return "\n".join(lines)


def run_study(spec: SweepSpec, plan: StudyPlan, stored: dict, out: str | Path, jobs: int = 1,
              dry_run: bool = False, train_cmd: tuple[str, ...] | None = None, quiet: bool = False,
              step_time: float | None = None, deadline: float | None = None) -> int:
    """Run the phases of the module docstring into ``out``; returns 0, or 1 if a run failed or was skipped. ``dry_run``
    prints the whole plan (``plan_text``, with ``step_time`` for its time estimate) and trains nothing. The study
    holds ``out/.lock`` while it trains: ``rundir.RunLocked`` (naming the holder's PID) when another study holds it.
    Each step of a phase trains every strategy's runs in one sweep (in turn by strategy, ``sweep.interleaved``).
    ``deadline`` (``time.time()`` seconds; ``--budget-s``, a GPU slice): no run starts that would end after it,
    the running ones checkpoint at it (``run_sweep``), and a rerun of the same command resumes."""
    out = Path(out)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    check_jobs(jobs)  # phase 1's sweep checks it too, but only after the folder, its lock and spec are written
    sweepdir.check_folder(out, spec.file)  # before the study's spec is written there
    # phase 1's runs still to train (later phases' runs are checked by their sweeps, as they start)
    check_sources([r for r in phase1_runs(spec, plan.lr_grids)
                   if run_status(r, out / "runs") not in ("done", "diverged")])
    if dry_run:
        print(plan_text(spec, plan, out, step_time=step_time, jobs=jobs))
        return 0
    # one study per folder: a second one on the same --out is refused with the first's PID (rundir.RunLocked, exit 2),
    # as `train` is; otherwise each would decide its phases from runs the other holds and counts as failed
    out.mkdir(parents=True, exist_ok=True)
    lock = rundir.RunLock(out).acquire()
    scope = None

    def train(subs: list[SweepSpec]) -> int:  # one step of a phase, every strategy's runs at once, into the folder
        runs = [r for sub in subs for r in expand(sub)]
        return run_sweep(spec, out, jobs=jobs, train_cmd=train_cmd, report=False, tables=True, quiet=quiet,
                         record_spec=False, scope=scope, runs=runs, deadline=deadline)

    def phases() -> int:
        nonlocal scope
        if not quiet:  # the whole study's bound; every progress line then repeats what is left of it (``study ≤``)
            say(plan_text(spec, plan, out, step_time=step_time, jobs=jobs).splitlines()[-1])
        scope = study_scope(spec, plan, out, jobs)
        sweepdir.write_spec(out, stored)
        runs_dir = out / "runs"
        tuning = list(dict(spec.axes)[SEED])
        groups, examples, axis_value = grid_cells(spec)
        if plan.lr_grids is None:
            rc = train([spec])
        else:  # phase 1, each strategy on its own lrs, all in one step
            for by_strategy in groups.values():
                for label in by_strategy:
                    by_strategy[label] = list(plan.lr_grids[label])
            rc = train([narrowed(spec, examples[cell], axis_value[label], lrs, tuning)
                        for cell, by_strategy in groups.items() for label, lrs in by_strategy.items()])
        # phase 2 in rounds: each round adds, to every strategy and cell whose best lr is at an edge, the next lr
        # past it, and trains all of them at once; a strategy's choices depend on its own runs alone, so they are
        # the ones a strategy-by-strategy order makes
        growing = [(cell, label) for cell, by_strategy in groups.items() for label in by_strategy]
        for _ in range(plan.max_extensions):
            steps = []
            for cell, label in list(growing):
                lrs = groups[cell][label]
                losses = {lr: [] for lr in lrs}
                for run in expand(narrowed(spec, examples[cell], axis_value[label], lrs, tuning)):
                    losses[run.values[LR]].append(_final(runs_dir, run.name))
                nxt = _grow(lrs, losses, plan.extend)
                if nxt is None:
                    growing.remove((cell, label))
                    continue
                nxt = float(f"{nxt:.6g}")
                say(f"study: {label} in {dict(cell) or 'the cell'}: best lr at the edge of {sorted(lrs)}; adding "
                    f"{nxt:g}")
                lrs.append(nxt)
                steps.append(narrowed(spec, examples[cell], axis_value[label], [nxt], tuning))
            if not steps:
                break
            rc |= train(steps)
        tuned: dict[tuple, dict[str, float]] = defaultdict(dict)  # cell -> strategy label -> its tuned lr
        confirm = []
        for cell, by_strategy in groups.items():
            for label, lrs in by_strategy.items():
                strategy = axis_value[label]
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
                    confirm.append(narrowed(spec, examples[cell], strategy, [best], plan.confirm_seeds))
        if confirm:
            rc |= train(confirm)
        if plan.target_halfwidth is not None:
            seeds = list(dict.fromkeys(tuning + plan.confirm_seeds))
            for cell, lr_of in tuned.items():
                rc |= _add_seeds(spec, plan, out, examples[cell], lr_of, {k: axis_value[k] for k in lr_of}, seeds,
                                 tuning, train, say)
        from scalevec.experiments.report import write_report

        try:
            write_report(out, quiet=quiet)
        except (ValueError, FileNotFoundError) as e:
            say(f"no report: {e}")
        return 1 if rc else 0

    try:
        return phases()
    finally:
        lock.release()


def _add_seeds(spec: SweepSpec, plan: StudyPlan, out: Path, example: Run, lr_of: dict[str, float],
               value_of: dict[str, Any], seeds: list[int], tuning: list[int], train, say) -> int:
    """Phase 4 for one cell: grow every strategy's seeds (at its tuned lr ``lr_of``) until the paired
    differences to the baseline plan a half-width of ``plan.target_halfwidth`` or ``plan.max_seeds`` is reached;
    with ``plan.halfwidth_on == "held-out"`` only the differences on seeds outside ``tuning`` count, and the
    tuning seeds are added to the count they plan.
    ``train(sub_specs)`` trains a step, every strategy at once, into the study's folder (``run_study``'s).
    Deterministic from the results on disk, so a rerun makes the same decisions. Returns ``run_sweep``'s rc."""
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
        need = seeds_needed(finals, spec.baseline, seeds, tuning, plan)
        if need <= len(seeds):
            return rc
        new = [max(seeds) + 1 + i for i in range(need - len(seeds))]
        which = "held-out seeds" if plan.halfwidth_on == "held-out" else "seeds"
        say(f"study: the {which} so far plan a half-width above {plan.target_halfwidth:g} nats; adding seeds "
            f"{new[0]}-{new[-1]} ({need} in all)")
        rc |= train([narrowed(spec, example, value_of[label], [lr], new) for label, lr in lr_of.items()])
        seeds = seeds + new
    return rc


def seeds_needed(finals: dict[str, list[float]], baseline: str, seeds: list[int], tuning: list[int],
                 plan: StudyPlan) -> int:
    """Phase 4's plan for one cell: how many seeds each strategy should have, from ``finals`` (strategy label ->
    final loss per seed, in the order of ``seeds``; the baseline's under ``baseline``). Each other strategy's
    paired differences to the baseline plan ``plan.target_halfwidth`` (``stats.seeds_for_halfwidth``); with
    ``plan.halfwidth_on == "held-out"`` only the seeds outside ``tuning`` are differences, and the tuning seeds
    are added to the count they plan. At most ``plan.max_seeds``; at least the tuning seeds + 2."""
    counted = [i for i, s in enumerate(seeds) if plan.halfwidth_on == "all" or s not in tuning]
    skipped = len(seeds) - len(counted)
    need = skipped + 2
    for label, vs in finals.items():
        if label != baseline and len(counted) >= 2:
            diffs = [vs[i] - finals[baseline][i] for i in counted]
            n = stats.seeds_for_halfwidth(diffs, plan.target_halfwidth, max_seeds=max(2, plan.max_seeds - skipped))
            need = max(need, plan.max_seeds if n is None else skipped + n)
    return min(need, max(plan.max_seeds, skipped + 2))


HELP = """\
a study file is a sweep file (scalevec sweep) plus a `study:` section:

  name: own-corpus
  base:                                    # every run's config (any field of `scalevec train --help`)
    preset: tiny
    data: {source: corpus.txt, tokenizer: bytes}   # your corpus: a .txt file (documents split by two
                                           # blank lines), a folder of .txt, .jsonl/.parquet ("text"), hf:NAME;
                                           # a relative path is read beside the study file
  grid:                                    # crossed axes; a study needs strategy, lr and seed
    strategy: [baseline, unified]
    lr: [3.0e-3, 1.0e-2]                   # tuned per strategy on the tuning seeds
    seed: [0]                              # the tuning seeds
  study:
    extend: 2.0                            # a best lr at a grid edge gets the next lr past it (× or ÷ 2),
    max_extensions: 4                      #   at most this many times per strategy and cell
    confirm_seeds: [1, 2]                  # then these seeds at each strategy's tuned lr
    target_halfwidth: 0.015                # optional: then seeds until each delta's 95 % interval is this
    max_seeds: 20                          #   narrow (nats), at most this many seeds
    halfwidth_on: held-out                 # optional: for delta on the seeds after the tuning seeds (default all)
    lr_grids: {baseline: [...], unified: [...]}   # optional: each strategy's own phase-1 lrs

Example: sweeps/examples/study-own-corpus.yaml (8 tiny runs at most, 40 CPU-seconds).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # HELP's layout is the file's
    p.epilog = HELP
    p.add_argument("spec", help="study YAML file: a sweep file with a 'study' section (below; sweeps/study-*.yaml)")
    p.add_argument("--out", help="output folder (default runs/<name>); rerun the command to resume")
    p.add_argument("--dry-run", action="store_true",
                   help="print the whole plan, phase by phase (phase 1's runs; later phases at their worst case), "
                        "with run counts and a time estimate; train nothing")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (default 1)")
    p.add_argument("--step-time", type=float, metavar="SECONDS",
                   help="seconds per optimizer step of the first run, for the time estimate (default: measured "
                        "from the folder's finished runs)")
    p.add_argument("--budget-s", type=float, metavar="SECONDS",
                   help="a slice: start no run that would end after this many seconds (at the folder's measured "
                        "rate) and checkpoint the running ones then; rerun to resume (scripts/gpu_ladder.sh)")


def run(args: argparse.Namespace) -> int:
    spec, plan, stored = parse(load_yaml(args.spec), where=str(args.spec))
    spec = replace(spec, file=str(args.spec))  # its relative data paths resolve beside it (sweep_spec.spec_paths)
    # finite and within a timer's reach: an inf budget (or 1e12 s) passed `> 0` and made a deadline whose timer thread
    # died with an OverflowError traceback, leaving the slice without an end
    if args.step_time is not None:
        read_number(args.step_time, "--step-time", above=0, like=0.1, fix="give the seconds per optimizer step")
    if args.budget_s is not None:
        read_number(args.budget_s, "--budget-s", above=0, most=threading.TIMEOUT_MAX, like=480,
                    fix="give the slice's length in seconds")
    deadline = None if args.budget_s is None else time.time() + args.budget_s
    return run_study(spec, plan, stored, args.out or f"runs/{spec.name}", jobs=args.jobs, dry_run=args.dry_run,
                     step_time=args.step_time, deadline=deadline)


__all__ = ["StudyPlan", "measured_rate", "parse", "plan_text", "run_study", "seeds_needed"]
