"""Run directories -> ``RunRecord``s: what the report reads of each run (DESIGN.md §9).

Like lingua's run folder -> DataFrame: a record is one run's resolved config (flattened to dotted
keys), its summary when finished, its evaluation rows and its status (done, diverged, unfinished). Every
file is read through ``training.rundir``; nothing is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalevec.config import RunConfig
from scalevec.config.codec import to_dict
from scalevec.training import rundir


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
    machine: str = ""  # "CPU (instruction set), N thread(s), torch V" from meta.json: what a bitwise re-run needs
    meta: dict = field(default_factory=dict)  # the run's meta.json ({} when absent or unreadable)

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
    present, the eval rows from the summary when metrics.jsonl is not; a cut-off last metrics line is
    skipped). ``RunDirError`` names a damaged file and the fix."""
    cfg = rundir.load_config(path)
    summary = None
    if rundir.state(path) == "done":  # raises for DONE without summary.json, as a sweep's skip does
        summary = rundir.read_summary(path, fix="retrain the run, or delete its DONE to report it unfinished")
    evals = rundir.read_metrics(path, kind="eval")
    if not evals and summary and not (path / rundir.METRICS).exists():
        evals = list(summary.get("evals") or [])  # a run kept in git without its metrics.jsonl
    status = "done" if summary else ("diverged" if rundir.is_diverged(path) else "unfinished")
    meta = rundir.read_meta(path)
    return RunRecord(path.name, path, cfg, flatten_config(cfg), summary, evals, status, describe_machine(meta, cfg),
                     meta)


def describe_machine(meta: dict, cfg: RunConfig) -> str:
    """What a run's bits depend on besides its config (README "What reproduces where"): the CPU kind and
    instruction set from its ``meta.json``, its thread count and torch version, e.g. ``AMD EPYC (AVX512), 1
    thread(s), torch 2.13.0+cpu``; "" when meta.json names no CPU."""
    if not meta.get("cpu"):
        return ""
    threads = meta.get("threads", cfg.train.threads)
    torch = f", torch {meta['torch']}" if meta.get("torch") else ""
    return f"{meta['cpu']} ({meta.get('cpu_capability', '?')}), {threads} thread(s){torch}"


def machine_of(path: Path, cfg: RunConfig) -> str:
    """``describe_machine`` of the run directory ``path``'s meta.json."""
    return describe_machine(rundir.read_meta(path), cfg)


def machines(runs: list[RunRecord]) -> list[tuple[str, int]]:
    """``[(machine, number of runs)]`` over the runs whose meta.json names one, most runs first: one entry
    when every run came from one kind of machine (what a bitwise re-run needs, ``describe_machine``)."""
    counts: dict[str, int] = {}
    for r in runs:
        if r.machine:
            counts[r.machine] = counts.get(r.machine, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def validation_splits(runs: list[RunRecord]) -> list[tuple[str, int]]:
    """``[(split, number of runs)]`` over the runs whose meta.json records their validation split (the trainer's
    ``validation_split``, ``split.SplitRecord.as_dict``), most runs first: the data source, the split's note
    (rule, documents held out) and the first 12 hex digits of the hash of the validation document indices, so
    two runs that name the same entry validated on the same documents."""
    counts: dict[str, int] = {}
    for r in runs:
        rec = r.meta.get("validation_split")
        if isinstance(rec, dict) and rec.get("note"):
            source = r.cfg.data.source
            key = f"`{source}`: {rec['note']} (validation index sha256 {str(rec.get('val_index_sha256', '?'))[:12]})"
            counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def load_runs(root: str | Path) -> list[RunRecord]:
    """Every run directory under ``root/runs/`` (or directly under ``root``), sorted by name.

    Raises ``FileNotFoundError`` when ``root`` is missing or holds no run directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory; pass the --out folder of a sweep or compare")
    base = root / "runs" if (root / "runs").is_dir() else root
    runs = [read_run(d) for d in sorted(base.iterdir()) if d.is_dir() and rundir.has_config(d)]
    if not runs:
        raise FileNotFoundError(f"no run directories (with config.yaml) in {base}; run `scalevec sweep` or "
                                f"`scalevec compare` with --out {root} first")
    return runs


__all__ = ["RunRecord", "describe_machine", "flatten_config", "load_runs", "machine_of", "machines", "read_run"]
