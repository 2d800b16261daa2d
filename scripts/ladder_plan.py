"""Write the study file of a ladder rung from the smaller rungs' committed results (issue 23).

    python scripts/ladder_plan.py cpu-80k kjv            # sweeps/study-ladder-cpu-80k-kjv.yaml
    python scripts/ladder_plan.py cpu-550k shakespeare --predicted-only --max-seeds 2

Each strategy's lr is predicted from the tuned lrs of every smaller rung of the same corpus that has reported
(``ladder.predict_lr``: a line in log lr against log N) and its grid is 3 values ×√2 around the prediction
(``study.lr_grids``; the study grows it at an edge as usual). ``--predicted-only``: the predicted lr alone, no
tuning, for a rung too expensive to tune (the report then shows the lr as picked from one value); its seeds
still grow toward the ±0.015-nat target unless ``--no-confirm``. The file's
header records the points the prediction came from. Refuses to overwrite a study file whose folder has runs.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from scalevec.experiments import ladder  # noqa: E402

STRATEGIES = ("baseline", "none", "unified")


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
    head = textwrap.fill(f"Issue 23, the ladder in the 0.12B model's init regime (model.init_width 640 in the preset), "
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rung")
    p.add_argument("corpus", choices=ladder.CORPORA)
    p.add_argument("--results", default=str(ROOT / "results"))
    p.add_argument("--predicted-only", action="store_true", help="the predicted lr alone (no lr tuning)")
    p.add_argument("--max-seeds", type=int, default=20)
    p.add_argument("--tuning-seeds", type=int, default=2, help="seeds every lr is tried on (default 2)")
    p.add_argument("--no-confirm", action="store_true", help="no seeds after the tuning seeds")
    p.add_argument("--lr-scale", type=float, default=1.0, help="multiply every predicted lr (default 1)")
    p.add_argument("--grid-factor", type=float, default=ladder.GRID_FACTOR, help="grid spacing (default √2)")
    p.add_argument("--tokens-per-param", type=float, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--device", default="cpu", help="cpu (one thread a run) or cuda")
    p.add_argument("--val-tokens", type=int, help="validation tokens (default: data.val_tokens' 131,072)")
    p.add_argument("--compile", action="store_true", help="compile every run's blocks (train.compile: true)")
    p.add_argument("--out", help="the study file (default sweeps/study-ladder-RUNG-CORPUS.yaml)")
    args = p.parse_args()
    out = Path(args.out or ROOT / "sweeps" / f"study-ladder-{args.rung}-{args.corpus}.yaml")
    try:
        text = plan(args.rung, args.corpus, Path(args.results), args.predicted_only, args.max_seeds,
                    tuning_seeds=args.tuning_seeds, lr_scale=args.lr_scale, factor=args.grid_factor,
                    tokens_per_param=args.tokens_per_param, batch_size=args.batch_size, seq_len=args.seq_len,
                    device=args.device, confirm=not args.no_confirm, val_tokens=args.val_tokens,
                    compile_blocks=args.compile)
    except ValueError as e:
        print(f"ladder_plan: {e}", file=sys.stderr)
        return 2
    runs = ladder.folder(Path(args.results), args.rung, args.corpus) / "runs"
    if out.exists() and runs.is_dir() and any(runs.iterdir()):
        print(f"ladder_plan: {out} already drives runs in {runs}; a new grid would mix protocols. Move that "
              f"folder away first", file=sys.stderr)
        return 2
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
