"""Downstream scores: ``eval.json`` and the names of lm-evaluation-harness metrics (DESIGN.md §8).

``scalevec eval`` (hf/evaluation.py) writes ``eval.json`` into a run directory or an export directory
(``write_eval``); ``scalevec report`` reads it back as ``eval.<task>.<metric>`` columns of runs.csv
(``eval_columns``). ``main_metrics`` turns lm-eval's keys (``"acc,none"``, ``"acc_stderr,none"``)
into ``(metric, value, stderr)``, the one rule both sides use. The file's name is ``rundir.EVAL``.
"""

from __future__ import annotations

import datetime
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from scalevec.config.files import load_json
from scalevec.config.typed import is_number
from scalevec.training.rundir import EVAL, RunDirError, read_json, write_atomic


def write_eval(directory: Path, results: dict, num_fewshot: int | None, limit: int | float | None) -> Path:
    """Merge ``results`` into ``directory/eval.json`` (``{"tasks": {task: {...}}}``; other tasks kept),
    written atomically (``rundir.write_atomic``). Each task records its metrics, ``num_fewshot``, ``limit``,
    lm-eval's version, date."""
    try:
        lm_eval_version = version("lm_eval")
    except PackageNotFoundError:  # scores handed in by a caller, not computed here
        lm_eval_version = None
    file = directory / EVAL
    data = read_json(file, fix="move it away or delete it, then retry") if file.exists() else {}
    if not isinstance(data, dict) or not isinstance(data.setdefault("tasks", {}), dict):
        raise RunDirError(f"{file} is not an eval.json ({{\"tasks\": {{...}}}}); move it away or delete it, then retry")
    tasks = data["tasks"]
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    for task, metrics in results.items():
        tasks[task] = {"metrics": metrics, "num_fewshot": num_fewshot, "limit": limit,
                       "lm_eval_version": lm_eval_version, "date": stamp}
    write_atomic(file, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return file


def eval_columns(directory: str | Path) -> dict[str, float]:
    """``{"eval.<task>.<metric>": value}`` from ``directory/eval.json`` (``write_eval``), standard errors left
    out; ``{}`` when the file is absent or unreadable. ``scalevec report`` puts them in runs.csv."""
    file = Path(directory) / EVAL
    try:
        tasks = load_json(file, "the scores file", "")["tasks"]
        return {f"eval.{task}.{name}": value for task, entry in sorted(tasks.items())
                for name, value, _ in main_metrics(entry["metrics"])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):  # 100,000 nested '['
        return {}


def main_metrics(metrics: dict) -> list[tuple[str, float, float | None]]:
    """``[(metric, value, stderr or None)]`` of one task's lm-eval metrics (``"acc,none"`` -> ``"acc"``)."""
    rows = []
    for key, value in metrics.items():
        name, _, flt = key.partition(",")
        if name.endswith("_stderr") or not is_number(value, finite=False):
            continue
        stderr = metrics.get(f"{name}_stderr,{flt}")
        rows.append((name if flt in ("none", "") else f"{name},{flt}", float(value),
                     float(stderr) if is_number(stderr, finite=False) else None))
    return rows


__all__ = ["eval_columns", "main_metrics", "write_eval"]
