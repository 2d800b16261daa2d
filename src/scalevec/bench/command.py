"""``scalevec bench``'s flags and dispatch: the training-step benchmark, ``--generate`` or ``--count`` (DESIGN.md §12).

``run`` returns 0 and prints the tables (or ``--json``); bad input raises ``ValueError``, which ``cli``
turns into one line and exit code 2. The JSON files it writes (``--save``, ``--json FILE``) are checked before
any work and never replace an existing file unless ``--overwrite`` says so (``json_targets``, ``write_json``).
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
from scalevec.config.presets import PRESETS


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
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="float32, or bfloat16 autocast as the trainer uses on CUDA (default float32; bfloat16 with "
                        "--count)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda")
    p.add_argument("--no-inference", action="store_true", help="skip the forward-only / folded-model timing")
    p.add_argument("--generate", action="store_true",
                   help=f"instead: greedy generation tokens/s of scalevec generate vs transformers generate() on the "
                        f"same export, on CPU (strategies default {GENERATE_STRATEGIES}, --steps rounds, default 3; "
                        f"--threads default 1)")
    p.add_argument("--count", action="store_true",
                   help="instead: count the kernels and the non-matmul bytes per token of one block of a CUDA training "
                        "step (forward + backward) per strategy, on the meta device: no GPU needed (strategies default "
                        "baseline,unified,unified_foldable; --batch-size / --seq-len default 16 x the preset's "
                        "context)")
    p.add_argument("--new-tokens", type=int, default=200, help="with --generate: greedy tokens per run (default 200)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument("--peak-tflops", type=float,
                   help="the peak TFLOP/s for MFU (default: measured in this process, best square matmul)")
    p.add_argument("--threads", type=int,
                   help="CPU threads for torch (default torch's); 1 is steadier on a shared machine")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the models' initial weights and of the random tokens they run on (default 0)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="print the results as JSON instead of tables; with FILE, write the JSON there instead")
    p.add_argument("--save", help="also write the JSON results to this file (missing folders are created)")
    p.add_argument("--overwrite", action="store_true", help="let --save / --json FILE replace an existing file")


def json_targets(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """``[(flag, path)]`` of the JSON files ``args`` ask for (``--save``, ``--json FILE``), each checked before any
    work: ``FileNotFoundError`` for a symbolic link that leads nowhere or loops at it or above it,
    ``NotADirectoryError`` for one under a file (``outpath.check_out_path``), ``IsADirectoryError`` for an existing
    folder, ``FileExistsError`` for an existing file without ``--overwrite``."""
    from scalevec.outpath import check_out_path

    targets = [(flag, Path(value)) for flag, value in (("--save", args.save), ("--json", args.json))
               if value and value != "-"]
    for flag, path in targets:
        check_out_path(path, flag=flag)  # open() below a dangling link or a file: a bare errno, after the run
        if path.is_dir():  # open() would fail with "[Errno 21] Is a directory", after the benchmark
            raise IsADirectoryError(f"{flag} {path} is a folder; give the path of a file to write, e.g. "
                                    f"{path / 'bench.json'}")
        if (path.exists() or path.is_symlink()) and not args.overwrite:
            raise FileExistsError(f"{flag} {path} already exists; pass --overwrite to replace it, or choose another "
                                  f"file")
    return targets


def write_json(path: Path, results: dict) -> None:
    """Write ``results`` as JSON to ``path`` (missing folders created) through a fresh file renamed over it, so that
    a link at ``path`` is replaced, never written through, and a failed write leaves what was there."""
    from scalevec.training.rundir import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(results, indent=1))


def _refuse_unread(args: argparse.Namespace, mode: str, what: str, flags: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the ``flags`` given that ``mode`` never reads (they are not ignored silently: a
    --count --compile would print the eager count as if compiled). A flag is given when it is set away from its
    default (``--device``: other than auto or cpu)."""
    given = {"--batch-size": args.batch_size is not None, "--seq-len": args.seq_len is not None,
             "--compile": args.compile, "--dtype": args.dtype is not None,
             "--device": args.device not in ("auto", "cpu"),
             "--steps": args.steps is not None, "--threads": args.threads is not None,
             "--peak-tflops": args.peak_tflops is not None, "--no-inference": args.no_inference,
             "--no-memory": args.no_memory}
    unread = [f for f in flags if given[f]]
    if unread:
        raise ValueError(f"{mode} {what} and does not use {', '.join(unread)}; drop "
                         f"{'it' if len(unread) == 1 else 'them'}")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` ask for, print its tables (or JSON) and return 0; ``--save`` and ``--json FILE``
    write the JSON to their files, creating missing folders above them (as every ``--out`` is created). Raises
    ``ValueError`` for bad arguments and, before the benchmark runs, the ``OSError`` of ``json_targets``."""
    if args.count and args.generate:
        raise ValueError("--count and --generate are two different benchmarks; give one of them")
    targets = json_targets(args)
    log = (lambda m: print(m, file=sys.stderr, flush=True))
    if args.count:
        from scalevec.bench.count import count, format_count

        _refuse_unread(args, "--count", "counts the eager CUDA path on the meta device",
                       ("--compile", "--steps", "--device", "--threads", "--peak-tflops", "--no-inference",
                        "--no-memory"))
        r = count(args.preset, args.strategies, args.batch_size, args.seq_len, args.dtype or "bfloat16")
        for _, path in targets:
            write_json(path, r)
        print(json.dumps(r, indent=1) if args.json == "-" else format_count(r))
        return 0
    if args.generate:
        _refuse_unread(args, "--generate", "times greedy generation on CPU",
                       ("--batch-size", "--seq-len", "--compile", "--dtype", "--device", "--peak-tflops",
                        "--no-inference", "--no-memory"))
        # `is None`, not `or`: an asked-for 0 is refused by the benchmark, never turned into the default
        r = bench_generate(args.preset, args.strategies, args.new_tokens,
                           rounds=3 if args.steps is None else args.steps,
                           threads=1 if args.threads is None else args.threads, seed=args.seed, log=log)
    else:
        r = bench(args.preset, args.strategies, args.batch_size, args.seq_len,
                  20 if args.steps is None else args.steps, args.warmup,
                  args.compile, args.dtype or "float32", args.device, inference=not args.no_inference,
                  memory=not args.no_memory, seed=args.seed, peak=args.peak_tflops, threads=args.threads, log=log)
    for _, path in targets:
        write_json(path, r)
    report = format_generate_report if args.generate else format_report
    print(json.dumps(r, indent=1) if args.json == "-" else report(r))
    return 0
