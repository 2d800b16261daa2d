"""Where a strategy's extra step time goes: torch.profiler self CPU time per op, against a reference.

    .venv/bin/python benchmarks/profile_step.py --preset small --strategies baseline,unified_foldable,unified

Builds the candidates as ``scalevec bench`` does (same batch, same step), warms them up, then profiles
``--reps`` rounds of ``--steps`` steps each, interleaved, and prints each op's self CPU ms per step
(calls per step in parentheses), sorted by the largest difference from the first candidate. The
profiler's own overhead grows with the number of ops, so read the differences, not the totals.
"""

from __future__ import annotations

import argparse
import collections
from contextlib import nullcontext

import torch
from torch.profiler import ProfilerActivity, profile

from scalevec.bench.candidates import make_candidate, parse_candidates
from scalevec.config import OptimConfig
from scalevec.config.presets import get_preset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--strategies", default="baseline,unified_foldable,unified")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rows", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = get_preset(args.preset)
    data = torch.randint(0, cfg.vocab_size, (args.batch_size, args.seq_len + 1),
                         generator=torch.Generator().manual_seed(0))
    x, y = data[:, :-1], data[:, 1:]
    names = parse_candidates(args.strategies)
    cands = [make_candidate(n, cfg, x, y, torch.device("cpu"), nullcontext(), False, 0, OptimConfig()) for n in names]
    for c in cands:
        for _ in range(3):
            c.step()
    n_steps = args.reps * args.steps
    ms = {c.name: collections.Counter() for c in cands}
    calls = {c.name: collections.Counter() for c in cands}
    for _ in range(args.reps):
        for c in cands:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    c.step()
            for e in prof.key_averages():
                ms[c.name][e.key] += e.self_cpu_time_total / 1e3 / n_steps
                calls[c.name][e.key] += e.count / n_steps
    ref = names[0]
    print(f"preset {args.preset}, batch {args.batch_size} x {args.seq_len}, {args.threads} thread(s); "
          f"self CPU ms per step (calls per step); profiled total: "
          + ", ".join(f"{n} {sum(ms[n].values()):.1f} ms" for n in names))
    keys = sorted(set().union(*ms.values()), key=lambda k: -max(abs(ms[n][k] - ms[ref][k]) for n in names))
    print("| op | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for k in keys[:args.rows]:
        print(f"| {k[:58]} | " + " | ".join(f"{ms[n][k]:.2f} ({calls[n][k]:.0f})" for n in names) + " |")


if __name__ == "__main__":
    main()
