"""What ``torch.compile`` costs and saves over a whole run: the input to ``train.compile=auto`` (autocompile.py).

    .venv/bin/python benchmarks/compile_cost.py --presets tiny,small --strategies baseline,unified --steps 200

For each preset × strategy it trains ``--steps`` steps eager and ``--steps`` steps compiled (per block, as
the trainer compiles: ``bench.candidates.make_candidate``) on the same batch, and prints the compile time (the
compiled run's first step minus an eager step), the steady step time of both (median after 5 steps, wall
and process CPU), the break-even run length ``compile seconds / (eager step - compiled step)``, the whole
run's time both ways, and whether the compiled losses equal the eager ones bitwise.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch

from scalevec.bench.candidates import make_candidate
from scalevec.bench.harness import quiet_stderr
from scalevec.config import OptimConfig
from scalevec.config.presets import get_preset
from scalevec.model.flops import cpu_name


def run(preset: str, strategy: str, steps: int, compile: bool, batch: int, seq: int) -> dict:
    cfg = get_preset(preset)
    data = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    x, y = data[:, :-1], data[:, 1:]
    torch.compiler.reset()
    c = make_candidate(strategy, cfg, x, y, torch.device("cpu"), nullcontext(), compile, 0, OptimConfig())
    wall, cpu, losses = [], [], []
    t_run = time.perf_counter()
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(float(c.step()))
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"total_s": time.perf_counter() - t_run, "first_s": wall[0], "step_s": statistics.median(wall[5:]),
            "cpu_s": statistics.median(cpu[5:]), "losses": losses}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--strategies", default="baseline,unified")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import os

    print(f"{cpu_name()}, {args.threads} thread(s), torch {torch.__version__}, batch {args.batch_size} x "
          f"{args.seq_len}, {args.steps} steps each; load average at start {os.getloadavg()}")
    print("| preset | strategy | compile s | eager step ms (CPU ms) | compiled step ms (CPU ms) | compiled / eager "
          "(CPU) | break-even steps | run eager s | run compiled s | losses bitwise equal |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for preset in args.presets.split(","):
        for strategy in args.strategies.split(","):
            with quiet_stderr():
                e = run(preset, strategy, args.steps, False, args.batch_size, args.seq_len)
                c = run(preset, strategy, args.steps, True, args.batch_size, args.seq_len)
            compile_s = c["first_s"] - e["step_s"]
            gain = e["step_s"] - c["step_s"]
            even = f"{compile_s / gain:,.0f}" if gain > 0 else "never"
            print(f"| {preset} | {strategy} | {compile_s:.1f} | {1e3 * e['step_s']:.1f} ({1e3 * e['cpu_s']:.1f}) | "
                  f"{1e3 * c['step_s']:.1f} ({1e3 * c['cpu_s']:.1f}) | {c['step_s'] / e['step_s']:.3f} "
                  f"({c['cpu_s'] / e['cpu_s']:.3f}) | {even} | {e['total_s']:.1f} | {c['total_s']:.1f} | "
                  f"{'yes' if e['losses'] == c['losses'] else 'no'} |", flush=True)
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
