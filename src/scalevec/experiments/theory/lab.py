"""``scalevec theory NAME --out DIR [--seed S] [--threads N]``: run a §4 experiment, write NAME.json and NAME.png.

Experiments (DESIGN.md §4): ``fold`` (expressivity on the real model), ``precondition`` (Theorem 2.2),
``weight-decay`` (Input-Norm vs Output-Norm), ``placement`` (Theorem 3.1), ``magdir`` (Theorem 3.2),
or ``all``. Each is deterministic given the seed and takes seconds on one CPU core. The JSON holds
the setup, every figure and the printed summary; it holds no timings, so that two runs with the same
seed write identical files. ``--threads`` sets torch's CPU threads for the experiment (as ``train`` and
``compare`` take it; default: every CPU this process may use), and torch's count is restored after.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

from scalevec.outpath import replace_file

# name -> module in scalevec.experiments.theory with compute(seed) -> dict, summarize(dict) -> list[str],
# plot(dict, path)
EXPERIMENTS = {
    "fold": "expressivity",
    "precondition": "precondition",
    "weight-decay": "weight_decay",
    "placement": "placement",
    "magdir": "magdir",
}


def run_experiment(name: str, out: str | Path, seed: int = 0) -> dict:
    """Run experiment ``name``, write ``out/name.json`` and ``out/name.png``; return the result dict
    (``{"experiment", "seed", "summary": [lines], **figures}``). Raises ``ValueError`` for an unknown name."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown theory experiment {name!r}; choose one of: {', '.join(EXPERIMENTS)}, all")
    module = importlib.import_module(f"scalevec.experiments.theory.{EXPERIMENTS[name]}")
    figures = module.compute(seed)
    result = {"experiment": name, "seed": seed, "summary": module.summarize(figures), **figures}
    out = Path(out)
    replace_file(out / f"{name}.json", json.dumps(result, indent=1, allow_nan=False) + "\n")
    module.plot(figures, str(out / f"{name}.png"))
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=[*EXPERIMENTS, "all"], help="which experiment (all: the five in turn)")
    p.add_argument("--out", required=True, help="directory for NAME.json and NAME.png (created if missing)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--threads", type=int, help="CPU threads (default: every CPU this process may use); the thread "
                   "count changes the last bits of fp32 sums, so reproduce a JSON with the same one")


def run(args: argparse.Namespace) -> int:
    """``scalevec theory``: run the experiment(s) into ``--out`` (created if missing). Raises ``ValueError`` for an
    ``--out`` that is a file or a ``--threads`` below 1, ``FileNotFoundError`` for a symbolic link that leads
    nowhere or loops as ``--out`` or a folder above it and ``NotADirectoryError`` for an ``--out`` under a file
    (``outpath.check_out_path``), before anything is written."""
    import torch

    from scalevec.config.run_budget import usable_cpus
    from scalevec.outpath import check_out_path

    out = Path(args.out)
    check_out_path(out)  # mkdir through a dangling link or below a file: a bare "[Errno 17]" / "[Errno 20]"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory path (it is created if missing)")
    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads} must be >= 1 (or leave it out: every CPU this process may use)")
    out.mkdir(parents=True, exist_ok=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or usable_cpus())
    try:
        _run_all(args, out)
    finally:
        torch.set_num_threads(before)
    return 0


def _run_all(args: argparse.Namespace, out: Path) -> None:
    for name in EXPERIMENTS if args.name == "all" else [args.name]:
        start = time.perf_counter()
        result = run_experiment(name, out, args.seed)
        print(f"== {name} (seed {args.seed}, {time.perf_counter() - start:.1f} s) -> {out / name}.json, .png")
        for line in result["summary"]:
            print(f"  {line}")
