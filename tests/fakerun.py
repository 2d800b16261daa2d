"""Synthetic run directories following the trainer's run-directory contract, for sweep/report/compare tests.

``python tests/fakerun.py --config RUN.yaml --out RUN [--quiet] [--resume|--overwrite]`` stands in for
``python -m scalevec train``: it writes config.yaml, meta.json, optim_groups.txt, metrics.jsonl,
summary.json and DONE in a fraction of a second (no torch import). Its losses follow a known model:

    final loss = E + A·N^(-α) / k(strategy)^α + c·log(lr / lr*)² + seed noise

so a strategy with k = 2 behaves exactly like a baseline with twice the parameters (compute multiplier
k² = 4 at fixed tokens per parameter) and the best lr is ``LR_STAR``. ``FAKE_SLEEP`` (seconds) delays
every run after the first one of a sweep (for the interrupted-sweep test); ``FAKE_LOG`` names a file
that gets one line per invocation; runs with lr >= ``FAKE_DIVERGE_LR`` stop like a diverged trainer
(a DIVERGED marker, a message with "non-finite" and exit code 3).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import yaml

E, A, ALPHA = 1.5, 30.0, 0.3
LR_STAR, LR_COEF = 3e-3, 0.02
K_STRATEGY = {"baseline": 1.0, "none": 0.8, "unified": 2.0}
SEED_NOISE = 0.01  # shared by every strategy of a seed (pairing cancels it)
STEP_TIME = {"baseline": 0.10, "none": 0.09, "unified": 0.11}


def non_embedding_params(cfg: dict) -> int:
    """Approximate non-embedding parameters: attention 4·d² and SwiGLU 3·d·d_ff per layer."""
    m = cfg["model"]
    return m["n_layers"] * (4 * m["d_model"] ** 2 + 3 * m["d_model"] * m["d_ff"])


def final_loss(cfg: dict) -> float:
    """The synthetic final validation loss of a run (module docstring)."""
    n = non_embedding_params(cfg)
    k = K_STRATEGY.get(cfg["strategy"], 1.0)
    lr = float(cfg["optim"]["lr"])
    seed_shift = random.Random(cfg["train"]["seed"]).gauss(0, SEED_NOISE)
    run_noise = random.Random(f"{cfg['strategy']}-{cfg['train']['seed']}-{lr}-{n}").gauss(0, 0.001)
    return E + A * (k * n) ** (-ALPHA) + LR_COEF * math.log(lr / LR_STAR) ** 2 + seed_shift + run_noise


def write_run(out: Path, cfg: dict, n_evals: int = 5, curve: list[float] | None = None) -> dict:
    """Write a complete synthetic run directory for ``cfg`` (a RunConfig mapping) and return its summary.

    ``curve``: validation losses at ``n_evals`` evenly spaced evaluations (default: the synthetic model).
    """
    t = cfg["train"]
    per_step = t["batch_size"] * t["seq_len"]
    steps = math.ceil(t["tokens"] / per_step) if t.get("tokens") else t["steps"]
    n_evals = len(curve) if curve else n_evals
    final = curve[-1] if curve else final_loss(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (out / "meta.json").write_text(json.dumps({"format": "scalevec-run/1", "fake": True}))  # rundir.RUN_FORMAT
    (out / "optim_groups.txt").write_text("fake\n")
    rows = []
    for i in range(1, n_evals + 1):
        step = round(steps * i / n_evals)
        frac = step / steps  # loss decays towards the final value as 1/frac
        val = curve[i - 1] if curve else final + 0.5 * (1 / frac - 1)
        rows.append({"kind": "train", "step": step - 1, "tokens": step * per_step, "lr": cfg["optim"]["lr"],
                     "loss": val + 0.02, "grad_norm": 1.0, "tok_per_s": 1e5, "step_time": 0.1,
                     "scales": {"layers.0.attn": {"mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0}}})
        rows.append({"kind": "eval", "step": step, "tokens": step * per_step, "val_loss": val,
                     "val_bpb": val / math.log(2)})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = cfg["model"]
    emb = 2 * m["vocab_size"] * m["d_model"]
    summary = {"final_val_loss": final, "final_val_bpb": final / math.log(2), "best_val_loss": final,
               "tokens": steps * per_step, "steps": steps, "wall_time_s": 1.0,
               "step_time_s": STEP_TIME.get(cfg["strategy"], 0.1), "params": non_embedding_params(cfg) + emb,
               "non_embedding_params": non_embedding_params(cfg), "scale_params": 10,
               "strategy": cfg["strategy"], "preset": cfg["preset"], "lr": cfg["optim"]["lr"],
               "seed": t["seed"], "optimizer": cfg["optim"]["name"], "schedule": cfg["schedule"]["name"]}
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "DONE").write_text("done\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not (args.resume or args.overwrite):
        print(f"{out} already holds a run", file=sys.stderr)
        return 2
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(out.name + "\n")
    cfg = yaml.safe_load(Path(args.config).read_text())
    if float(cfg["optim"]["lr"]) >= float(os.environ.get("FAKE_DIVERGE_LR", "inf")):
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(Path(args.config).read_text())
        (out / "DIVERGED").write_text(json.dumps({"step": 3, "first_bad_step": 3, "checkpoint": None,
                                                  "reason": "non-finite loss or gradient norm at step 3"}))
        print("non-finite loss or gradient norm at step 3", file=sys.stderr)
        return 3
    if float(cfg["optim"]["lr"]) >= float(os.environ.get("FAKE_FAIL_LR", "inf")):  # a failure, as the CLI reports one
        if not os.environ.get("FAKE_FAIL_QUIET"):  # quiet: dies without a word, as a killed process does
            print("loading 3 documents\nscalevec train: error: the fake trainer fails at this lr", file=sys.stderr)
        return 2
    sleep = float(os.environ.get("FAKE_SLEEP", "0"))
    if sleep and any(d.is_dir() and (d / "DONE").exists() for d in out.parent.iterdir()):
        out.mkdir(parents=True, exist_ok=True)  # a partial run directory, as a killed trainer leaves it
        (out / "config.yaml").write_text(Path(args.config).read_text())
        time.sleep(sleep)
    write_run(out, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
