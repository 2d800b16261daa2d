"""``scalevec compare``: strategies × seeds on one config, each strategy at its own tuned lr (DESIGN.md §9).

A comparison is an ordinary sweep whose grid is strategy × (lr) × seed: this module only turns the
command line into a ``sweep_spec.SweepSpec``, runs it with ``sweep.run_sweep`` (finished runs are skipped,
so rerunning the same command resumes) and prints the table that ``report`` builds from the run
directories. The same seed gives every strategy the same data order, validation tokens and initial
matrices (the trainer guarantees it), which is what makes the per-seed differences paired.

``scalevec compare`` with no arguments is the project's main job; its settings are ``DEFAULTS`` below
(the one place to change them). A fair comparison puts every strategy at its own best lr (DESIGN.md §9):
with ``--lr tuned`` (the default) each strategy trains at the lr that the committed reproduction study
found for this preset, corpus, tokenizer, optimizer, schedule and budget (``TUNED``: the study's cell it reads
them from, ``RESULTS/ladder-<rung>-<corpus>/results.csv`` with ``--results RESULTS``, default ``results`` in the
working directory, and the protocol they were tuned under, the ladder's);
``--lr 3e-3,1e-2`` tunes on the spot instead, and ``--lr 1e-2`` puts every strategy at one lr (a test of lr
tolerance, not of the strategies).
"""

from __future__ import annotations

import argparse
import csv
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

from scalevec.config import ScaleConfig
from scalevec.config.codec import section_message, section_of
from scalevec.config.files import YAMLBoundError, safe_load
from scalevec.config.presets import LADDER_INIT_WIDTH
from scalevec.experiments.report import write_report
from scalevec.experiments.sweep import run_sweep
from scalevec.experiments.sweep_spec import canonical_key, spec_from_dict
from scalevec.experiments.tables import LEGEND, cell_rows, text_table

# The main job (`scalevec compare` with no arguments): 3 strategies × 3 seeds of `cpu-80k` at 20 tokens
# per parameter (2.16M tokens per run) on the bundled Shakespeare as bytes.
DEFAULTS = {
    "strategies": "baseline,none,unified",
    "seeds": 3,  # a paired 95 % CI needs at least 3 seeds to say anything (t_0.975 = 4.3 with 2 dof)
    "preset": "cpu-80k",
    "tokens_per_param": 20.0,
    "lr": "tuned",
    "optimizer": "adamw",
    "schedule": "cosine",
    "batch_size": 16,
    "seq_len": 128,
    "eval_every": 100,
    "out": "runs/compare",
    "results": "results",  # the committed study `--lr tuned` reads, relative to the working directory
}

@dataclass(frozen=True)
class TunedCell:
    """A committed study cell that ``--lr tuned`` reads: ``folder`` (``<cell>`` in the study's results folder; its
    ``results.csv`` holds each strategy's tuned lr as ``best_value``) and ``protocol``, the cell's settings that
    are not compare's own flags, applied to every run so that the lrs are used under the setting they were
    tuned in (the ladder's: the 0.12B model's init regime and warmup over 5 % of the steps, DESIGN.md §2)."""

    folder: str
    protocol: dict


# The ladder's protocol, pinned so that a changed preset default cannot move the main job off it: the 0.12B
# model's init regime and warmup over 5 % of the steps on every rung (DESIGN.md §2: the same regime on every rung).
LADDER_WARMUP_FRAC = 0.05
LADDER_PROTOCOL = {"model.init_width": LADDER_INIT_WIDTH, "schedule.warmup_frac": LADDER_WARMUP_FRAC}
# The study cells behind `--lr tuned`: the ladder's finished rungs on the two bundled corpora
# (sweeps/study-ladder-RUNG-CORPUS.yaml; each lr picked on the mean of two seeds). Key: (preset, corpus,
# tokenizer, optimizer, schedule, tokens per parameter) at batch 16 × 128 tokens.
TUNED: dict[tuple, TunedCell] = {
    (rung, corpus, "bytes", "adamw", "cosine", 20.0): TunedCell(f"ladder-{rung}-{corpus}", LADDER_PROTOCOL)
    for rung in ("cpu-10k", "cpu-25k", "cpu-80k", "cpu-200k") for corpus in ("shakespeare", "kjv")
}
TUNED_AT = {"batch_size": 16, "seq_len": 128}


def study_lrs(cell: TunedCell, results: Path | str = DEFAULTS["results"]) -> dict[str, float]:
    """Each strategy's tuned lr from ``results/cell.folder/results.csv`` (``results``: the study's results folder,
    a relative one read from the working directory). ``ValueError`` naming the file and the fix when it is missing
    or has no tuned lr."""
    path = Path(results) / cell.folder / "results.csv"
    if not path.is_file():
        raise ValueError(f"--lr tuned reads the committed study in {path}, which is not here; run from the "
                         f"scalevec repository checkout or pass --results FOLDER, or pass --lr with a comma list "
                         f"to tune now")
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("tuned") == "optim.lr" and r.get("best_value")]
    if not rows:
        raise ValueError(f"{path} has no tuned lr (no row with tuned=optim.lr); regenerate it with the command in "
                         f"its study file, or pass --lr")
    return {r["strategy"]: float(r["best_value"]) for r in rows}


def _tuned_cell(args: argparse.Namespace, tpp: float | None) -> TunedCell | None:
    key = (args.preset, args.data or "shakespeare", args.tokenizer or "bytes", args.optimizer, args.schedule,
           float(tpp) if tpp is not None else None)
    return TUNED.get(key)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    p.add_argument("--strategies", default=d["strategies"],
                   help=f"comma-separated; the first is the baseline of the Δ column (default {d['strategies']})")
    p.add_argument("--seeds", type=int, default=d["seeds"], help=f"seeds 0..N-1 per strategy (default {d['seeds']})")
    p.add_argument("--preset", default=d["preset"], help=f"model preset (default {d['preset']})")
    p.add_argument("--tokens-per-param", type=float, default=None,
                   help=f"token budget per (baseline) parameter (default {d['tokens_per_param']:g}, DESIGN.md §9)")
    p.add_argument("--steps", type=int, help="optimizer steps per run instead of a tokens-per-parameter budget")
    p.add_argument("--lr", default=d["lr"],
                   help="'tuned' (default: each strategy at the study's best lr for this setting), a comma list "
                        "to tune per strategy now, or one lr for every strategy")
    p.add_argument("--optimizer", default=d["optimizer"], choices=["adamw", "muon"],
                   help=f"as train's (default {d['optimizer']})")
    p.add_argument("--schedule", default=d["schedule"], choices=["cosine", "wsd", "linear", "constant"],
                   help=f"as train's (default {d['schedule']})")
    p.add_argument("--batch-size", type=int, default=d["batch_size"],
                   help=f"sequences per step (default {d['batch_size']})")
    p.add_argument("--seq-len", type=int, default=d["seq_len"], help=f"tokens per sequence (default {d['seq_len']})")
    p.add_argument("--data", help="corpus (default: the bundled Shakespeare); see `scalevec train --help`")
    p.add_argument("--tokenizer", help="bytes (default), bpe:N or a tokenizer.json")
    p.add_argument("--out", default=d["out"], help=f"output folder (default {d['out']}); rerun to resume")
    p.add_argument("--results", default=d["results"],
                   help=f"the study's results folder that --lr tuned reads (default {d['results']}, as in the "
                        f"repository checkout)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (default 1)")
    p.add_argument("--threads", type=int, help="CPU threads per run (default: the usable CPUs split between --jobs); "
                                               "a loss is bitwise reproducible at the same thread count only")
    p.add_argument("--dry-run", action="store_true", help="print the runs (with each one's lr) and the token budget")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any config field, e.g. model.qk_norm=true")


def _list(text: str, what: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"--{what} is empty; give a comma-separated list")
    if len(set(items)) != len(items):
        raise ValueError(f"--{what} lists a value twice ({text}); give each once")
    return items


def tuned_lrs(args: argparse.Namespace, strategies: list[str], tpp: float | None) -> dict[str, float]:
    """Each strategy's tuned lr for the command line's setting, read from the committed study (``TUNED``).
    ``ValueError`` naming the fix when the study has none for it (a setting it did not cover, or a changed batch),
    or when its results are missing."""
    cell = _tuned_cell(args, tpp)
    changed = [f"--{k.replace('_', '-')} {getattr(args, k)}" for k, v in TUNED_AT.items() if getattr(args, k) != v]
    if cell is None or changed or any(o.split("=")[0] in ("optim.lr", "schedule.warmup", "schedule.warmup_frac",
                                                           "model.init_width") for o in args.overrides):
        known = "; ".join(f"{k[0]} {k[1]} {k[2]} {k[3]} {k[4]} {k[5]:g} tokens/param" for k in TUNED)
        why = f"it was tuned at batch 16 × 128 and you gave {', '.join(changed)}" if changed and cell else \
            "the study has no tuned lr for this setting"
        raise ValueError(f"--lr tuned: {why} (tuned settings: {known}); pass --lr with a comma list to tune now "
                         f"(e.g. --lr 5e-3,1e-2,2e-2) or run `scalevec study`")
    table = study_lrs(cell, getattr(args, "results", DEFAULTS["results"]))
    missing = [s for s in strategies if s not in table]
    if missing:
        raise ValueError(f"--lr tuned: no tuned lr for {', '.join(missing)} in this setting (tuned: "
                         f"{', '.join(table)}); "
                         f"drop it from --strategies or pass --lr with a comma list to tune now")
    return {s: table[s] for s in strategies}


# the keys compare sets from its flags (the grid's per run, the rest for every run, and the tuned lr's setting
# from them): one way to set each, so that a key=value cannot bypass the flag's checks or the tuned-lr lookup
FLAG_KEYS = {"strategy": "--strategies", "optim.lr": "--lr", "train.seed": "--seeds", "preset": "--preset",
             "tokens_per_param": "--tokens-per-param", "train.steps": "--steps", "optim.name": "--optimizer",
             "schedule.name": "--schedule", "train.batch_size": "--batch-size", "train.seq_len": "--seq-len",
             "data.source": "--data", "data.tokenizer": "--tokenizer", "train.threads": "--threads"}


def build_spec(args: argparse.Namespace) -> dict:
    """The sweep mapping of a compare command line. Raises ``ValueError`` for bad values."""
    strategies = _list(args.strategies, "strategies")
    for strategy in strategies:
        ScaleConfig.preset(strategy)  # an unknown name is named before any lr lookup
    if args.seeds < 1:
        raise ValueError(f"--seeds {args.seeds} must be >= 1 (2 or more give a confidence interval)")
    tpp = getattr(args, "tokens_per_param", None)
    if tpp is not None and args.steps is not None:
        raise ValueError("--steps and --tokens-per-param both set the budget; give one of them")
    if tpp is None and args.steps is None:
        tpp = DEFAULTS["tokens_per_param"]
    base = {"preset": args.preset, "optim.name": args.optimizer, "schedule.name": args.schedule,
            "train.batch_size": args.batch_size, "train.seq_len": args.seq_len,
            "train.eval_every": DEFAULTS["eval_every"]}
    if args.steps is not None:
        base["train.steps"] = args.steps
        base["train.eval_every"] = min(DEFAULTS["eval_every"], args.steps)
    else:
        base["tokens_per_param"] = tpp
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads} must be >= 1 (or leave it out: the CPUs split between --jobs)")
        base["train.threads"] = threads
    if args.data:
        base["data.source"] = args.data
    if args.tokenizer:
        base["data.tokenizer"] = args.tokenizer
    for item in args.overrides:
        if "=" not in item:
            raise ValueError(f"unexpected argument {item!r}; overrides are key=value (e.g. model.qk_norm=true)")
        key, value = item.split("=", 1)
        flag = FLAG_KEYS.get(canonical_key(key.strip()))
        if flag:
            raise ValueError(f"{key.strip()} is set by compare's {flag}; use {flag} instead of {item}")
        section = section_of(key)
        if section is not None:  # before the tuned-lr lookup, which would otherwise speak first
            raise ValueError(section_message(key.strip(), section))
        try:
            base[key.strip()] = safe_load(value) if value.strip() else ""
        except YAMLBoundError as e:
            raise ValueError(f"{key.strip()}=... is refused: {e.problem}; write the value out") from None
        except yaml.YAMLError:
            base[key.strip()] = value  # not YAML: the config's type check names the key
    grid: dict = {}
    if str(args.lr).strip() == "tuned":
        lrs = tuned_lrs(args, strategies, tpp if args.steps is None else None)
        grid["strategy"] = [{"name": s, "strategy": s, "optim.lr": lr} for s, lr in lrs.items()]
        tune = ["optim.lr"]  # one value per strategy: the report shows it in the "best lr" column
    else:
        lr_items = _list(args.lr, "lr")
        try:
            values = [float(x) for x in lr_items]
        except ValueError:
            raise ValueError(f"--lr {args.lr!r} is 'tuned', a number or a comma list of numbers "
                             f"(e.g. 3e-3,1e-2)") from None
        grid["strategy"] = strategies
        if len(values) > 1:
            grid["lr"] = values
        else:
            base["optim.lr"] = values[0]
        tune = ["optim.lr"] if len(values) > 1 else []
    cell = _tuned_cell(args, tpp if tpp is not None else DEFAULTS["tokens_per_param"])
    if cell is not None:  # the study's protocol (init, warmup) whatever the lr: `--lr` changes the lr alone
        for key, value in cell.protocol.items():
            base.setdefault(key, value)
    grid["seed"] = list(range(args.seeds))
    return {"name": "compare", "base": base, "grid": grid, "baseline": strategies[0], "tune": tune}


def run(args: argparse.Namespace) -> int:
    spec = spec_from_dict(build_spec(args), where="compare")
    from scalevec.config.run_budget import total_steps
    from scalevec.experiments.sweep_grid import expand
    from scalevec.training.schedule import warmup_warning

    cfg = expand(spec)[0].cfg
    warning = warmup_warning(total_steps(cfg), cfg.schedule)
    if warning:  # the trainers' own warning goes to their logs only
        print(f"warning: {warning}")
    rc = run_sweep(spec, args.out, jobs=args.jobs, dry_run=args.dry_run, report=False)
    if args.dry_run:
        print(f"would write the runs and the report into {args.out}")
        if str(args.lr).strip() == "tuned":
            lrs = {v["strategy"]: v["optim.lr"] for v in dict(spec.axes)["strategy"]}
            tpp = args.tokens_per_param if args.tokens_per_param is not None else DEFAULTS["tokens_per_param"]
            print(f"lr per strategy (tuned, read from {Path(args.results) / _tuned_cell(args, tpp).folder}"
                  f"/results.csv): "
                  + ", ".join(f"{s} {lr:g}" for s, lr in lrs.items()))
        return rc
    analysis = write_report(args.out, quiet=True)
    for cell in analysis.cells:
        print(f"\n{cell.label}\n{text_table(*cell_rows(cell))}")
        print(per_seed_table(cell))
    print("\n" + textwrap.fill(LEGEND, 110))
    for w in analysis.warnings:
        print(f"warning: {w}")
    out = Path(args.out)
    print(f"\nwrote {', '.join(str(out / name) for name in analysis.files)}")
    return rc


def per_seed_table(cell) -> str:
    """Final validation loss of every seed, one row per strategy (the values behind mean ± std and the CI)."""
    seeds = sorted({r.seed for res in cell.results for r in res.runs})
    header = ["strategy", "lr"] + [f"seed {s}" for s in seeds]
    rows = []
    for res in cell.results:
        by_seed = {r.seed: r.final_loss for r in res.runs}
        lr = f"{res.pick.lr:g}" if res.pick else f"{res.runs[0].flat.get('optim.lr'):g}"
        rows.append([res.strategy, lr] + [f"{by_seed[s]:.4f}" if s in by_seed else "—" for s in seeds])
    return "per seed (final val loss, nats/token):\n" + text_table(header, rows)


__all__ = ["DEFAULTS", "TUNED", "TunedCell", "add_arguments", "build_spec", "per_seed_table", "run", "study_lrs",
           "tuned_lrs"]
