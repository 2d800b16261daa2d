"""Write the study file of a ladder rung from the smaller rungs' committed results (issue 23).

    python scripts/ladder_plan.py cpu-80k kjv            # sweeps/study-ladder-cpu-80k-kjv.yaml
    python scripts/ladder_plan.py cpu-550k shakespeare --predicted-only --max-seeds 2

Each strategy's lr is predicted from the tuned lrs of every smaller rung of the same corpus that has reported
(``ladder.predict_lr``: a line in log lr against log N) and its grid is 3 values ×√2 around the prediction
(``study.lr_grids``; the study grows it at an edge as usual). ``--predicted-only``: the predicted lr alone, no
tuning, for a rung too expensive to tune (the report then shows the lr as picked from one value). The file's
header records the points the prediction came from. Refuses to overwrite a study file whose folder has runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from scalevec.experiments import ladder  # noqa: E402

STRATEGIES = ("baseline", "none", "unified")


def plan(rung: str, corpus: str, results: Path, predicted_only: bool, max_seeds: int) -> str:
    """The study YAML for ``rung`` on ``corpus``. ``ValueError`` when no smaller rung has reported."""
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
        lr = ladder.predict_lr(pts, n)
        grids[s] = [float(f"{lr:.6g}")] if predicted_only else ladder.lr_grid(lr)
        notes.append(f"#   {s}: " + ", ".join(f"N {p[0]:,} -> {p[1]:g}" for p in pts) + f"; predicted {lr:.4g}")
    union = sorted({x for g in grids.values() for x in g})
    seeds = "[0, 1]" if max_seeds >= 2 else "[0]"
    study = ("{extend: 1.41421356, max_extensions: 4, confirm_seeds: [2, 3, 4, 5], target_halfwidth: 0.015, "
             f"max_seeds: {max_seeds}, lr_grids: {{{', '.join(f'{s}: {grids[s]}' for s in STRATEGIES)}}}}}")
    if predicted_only:
        study = ("{extend: 1.41421356, max_extensions: 0, confirm_seeds: [], lr_grids: "
                 f"{{{', '.join(f'{s}: {grids[s]}' for s in STRATEGIES)}}}}}")
    how = ("the predicted lr only (no tuning: too expensive here)" if predicted_only else
           "3 values ×√2 around the lr predicted from the smaller rungs, grown at an edge; seeds added until each "
           f"Δ's 95 % interval is planned at ±0.015 nats (at most {max_seeds} seeds)")
    flag = " --predicted-only" if predicted_only else ""
    return f"""# Issue 23, the ladder in the 0.12B model's init regime (model.init_width 640 in the preset), warmup
# 5 % of the steps, 20 tokens per parameter. Written by scripts/ladder_plan.py {rung} {corpus}{flag}: each strategy's
# lrs are {how}. The predictions (a line in log lr against log N over these tuned lrs):
{chr(10).join(notes)}
# Regenerate: scalevec study sweeps/study-ladder-{rung}-{corpus}.yaml --out results/ladder-{rung}-{corpus}
name: ladder-{rung}-{corpus}
base:
  preset: {rung}
  data: {{source: {corpus}, tokenizer: bytes}}
  optim: {{name: adamw}}
  schedule: {{name: cosine, warmup_frac: 0.05}}
  train: {{batch_size: 16, seq_len: 128, eval_every: 500, threads: 1}}
  tokens_per_param: 20
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
    p.add_argument("--out", help="the study file (default sweeps/study-ladder-RUNG-CORPUS.yaml)")
    args = p.parse_args()
    out = Path(args.out or ROOT / "sweeps" / f"study-ladder-{args.rung}-{args.corpus}.yaml")
    try:
        text = plan(args.rung, args.corpus, Path(args.results), args.predicted_only, args.max_seeds)
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
