"""``scalevec report DIR``: rebuild every table and figure of a sweep from its run directories (DESIGN.md §9).

Nothing is kept between commands: the report reads ``DIR/runs/*/`` (or ``DIR/*/``) — each run's
``config.yaml``, ``summary.json`` and ``metrics.jsonl`` — and ``DIR/sweep.yaml`` when present (which
axis was tuned, which strategy is the baseline), like lingua's run folder → DataFrame. It writes:

- ``runs.csv``: one row per run (the "DataFrame"); ``results.csv``: one row per cell × strategy;
- ``report.md``: per cell (runs that differ only in strategy, tuned lr and seed), each strategy at its
  own best lr (``stats.pick_lr``, with a warning at a grid edge): final validation loss mean ± std
  over seeds, Δ against the baseline with a paired-seed 95 % CI (``*`` when it excludes 0, our
  significance rule), bits-per-byte, token efficiency (baseline tokens / tokens the strategy needs to
  reach the baseline's final loss, on the seed-averaged validation curve), parameters and step time
  relative to the baseline; scaling fits ``L(N) = E + A·N^(-α)`` over non-embedding parameters with
  compute multipliers; an overhead table;
- figures: ``loss_curves.png`` (one panel per cell), ``lr_sweep.png`` (when an lr is tuned),
  ``scaling.png`` (when a group of cells spans 3 or more sizes).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scalevec.config import EXECUTION_FIELDS, RunConfig, load_yaml, to_dict
from scalevec.experiments import stats, sweepdir
from scalevec.training import rundir

SIZE_PREFIXES = ("preset", "model.", "train.")  # varying keys that define a model size / token budget
PRIMARY_KEYS = ("preset", "optim.name", "schedule.name", "train.tokens", "data.source", "data.tokenizer")
EXCLUDED_PREFIXES = ("strategy", "scale.", "train.seed")  # what varies inside a cell
SHORT = {"optim.name": "optimizer", "schedule.name": "schedule", "train.tokens": "tokens", "data.source": "data",
         "data.tokenizer": "tokenizer", "optim.lr": "lr"}
EXTRAPOLATE = 10.0  # extrapolated compute multiplier at 10× the largest measured size


# ----------------------------------------------------------------------------------------- loading


@dataclass
class RunRecord:
    """One run directory read from disk. ``summary`` is None for an unfinished run."""

    name: str
    path: Path
    cfg: RunConfig
    flat: dict[str, Any]
    summary: dict | None
    evals: list[dict]
    status: str  # done | diverged | unfinished

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def seed(self) -> int:
        return self.cfg.train.seed

    @property
    def final_loss(self) -> float:
        return float(self.summary["final_val_loss"]) if self.summary else math.nan


def flatten_config(cfg: RunConfig) -> dict[str, Any]:
    """``{dotted key: value}`` of a RunConfig; lists become tuples so that values are hashable."""
    out: dict[str, Any] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[prefix + k] = tuple(v) if isinstance(v, list) else v

    walk(to_dict(cfg), "")
    return out


def read_run(path: Path) -> RunRecord:
    """Read one run directory through ``rundir`` (``config.yaml`` required; summary and metrics when
    present; a cut-off last metrics line is skipped). ``RunDirError`` names a damaged file and the fix."""
    cfg = rundir.load_config(path)
    summary = None
    if rundir.is_done(path) and (path / rundir.SUMMARY).is_file():
        summary = rundir.read_json(path / rundir.SUMMARY, fix="retrain the run, or delete its DONE to report it unfinished")
    evals = rundir.read_metrics(path, kind="eval")
    status = "done" if summary else ("diverged" if rundir.is_diverged(path) else "unfinished")
    return RunRecord(path.name, path, cfg, flatten_config(cfg), summary, evals, status)


def load_runs(root: str | Path) -> list[RunRecord]:
    """Every run directory under ``root/runs/`` (or directly under ``root``), sorted by name.

    Raises ``FileNotFoundError`` when ``root`` is missing or holds no run directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory; pass the --out folder of a sweep or compare")
    base = root / "runs" if (root / "runs").is_dir() else root
    runs = [read_run(d) for d in sorted(base.iterdir()) if d.is_dir() and (d / "config.yaml").is_file()]
    if not runs:
        raise FileNotFoundError(f"no run directories (with config.yaml) in {base}; run `scalevec sweep` or "
                                f"`scalevec compare` with --out {root} first")
    return runs


# ----------------------------------------------------------------------------------------- analysis


@dataclass
class StrategyResult:
    """One strategy in one cell, at its chosen (tuned) value; ``runs`` are its finished runs there."""

    strategy: str
    runs: list[RunRecord]
    pick: stats.LrPick | None = None
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
    step_time_ratio: float = math.nan

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
    """Fits of one group of cells that differ only in size (needs >= 3 sizes)."""

    label: str
    sizes: list[tuple[str, Cell]]  # (size label, cell), by increasing baseline size
    fits: dict[str, stats.PowerLawFit]
    shared: dict[str, stats.SharedFit]
    per_size: dict[str, list[float]]  # compute multiplier of each strategy at each size
    extrapolated: dict[str, float]
    n_extrapolated: float


@dataclass
class Analysis:
    """Everything the report shows; built by ``analyze`` from run records only."""

    name: str
    baseline: str
    cells: list[Cell]
    scaling: list[ScalingResult]
    runs: list[RunRecord]
    warnings: list[str] = field(default_factory=list)


def _varying(runs: list[RunRecord]) -> list[str]:
    keys = sorted({k for r in runs for k in r.flat})
    return [k for k in keys if len({r.flat.get(k) for r in runs}) > 1]


class Labeler:
    """Short human labels for cells: the sweep's bundle names, the primary settings, other varying keys.

    A key is left out when the primary keys (preset, optimizer, schedule, tokens, data) determine it
    (e.g. ``model.n_layers`` given the preset) or when a named bundle of the sweep grid sets it.
    """

    def __init__(self, runs: list[RunRecord], keys: list[str], spec: dict):
        self.keys = keys
        primary = [k for k in keys if k in PRIMARY_KEYS]
        self.implied = set()
        for k in keys:
            groups: dict[tuple, set] = defaultdict(set)
            for r in runs:
                groups[tuple(r.flat.get(p) for p in primary)].add(r.flat.get(k))
            if k not in primary and primary and all(len(v) == 1 for v in groups.values()):
                self.implied.add(k)
        self.axes = [[(str(v["name"]), {k: x for k, x in v.items() if k != "name"}) for v in values
                      if isinstance(v, dict) and "name" in v]
                     for values in (spec.get("grid") or {}).values() if isinstance(values, list)]
        self.bundles = [b for axis in self.axes for b in axis]
        self.bundle_keys = {k for _, b in self.bundles for k in b}

    def bundle_names(self, run: RunRecord) -> list[str]:
        """Per grid axis of named bundles, the most specific bundle whose every field matches ``run``."""
        def matches(k: str, x: Any) -> bool:
            if k in ("preset", "strategy"):
                return getattr(run.cfg, k) == x
            v = run.flat.get(k)
            return k == "tokens_per_param" or v == x or (isinstance(v, tuple) and list(v) == x) or (
                isinstance(v, (int, float)) and isinstance(x, (int, float)) and float(v) == float(x))

        names = []
        for axis in self.axes:
            hits = [(len(b), name) for name, b in axis if all(matches(k, x) for k, x in b.items())]
            if hits:
                names.append(max(hits)[1])
        return names

    def size(self, run: RunRecord) -> str:
        names = [n for n, b in self.bundles if n in self.bundle_names(run) and any(_is_size_key(k) for k in b)]
        return "+".join(names) or run.cfg.preset

    def label(self, key: tuple, run: RunRecord, sizes: bool = True) -> str:
        """``d96 · optimizer=adamw · schedule=cosine · tokens=1,024,000`` (without the size parts when
        ``sizes`` is False: the label of a scaling group)."""
        c = run.cfg
        names = self.bundle_names(run)
        tokens = (run.summary or {}).get("tokens") or c.train.tokens or c.train.steps * c.train.batch_size * c.train.seq_len
        parts = {"preset": c.preset, "optimizer": c.optim.name, "schedule": c.schedule.name, "tokens": f"{tokens:,}"}
        if names and "preset" in self.bundle_keys:
            parts.pop("preset")
        if not sizes:
            parts = {k: v for k, v in parts.items() if k not in ("preset", "tokens")}
            names = [n for n, b in self.bundles if n in names and not any(_is_size_key(k) for k in b)]
        for k, v in key:
            short = SHORT.get(k, k.split(".")[-1] if k.startswith("model.") else k)
            if (k in self.implied or k in ("train.steps", "train.tokens") or short in parts
                    or (names or not sizes) and k in self.bundle_keys or (not sizes and _is_size_key(k))):
                continue
            parts[short] = v
        return " · ".join(names + [f"{k}={v}" for k, v in parts.items()]) or "all runs"


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


def _strategy_result(strategy: str, runs: list[RunRecord], tune_key: str | None, warnings: list[str],
                     label: str) -> StrategyResult | None:
    finished = [r for r in runs if r.done]
    pick = None
    if tune_key is not None:
        # The value is picked on the seeds that every value was run with (a study tunes on seed 0, then adds
        # seeds at the picked value only: those confirm the pick and must not re-choose it, issue 12).
        seeds_of: dict[float, set[int]] = defaultdict(set)
        for r in runs:
            seeds_of[float(r.flat[tune_key])].add(r.seed)
        common = set.intersection(*seeds_of.values()) if seeds_of else set()
        by_value: dict[float, list[float]] = defaultdict(list)
        for r in runs:  # an unfinished or diverged run makes its value ineligible (counts as inf)
            if r.seed in common:
                by_value[float(r.flat[tune_key])].append(r.final_loss)
        try:
            pick = stats.pick_lr(by_value)
        except ValueError:
            warnings.append(f"[{label}] {strategy}: no {tune_key} value has all its runs finished")
            return None
        if pick.warning:
            warnings.append(f"[{label}] {strategy}: {pick.warning}")
        finished = [r for r in finished if float(r.flat[tune_key]) == pick.lr]
    if not finished:
        return None
    finished.sort(key=lambda r: r.seed)
    res = StrategyResult(strategy, finished, pick)
    res.loss_mean, res.loss_std = stats.mean_std(res.losses)
    res.bpb_mean = float(np.mean([r.summary["final_val_bpb"] for r in finished]))
    s = finished[0].summary
    res.params, res.non_embedding_params = int(s["params"]), int(s["non_embedding_params"])
    res.scale_params = int(s.get("scale_params", 0))
    # step time does not depend on lr or seed: average every finished run of the strategy in the cell
    # CPU (process) time per step where every run logged it (issue 17): wall clock on a shared machine measures
    # the neighbours too (it showed `none` 0.35x); older runs without cpu_time_s fall back to wall clock
    done = [r.summary for r in runs if r.done]
    key = "cpu_time_s" if done and all(math.isfinite(d.get("cpu_time_s", math.nan)) for d in done) else "step_time_s"
    res.step_time_s = float(np.mean([d[key] for d in done]))
    return res


def _compare_to_baseline(results: list[StrategyResult], label: str, warnings: list[str]) -> None:
    base = results[0]
    base_curve = mean_curve(base.runs)
    t_base = stats.tokens_to_reach(*base_curve, base.loss_mean) if base_curve[0].size else math.nan
    base_by_seed = {r.seed: r.final_loss for r in base.runs}
    for res in results:
        res.extra_params = res.params - base.params
        res.step_time_ratio = res.step_time_s / base.step_time_s
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


def analyze(runs: list[RunRecord], spec: dict | None = None) -> Analysis:
    """Group runs into cells, pick each strategy's tuned value, compare with the baseline, fit scaling.

    ``spec``: the sweep's ``sweep.yaml`` mapping (``tune``, ``baseline``, ``grid.strategy`` order) or
    None to infer them (tune ``optim.lr`` if it varies; baseline ``baseline`` or the first strategy).
    """
    spec = spec or {}
    warnings: list[str] = []
    strategies = {r.cfg.strategy for r in runs}
    baseline = str(spec.get("baseline") or ("baseline" if "baseline" in strategies else min(strategies)))
    order = _strategy_order(runs, spec, baseline)
    if baseline not in strategies:
        warnings.append(f"no run of the baseline strategy {baseline!r}; comparing against {order[0]!r}")
        baseline = order[0]
    varying = _varying(runs)
    tune = spec.get("tune")
    tune_key = (tune[0] if tune else None) if tune is not None else ("optim.lr" if "optim.lr" in varying else None)
    setting_keys = [k for k in varying if k != tune_key and not k.startswith(EXCLUDED_PREFIXES)]
    labeler = Labeler(runs, setting_keys, spec)

    groups: dict[tuple, list[RunRecord]] = defaultdict(list)
    for r in runs:
        groups[tuple((k, r.flat.get(k)) for k in setting_keys)].append(r)
    cells = []
    for key, cell_runs in groups.items():
        example = next((r for r in cell_runs if r.done), cell_runs[0])
        label = labeler.label(key, example)
        results = []
        for strategy in order:
            res = _strategy_result(strategy, [r for r in cell_runs if r.cfg.strategy == strategy], tune_key,
                                   warnings, label)
            if res is not None:
                results.append(res)
        if not results or results[0].strategy != baseline:
            warnings.append(f"[{label}] the baseline {baseline!r} has no finished run; cell skipped")
            continue
        _compare_to_baseline(results, label, warnings)
        cells.append(Cell(key, label, results, tune_key, labeler.size(example)))
    cells.sort(key=lambda c: (c.results[0].non_embedding_params, c.label))
    for status in ("diverged", "unfinished"):
        names = [r.name for r in runs if r.status == status]
        if names:
            warnings.append(f"{len(names)} run(s) {'diverged' if status == 'diverged' else 'not finished'} "
                            f"(left out; their lr counts as failed): {', '.join(names)}")
    scaling = _scaling(cells, setting_keys, labeler, baseline, warnings)
    return Analysis(str(spec.get("name") or ""), baseline, cells, scaling, runs, warnings)


def _is_size_key(k: str) -> bool:
    return k.startswith(SIZE_PREFIXES)


def _scaling(cells: list[Cell], setting_keys: list[str], labeler: Labeler, baseline: str,
             warnings: list[str]) -> list[ScalingResult]:
    if not any(_is_size_key(k) for k in setting_keys):
        return []
    groups: dict[tuple, list[Cell]] = defaultdict(list)
    for c in cells:
        groups[tuple((k, v) for k, v in c.key if not _is_size_key(k))].append(c)
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
            size_labels = [f"{c.size} ({_si(c.results[0].non_embedding_params)})" for c in gcells]
        points: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
        for c in gcells:
            for res in c.results:
                points[res.strategy][0].extend([res.non_embedding_params] * len(res.runs))
                points[res.strategy][1].extend(res.losses)
        fits, shared, per_size, extrapolated = {}, {}, {}, {}
        for strategy, (n, loss) in points.items():
            try:
                fits[strategy] = stats.fit_power_law(n, loss)
            except (ValueError, RuntimeError) as e:
                warnings.append(f"[scaling {label}] {strategy}: {e}")
        n_x = EXTRAPOLATE * max(sizes)
        base_fit = fits.get(baseline)
        if base_fit is not None:
            for strategy, fit in fits.items():
                if strategy == baseline:
                    continue
                try:
                    shared[strategy] = stats.fit_shared_power_law(*points[baseline], *points[strategy])
                except (ValueError, RuntimeError) as e:
                    warnings.append(f"[scaling {label}] {strategy}: shared fit failed: {e}")
                per_size[strategy] = [
                    next((stats.compute_multiplier(base_fit, r.loss_mean, r.non_embedding_params)
                          for r in c.results if r.strategy == strategy), math.nan) for c in gcells]
                extrapolated[strategy] = stats.compute_multiplier(base_fit, float(fit.predict(n_x)), n_x)
        out.append(ScalingResult(label, list(zip(size_labels, gcells)), fits, shared, per_size, extrapolated, n_x))
    return out


# ----------------------------------------------------------------------------------------- formatting


def _num(v: float, fmt: str = ".4f") -> str:
    return "—" if v is None or not math.isfinite(v) else format(v, fmt)


def _si(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:g}"


def format_delta(d: stats.PairedDelta | None) -> str:
    """``+0.0123 [+0.0050, +0.0196] *`` (``*`` when the 95 % CI excludes 0); ``—`` for the baseline."""
    if d is None:
        return "—"
    if d.n < 2:
        return f"{d.delta:+.4f} (1 seed, no CI)"
    return f"{d.delta:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]{' *' if d.significant else ''}"


def cell_rows(cell: Cell) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-cell comparison table (terminal and markdown)."""
    header = ["strategy"]
    if cell.tune_key:
        header.append(f"best {SHORT.get(cell.tune_key, cell.tune_key)}")
    header += ["seeds", "val loss (mean ± std)", "Δ vs baseline [95 % CI]", "bits/byte", "token eff.", "params",
               "extra params", "step time"]
    rows = []
    for i, r in enumerate(cell.results):
        row = [r.strategy]
        if cell.tune_key:
            row.append(f"{r.pick.lr:g}{' †' if r.pick.at_edge else ''}" if r.pick else "—")
        row += [str(len(r.runs)), f"{r.loss_mean:.4f} ± {_num(r.loss_std)}", format_delta(r.delta),
                _num(r.bpb_mean), "—" if i == 0 else _token_eff(r),
                f"{r.params:,}", f"{r.extra_params:+,}", f"{r.step_time_ratio:.2f}×"]
        rows.append(row)
    return header, rows


def _token_eff(r: StrategyResult) -> str:
    if not math.isfinite(r.token_efficiency):
        return "not reached"
    return f"{'≥ ' if r.token_efficiency_is_bound else ''}{r.token_efficiency:.2f}×"


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Aligned plain-text table (first column left, the rest right-aligned)."""
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """GitHub-flavoured markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


LEGEND = ("Final validation loss in nats/token on the same validation tokens for every run, mean ± std over "
          "seeds. Δ = strategy − baseline, paired by seed (same seed ⇒ same data order and initial matrices), "
          "with a two-sided 95 % t interval; `*` marks an interval that excludes 0 (our significance rule). "
          "Token eff. = tokens the baseline needs to reach its final loss ÷ tokens the strategy needs "
          "(seed-averaged validation curves, interpolated; > 1 is better; ≥ when reached by the first evaluation, "
          "'not reached' when never). Step time is the process CPU time per optimizer step relative to the "
          "baseline (wall clock for runs that did not log it); a busy machine still inflates it through shared "
          "caches, so compare with care. † marks a tuned value at the edge of its grid.")


SCALING_LEGEND = (
    "Fit of `L(N) = E + A·N^(-α)` to every run's final loss against non-embedding parameters N (scipy "
    "`curve_fit`, ± one sigma). Compute multiplier = (N the baseline needs for the same loss ÷ N)², i.e. the "
    "compute ratio at a fixed number of tokens per parameter (C ∝ N²); > 1 means the strategy is better. "
    "*Shared fit*: one curve for both with the strategy acting as m× the parameters (multiplier m², constant "
    "over size); *at size*: the strategy's measured mean loss against the baseline's fit; *at "
    f"{EXTRAPOLATE:g}× the largest size*: the two independent fits extrapolated.")


def scaling_rows(s: ScalingResult, baseline: str) -> tuple[list[str], list[list[str]]]:
    header = ["strategy", "E", "A", "α", "points", "compute × (shared fit)",
              *[f"compute × at {lbl}" for lbl, _ in s.sizes], f"compute × at {_si(s.n_extrapolated)}"]
    rows = []
    for strategy, fit in s.fits.items():
        sh = s.shared.get(strategy)
        rows.append([strategy, f"{fit.E:.3f} ± {_num(fit.E_err, '.3f')}", f"{fit.A:.3g} ± {_num(fit.A_err, '.2g')}",
                     f"{fit.alpha:.3f} ± {_num(fit.alpha_err, '.3f')}", str(fit.n_points),
                     "—" if strategy == baseline or sh is None else f"{sh.multiplier:.3f} ± {_num(sh.multiplier_err, '.3f')}",
                     *(["—"] * len(s.sizes) if strategy == baseline else
                       [_num(m, ".3f") for m in s.per_size.get(strategy, [math.nan] * len(s.sizes))]),
                     "—" if strategy == baseline else _num(s.extrapolated.get(strategy, math.nan), ".3f")])
    return header, rows


def overhead_rows(a: Analysis) -> tuple[list[str], list[list[str]]]:
    """Per size and strategy: parameters, extra parameters, and the step-time ratio (geometric mean over cells)."""
    header = ["size", "strategy", "params", "scale params", "extra params", "extra share", "step time"]
    by_size: dict[str, list[Cell]] = defaultdict(list)
    for c in a.cells:  # cells are sorted by size
        by_size[c.size].append(c)
    rows = []
    for size, cells in by_size.items():
        ratios: dict[str, list[float]] = defaultdict(list)
        for c in cells:
            for r in c.results:
                ratios[r.strategy].append(r.step_time_ratio)
        for r in cells[0].results:
            geo = float(np.exp(np.mean(np.log(ratios[r.strategy]))))
            rows.append([size, r.strategy, f"{r.params:,}", f"{r.scale_params:,}", f"{r.extra_params:+,}",
                         f"{r.extra_params / cells[0].results[0].params:+.3%}", f"{geo:.3f}×"])
    return header, rows


# ----------------------------------------------------------------------------------------- files


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


# keys that runs.csv names already (lr, seed) or that do not change the experiment (how a run executes)
_NOT_SETTINGS = ("optim.lr", "train.seed", *EXECUTION_FIELDS)


def setting_columns(runs: list[RunRecord]) -> list[str]:
    """The config keys that vary between runs of one strategy (e.g. ``scale.wd`` in a weight-decay
    study, a size bundle's ``model.d_model``): what ``strategy``, ``lr`` and ``seed`` do not name.
    They become columns of ``runs.csv`` so that an analysis of that file alone can tell the arms apart."""
    by_strategy: dict[str, list[RunRecord]] = defaultdict(list)
    for r in runs:
        by_strategy[r.cfg.strategy].append(r)
    return [k for k in _varying(runs) if k not in _NOT_SETTINGS
            and any(len({r.flat.get(k) for r in rs}) > 1 for rs in by_strategy.values())]


def runs_frame(runs: list[RunRecord]) -> list[dict]:
    """One flat row per run: identity, the usual axes, the settings that vary within a strategy
    (``setting_columns``), the summary numbers and the downstream scores ``scalevec eval`` wrote
    (``eval.<task>.<metric>``) (``runs.csv``)."""
    rows = []
    settings = setting_columns(runs)
    for r in runs:
        s = r.summary or {}
        rows.append({"run": r.name, "status": r.status, "preset": r.cfg.preset, "strategy": r.cfg.strategy,
                     "optimizer": r.cfg.optim.name, "schedule": r.cfg.schedule.name, "lr": r.cfg.optim.lr,
                     "seed": r.seed, **{k: r.flat.get(k) for k in settings}, **{k: s.get(k, "") for k in (
                         "final_val_loss", "final_val_bpb", "best_val_loss", "tokens", "steps", "params",
                         "non_embedding_params", "scale_params", "step_time_s", "wall_time_s")},
                     **rundir.eval_columns(r.path)})  # downstream scores of `scalevec eval` (eval.json), if any
    return rows


def results_frame(a: Analysis) -> list[dict]:
    """One row per cell × strategy with every number of the cell tables (``results.csv``)."""
    rows = []
    for c in a.cells:
        for r in c.results:
            d = r.delta
            rows.append({"cell": c.label, **{SHORT.get(k, k): v for k, v in c.key}, "strategy": r.strategy,
                         "tuned": c.tune_key or "", "best_value": r.pick.lr if r.pick else "",
                         "at_grid_edge": r.pick.at_edge if r.pick else "", "seeds": len(r.runs),
                         "val_loss_mean": r.loss_mean, "val_loss_std": r.loss_std,
                         "delta": d.delta if d else "", "ci_lo": d.lo if d else "", "ci_hi": d.hi if d else "",
                         "significant": d.significant if d else "", "p_value": d.p_value if d else "",
                         "val_bpb_mean": r.bpb_mean, "token_efficiency": r.token_efficiency,
                         "token_efficiency_is_lower_bound": r.token_efficiency_is_bound,
                         "params": r.params, "non_embedding_params": r.non_embedding_params,
                         "scale_params": r.scale_params, "extra_params": r.extra_params,
                         "step_time_s": r.step_time_s, "step_time_ratio": r.step_time_ratio})
    return rows


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, 60))


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 3)
    return math.ceil(n / cols), cols


def _parent_curves(runs: list[RunRecord]) -> list[tuple[str, np.ndarray, np.ndarray]]:
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
    parent is drawn dashed up to the branch point (``_parent_curves``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = _grid(len(a.cells))
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax, cell in zip(axes.flat, a.cells):
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
        for name, tokens, loss in _parent_curves([run for r in cell.results for run in r.runs]):
            ax.plot(tokens, loss, color="0.5", linestyle="--", linewidth=1, label=name)
            ax.plot(tokens[-1:], loss[-1:], color="0.5", marker="o")  # the branch point
        if tail:  # zoom on the second part of training, where the strategies separate
            lo, hi = min(tail), max(tail)
            ax.set_ylim(lo - 0.1 * (hi - lo + 1e-3), hi + 0.1 * (hi - lo + 1e-3))
        ax.set_title(_wrap(cell.label), fontsize=9)
        ax.set(xlabel="tokens", ylabel="validation loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(a.cells):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lr_sweep(a: Analysis, path: Path) -> None:
    """Mean final loss vs the tuned value (log x) per strategy, one panel per cell; the pick is circled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in a.cells if c.tune_key]
    rows, cols = _grid(len(cells))
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax, cell in zip(axes.flat, cells):
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
    for ax in list(axes.flat)[len(cells):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scaling(a: Analysis, path: Path) -> None:
    """Final loss vs non-embedding parameters (log x): every run as a point, each strategy's fit as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = _grid(len(a.scaling))
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax, s in zip(axes.flat, a.scaling):
        n_all = [r.non_embedding_params for _, c in s.sizes for r in c.results]
        grid = np.geomspace(min(n_all) / 1.5, s.n_extrapolated, 200)
        for strategy in s.fits:
            n = [r.non_embedding_params for _, c in s.sizes for r in c.results if r.strategy == strategy for _ in r.runs]
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
    for ax in list(axes.flat)[len(a.scaling):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_markdown(a: Analysis, root: Path, figures: list[str]) -> str:
    """The text of ``report.md``."""
    n_done = sum(r.done for r in a.runs)
    intro = (f"Rebuilt from {len(a.runs)} run directories in `{root}` ({n_done} finished) by "
             f"`scalevec report {root}`. Baseline: `{a.baseline}`.")
    out = [f"# scalevec report{': ' + a.name if a.name else ''}", "", intro, "", "## Final validation loss", "",
           LEGEND, ""]
    for cell in a.cells:
        out += [f"### {cell.label}", "", md_table(*cell_rows(cell)), ""]
    if a.scaling:
        out += ["## Scaling", "", SCALING_LEGEND, ""]
        for s in a.scaling:
            out += [f"### {s.label}", "", md_table(*scaling_rows(s, a.baseline)), ""]
    overhead = ("Extra parameters against the baseline, and step time (geometric mean over the cells of that "
                "size) relative to it. Step time is the process CPU time per step (train rows' `cpu_time`), "
                "which load from other processes does not inflate; runs logged before it existed use wall clock.")
    out += ["## Overhead", "", overhead, "", md_table(*overhead_rows(a)), ""]
    if figures:
        out += ["## Figures", ""] + [f"![{f}]({f})" for f in figures] + [""]
    if a.warnings:
        out += ["## Warnings", ""] + [f"- {w}" for w in a.warnings] + [""]
    return "\n".join(out)


def write_report(root: str | Path, quiet: bool = False) -> Analysis:
    """Read every run under ``root`` and write ``report.md``, ``results.csv``, ``runs.csv`` and figures there.

    Raises ``FileNotFoundError`` when ``root`` holds no run directory, ``ValueError`` when no cell has a
    finished baseline run.
    """
    root = Path(root)
    runs = load_runs(root)
    spec = sweepdir.load_specs(root)
    a = analyze(runs, spec)
    if not a.cells:
        raise ValueError(f"no finished runs to compare in {root} ({'; '.join(a.warnings)}); finish the sweep first")
    figures = ["loss_curves.png"]
    plot_loss_curves(a, root / "loss_curves.png")
    if any(c.tune_key for c in a.cells):
        plot_lr_sweep(a, root / "lr_sweep.png")
        figures.append("lr_sweep.png")
    if a.scaling:
        plot_scaling(a, root / "scaling.png")
        figures.append("scaling.png")
    (root / "runs.csv").write_text(_csv(runs_frame(runs)))
    (root / "results.csv").write_text(_csv(results_frame(a)))
    (root / "report.md").write_text(render_markdown(a, root, figures))
    if not quiet:
        print(f"report: {root / 'report.md'} ({len(a.cells)} cell(s), {len(runs)} runs; figures: {', '.join(figures)})")
        for w in a.warnings:
            print(f"warning: {w}")
    return a


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="the --out folder of `scalevec sweep` or `scalevec compare`")
    p.add_argument("--print", action="store_true", help="also print the comparison tables")


def run(args: argparse.Namespace) -> int:
    a = write_report(args.dir)
    if args.print:
        for cell in a.cells:
            print(f"\n{cell.label}\n{text_table(*cell_rows(cell))}")
    return 0


__all__ = [
    "Analysis",
    "Cell",
    "RunRecord",
    "ScalingResult",
    "StrategyResult",
    "analyze",
    "cell_rows",
    "format_delta",
    "load_runs",
    "md_table",
    "mean_curve",
    "read_run",
    "results_frame",
    "runs_frame",
    "text_table",
    "write_report",
]
