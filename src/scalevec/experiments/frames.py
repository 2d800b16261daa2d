"""The report's two CSV tables: ``runs.csv`` (one row per run) and ``results.csv`` (one per cell × strategy).

Flat rows (dicts) for pandas or a spreadsheet: ``runs_frame`` from the run records (with the downstream
scores ``scalevec eval`` left in each run's ``eval.json``), ``results_frame`` from the ``Analysis``;
``to_csv`` writes either as CSV text (columns in order of first appearance); ``read_runs_csv`` reads a
``runs.csv`` back, refusing a torn or doubled one.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from pathlib import Path

from scalevec.config import EXECUTION_FIELDS
from scalevec.experiments.analysis import Analysis
from scalevec.experiments.labels import SHORT, varying_keys
from scalevec.experiments.records import RunRecord
from scalevec.training.eval_results import eval_columns


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


# what a bitwise re-run needs besides the config, from each run's meta.json (records.describe_machine)
MACHINE_COLUMNS = ("cpu", "cpu_capability", "threads", "torch")
SUMMARY_COLUMNS = ("final_val_loss", "final_val_bpb", "best_val_loss", "tokens", "steps", "params",
                   "non_embedding_params", "scale_params", "step_time_s", "cpu_time_s", "wall_time_s",
                   "compiled")  # summary.json's: step_time_s wall clock, cpu_time_s process time (median per step)

# keys that runs.csv names already (lr, seed) or that do not change the experiment (how a run executes)
_NOT_SETTINGS = ("optim.lr", "train.seed", *EXECUTION_FIELDS)


def setting_columns(runs: list[RunRecord]) -> list[str]:
    """The config keys that vary between runs of one strategy (e.g. ``scale.wd`` in a weight-decay
    study, a size bundle's ``model.d_model``): what ``strategy``, ``lr`` and ``seed`` do not name.
    They become columns of ``runs.csv`` so that an analysis of that file alone can tell the arms apart."""
    by_strategy: dict[str, list[RunRecord]] = defaultdict(list)
    for r in runs:
        by_strategy[r.cfg.strategy].append(r)
    return [k for k in varying_keys(runs) if k not in _NOT_SETTINGS
            and any(len({r.flat.get(k) for r in rs}) > 1 for rs in by_strategy.values())]


def runs_frame(runs: list[RunRecord]) -> list[dict]:
    """One flat row per run: identity, the usual axes, the settings that vary within a strategy
    (``setting_columns``), the summary numbers, the machine (``MACHINE_COLUMNS`` from meta.json, when some
    run's meta.json has them; blank for a run whose does not) and the downstream scores ``scalevec eval``
    wrote (``eval.<task>.<metric>``) (``runs.csv``)."""
    rows = []
    settings = setting_columns(runs)
    machine = [k for k in MACHINE_COLUMNS if any(k in r.meta for r in runs)]
    for r in runs:
        s = r.summary or {}
        rows.append({"run": r.name, "status": r.status, "preset": r.cfg.preset, "strategy": r.cfg.strategy,
                     "optimizer": r.cfg.optim.name, "schedule": r.cfg.schedule.name, "lr": r.cfg.optim.lr,
                     "seed": r.seed, **{k: r.flat.get(k) for k in settings},
                     **{k: s.get(k, "") for k in SUMMARY_COLUMNS},
                     **{k: r.meta.get(k, "") for k in machine},
                     **eval_columns(r.path)})  # downstream scores of `scalevec eval` (eval.json), if any
    return rows


# what every reader of runs.csv needs (runs_frame always writes them); other columns are checked when present
RUNS_REQUIRED = ("run", "status", "strategy", "lr", "seed", "final_val_loss", "tokens", "params",
                 "non_embedding_params", "wall_time_s")
RUNS_NUMERIC = tuple(k for k in SUMMARY_COLUMNS if k != "compiled")  # numbers when not blank
STATUSES = ("done", "diverged", "unfinished")  # records.RunRecord.status
DONE_SIZES = ("tokens", "params", "non_embedding_params")  # positive numbers in every done row


def read_runs_csv(path: str | Path) -> list[dict]:
    """The rows of a ``runs.csv`` written by ``scalevec report`` (``runs_frame`` / ``to_csv``; DESIGN.md §9), as
    ``csv.DictReader`` gives them (every value a string), after checking that the file is whole: a header-only file
    is valid and gives ``[]`` (a caller that reports the cell must say it has no runs).

    Raises ``ValueError`` with one line naming the file, the line and the problem, and the command that rewrites
    the file (``scalevec report FOLDER``), when: the file is empty or not CSV, a column of ``RUNS_REQUIRED`` is
    missing, a row has more or fewer fields than the header (a torn or hand-edited line), ``status`` is not one of
    ``STATUSES``, ``lr`` is not a number or ``seed`` not an integer, ``final_val_loss`` is not a finite number in a
    ``done`` row, a ``DONE_SIZES`` value is not finite or, in a ``done`` row, blank or not positive, a non-blank
    summary column (``RUNS_NUMERIC``: parameters, tokens, wall time...) is not a number, or a run is listed twice
    (it would be counted twice). ``OSError`` when the file cannot be read."""
    path = Path(path)
    fix = f"rewrite it with `scalevec report {path.parent}`"

    def bad(line: int, problem: str) -> ValueError:
        return ValueError(f"{path} line {line}: {problem}; {fix}")

    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            header = reader.fieldnames
            if not header:
                raise bad(1, "no header (the file is empty)")
            missing = [k for k in RUNS_REQUIRED if k not in header]
            if missing:
                raise bad(1, f"the header lacks {', '.join(missing)}")
            rows, first = [], {}
            for row in reader:
                line = reader.line_num
                # DictReader files extra fields under the key None and fills missing ones with None
                if None in row or None in row.values():
                    n = len(header) + len(row.get(None) or ()) - sum(v is None for v in row.values())
                    raise bad(line, f"{n} fields where the header has {len(header)} (a torn or edited line)")
                if row["status"] not in STATUSES:
                    raise bad(line, f"status {row['status']!r} is not one of {', '.join(STATUSES)}")
                numeric = [k for k in RUNS_NUMERIC if k in row and row[k] != ""]
                if row["status"] == "done" and "final_val_loss" not in numeric:
                    raise bad(line, "a done run without final_val_loss")
                for k in ("lr", *numeric):
                    try:
                        float(row[k])
                    except ValueError:
                        raise bad(line, f"{k} {row[k]!r} is not a number") from None
                for k in DONE_SIZES:  # counts: an inf or nan one is no count (int() of it fails downstream)
                    if k in numeric and not math.isfinite(float(row[k])):
                        raise bad(line, f"{k} {row[k]!r} is not a finite number")
                sizes = [k for k in DONE_SIZES if (k not in numeric or float(row[k]) <= 0)]
                if row["status"] == "done" and sizes:  # read as 0 they would divide by zero (tokens per parameter)
                    raise bad(line, f"a done run without a positive {', '.join(sizes)}")
                if row["status"] == "done" and not math.isfinite(float(row["final_val_loss"])):
                    raise bad(line, f"a done run whose final_val_loss is {row['final_val_loss']} (a diverged run's "
                                    f"status is diverged)")
                try:
                    int(row["seed"])
                except ValueError:
                    raise bad(line, f"seed {row['seed']!r} is not an integer") from None
                if row["run"] in first:
                    raise bad(line, f"run {row['run']!r} is listed twice (also line {first[row['run']]})")
                first[row["run"]] = line
                rows.append(row)
        except csv.Error as e:  # a NUL byte, an unclosed quote at the end of a torn file
            raise bad(reader.line_num, f"not CSV ({e})") from None
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
                         "step_time_s": r.step_time_s, "step_time_clock": r.step_time_clock,
                         "step_time_ratio": r.step_time_ratio})
    return rows


__all__ = ["MACHINE_COLUMNS", "RUNS_NUMERIC", "RUNS_REQUIRED", "STATUSES", "SUMMARY_COLUMNS", "read_runs_csv",
           "results_frame", "runs_frame", "setting_columns", "to_csv"]
