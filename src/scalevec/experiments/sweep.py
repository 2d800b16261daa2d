"""``scalevec sweep``: a grid of runs from one YAML file, resumable, N at a time (DESIGN.md §9).

Every combination of the file's grid becomes an ordinary run directory ``OUT/runs/NAME/`` trained by a
subprocess ``python -m scalevec train --config OUT/runs/NAME.yaml --out OUT/runs/NAME``. This module is the
runner: it checks the folder and the data sources before anything is written, says what it will do
(``dry_run_text``), trains what is left, one line per finished run (``failure_cause`` for a failed one), and
writes the report. The parts live beside it, one job each:

- ``sweep_spec``: the file's format (its docstring) and its validation into a ``SweepSpec``;
- ``sweep_grid``: the grid's points, their stable names and configs (the token budget of ``tokens_per_param``),
  and each point's state in the folder (``run_status``);
- ``sweep_launch``: the trainer subprocesses, ``jobs`` at a time, their threads, and SIGINT / SIGTERM;
- ``sweepdir``: the folder's stored specs.

Choices made here (ours): a run directory with ``DONE`` or ``DIVERGED`` is skipped, one with a checkpoint is
resumed, one without is restarted, one that another process holds (its lock, ``rundir.RunLock``) is skipped with
a message (nanochat's sweeps skip finished runs the same way); a failed run does not stop the others, and the
sweep exits 1 so that a rerun of the same command retries it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import threading
import time
from pathlib import Path

from scalevec.config.run_budget import run_tokens, total_steps
from scalevec.experiments import sweepdir
from scalevec.experiments.sweep_grid import (
    Run,
    assigned_config,
    baseline_params,
    expand,
    run_params,
    run_status,
    same_path,
)
from scalevec.experiments.sweep_launch import (
    DEFAULT_TRAIN_CMD,
    run_jobs,
    stopping,
    threads_per_run,
    train_one,
    unwritable,
)
from scalevec.experiments.sweep_spec import SweepSpec, load_spec, spec_from_dict
from scalevec.training import rundir
from scalevec.training.exits import DIVERGED_EXIT  # the trainer's code after its health guard stopped it


def live_progress(todo: list[tuple[Run, str]], runs_dir: Path, scope=None):
    """A started ``progress.GridProgress`` over the runs to train: each run's step and loss from its
    metrics.jsonl, an ETA for the grid weighted by 6·N·D (one refreshing line on a TTY, else a plain
    line every minute), and with ``scope`` (a ``progress.StudyScope``) the whole study's bound."""
    from scalevec.experiments.progress import GridProgress

    items = []
    for run, _ in todo:
        items.append((run.name, runs_dir / run.name, total_steps(run.cfg),
                      6.0 * run_params(run.cfg) * run_tokens(run.cfg)))
    return GridProgress(items, scope=scope).start()


def _final_loss(run_dir: Path) -> str:
    try:
        s = rundir.read_summary(run_dir)
        return f"val_loss {s['final_val_loss']:.4f}"
    except (ValueError, KeyError, TypeError):
        return "no summary"


# ----------------------------------------------------------------------------------------- the sweep


def check_sources(runs: list[Run]) -> None:
    """Check each distinct data source of ``runs`` as its trainer would before reading it
    (``corpus.check_source``), so that a missing or unreadable ``--data`` stops the sweep (and its dry run)
    with one line instead of failing every run. Raises ``FileNotFoundError`` / ``ValueError`` naming the
    first run with that source."""
    from scalevec.data.corpus import check_source

    first: dict[str, Run] = {}
    for r in runs:
        first.setdefault(r.cfg.data.source, r)
    for r in first.values():
        try:
            check_source(r.cfg.data)
        except (OSError, ValueError) as e:
            raise type(e)(f"run {r.name}: {e}") from None


def failure_cause(log: Path, since: int = 0, tail_bytes: int = 16384) -> str:
    """The last line that names an error (the CLI's ``scalevec …: error: …`` line or a traceback's last line)
    among what this attempt appended to a failed run's log (from byte ``since``: an earlier attempt's error is
    not this one's), shortened to 200 characters; ``""`` when there is none or the log cannot be read."""
    try:
        with open(log, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        line = line.strip()
        if ": error: " in line or re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line):
            return line.split(": error: ", 1)[-1][:200]
    return ""


def dry_run_text(runs: list[Run], statuses: list[str]) -> str:
    """The run list with status, lr, steps, tokens and parameters, and the total token budget."""
    lines = [f"{'run':<48} {'status':<8} {'lr':>9} {'steps':>7} {'tokens':>12} {'params':>12}"]
    total = todo = flops = 0
    for run, status in zip(runs, statuses):
        tokens, params, steps = run_tokens(run.cfg), run_params(run.cfg), total_steps(run.cfg)
        total += tokens
        if status != "done":
            todo += tokens
            flops += 6 * params * tokens
        lines.append(f"{run.name:<48} {status:<8} {run.cfg.optim.lr:>9g} {steps:>7,} {tokens:>12,} {params:>12,}")
    n_todo = sum(s != "done" for s in statuses)
    lines.append(f"{len(runs)} runs ({n_todo} to train); total token budget {total:,} tokens "
                 f"({todo:,} still to train, about {flops:.2e} FLOP at 6·N·D)")
    return "\n".join(lines)


def run_sweep(spec: SweepSpec, out: str | Path, jobs: int = 1, dry_run: bool = False,
              train_cmd: tuple[str, ...] | None = None, report: bool = True, quiet: bool = False,
              record_spec: bool = True, scope=None, tables: bool | None = None, runs: list[Run] | None = None,
              deadline: float | None = None) -> int:
    """Expand ``spec``, skip finished runs, train the rest ``jobs`` at a time, then write the report.

    ``tables`` (default: ``report``): rewrite ``runs.csv`` and ``results.csv`` each time a run finishes or
    diverges (``report.write_tables``), so that the folder's tables hold every finished run while the rest train
    (a study passes it, writing its report once at the end).

    ``record_spec=False`` trains into ``out`` without storing ``spec`` there (``study``: its narrowed
    follow-up grids belong to the study's own spec, which is stored; ``sweepdir``); ``scope`` (a
    ``progress.StudyScope``) puts the whole study's time bound on the progress line.

    Everything is validated before anything is written. Returns 0 when every run finished, 1 when a run
    failed (the others still run; rerun the same command to retry) or was skipped because another process (a
    dying sweep's trainer, another sweep) held it. Raises ``ValueError`` for an invalid
    spec, a config mismatch with an existing run, or ``jobs < 1``. ``train_cmd`` (default: the spec's
    ``command``, else ``python -m scalevec train``) gets ``--config FILE --out DIR`` appended; its output
    goes to ``OUT/runs/NAME.log``, and unless ``quiet`` a live status (``live_progress``) shows on stdout.

    ``runs``: train these (a study's step over every strategy at once) instead of ``expand(spec)``. The runs to
    train start in turn by strategy (``interleaved``), so every strategy has runs in flight from the start.
    ``deadline`` (``time.time()`` seconds; a GPU slice's budget, ``gpu_ladder.sh``): a run whose expected time
    (the folder's measured seconds per FLOP, ``measured_rate``, × its 6·N·D; unknown before one has
    finished) ends after it is not started, and at the deadline the running ones checkpoint and stop
    (``run_jobs``); both are said, neither counts as failed, and a rerun resumes them.
    """
    train_cmd = tuple(train_cmd or spec.command or DEFAULT_TRAIN_CMD)
    check_jobs(jobs)
    out = Path(out)
    sweepdir.check_folder(out, spec.file)
    runs = expand(spec) if runs is None else runs
    runs_dir = out / "runs"
    statuses = [run_status(r, runs_dir) for r in runs]
    check_sources([r for r, s in zip(runs, statuses) if s not in ("done", "diverged")])
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    if dry_run:
        print(dry_run_text(runs, statuses))
        return 0
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        if record_spec:
            sweepdir.write_spec(out, spec.to_dict())
    except OSError as e:
        raise unwritable(out, e) from None
    todo = interleaved([(r, s) for r, s in zip(runs, statuses) if s not in ("done", "diverged", "locked")])
    n_div, n_resume = statuses.count("diverged"), statuses.count("resume")
    say(f"sweep {spec.name}: {len(runs)} runs, {statuses.count('done')} already done, "
        f"{f'{n_div} diverged before (not retried; --overwrite or delete the run to retry), ' if n_div else ''}"
        f"{len(todo)} to train{f' ({n_resume} resume from a checkpoint)' if n_resume else ''} ({jobs} at a time) "
        f"in {runs_dir}")
    skipped: list[str] = []  # runs another process held: not done, so the sweep does not exit 0
    for r, s in zip(runs, statuses):
        if s == "locked":
            skipped.append(r.name)
            say(f"skipped {r.name}: in use by process {rundir.locked_by(runs_dir / r.name)} (another sweep or train); "
                f"rerun this sweep when it is done")
    threads = threads_per_run(jobs)
    failed: list[str] = []
    progress = None if quiet else live_progress(todo, runs_dir, scope)
    say = progress.say if progress else say

    refresh = report if tables is None else tables
    tables_lock = threading.Lock()  # runs land from several threads: one rewrite of the tables at a time

    def landed() -> None:
        if not refresh:
            return
        from scalevec.experiments.report import write_tables

        with tables_lock:
            try:
                write_tables(out)
            except (ValueError, FileNotFoundError, OSError) as e:
                say(f"runs.csv not refreshed: {e}")

    seconds_per_flop = measured_rate(runs_dir)[0] if deadline is not None else math.nan

    def one(item: tuple[int, tuple[Run, str]]) -> None:
        i, (run, status) = item
        if deadline is not None:
            need = seconds_per_flop * 6.0 * run_params(run.cfg) * run_tokens(run.cfg)  # nan: not known yet
            left = deadline - time.time()
            if left <= 0 or need > left:
                say(f"[{i + 1}/{len(todo)}] {run.name}: not started, the slice has {max(left, 0):.0f} s left"
                    f"{f' and it needs ~{need:.0f} s' if math.isfinite(need) else ''}; the next slice trains it")
                return
        t0 = time.perf_counter()
        if progress:
            progress.started(run.name, resumed=status == "resume")
        log = runs_dir / (run.name + ".log")
        log_start = log.stat().st_size if log.is_file() else 0  # the log is appended to, attempt after attempt
        rc = train_one(run, runs_dir, status, tuple(train_cmd), threads)
        if progress:
            progress.finished(run.name)
        head = f"[{i + 1}/{len(todo)}] {run.name}:"
        if rc == 0 and rundir.is_done(runs_dir / run.name):
            took = f"{time.perf_counter() - t0:.0f} s" + (" since its resume" if status == "resume" else "")
            say(f"{head} {_final_loss(runs_dir / run.name)} ({took})")
            landed()
        elif rc == DIVERGED_EXIT and rundir.is_diverged(runs_dir / run.name):
            # a result (this lr is too high), not a failure
            div = rundir.read_diverged(runs_dir / run.name) or {}
            say(f"{head} diverged ({div.get('reason', 'health guard')}); the report counts it as a failed lr")
            landed()
        elif stopping():
            say(f"{head} stopped with the sweep (exit {rc}); rerun the same command to resume it")
        elif rundir.locked_by(runs_dir / run.name):
            skipped.append(run.name)
            say(f"{head} skipped: in use by process {rundir.locked_by(runs_dir / run.name)}; rerun this sweep later")
        else:
            failed.append(run.name)
            cause = failure_cause(log, log_start)
            say(f"{head} FAILED (exit {rc}){f': {cause}' if cause else ''}; see {log}")

    run_jobs(one, list(enumerate(todo)), jobs, runs_dir, on_stop=progress.stop if progress else None,
             deadline=deadline)
    if progress:
        progress.stop()
    if report:
        from scalevec.experiments.report import write_report

        try:
            write_report(out, quiet=quiet)
        except (ValueError, FileNotFoundError) as e:
            say(f"no report: {e}")
    if skipped:  # said on stderr too, so that `sweep && report` in a script shows why it stopped
        print(f"scalevec sweep: {len(skipped)} run(s) skipped, in use by another process: {', '.join(skipped)}; "
              f"rerun the same command when it is done", file=sys.stderr, flush=True)
    if failed:
        say(f"{len(failed)} run(s) failed: {', '.join(failed)}; rerun the same command to retry them")
    return 1 if failed or skipped else 0


def interleaved(todo: list[tuple[Run, str]]) -> list[tuple[Run, str]]:
    """``todo`` in turn by strategy (the first of each, then the second of each, ...), each strategy's runs in
    their order: with ``jobs`` at a time every strategy trains from the start, not the last one alone at the end."""
    by_strategy: dict[str, list[tuple[Run, str]]] = {}
    for item in todo:
        by_strategy.setdefault(str(item[0].cfg.strategy), []).append(item)
    queues = list(by_strategy.values())
    return [q[k] for k in range(max(map(len, queues), default=0)) for q in queues if k < len(q)]


def measured_rate(runs_dir: Path) -> tuple[float, int]:
    """Seconds per training FLOP (6·N·D) over the finished runs in ``runs_dir``, and how many runs that is;
    ``(nan, 0)`` when none has finished. A run's seconds are what its sweep waited for, start-up included:
    from its ``NAME.yaml`` (written by the sweep as it starts the trainer) to its ``DONE``, or the summary's
    ``wall_time_s`` (the trainer's own loop) when that span is shorter (files copied, e.g. by git)."""
    seconds = flops = 0.0
    n = 0
    for d in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        if not d.is_dir() or rundir.state(d) != "done":
            continue
        try:
            s = rundir.read_json(d / rundir.SUMMARY)
            wall, work = float(s["wall_time_s"]), 6.0 * float(s["params"]) * float(s["tokens"])
            started = runs_dir / f"{d.name}.yaml"
            if started.is_file():
                wall = max(wall, (d / rundir.DONE).stat().st_mtime - started.stat().st_mtime)
        except (rundir.RunDirError, KeyError, TypeError, ValueError, OSError):
            continue
        if math.isfinite(wall) and wall > 0 and work > 0:
            seconds, flops, n = seconds + wall, flops + work, n + 1
    return (seconds / flops, n) if n else (math.nan, 0)


def check_jobs(jobs: int) -> None:
    """Raise ``ValueError`` for a ``--jobs`` below 1 (sweep, and study before its dry run or its folder)."""
    if jobs < 1:
        raise ValueError(f"--jobs {jobs} must be >= 1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="sweep YAML file (see sweeps/smoke.yaml)")
    p.add_argument("--out", help="output folder (default runs/<sweep name>); rerun the command to resume")
    p.add_argument("--dry-run", action="store_true", help="print the runs and the total token budget, train nothing")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs trained at the same time (default 1; threads split between them)")
    p.add_argument("--no-report", action="store_true", help="skip `scalevec report` at the end")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    if spec.notice:
        print(f"note: {spec.notice}", flush=True)
    out = args.out or f"runs/{spec.name}"
    return run_sweep(spec, out, jobs=args.jobs, dry_run=args.dry_run, report=not args.no_report)


__all__ = [
    # the runner's own names, then the parts' names this module has always offered (tests import them from here)
    "DEFAULT_TRAIN_CMD",
    "Run",
    "SweepSpec",
    "assigned_config",
    "baseline_params",
    "check_sources",
    "dry_run_text",
    "expand",
    "failure_cause",
    "live_progress",
    "load_spec",
    "measured_rate",
    "run_status",
    "run_sweep",
    "same_path",
    "spec_from_dict",
]
