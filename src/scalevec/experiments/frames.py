"""The report's two CSV tables: ``runs.csv`` (one row per run) and ``results.csv`` (one per cell × strategy).

Flat rows (dicts) for pandas or a spreadsheet: ``runs_frame`` from the run records (with the downstream
scores ``scalevec eval`` left in each run's ``eval.json``), ``results_frame`` from the ``Analysis``;
``to_csv`` writes either as CSV text (columns in order of first appearance).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict

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


__all__ = ["MACHINE_COLUMNS", "SUMMARY_COLUMNS", "results_frame", "runs_frame", "setting_columns", "to_csv"]
