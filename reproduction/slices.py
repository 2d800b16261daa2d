"""The end of a GPU-ladder slice (``scripts/gpu_slice.sh``): its runs brought home, and its record.

    python -m reproduction.slices OUT --work WORK --results RESULTS --budget-s S --seconds T --jobs J PLAN...

For each plan's study folder ``WORK/NAME``: the files of it that git keeps of a results folder (``results_files``:
the folder's tables, report and figures, and per run config.yaml, meta.json, summary.json, DONE / DIVERGED,
optim_groups.txt; no checkpoints, metrics or logs) are copied to ``OUT/results/NAME``, so that ``cp -r
OUT/results/* results/`` lands them where ``scripts/reproduction.py`` tables them, unchanged. ``OUT/slice.json``
records the slice: the budget and the seconds used, per plan the runs finished before (in ``RESULTS/NAME``) and
after, and the runs left checkpointed, runs finished per hour, and where ``OUT/gpu_busy.txt`` holds nvidia-smi's
utilization samples (percent, one a second) the GPU's busy fraction and ``packing_jobs``' JOBS for the next slice.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

from scalevec.config.files import load_yaml
from scalevec.training import rundir
from scalevec.training.checkpoint.layout import CKPT_DIR

RUN_FILES = (rundir.CONFIG, rundir.META, rundir.SUMMARY, rundir.GROUPS, rundir.DONE, rundir.DIVERGED)  # git keeps these
FOLDER_SUFFIXES = (".csv", ".md", ".png", ".yaml")  # the folder's tables, report, figures and stored spec
MAX_JOBS = 16  # the packing rule's ceiling: past it, start-up and memory, not the GPU's idle time, bound a slice
BUSY_TARGET = 0.9  # the busy fraction the packing rule aims at (our choice: room for evaluation and start-up)


def results_files(folder: Path) -> list[Path]:
    """The files of a study folder that a results/ folder keeps (module docstring), relative to ``folder``."""
    out = [f.relative_to(folder) for f in sorted(folder.iterdir()) if f.is_file() and f.suffix in FOLDER_SUFFIXES]
    runs = folder / "runs"
    for run in sorted(runs.iterdir()) if runs.is_dir() else []:
        if run.is_dir():
            out += [(run / n).relative_to(folder) for n in RUN_FILES if (run / n).is_file()]
    return out


def bring_home(work: Path, dest: Path) -> None:
    """Copy ``results_files(work)`` into ``dest`` (created), keeping their paths."""
    for rel in results_files(work):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(work / rel, dest / rel)


def finished(folder: Path) -> int:
    """Runs of a study folder that finished or diverged (both are results)."""
    runs = folder / "runs"
    return sum(1 for r in runs.iterdir() if r.is_dir() and rundir.state(r) in ("done", "diverged")) if runs.is_dir() \
        else 0


def checkpointed(folder: Path) -> int:
    """Runs of a study folder left unfinished with a checkpoint to resume from (stopped by the slice's end)."""
    runs = folder / "runs"
    return sum(1 for r in runs.iterdir() if r.is_dir() and rundir.state(r) not in ("done", "diverged")
               and (r / CKPT_DIR).is_dir()) if runs.is_dir() else 0


def busy_fraction(samples: list[float]) -> float | None:
    """The mean of nvidia-smi's utilization.gpu samples (percent) as a fraction; None without samples."""
    return sum(samples) / (100.0 * len(samples)) if samples else None


def packing_jobs(jobs: int, busy: float | None) -> int:
    """Runs to pack on the GPU in the next slice, from this slice's ``jobs`` and busy fraction (our rule): a GPU
    busy ``b`` of the time with ``jobs`` runs is asked for ``jobs · BUSY_TARGET / b`` (rounded up) runs, at most
    twice as many as now and ``MAX_JOBS``, at least 1; unchanged without a measurement."""
    if busy is None or busy <= 0:
        return jobs
    return max(1, min(MAX_JOBS, 2 * jobs, math.ceil(jobs * BUSY_TARGET / busy)))


def record(out: Path, work: Path, results: Path, plans: list[Path], budget_s: float, seconds: float,
           jobs: int) -> dict:
    """Bring every plan's runs home and write ``out/slice.json`` (module docstring); returns the record."""
    per_plan = []
    for plan in plans:
        name = load_yaml(plan, "plan file")["name"]
        folder = work / name
        before = finished(results / name)
        after = finished(folder) if folder.is_dir() else before
        if folder.is_dir():
            bring_home(folder, out / "results" / name)
        per_plan.append({"plan": str(plan), "name": name, "finished_before": before, "finished_after": after,
                         "checkpointed": checkpointed(folder) if folder.is_dir() else 0})
    new = sum(p["finished_after"] - p["finished_before"] for p in per_plan)
    samples_file = out / "gpu_busy.txt"
    samples = [float(x) for x in samples_file.read_text().split()] if samples_file.is_file() else []
    busy = busy_fraction(samples)
    rec = {"budget_s": budget_s, "seconds": seconds, "jobs": jobs, "runs_finished": new,
           "runs_per_hour": round(new * 3600.0 / seconds, 2) if seconds > 0 else None,
           "gpu_busy_fraction": None if busy is None else round(busy, 3), "gpu_samples": len(samples),
           "next_jobs": packing_jobs(jobs, busy), "plans": per_plan}
    (out / "slice.json").write_text(json.dumps(rec, indent=2) + "\n")
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="bring a GPU-ladder slice's runs home and record it")
    p.add_argument("out", type=Path)
    p.add_argument("plans", nargs="+", type=Path)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--budget-s", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--jobs", type=int, required=True)
    a = p.parse_args(argv)
    rec = record(a.out, a.work, a.results, a.plans, a.budget_s, a.seconds, a.jobs)
    busy = "" if rec["gpu_busy_fraction"] is None else f", GPU busy {rec['gpu_busy_fraction']:.0%}"
    print(f"slice: {rec['runs_finished']} run(s) finished in {rec['seconds']:.0f} s of {rec['budget_s']:.0f} "
          f"({rec['runs_per_hour']} an hour{busy}; next JOBS {rec['next_jobs']}); "
          f"{sum(x['checkpointed'] for x in rec['plans'])} checkpointed; runs in {a.out / 'results'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
