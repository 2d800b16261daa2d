"""``scalevec bench``'s flags and dispatch: the training-step benchmark, or ``--generate`` (DESIGN.md §12).

``run`` returns 0 and prints the tables (or ``--json``); bad input raises ``ValueError``, which ``cli``
turns into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scalevec.bench.candidates import DEFAULT_STRATEGIES, DENSE, GPU_STRATEGIES, HF
from scalevec.bench.generate import GENERATE_STRATEGIES, bench_generate
from scalevec.bench.report import format_generate_report, format_report
from scalevec.bench.step import bench
from scalevec.config import SCALE_CHOICES
from scalevec.presets import PRESETS


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register ``scalevec bench``'s flags on ``p``."""
    p.add_argument("--preset", default="small", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("--strategies",
                   help=f"comma-separated candidates, the first is the reference: a strategy, STRATEGY:APPLY "
                        f"({' / '.join(SCALE_CHOICES['apply'])}; fused is opt-in, not bitwise), {HF} or {DENSE} "
                        f"(default {DEFAULT_STRATEGIES}; on CUDA {GPU_STRATEGIES})")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 16)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 128 on CPU, the preset's context on CUDA)")
    p.add_argument("--steps", type=int, help="timed interleaved rounds (default 20; 3 with --generate)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per candidate first (default 3)")
    p.add_argument("--compile", action="store_true", help="torch.compile each block, as the trainer does")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="float32, or bfloat16 autocast as the trainer uses on CUDA (default float32)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda")
    p.add_argument("--no-inference", action="store_true", help="skip the forward-only / folded-model timing")
    p.add_argument("--generate", action="store_true",
                   help=f"instead: greedy generation tokens/s of scalevec generate vs transformers generate() on the "
                        f"same export, on CPU (strategies default {GENERATE_STRATEGIES}, --steps rounds, default 3; "
                        f"--threads default 1)")
    p.add_argument("--new-tokens", type=int, default=200, help="with --generate: greedy tokens per run (default 200)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument("--peak-tflops", type=float,
                   help="the peak TFLOP/s for MFU (default: measured in this process, best square matmul)")
    p.add_argument("--threads", type=int,
                   help="CPU threads for torch (default torch's); 1 is steadier on a shared machine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    p.add_argument("--save", help="also write the JSON results to this file (missing folders are created)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` ask for, print its tables (or JSON) and return 0; ``--save`` writes the JSON to its
    file, creating missing folders above it (as every ``--out`` is created). Raises ``ValueError`` for bad
    arguments, and before the benchmark runs: ``FileNotFoundError`` for a ``--save`` with a symbolic link that
    leads nowhere or loops at it or on a folder above it, ``NotADirectoryError`` for one under a file
    (``outpath.check_out_path``) and ``IsADirectoryError`` for a ``--save`` that is an existing folder."""
    save = Path(args.save) if args.save else None
    if save is not None:
        from scalevec.outpath import check_out_path

        check_out_path(save, flag="--save")  # open() below a dangling link or a file: a bare errno, after the run
        if save.is_dir():  # open() would fail with "[Errno 21] Is a directory", after the benchmark
            raise IsADirectoryError(f"--save {save} is a folder; give the path of a file to write, e.g. "
                                    f"{save / 'bench.json'}")
    log = (lambda m: print(m, file=sys.stderr, flush=True))
    if args.generate:
        r = bench_generate(args.preset, args.strategies, args.new_tokens, rounds=args.steps or 3,
                           threads=args.threads or 1, seed=args.seed, log=log)
    else:
        r = bench(args.preset, args.strategies, args.batch_size, args.seq_len, args.steps or 20, args.warmup,
                  args.compile, args.dtype, args.device, inference=not args.no_inference, memory=not args.no_memory,
                  seed=args.seed, peak=args.peak_tflops, threads=args.threads, log=log)
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        with open(save, "w") as f:
            json.dump(r, f, indent=1)
    print(json.dumps(r, indent=1) if args.json else (format_generate_report if args.generate else format_report)(r))
    return 0
