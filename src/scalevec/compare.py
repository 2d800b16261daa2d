"""``scalevec compare``: strategies × seeds on one config, with a paired-seed table (DESIGN.md §9).

A comparison is an ordinary sweep whose grid is strategy × (lr) × seed: this module only turns the
command line into a ``sweep.SweepSpec``, runs it with ``sweep.run_sweep`` (finished runs are skipped,
so rerunning the same command resumes) and prints the table that ``report`` builds from the run
directories. The same seed gives every strategy the same data order, validation tokens and initial
matrices (the trainer guarantees it), which is what makes the per-seed differences paired.

``scalevec compare`` with no arguments is the project's main job; its settings are ``DEFAULTS`` below
(the one place to change them): the bundled Shakespeare as bytes, a CPU preset, baseline vs no scale
vectors vs the unified strategy. Per DESIGN.md §13, at small scale the strategies differ mostly in
how well they tolerate a large learning rate, so the default lr is the high end of the useful range;
``--lr 3e-3,1e-2`` tunes the lr per strategy instead (each strategy at its own best lr).
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import yaml

from .report import LEGEND, cell_rows, text_table, write_report
from .sweep import run_sweep, spec_from_dict

# The main job (`scalevec compare` with no arguments). About 0.2 s per step for `small` on 2 cores
# (DESIGN.md §13): 3 strategies × 2 seeds × 500 steps ≈ 10 minutes in all.
DEFAULTS = {
    "strategies": "baseline,none,unified",
    "seeds": 3,  # a paired 95 % CI needs at least 3 seeds to say anything (t_0.975 = 4.3 with 2 dof)
    "preset": "small",
    "steps": 400,
    "lr": "1e-2",
    "optimizer": "adamw",
    "schedule": "cosine",
    "batch_size": 16,
    "seq_len": 128,
    "eval_every": 100,
    "out": "runs/compare",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    p.add_argument("--strategies", default=d["strategies"],
                   help=f"comma-separated; the first is the baseline of the Δ column (default {d['strategies']})")
    p.add_argument("--seeds", type=int, default=d["seeds"], help=f"seeds 0..N-1 per strategy (default {d['seeds']})")
    p.add_argument("--preset", default=d["preset"], help=f"model preset (default {d['preset']})")
    p.add_argument("--steps", type=int, default=d["steps"], help=f"optimizer steps per run (default {d['steps']})")
    p.add_argument("--lr", default=d["lr"], help=f"peak lr, or a comma list to tune per strategy (default {d['lr']})")
    p.add_argument("--optimizer", default=d["optimizer"], choices=["adamw", "muon"])
    p.add_argument("--schedule", default=d["schedule"], choices=["cosine", "wsd", "linear", "constant"])
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help="sequences per step")
    p.add_argument("--seq-len", type=int, default=d["seq_len"])
    p.add_argument("--data", help="corpus (default: the bundled Shakespeare); see `scalevec train --help`")
    p.add_argument("--tokenizer", help="bytes (default), bpe:N or a tokenizer.json")
    p.add_argument("--out", default=d["out"], help=f"output folder (default {d['out']}); rerun to resume")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time")
    p.add_argument("--dry-run", action="store_true", help="print the runs and the token budget, train nothing")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any config field, e.g. model.qk_norm=true")


def _list(text: str, what: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"--{what} is empty; give a comma-separated list")
    if len(set(items)) != len(items):
        raise ValueError(f"--{what} lists a value twice ({text}); give each once")
    return items


def build_spec(args: argparse.Namespace) -> dict:
    """The sweep mapping of a compare command line. Raises ``ValueError`` for bad values."""
    strategies = _list(args.strategies, "strategies")
    if args.seeds < 1:
        raise ValueError(f"--seeds {args.seeds} must be >= 1 (2 or more give a confidence interval)")
    lr_items = _list(args.lr, "lr")
    try:
        lrs = [float(x) for x in lr_items]
    except ValueError:
        raise ValueError(f"--lr {args.lr!r} is not a number or a comma list of numbers (e.g. 3e-3,1e-2)") from None
    base = {"preset": args.preset, "optim.name": args.optimizer, "schedule.name": args.schedule,
            "train.steps": args.steps, "train.batch_size": args.batch_size, "train.seq_len": args.seq_len,
            "train.eval_every": min(DEFAULTS["eval_every"], args.steps)}
    if args.data:
        base["data.source"] = args.data
    if args.tokenizer:
        base["data.tokenizer"] = args.tokenizer
    for item in args.overrides:
        if "=" not in item:
            raise ValueError(f"unexpected argument {item!r}; overrides are key=value (e.g. model.qk_norm=true)")
        key, value = item.split("=", 1)
        base[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    grid: dict = {"strategy": strategies}
    if len(lrs) > 1:
        grid["lr"] = lrs
    else:
        base["optim.lr"] = lrs[0]
    grid["seed"] = list(range(args.seeds))
    return {"name": "compare", "base": base, "grid": grid, "baseline": strategies[0],
            "tune": ["optim.lr"] if len(lrs) > 1 else []}


def run(args: argparse.Namespace) -> int:
    spec = spec_from_dict(build_spec(args), where="compare")
    rc = run_sweep(spec, args.out, jobs=args.jobs, dry_run=args.dry_run, report=False)
    if args.dry_run:
        return rc
    analysis = write_report(args.out, quiet=True)
    for cell in analysis.cells:
        print(f"\n{cell.label}\n{text_table(*cell_rows(cell))}")
    print("\n" + textwrap.fill(LEGEND, 110))
    for w in analysis.warnings:
        print(f"warning: {w}")
    out = Path(args.out)
    print(f"\nwrote {out / 'report.md'}, {out / 'results.csv'}, {out / 'loss_curves.png'}")
    return rc


__all__ = ["DEFAULTS", "add_arguments", "build_spec", "run"]
