"""The golden losses: 20 training steps of ``tiny`` per guarded configuration, written as exact floats.

``python tests/golden/generate.py`` prints the losses of the current code on this machine;
``--update`` writes them into ``tests/golden/losses.json`` under this machine's key (torch version and
CPU capability, since fp32 kernels round differently per instruction set). Update only on purpose:
a change that is meant to alter the numerics of training (model, kernels, optimizer, schedule, data
order) says so in its commit message and regenerates every loss that README and docs quote.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from scalevec.model.flops import cpu_name

GOLDEN = Path(__file__).with_name("losses.json")
STEPS = 20
# name -> train command-line style overrides; each guards one path through the numerics
CASES: dict[str, dict] = {
    "baseline": {"strategy": "baseline"},
    "none": {"strategy": "none"},
    "iwd": {"strategy": "iwd"},
    "er": {"strategy": "er"},
    "unified_foldable": {"strategy": "unified_foldable"},
    "unified": {"strategy": "unified"},
    "unified-muon-wsd": {"strategy": "unified", "optim.name": "muon", "schedule.name": "wsd",
                         "schedule.min_lr_ratio": 0.0},
    "peri-qknorm-wd-output": {"strategy": "baseline", "model.layout": "peri", "model.qk_norm": True,
                              "scale.wd": "output"},
    "moe-unified": {"strategy": "unified", "preset": "moe-tiny"},
}
BASE = {"train.steps": STEPS, "train.threads": 1, "train.batch_size": 4, "train.seq_len": 64, "train.log_every": 1,
        "train.eval_every": STEPS, "schedule.warmup": 5, "optim.lr": 1e-2, "data.val_tokens": 4096}


def machine_key() -> str:
    """Where bitwise equality is expected: the torch version, the CPU kernels' instruction set and the CPU's make
    (an Intel Xeon and an AMD EPYC both run AVX-512 kernels, yet round differently: 2e-7 at step 5 measured)."""
    return f"torch {torch.__version__} · {torch.backends.cpu.get_cpu_capability()} · {cpu_name()}"


def case_losses(name: str, cache_dir: str) -> list[float]:
    """The per-step training losses (nats/token) and the final validation loss of one case, one thread."""
    from scalevec.experiments.sweep import assigned_config
    from scalevec.training.trainer import train

    assign = {"preset": "tiny", **BASE, "data.cache_dir": cache_dir, **CASES[name]}
    cfg = assigned_config(assign)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", quiet=True)
        rows = [json.loads(ln) for ln in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"] + [r["val_loss"] for r in rows if r["kind"] == "eval"]


def all_losses() -> dict[str, list[float]]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as cache:
        return {name: case_losses(name, cache) for name in CASES}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--update", action="store_true", help="write this machine's losses into losses.json")
    args = p.parse_args(argv)
    losses = all_losses()
    for name, values in losses.items():
        print(f"{name:<24} first {values[0]:.6f}  last train {values[-2]:.6f}  val {values[-1]:.6f}")
    if args.update:
        data = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        data[machine_key()] = {"cpu": cpu_name(),
                               "losses": {k: [float.hex(v) for v in vs] for k, vs in losses.items()}}
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN} [{machine_key()}]")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
