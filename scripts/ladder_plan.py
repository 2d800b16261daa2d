"""Write the study file of a ladder rung from the smaller rungs' committed results (``reproduction.ladder``).

    python scripts/ladder_plan.py cpu-80k kjv            # sweeps/study-ladder-cpu-80k-kjv.yaml
    python scripts/ladder_plan.py cpu-550k shakespeare --predicted-only --max-seeds 2

Each strategy's lr is predicted from the tuned lrs of every smaller rung of the same corpus that has reported
(``ladder.predict_lr``: a line in log lr against log N) and its grid is 3 values ×√2 around the prediction
(``study.lr_grids``; the study grows it at an edge as usual). ``--predicted-only``: the predicted lr alone, no
tuning, for a rung too expensive to tune (the report then shows the lr as picked from one value); its seeds
still grow toward the ±0.015-nat target unless ``--no-confirm``. The file's
header records the points the prediction came from.

The horizon axis (budgets other than the ladder's 20 tokens per parameter): ``--tokens-per-param D`` with D ≠ 20
writes ``sweeps/study-ladder-RUNG-CORPUS-tppD.yaml`` (folder ``results/ladder-RUNG-CORPUS-tppD``): each strategy's
grid is 3 values ×√2 around the *20-token pick of the same rung and corpus* shifted by the horizon,
``pick · (D/20)^s`` with s measured on the first protocol's 20- and 100-token cells (``ladder.horizon_exponent``: s ≈
-0.07, i.e. ×0.89 at 100 and ×0.81 at 400), grown at an edge; tuning seeds 0-1, then held-out seeds 2-5 and more until
each Δ *on the held-out seeds* (protocol v3's) is planned at ``--target`` nats (0.015 by default; the study's
``halfwidth_on: held-out``), at most ``--max-seeds``. The header states the data passes the cell makes over the
corpus.

``--centre-corpus C`` centres the grids on corpus C's 20-token picks of the same rung instead: how the 20-token
cells of the third corpus, ``prose`` (``data/corpora/gutenberg-sotu.txt``, ``ladder.SOURCES``; large enough that no
horizon cell repeats data), start (``scripts/ladder_plan.py cpu-80k prose --tokens-per-param 20 --centre-corpus
shakespeare``); its 100- and 400-token cells are then centred on its own 20-token picks.

Refusals (one line on stderr, exit 2, nothing written): an ``--out`` that exists (never overwritten), an ``--out``
whose folder does not exist, a study file whose results folder already has runs, and invalid numbers
(``--grid-factor`` ≤ 1.01, ``--val-tokens`` ≤ 0, ``--max-seeds`` / ``--tuning-seeds`` / ``--batch-size`` /
``--seq-len`` < 1, ``--lr-scale`` / ``--target`` not positive and finite, ``--tokens-per-param`` above
10,000, or below 1 for a horizon cell), a horizon cell whose 20-token cell has not reported, and a damaged
results.csv (named).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]  # scalevec from this checkout, and its reproduction package

from reproduction import ladder  # noqa: E402

STRATEGIES = ("baseline", "none", "unified")
HELD_OUT_TARGET = 0.015  # nats: the planned half-width of Δ on the held-out seeds (protocol v3)
MAX_TPP = 10_000  # tokens per parameter: 25x the horizon's longest cell; a typo past it would plan years of CPU (or
# overflow the token count)


def plan_horizon(rung: str, corpus: str, results: Path, tokens_per_param: float, max_seeds: int = 20, *,
                 tuning_seeds: int = 2, factor: float = ladder.GRID_FACTOR, target: float = HELD_OUT_TARGET,
                 batch_size: int = 16, seq_len: int = 128, eval_every: int = 250, schedule: str = "cosine",
                 val_tokens: int | None = None, centre_corpus: str | None = None,
                 out_dir: Path = ROOT / "sweeps") -> str:
    """The study YAML of a horizon cell: ``rung`` on ``corpus`` at ``tokens_per_param`` (tokens per total
    parameter), each strategy's grid 3 values ×``factor`` around its 20-token pick shifted by
    ``ladder.horizon_centre`` (exponent ``ladder.horizon_exponent``), held-out seeds to ``target``.
    ``schedule``: ``cosine`` (the ladder's) or ``wsd`` (stable, then linear to 0 over the last 20 %; the name gets
    ``-wsd``). ``out_dir``: the study file's folder (a built corpus's path is written relative to it, as
    ``scalevec study`` resolves it). ``centre_corpus``: take the 20-token picks of the same rung on that corpus
    instead (a corpus without a 20-token cell of its own yet: the ``prose`` cells at 20, centred on
    Shakespeare's). ``ValueError`` when the 20-token cell or the evidence has not reported."""
    if schedule not in ("cosine", "wsd"):
        raise ValueError(f"schedule {schedule!r}: choose cosine or wsd")
    centre = centre_corpus or corpus
    whose = f"20-token pick on {centre}" if centre != corpus else "20-token pick"
    picks = ladder.read_rung(ladder.folder(results, rung, centre), rung, centre)
    missing = [s for s in STRATEGIES if s not in picks]
    if missing:
        fix = ("scripts/study.sh horizon runs it, or pass --centre-corpus shakespeare" if centre not in ladder.CORPORA
               else "scripts/study.sh ladder")
        raise ValueError(f"{ladder.folder(results, rung, centre)} has not reported {', '.join(missing)} at 20 tokens "
                         f"per parameter; the horizon grid is centred on those picks ({fix})")
    s_exp, evidence = ladder.horizon_exponent(results)
    shift = (tokens_per_param / 20) ** s_exp
    grids, notes = {}, []
    for s in STRATEGIES:
        centre = ladder.horizon_centre(picks[s].lr, tokens_per_param, s_exp)
        grids[s] = ladder.lr_grid(centre, factor=factor)
        notes.append(f"#   {s}: {whose} {picks[s].lr:g}{' (at its grid edge)' if picks[s].at_edge else ''}"
                     f" -> centre {centre:.4g}")
    params, n = ladder.total_params(rung), ladder.non_embedding_params(rung)
    tokens = ladder.run_tokens(params, tokens_per_param, batch_size * seq_len)
    passes = ladder.passes(tokens, corpus)
    name = ladder.horizon_name(rung, corpus, tokens_per_param) + ("-wsd" if schedule == "wsd" else "")
    grids = ladder.share_lrs(grids)
    union = sorted({x for g in grids.values() for x in g})
    lr_grids = "{" + ", ".join(f"{s}: {grids[s]}" for s in STRATEGIES) + "}"
    confirm = list(range(tuning_seeds, tuning_seeds + 4))
    study = (f"{{extend: {factor:.8g}, max_extensions: 4, confirm_seeds: {confirm}, target_halfwidth: {target:g}, "
             f"halfwidth_on: held-out, max_seeds: {max(max_seeds, tuning_seeds + 4)}, lr_grids: {lr_grids}}}")
    ratios = ", ".join(f"{c} {st} ×{r:g}" for c, st, r in evidence)
    sched = (f"{{name: cosine, warmup_frac: {ladder.WARMUP_FRAC:g}}}" if schedule == "cosine" else
             f"{{name: wsd, warmup_frac: {ladder.WARMUP_FRAC:g}, min_lr_ratio: 0.0}}")
    flags = (f" --tokens-per-param {tokens_per_param:g}" + (" --schedule wsd" if schedule == "wsd" else "")
             + (f" --centre-corpus {centre_corpus}" if centre_corpus else ""))
    head = textwrap.fill(
        f"The horizon axis: the ladder's {rung} on {corpus} at {tokens_per_param:g} tokens per total "
        f"parameter ({tokens:,} tokens = {tokens / n:.1f} per non-embedding parameter; {passes:.2f} passes over "
        f"the corpus's {ladder.TRAIN_TOKENS[corpus]:,} training tokens{': DATA REPEATS' if passes > 1 else ''}), "
        f"schedule {schedule}, the ladder's protocol otherwise. Written by scripts/ladder_plan.py {rung} {corpus}"
        f"{flags}: each strategy's lrs are 3 values ×{factor:.3g} around its {whose} × (D/20)^s = ×{shift:.3f}, "
        f"s = {s_exp:.4f} measured on the first protocol's 20- vs 100-token picks ({ratios}), grown at an edge; "
        f"lr picked on seeds 0-{tuning_seeds - 1}, then held-out seeds {confirm[0]}-{confirm[-1]} and more until "
        f"each Δ on the held-out seeds is planned at ±{target:g} nats, at most "
        f"{max(max_seeds, tuning_seeds + 4)} seeds. Centres:", width=118, initial_indent="# ",
        subsequent_indent="# ")
    val = f", val_tokens: {val_tokens}" if val_tokens else ""
    source = ladder.SOURCES[corpus]
    if source != corpus:  # a built corpus, data/corpora/NAME.txt (not committed), resolved beside the study file
        source = os.path.relpath((ROOT / "sweeps" / source).resolve(), Path(out_dir).resolve())
        notes.append(f"# Build the corpus first: python3 data/corpora/build_{Path(source).stem.replace('-', '_')}.py")
    return f"""{head}
{chr(10).join(notes)}
# Regenerate: scalevec study sweeps/study-{name}.yaml --out results/{name}
name: {name}
base:
  preset: {rung}
  data: {{source: {source}, tokenizer: bytes{val}}}
  optim: {{name: adamw}}
  schedule: {sched}
  train: {{batch_size: {batch_size}, seq_len: {seq_len}, eval_every: {eval_every}, threads: 1}}
  tokens_per_param: {tokens_per_param:g}
grid:
  strategy: [{', '.join(STRATEGIES)}]
  lr: {union}
  seed: {list(range(tuning_seeds))}
tune: [optim.lr]
baseline: baseline
study: {study}
"""


def plan(rung: str, corpus: str, results: Path, predicted_only: bool = False, max_seeds: int = 20, *,
         tuning_seeds: int = 2, lr_scale: float = 1.0, factor: float = ladder.GRID_FACTOR, tokens_per_param: float = 20,
         batch_size: int = 16, seq_len: int = 128, device: str = "cpu", confirm: bool = True,
         val_tokens: int | None = None, compile_blocks: bool = False) -> str:
    """The study YAML for ``rung`` on ``corpus``. ``ValueError`` when no smaller rung has reported.

    ``lr_scale`` multiplies every prediction (the GPU ladder's larger batch: √(batch ratio), Adam's square-root
    rule, our choice); ``confirm=False`` adds no seeds after the tuning seeds (a budget-bound run);
    ``compile_blocks`` sets ``train.compile: true`` for every run of the rung (long CPU runs: compiled steps take
    ~0.85x the eager CPU time, deterministic run to run but not bitwise equal to eager; docs/performance.md)."""
    if rung not in ladder.RUNGS:
        raise ValueError(f"unknown rung {rung!r}; choose one of {', '.join(ladder.RUNGS)}")
    smaller = ladder.RUNGS[:ladder.RUNGS.index(rung)]
    rows = [r for r in ladder.read_ladder(results) if r.corpus == corpus and r.rung in smaller]
    n = ladder.non_embedding_params(rung)
    grids, notes = {}, []
    for s in STRATEGIES:
        pts = [(r.n, r.lr) for r in rows if r.strategy == s]
        if not pts:
            raise ValueError(f"no smaller rung of {corpus} has reported {s}; run those rungs first "
                             f"(scripts/study.sh ladder)")
        lr = ladder.predict_lr(pts, n) * lr_scale
        grids[s] = [float(f"{lr:.6g}")] if predicted_only else ladder.lr_grid(lr, factor=factor)
        notes.append(f"#   {s}: " + ", ".join(f"N {p[0]:,} -> {p[1]:g}" for p in pts) + f"; predicted {lr:.4g}"
                     + (f" (× {lr_scale:.4g})" if lr_scale != 1 else ""))
    grids = ladder.share_lrs(grids)
    union = sorted({x for g in grids.values() for x in g})
    seeds = list(range(tuning_seeds))
    lr_grids = "{" + ", ".join(f"{s}: {grids[s]}" for s in STRATEGIES) + "}"
    extensions = 0 if predicted_only else 4
    if not confirm:
        study = f"{{extend: {factor:.8g}, max_extensions: {extensions}, confirm_seeds: [], lr_grids: {lr_grids}}}"
    else:  # seeds 0..tuning_seeds-1 for every strategy first, so an interrupted rung already has paired seeds
        study = (f"{{extend: {factor:.8g}, max_extensions: {extensions}, confirm_seeds: "
                 f"{list(range(tuning_seeds, 6))}, target_halfwidth: 0.015, max_seeds: {max_seeds}, "
                 f"lr_grids: {lr_grids}}}")
    how = (("the predicted lr only (no tuning: too expensive here)" if predicted_only else
            f"3 values ×{factor:.3g} around the lr predicted from the smaller rungs, grown at an edge") +
           (f"; seeds added until each Δ's 95 % interval is planned at ±0.015 nats (at most {max_seeds} seeds)"
            if confirm else f"; {tuning_seeds} seed(s), no more"))
    flag = " --predicted-only" if predicted_only else ""
    threads = "threads: 1" if device == "cpu" else f"device: {device}"
    threads += ", compile: 'true'" if compile_blocks else ""
    head = textwrap.fill(f"The ladder in the 0.12B model's init regime (model.init_width 640 in the preset), "
                         f"warmup 5 % of the steps, {tokens_per_param:g} tokens per parameter. Written by "
                         f"scripts/ladder_plan.py {rung} {corpus}{flag}: each strategy's lrs are {how}. The "
                         f"predictions (ladder.predict_lr: a line in log lr against log N over 3 or more rungs, "
                         f"else of slope -1/2 through the rungs' geometric mean), from these tuned lrs:",
                         width=118, initial_indent="# ", subsequent_indent="# ")
    return f"""{head}
{chr(10).join(notes)}
# Regenerate: scalevec study sweeps/study-ladder-{rung}-{corpus}.yaml --out results/ladder-{rung}-{corpus}
name: ladder-{rung}-{corpus}
base:
  preset: {rung}
  data: {{source: {corpus}, tokenizer: bytes{f", val_tokens: {val_tokens}" if val_tokens else ""}}}
  optim: {{name: adamw}}
  schedule: {{name: cosine, warmup_frac: {ladder.WARMUP_FRAC:g}}}
  train: {{batch_size: {batch_size}, seq_len: {seq_len}, eval_every: 500, {threads}}}
  tokens_per_param: {tokens_per_param:g}
grid:
  strategy: [{', '.join(STRATEGIES)}]
  lr: {union}
  seed: {seeds}
tune: [optim.lr]
baseline: baseline
study: {study}
"""


def _check(args: argparse.Namespace) -> str | None:
    """The first invalid argument, as one line (None when all are valid)."""
    def finite_pos(v: float) -> bool:
        return math.isfinite(v) and v > 0
    if not (math.isfinite(args.grid_factor) and args.grid_factor > 1 + 100 * ladder.SAME_LR_REL):
        return (f"--grid-factor {args.grid_factor} must be a finite number above {1 + 100 * ladder.SAME_LR_REL:g} "
                f"(the grid's spacing, like 1.41421; closer values are one lr to the rounding of run names)")
    if args.val_tokens is not None and args.val_tokens <= 0:
        return f"--val-tokens {args.val_tokens} must be > 0 (default: data.val_tokens' 131,072)"
    for flag, v in (("--max-seeds", args.max_seeds), ("--tuning-seeds", args.tuning_seeds),
                    ("--batch-size", args.batch_size), ("--seq-len", args.seq_len), ("--eval-every", args.eval_every)):
        if v < 1:
            return f"{flag} {v} must be >= 1"
    if args.max_seeds < args.tuning_seeds:
        return f"--max-seeds {args.max_seeds} is below --tuning-seeds {args.tuning_seeds}"
    for flag, v in (("--lr-scale", args.lr_scale), ("--tokens-per-param", args.tokens_per_param),
                    ("--target", args.target)):
        if not finite_pos(v):
            return f"{flag} {v} must be a finite number > 0"
    if args.tokens_per_param > MAX_TPP:
        return f"--tokens-per-param {args.tokens_per_param:g} is above {MAX_TPP:,} (the horizon's longest cell: 400)"
    if args.rung not in ladder.RUNGS:
        return f"unknown rung {args.rung!r}; choose one of {', '.join(ladder.RUNGS)}"
    if (args.schedule != "cosine" or args.centre_corpus) and _gpu_ladder(args):
        return ("--schedule wsd and --centre-corpus are a horizon cell's (tuned on CPU); they take none of "
                "--predicted-only, --no-confirm, --lr-scale, --device, --compile")
    if is_horizon(args) and args.tokens_per_param < 1:  # (D/20)^s would move the lrs by orders of magnitude
        return (f"--tokens-per-param {args.tokens_per_param:g}: a horizon cell needs 1 or more (the ladder's 20, the "
                f"paper's 100, 400); a tiny budget is a GPU-ladder rehearsal's (--predicted-only)")
    if args.corpus not in ladder.CORPORA and not is_horizon(args):
        return (f"{args.corpus} has no 20-token ladder of its own (a horizon cell's corpus): pass --centre-corpus "
                f"shakespeare (its 20-token cells) or --tokens-per-param D (after those have reported)")
    return None


def _gpu_ladder(args) -> bool:
    """The flags of a GPU-ladder rung (scripts/gpu_ladder.sh): lrs predicted up the rungs, not tuned on CPU."""
    return (args.predicted_only or args.no_confirm or args.lr_scale != 1 or args.device != "cpu"
            or args.compile)


def is_horizon(args) -> bool:
    """A horizon cell: a CPU cell tuned at another budget than 20 tokens per parameter, or under WSD.
    The same budget with the GPU-ladder flags is a rung planned up the ladder (``plan``), e.g. gpu_ladder.sh's
    CPU rehearsal at a tiny TPP."""
    return (args.tokens_per_param != 20 or args.schedule != "cosine" or bool(args.centre_corpus)) and not _gpu_ladder(
        args)


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (``ladder_plan: ...``, exit 2) instead of the usage text."""

    def error(self, message: str):
        print(f"ladder_plan: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    """Write one study file; 0 on success, 2 (one line on stderr, nothing written) on any refusal."""
    p = _Parser(description=__doc__.splitlines()[0])
    p.add_argument("rung")
    p.add_argument("corpus", choices=ladder.HORIZON_CORPORA)
    p.add_argument("--results", default=str(ROOT / "results"))
    p.add_argument("--predicted-only", action="store_true", help="the predicted lr alone (no lr tuning)")
    p.add_argument("--max-seeds", type=int, default=20)
    p.add_argument("--tuning-seeds", type=int, default=2, help="seeds every lr is tried on (default 2)")
    p.add_argument("--no-confirm", action="store_true", help="no seeds after the tuning seeds")
    p.add_argument("--lr-scale", type=float, default=1.0, help="multiply every predicted lr (default 1)")
    p.add_argument("--grid-factor", type=float, default=ladder.GRID_FACTOR, help="grid spacing (default √2)")
    p.add_argument("--tokens-per-param", type=float, default=20,
                   help="tokens per total parameter (default 20; another value writes a horizon cell)")
    p.add_argument("--schedule", choices=("cosine", "wsd"), default="cosine", help="horizon cells only")
    p.add_argument("--centre-corpus", choices=ladder.CORPORA,
                   help="horizon cells: centre the grids on this corpus's 20-token picks of the same rung")
    p.add_argument("--target", type=float, default=HELD_OUT_TARGET,
                   help=f"horizon cells: planned half-width of Δ on the held-out seeds (default {HELD_OUT_TARGET})")
    p.add_argument("--eval-every", type=int, default=250, help="horizon cells: steps between evaluations")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu (one thread a run) or cuda")
    p.add_argument("--val-tokens", type=int, help="validation tokens (default: data.val_tokens' 131,072)")
    p.add_argument("--compile", action="store_true", help="compile every run's blocks (train.compile: true)")
    p.add_argument("--out", help="the study file (default sweeps/study-NAME.yaml); never overwritten")
    args = p.parse_args(argv)
    bad = _check(args)
    if bad:
        print(f"ladder_plan: {bad}", file=sys.stderr)
        return 2
    horizon = is_horizon(args)
    name = ladder.horizon_name(args.rung, args.corpus, args.tokens_per_param) + (
        "-wsd" if args.schedule == "wsd" else "")
    out = Path(args.out) if args.out else ROOT / "sweeps" / f"study-{name}.yaml"
    if out.exists() or out.is_symlink():
        print(f"ladder_plan: {out} exists; it is never overwritten (remove it, or pass another --out)",
              file=sys.stderr)
        return 2
    if not out.parent.is_dir():
        print(f"ladder_plan: the folder of --out {out} does not exist", file=sys.stderr)
        return 2
    runs = Path(args.results) / name / "runs"
    if runs.is_dir() and any(runs.iterdir()):
        print(f"ladder_plan: {runs} already has runs; a new grid would mix protocols. Move that folder away "
              f"first", file=sys.stderr)
        return 2
    try:
        if horizon:
            text = plan_horizon(args.rung, args.corpus, Path(args.results), args.tokens_per_param, args.max_seeds,
                                tuning_seeds=args.tuning_seeds, factor=args.grid_factor, target=args.target,
                                batch_size=args.batch_size, seq_len=args.seq_len, eval_every=args.eval_every,
                                schedule=args.schedule, val_tokens=args.val_tokens,
                                centre_corpus=args.centre_corpus, out_dir=out.parent)
        else:
            text = plan(args.rung, args.corpus, Path(args.results), args.predicted_only, args.max_seeds,
                        tuning_seeds=args.tuning_seeds, lr_scale=args.lr_scale, factor=args.grid_factor,
                        tokens_per_param=args.tokens_per_param, batch_size=args.batch_size, seq_len=args.seq_len,
                        device=args.device, confirm=not args.no_confirm, val_tokens=args.val_tokens,
                        compile_blocks=args.compile)
    except ValueError as e:
        print(f"ladder_plan: {e}", file=sys.stderr)
        return 2
    try:
        with out.open("x") as fh:  # O_EXCL: never replaces a file that appeared meanwhile, never follows a link
            fh.write(text)
    except OSError as e:
        print(f"ladder_plan: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
