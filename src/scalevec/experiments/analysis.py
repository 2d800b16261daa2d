"""Run records -> the comparison: cells, each strategy at its tuned value, paired deltas, scaling fits (DESIGN.md §9).

A cell is the runs that differ only in strategy, tuned value and seed. In each, every strategy is taken at
its own best value of the tuned axis (``stats.pick_lr`` on the seeds every value was run with), compared
with the baseline by seed (``stats.paired_delta``) and by token efficiency on the seed-averaged
validation curves; cells that differ only in size get power-law fits and compute multipliers at the measured
sizes only (none is extrapolated beyond them: a fit is evidence only inside the sizes it was fitted on). Numbers
only: tables, CSV and figures are built from the ``Analysis`` elsewhere (``tables``, ``frames``, ``figures``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalevec.config import EXECUTION_FIELDS
from scalevec.config.typed import is_number
from scalevec.experiments import stats
from scalevec.experiments.labels import Labeler, is_size_key, si, varying_keys
from scalevec.experiments.records import RunRecord

EXCLUDED_PREFIXES = ("strategy", "scale.", "train.seed")  # what varies inside a cell


@dataclass
class StrategyResult:
    """One strategy in one cell, at its chosen (tuned) value; ``runs`` are its finished runs there."""

    strategy: str
    runs: list[RunRecord]
    pick: stats.LrPick | None = None
    tune_seeds: list[int] = field(default_factory=list)  # the seeds ``pick`` averaged (those every value has)
    loss_mean: float = math.nan
    loss_std: float = math.nan
    bpb_mean: float = math.nan
    delta: stats.PairedDelta | None = None
    token_efficiency: float = math.nan
    token_efficiency_is_bound: bool = False  # reached at the first evaluation: the true value is >= this
    params: int = 0
    non_embedding_params: int = 0
    scale_params: int = 0
    extra_params: int = 0
    step_time_s: float = math.nan
    step_time_clock: str = ""  # what step_time_s measured: "cpu" (process time), "wall" or "" (no run timed)
    step_times: dict[str, float] = field(default_factory=dict)  # clock -> mean seconds per step (nan: not logged)
    step_time_ratio: float = math.nan
    # the relative change of the runs' CPU share (cpu_share) against the baseline's: the load they ran under
    cpu_share_change: float = math.nan

    @property
    def losses(self) -> list[float]:
        return [r.final_loss for r in self.runs]


@dataclass
class Cell:
    """Runs that differ only in strategy, tuned value and seed."""

    key: tuple
    label: str
    results: list[StrategyResult]
    tune_key: str | None
    size: str = ""  # the model-size part of the label: a bundle name of the sweep, else the preset


@dataclass
class ScalingResult:
    """Fits of one group of cells that differ only in size (needs >= 3 sizes).

    ``per_size[strategy][i]`` is the compute multiplier at the i-th measured size: the strategy's mean loss there
    read on the baseline's fit, ``(N_b / N)²``. Where ``N_b`` falls outside the measured sizes the fit would be
    read beyond its data, so the value is the bound the data support instead, ``(N_max / N)²`` or
    ``(N_min / N)²``, and ``per_size_side[strategy][i]`` says which (``">"`` or ``"<"``; ``""`` for a point
    value). Nothing is evaluated outside ``[n_min, n_max]``, the smallest and largest measured non-embedding sizes.
    """

    label: str
    sizes: list[tuple[str, Cell]]  # (size label, cell), by increasing baseline size
    fits: dict[str, stats.PowerLawFit]
    shared: dict[str, stats.SharedFit]
    per_size: dict[str, list[float]]  # compute multiplier of each strategy at each measured size (or its bound)
    per_size_side: dict[str, list[str]]  # "" a point value, ">" / "<" a bound (the baseline's N_b outside the range)
    n_min: float
    n_max: float


@dataclass
class Analysis:
    """Everything the report shows; built by ``analyze`` from run records only."""

    name: str
    baseline: str
    cells: list[Cell]
    scaling: list[ScalingResult]
    runs: list[RunRecord]
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # what write_report wrote (names in its folder); [] before
    waiting: set[str] = field(default_factory=set)  # strategies whose lr pick waits for unfinished tuning runs


def _strategy_order(runs: list[RunRecord], spec: dict, baseline: str) -> list[str]:
    present = {r.cfg.strategy for r in runs}
    grid = spec.get("grid") or {}
    order = [str(s) for s in grid.get("strategy", [])] if isinstance(grid.get("strategy"), list) else []
    rest = sorted(present - set(order) - {baseline})
    order = [s for s in order if s in present]
    return ([baseline] if baseline in present and baseline not in order else []) + order + rest


def mean_curve(runs: list[RunRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Seed-averaged validation curve ``(tokens, loss)`` over the eval steps every run has."""
    if not runs:
        return np.array([]), np.array([])
    by_step = [{e["step"]: e for e in r.evals} for r in runs]
    steps = sorted(set.intersection(*(set(b) for b in by_step)))
    tokens = np.array([by_step[0][s]["tokens"] for s in steps], dtype=float)
    loss = np.array([np.mean([b[s]["val_loss"] for b in by_step]) for s in steps], dtype=float)
    return tokens, loss


def _seconds(value: Any) -> float:
    """A summary's time in seconds: a positive finite number, else nan (not logged, a run too short to time, or
    a hand-edited file)."""
    return float(value) if is_number(value, above=0) else math.nan


def _strategy_result(strategy: str, runs: list[RunRecord], tune_key: str | None, warnings: list[str],
                     label: str, not_started: dict[str, list[str]], waiting: set[str]) -> StrategyResult | None:
    finished = [r for r in runs if r.done]
    pick, common = None, set()
    if tune_key is not None:
        # The value is picked on the seeds that every value was run with (a study tunes on seed 0, then adds
        # seeds at the picked value only: those confirm the pick and must not re-choose it).
        seeds_of: dict[float, set[int]] = defaultdict(set)
        for r in runs:
            seeds_of[float(r.flat[tune_key])].add(r.seed)
        common = set.intersection(*seeds_of.values()) if seeds_of else set()
        # An unfinished tuning run blocks the pick (as ``scalevec study`` waits for it): its value may still win,
        # and a pick past it would be reported as tuned. A diverged one is a result: its value counts as inf.
        # so do planned runs without a folder (never started, or deleted to retrain): a grid's value they alone
        # hold would otherwise vanish from the pick without a word
        held = sorted(r.name for r in runs if r.seed in common and r.status == "unfinished")
        held += sorted({m for r in runs for m in not_started.get(r.name, [])} - set(held))
        if held:
            waiting.add(strategy)
            waits_for = (f"no result until its {len(held)} unfinished or not yet started run(s) at its one "
                         f"{tune_key} finish" if len(seeds_of) == 1 else  # a compare at the study's tuned lrs
                         f"no {tune_key} pick until its {len(held)} unfinished or not yet started tuning run(s) finish")
            warnings.append(f"[{label}] {strategy}: {waits_for} ({', '.join(held)})")
            return None
        by_value: dict[float, list[float]] = defaultdict(list)
        for r in runs:
            if r.seed in common:
                by_value[float(r.flat[tune_key])].append(r.final_loss)
        try:
            pick = stats.pick_lr(by_value)
        except ValueError as e:  # every value diverged
            warnings.append(f"[{label}] {strategy}: {e}")
            return None
        if pick.warning:
            warnings.append(f"[{label}] {strategy}: {pick.warning}")
        finished = [r for r in finished if float(r.flat[tune_key]) == pick.lr]
    if not finished:
        return None
    finished.sort(key=lambda r: r.seed)
    res = StrategyResult(strategy, finished, pick, sorted(common))
    res.loss_mean, res.loss_std = stats.mean_std(res.losses)
    res.bpb_mean = float(np.mean([r.summary["final_val_bpb"] for r in finished]))
    s = finished[0].summary
    res.params, res.non_embedding_params = int(s["params"]), int(s["non_embedding_params"])
    res.scale_params = int(s.get("scale_params", 0))
    # step time does not depend on lr or seed: average every finished run of the strategy in the cell, on both
    # clocks; _compare_to_baseline picks one clock for the whole cell (a nan: a run that logged none)
    done = [r.summary for r in runs if r.done]
    res.step_times = {clock: float(np.mean([_seconds(d.get(key)) for d in done])) if done else math.nan
                      for clock, key in (("cpu", "cpu_time_s"), ("wall", "step_time_s"))}
    res.step_times["share"] = float(np.mean([cpu_share(d) for d in done])) if done else math.nan
    return res


def cpu_share(summary: dict) -> float:
    """CPU seconds per wall second of a run's steps (``cpu_time_s / step_time_s`` of its summary.json; nan when it
    logged either not). The same code with the same threads on a machine as free gets the same share; a share that
    differs between two runs says the load they ran under differed (fewer CPUs to run on, or OpenMP threads
    spin-waiting for them), so their step-time ratio measures the load too."""
    cpu, wall = _seconds(summary.get("cpu_time_s")), _seconds(summary.get("step_time_s"))
    return cpu / wall if wall > 0 and math.isfinite(cpu) else math.nan


# Scale-vector strategies change a step's FLOPs by a few percent (README "Performance": 0.9-1.6x measured): a
# ratio outside this band says the measurement failed (OpenMP spin-waiting under oversubscription inflates CPU
# time: on a shared 2-core machine one baseline ran at 3.04 CPU-s per step against unified's 0.085), not the model.
PLAUSIBLE_STEP_RATIO = (1 / 3, 3.0)


def _compare_to_baseline(results: list[StrategyResult], label: str, warnings: list[str]) -> None:
    base = results[0]
    base_curve = mean_curve(base.runs)
    t_base = stats.tokens_to_reach(*base_curve, base.loss_mean) if base_curve[0].size else math.nan
    base_by_seed = {r.seed: r.final_loss for r in base.runs}
    # one clock for the cell: CPU (process) time per step where every run logged it (wall clock on a
    # shared machine measures the neighbours too, it showed `none` 0.35x); else the wall clock (older runs)
    clock = next((c for c in ("cpu", "wall") if all(r.step_times.get(c, math.nan) > 0 for r in results)), "")
    for res in results:
        res.extra_params = res.params - base.params
        res.step_time_s = res.step_times.get(clock, math.nan)
        res.step_time_clock = clock
        res.step_time_ratio = res.step_time_s / base.step_time_s if base.step_time_s > 0 else math.nan
        share, base_share = res.step_times.get("share", math.nan), base.step_times.get("share", math.nan)
        res.cpu_share_change = share / base_share - 1 if base_share > 0 else math.nan
        lo, hi = PLAUSIBLE_STEP_RATIO
        if res is not base and clock and not lo <= res.step_time_ratio <= hi:
            warnings.append(f"[{label}] {res.strategy}: step time {res.step_time_ratio:.2f}x the baseline's is not "
                            f"plausible for a scale-vector strategy (the machine was oversubscribed while they ran?); "
                            f"not shown; rerun with fewer --jobs or --threads, or measure with `scalevec bench`")
            res.step_time_ratio = math.nan
        if res is base:
            continue
        seeds = [r.seed for r in res.runs if r.seed in base_by_seed]
        if len(seeds) < len(res.runs) or len(seeds) < len(base.runs):
            warnings.append(f"[{label}] {res.strategy}: seeds differ from the baseline's; paired over {seeds}")
        if seeds:
            mine = {r.seed: r.final_loss for r in res.runs}
            res.delta = stats.paired_delta([base_by_seed[s] for s in seeds], [mine[s] for s in seeds])
        curve = mean_curve(res.runs)
        if curve[0].size and math.isfinite(t_base):
            res.token_efficiency = t_base / stats.tokens_to_reach(*curve, base.loss_mean)
            res.token_efficiency_is_bound = bool(curve[1][0] <= base.loss_mean)


def analyze(runs: list[RunRecord], spec: dict | None = None,
            not_started: dict[str, list[str]] | None = None) -> Analysis:
    """Group runs into cells, pick each strategy's tuned value, compare with the baseline, fit scaling.

    ``spec``: the sweep's ``sweep.yaml`` mapping (``tune``, ``baseline``, ``grid.strategy`` order) or
    None to infer them (tune ``optim.lr`` if it varies; baseline ``baseline`` or the first strategy).
    ``not_started``: a run's name -> the planned runs of its cell and strategy that have no folder
    (``report.not_started``); like an unfinished tuning run, one holds back its strategy's pick.
    """
    spec = spec or {}
    not_started = not_started or {}
    warnings: list[str] = []
    waiting: set[str] = set()
    strategies = {r.cfg.strategy for r in runs}
    baseline = str(spec.get("baseline") or ("baseline" if "baseline" in strategies else min(strategies)))
    order = _strategy_order(runs, spec, baseline)
    if baseline not in strategies:
        warnings.append(f"no run of the baseline strategy {baseline!r}; comparing against {order[0]!r}")
        baseline = order[0]
    varying = varying_keys(runs)
    tune = spec.get("tune")
    tune_key = (tune[0] if tune else None) if tune is not None else ("optim.lr" if "optim.lr" in varying else None)
    # how a run executes (threads, checkpoint interval, compile) never splits a cell: the same experiment
    setting_keys = [k for k in varying if k != tune_key and not k.startswith(EXCLUDED_PREFIXES)
                    and k not in EXECUTION_FIELDS]
    labeler = Labeler(runs, setting_keys, spec)

    groups: dict[tuple, list[RunRecord]] = defaultdict(list)
    for r in runs:
        groups[tuple((k, r.flat.get(k)) for k in setting_keys)].append(r)
    cells = []
    for key, cell_runs in groups.items():
        example = next((r for r in cell_runs if r.done), cell_runs[0])
        label = labeler.label(key, example)
        machines = sorted({r.machine for r in cell_runs if r.done and r.machine})
        if len(machines) > 1:  # e.g. compare reusing runs made under another --jobs/--threads or on another CPU
            warnings.append(f"[{label}] the runs were made on {len(machines)} machine kinds or thread counts "
                            f"(or torch versions) ({'; '.join(machines)}): their losses are not bitwise comparable "
                            f"across those, and step times not at all")
        results = []
        for strategy in order:
            res = _strategy_result(strategy, [r for r in cell_runs if r.cfg.strategy == strategy], tune_key,
                                   warnings, label, not_started, waiting)
            if res is not None:
                results.append(res)
        if not results or results[0].strategy != baseline:
            # a finished baseline run is not enough: its lr must have all its tuning seeds finished to be picked
            warnings.append(f"[{label}] the baseline {baseline!r} has no result yet (no finished run, a tuning run "
                            f"not finished, or every lr diverged: see above); cell skipped")
            continue
        _compare_to_baseline(results, label, warnings)
        cells.append(Cell(key, label, results, tune_key, labeler.size(example)))
    cells.sort(key=lambda c: (c.results[0].non_embedding_params, c.label))
    for status in ("diverged", "unfinished"):
        names = [r.name for r in runs if r.status == status]
        if names:
            why = ("diverged (left out; their lr counts as failed)" if status == "diverged" else
                   "not finished (left out" + ("; one on the tuning seeds holds back its strategy's lr pick)"
                                               if tune_key else ")"))
            warnings.append(f"{len(names)} run(s) {why}: {', '.join(names)}")
    scaling = _scaling(cells, setting_keys, labeler, baseline, warnings)
    return Analysis(str(spec.get("name") or ""), baseline, cells, scaling, runs, warnings, waiting=waiting)


def multiplier_within(base: stats.PowerLawFit, loss: float, n: float, n_min: float, n_max: float) -> tuple[float, str]:
    """Compute multiplier of a strategy with ``n`` parameters at ``loss``, read on ``base`` only within
    ``[n_min, n_max]`` (the measured sizes, non-embedding parameters).

    Returns ``((N_b / n)², "")`` when the baseline's size for that loss, ``N_b = base.params_for_loss(loss)``, is
    inside the range. Outside it the fit would be extrapolated; as ``base`` decreases in N, ``N_b > n_max`` only
    says the multiplier exceeds ``(n_max / n)²`` (returned with ``">"``) and ``N_b < n_min`` that it is below
    ``(n_min / n)²`` (``"<"``). ``(nan, "")`` for a nan loss (a strategy without a result at that size).
    Definition of the multiplier: ``stats.compute_multiplier`` (DESIGN.md §9).
    """
    if not (math.isfinite(loss) and n > 0):
        return math.nan, ""
    n_base = base.params_for_loss(loss)
    if n_base > n_max:
        return (n_max / n) ** 2, ">"
    if n_base < n_min:
        return (n_min / n) ** 2, "<"
    return (n_base / n) ** 2, ""


def _scaling(cells: list[Cell], setting_keys: list[str], labeler: Labeler, baseline: str,
             warnings: list[str]) -> list[ScalingResult]:
    if not any(is_size_key(k) for k in setting_keys):
        return []
    groups: dict[tuple, list[Cell]] = defaultdict(list)
    for c in cells:
        groups[tuple((k, v) for k, v in c.key if not is_size_key(k))].append(c)
    out = []
    for gkey, gcells in groups.items():
        label = labeler.label(gkey, gcells[0].results[0].runs[0], sizes=False)
        sizes = sorted({c.results[0].non_embedding_params for c in gcells})
        if len(sizes) < 3:
            continue
        if len(sizes) < len(gcells):
            warnings.append(f"[scaling {label}] several cells share a model size; no fit (vary one size axis)")
            continue
        gcells = sorted(gcells, key=lambda c: c.results[0].non_embedding_params)
        size_labels = [c.size for c in gcells]
        if len(set(size_labels)) < len(size_labels):
            size_labels = [f"{c.size} ({si(c.results[0].non_embedding_params)})" for c in gcells]
        points: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
        for c in gcells:
            for res in c.results:
                points[res.strategy][0].extend([res.non_embedding_params] * len(res.runs))
                points[res.strategy][1].extend(res.losses)
        # every strategy is fitted on the baseline's sizes: one missing a size (its pick waits, its runs are not in)
        # would extrapolate from other data than the baseline's, and its multiplier compare the two
        base_sizes = set(points[baseline][0]) if baseline in points else set()
        for strategy in [s for s in points if s != baseline]:
            lacking = sorted(base_sizes - set(points[strategy][0]))
            if lacking:
                warnings.append(f"[scaling {label}] {strategy}: no result at {', '.join(si(n) for n in lacking)} "
                                f"non-embedding parameters, which the baseline has; not fitted (finish its runs)")
                del points[strategy]
        fits, shared, per_size, per_size_side = {}, {}, {}, {}
        for strategy, (n, loss) in points.items():
            try:
                fits[strategy] = stats.fit_power_law(n, loss)
            except (ValueError, RuntimeError) as e:
                warnings.append(f"[scaling {label}] {strategy}: {e}")
        base_fit = fits.get(baseline)
        if base_fit is not None:
            for strategy in fits:
                if strategy == baseline:
                    continue
                try:
                    shared[strategy] = stats.fit_shared_power_law(*points[baseline], *points[strategy])
                except (ValueError, RuntimeError) as e:
                    warnings.append(f"[scaling {label}] {strategy}: shared fit failed: {e}")
                at_size = [next(((r.loss_mean, r.non_embedding_params) for r in c.results if r.strategy == strategy),
                                (math.nan, math.nan)) for c in gcells]
                pairs = [multiplier_within(base_fit, loss, n, min(sizes), max(sizes)) for loss, n in at_size]
                per_size[strategy] = [m for m, _ in pairs]
                per_size_side[strategy] = [side for _, side in pairs]
        out.append(ScalingResult(label, list(zip(size_labels, gcells)), fits, shared, per_size, per_size_side,
                                 float(min(sizes)), float(max(sizes))))
    return out


__all__ = ["Analysis", "Cell", "EXCLUDED_PREFIXES", "ScalingResult", "StrategyResult", "analyze", "cpu_share",
           "mean_curve", "multiplier_within"]
