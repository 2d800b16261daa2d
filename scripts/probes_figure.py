"""What the training probes show over a run, strategy against strategy (docs/reproduction.md, "Finding out why").

    python scripts/probes_figure.py RUN_DIR [RUN_DIR ...] --out results/probes-cpu-25k-shakespeare

Reads each run's ``metrics.jsonl`` (written by ``scalevec train --probe-every K --sharpness-every K``;
theory/probes.py defines the quantities) and writes ``probes.png`` and ``probes.csv``: per logged step,
over every Input-Norm branch of the model, the median and the spread (10th/90th percentile over
branches of the per-branch medians) of

- γ_j² (the per-channel preconditioner's scale part; DESIGN.md §2: the update of the folded weight's
  column j is preconditioned by γ_j² I + w_j w_jᵀ),
- ‖w_j‖² / γ_j² (how much of the preconditioner is the weight's own part; the self-amplification),
- the top Hessian eigenvalue (sharpness) on the first validation batch, and the validation loss.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np


def read(run: Path) -> dict:
    probes, sharp, evals = [], [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "probe" and "sharpness" in row:
            sharp.append((row["step"], row["sharpness"]))
        if row.get("kind") == "probe" and "norms" in row:
            g, ratio = [], []
            for norm in row["norms"].values():
                for b in (norm.get("branches") or {}).values():
                    if b.get("gamma_sq") is None:  # `none`: no scale vector, nothing to precondition with
                        continue
                    gamma_sq, col = b["gamma_sq"]["median"], b["col_norm"]["median"]
                    g.append(gamma_sq)
                    ratio.append(col ** 2 / gamma_sq if gamma_sq > 0 else np.nan)
            probes.append((row["step"], np.asarray(g), np.asarray(ratio)))
        elif row.get("kind") == "eval":
            evals.append((row["step"], row["val_loss"]))
    return {"probes": probes, "sharpness": sharp, "eval": evals}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    rows = []
    for run in map(Path, args.runs):
        cfg = (run / "config.yaml").read_text()
        name = next((ln.split(":", 1)[1].strip() for ln in cfg.splitlines() if ln.startswith("strategy:")), run.name)
        d = read(run)
        if not d["probes"] and not d["sharpness"]:
            print(f"{run}: no probe rows (train with --probe-every K)", file=sys.stderr)
            return 2
        d["probes"] = [p for p in d["probes"] if p[1].size]
        steps = [s for s, _, _ in d["probes"]]
        panels = ((axes[0], 1, "γ_j² (median over channels)"), (axes[1], 2, "‖w_j‖² / γ_j² (median over channels)"))
        for ax, idx, label in panels if steps else ():
            med = [float(np.nanmedian(v[idx])) for v in d["probes"]]
            lo = [float(np.nanpercentile(v[idx], 10)) for v in d["probes"]]
            hi = [float(np.nanpercentile(v[idx], 90)) for v in d["probes"]]
            (line,) = ax.plot(steps, med, label=name)
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)
            ax.set_title(label + ", over branches", fontsize=8)
        if d["sharpness"]:
            axes[2].plot(*zip(*d["sharpness"]), marker="o", ms=3, label=name)
        axes[3].plot(*zip(*d["eval"]), marker="o", ms=3, label=name)
        sharp = dict(d["sharpness"])
        for step, g, ratio in d["probes"]:
            rows.append({"strategy": name, "step": step, "gamma_sq_median": float(np.nanmedian(g)),
                         "gamma_sq_p10": float(np.nanpercentile(g, 10)), "gamma_sq_p90": float(np.nanpercentile(g, 90)),
                         "w_over_gamma_median": float(np.nanmedian(ratio)), "sharpness": sharp.get(step, "")})
    axes[2].set_title("sharpness (top Hessian eigenvalue, first val batch)", fontsize=8)
    axes[3].set_title("validation loss (nats/token)", fontsize=8)
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "probes.png", dpi=120)
    with open(out / "probes.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out / 'probes.png'} and {out / 'probes.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
