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
  compute multipliers at the measured sizes (none beyond them); an overhead table;
- figures: ``loss_curves.png`` (one panel per cell), ``lr_sweep.png`` (when a strategy ran two or more lrs),
  ``scaling.png`` (when a group of cells spans 3 or more sizes).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from scalevec.experiments import sweepdir
from scalevec.experiments.analysis import Analysis, analyze
from scalevec.experiments.figures import plot_loss_curves, plot_lr_sweep, plot_scaling, swept_cells
from scalevec.experiments.frames import results_frame, runs_frame, to_csv
from scalevec.experiments.gamma_plot import plot_cells
from scalevec.experiments.records import RunRecord, load_runs, machines, validation_splits
from scalevec.experiments.study_grid import LR, SEED, planned_runs
from scalevec.experiments.tables import (
    LEGEND,
    SCALING_LEGEND,
    cell_rows,
    md_table,
    overhead_rows,
    scaling_rows,
    text_table,
)
from scalevec.training.rundir import write_atomic


def _tally_text(found: list[tuple[str, int]], n_runs: int, *, none: str, one: str, many: str,
                unrecorded: str) -> str:
    """One sentence over ``found``, a tally ``[(value, runs)]`` of what ``n_runs`` runs record: ``none`` when no run
    records it, ``one`` (fields ``value``, ``n``, ``rest``) when all that do agree, ``many`` (fields ``k``,
    ``listed``, ``rest``) otherwise; ``rest`` counts the runs that record nothing, described by ``unrecorded``."""
    unknown = n_runs - sum(n for _, n in found)
    rest = f"; {unknown} run(s) {unrecorded}" if unknown else ""
    if not found:
        return none
    if len(found) == 1:
        return one.format(value=found[0][0], n=found[0][1], rest=rest)
    return many.format(k=len(found), listed="; ".join(f"{v} ({n} run(s))" for v, n in found), rest=rest)


def machine_text(runs: list[RunRecord]) -> str:
    """The report's line naming the machine(s) the runs were made on (``records.machines``: CPU kind, instruction
    set, threads, torch), saying so when there are several (their losses are then not bitwise comparable)."""
    return _tally_text(
        machines(runs), len(runs), none="Machine: not recorded (no run's meta.json names its CPU).",
        one="Machine: {value} ({n} run(s){rest}); the losses reproduce bitwise on the same CPU kind, thread count "
            "and torch version.",
        many="Machines: the runs come from {k} machines, so their losses are not bitwise comparable across them: "
             "{listed}{rest}.",
        unrecorded="record no machine (no CPU in meta.json)")


def split_text(runs: list[RunRecord]) -> str:
    """The report's line naming which documents the runs validated on (``records.validation_splits``), saying so
    when runs of one report used different splits (their losses then measure different text)."""
    return _tally_text(
        validation_splits(runs), len(runs),
        none="Validation split: not recorded (no run's meta.json holds `validation_split`).",
        one="Validation split: {value} ({n} run(s){rest}).",
        many="Validation splits: the runs validated on {k} different document sets: {listed}{rest}.",
        unrecorded="record no split (their meta.json predates the split's record)")


def render_markdown(a: Analysis, root: Path, figures: list[str]) -> str:
    """The text of ``report.md``."""
    n_done = sum(r.done for r in a.runs)
    intro = (f"Rebuilt from {len(a.runs)} run directories in `{root}` ({n_done} finished) by "
             f"`scalevec report {root}`. Baseline: `{a.baseline}`.")
    out = [f"# scalevec report{': ' + a.name if a.name else ''}", "", intro, "", machine_text(a.runs), "",
           split_text(a.runs), "",
           "## Final validation loss", "",
           LEGEND, ""]
    for cell in a.cells:
        out += [f"### {cell.label}", "", md_table(*cell_rows(cell)), ""]
    if a.scaling:
        out += ["## Scaling", "", SCALING_LEGEND, ""]
        for s in a.scaling:
            out += [f"### {s.label}", "", md_table(*scaling_rows(s, a.baseline)), ""]
    overhead = ("Extra parameters against the baseline, and step time (geometric mean over the cells of that "
                "size) relative to it. Step time is the process CPU time per step (train rows' `cpu_time`), "
                "which waiting for a core does not inflate (sharing caches and memory bandwidth still does); "
                "runs logged before it existed use wall clock.")
    out += ["## Overhead", "", overhead, "", md_table(*overhead_rows(a)), ""]
    if figures:
        out += ["## Figures", ""] + [f"![{f}]({f})" for f in figures] + [""]
    if a.warnings:
        out += ["## Warnings", ""] + [f"- {w}" for w in a.warnings] + [""]
    return "\n".join(out)


def _figure(plot, a: Analysis, path: Path):
    """``plot(a, file)`` into a temporary file beside ``path``, renamed over it once whole: a full disk leaves the
    previous figure (or none), never a truncated one. Returns what ``plot`` returns; re-raises its ``OSError``."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")  # the suffix tells matplotlib the format
    try:
        made = plot(a, tmp)
        if tmp.exists():
            os.replace(tmp, path)
        return made
    finally:
        tmp.unlink(missing_ok=True)


def not_started(root: Path, runs: list[RunRecord]) -> dict[str, list[str]]:
    """For each run of ``root``, the runs its sweep or study planned in the same cell and strategy (same axis values
    but lr and seed: ``study_grid.planned_runs`` of the stored specs) that have no folder: never started, failed
    before creating one, or deleted to retrain. {} when none is missing, or when a stored spec no longer parses
    (an old grammar: its runs are on disk and read as they are)."""
    try:
        planned = planned_runs(sweepdir.spec_files(root))
    except ValueError:
        return {}
    present = {r.name for r in runs}

    def sibling_key(run) -> tuple:  # the cell and the strategy: every axis value but lr and seed
        return tuple(sorted((k, repr(v)) for k, v in run.values.items() if k not in (LR, SEED)))

    names: dict[tuple, list[str]] = {}
    for p in planned:
        if p.name in present:
            names.setdefault(sibling_key(p), []).append(p.name)
    out: dict[str, list[str]] = {}
    for m in (p for p in planned if p.name not in present):
        for name in names.get(sibling_key(m), []):
            out.setdefault(name, []).append(m.name)
    return out


def write_tables(root: str | Path) -> None:
    """Rewrite ``root/runs.csv`` (every run directory, finished or not) and, once a cell has a result,
    ``root/results.csv`` from the run directories, each file whole or not at all; no report.md, no figure. A study
    or sweep calls it as each run lands (``sweep.run_sweep``), so the committed tables of a folder never lag its
    runs (DESIGN.md §9: files are the interface). ``FileNotFoundError`` when ``root`` holds no run directory."""
    root = Path(root)
    runs = load_runs(root)
    write_atomic(root / "runs.csv", to_csv(runs_frame(runs)))
    a = analyze(runs, sweepdir.load_specs(root), not_started(root, runs))
    if a.cells:
        write_atomic(root / "results.csv", to_csv(results_frame(a)))


def write_report(root: str | Path, quiet: bool = False) -> Analysis:
    """Read every run under ``root`` and write ``report.md``, ``results.csv``, ``runs.csv`` and figures there.

    Raises ``FileNotFoundError`` when ``root`` holds no run directory, ``ValueError`` when no cell has a
    finished baseline run.
    """
    root = Path(root)
    runs = load_runs(root)
    spec = sweepdir.load_specs(root)
    a = analyze(runs, spec, not_started(root, runs))
    if not a.cells:
        # a rerun trains what is unfinished or not started: where the baseline waits for none, advise what does
        # change the outcome (a study may still grow an lr grid past an edge; a sweep never retries a diverged run)
        waits = a.baseline in a.waiting or any(r.status == "unfinished" and r.cfg.strategy == a.baseline for r in runs)
        fix = ("finish the sweep first (rerun it: finished runs are kept)" if waits else
               "no baseline run is left to finish: rerun a study (its lr grid may grow) or sweep a changed grid into "
               "a new --out")
        raise ValueError(f"nothing to compare yet in {root} ({'; '.join(a.warnings)}); {fix}")
    try:
        figures = ["loss_curves.png"]
        _figure(plot_loss_curves, a, root / "loss_curves.png")
        if swept_cells(a):  # a strategy ran two or more lrs somewhere (not a compare at tuned lrs)
            _figure(plot_lr_sweep, a, root / "lr_sweep.png")
            figures.append("lr_sweep.png")
        if a.scaling:
            _figure(plot_scaling, a, root / "scaling.png")
            figures.append("scaling.png")
        if _figure(plot_cells, a, root / "gamma_trajectories.png"):  # rms(γ) per layer over steps, per strategy/role
            figures.append("gamma_trajectories.png")
        write_atomic(root / "runs.csv", to_csv(runs_frame(runs)))
        write_atomic(root / "results.csv", to_csv(results_frame(a)))
        write_atomic(root / "report.md", render_markdown(a, root, figures))
        a.files = ["report.md", "results.csv", "runs.csv", *figures]
    except OSError as e:  # a full disk was a bare "[Errno 28]" and left a 0-byte figure
        raise OSError(f"cannot write the report into {root} ({e.filename or root}: {e.strerror or e}); free space "
                      f"there (or make it writable) and rerun scalevec report {root}; every file it holds is whole "
                      f"(the report's files are written whole or not at all)") from None
    if not quiet:
        print(f"report: {root / 'report.md'} ({len(a.cells)} cell(s), {len(runs)} runs; figures: {', '.join(figures)})")
        for w in a.warnings:
            print(f"warning: {w}")
        if len(machines(runs)) > 1:
            print(f"warning: {machine_text(runs)}")
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


__all__ = ["add_arguments", "machine_text", "not_started", "render_markdown", "run", "write_report",
           "write_tables"]
