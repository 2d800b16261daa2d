"""The ``scalevec`` command line: one subcommand per stage (DESIGN.md §12).

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and ``run(args) -> int``;
this file only dispatches. User errors (``ValueError``, a missing file) print one line naming the
problem and the fix and exit with code 2; nothing is written by a command that fails validation.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

# (name, module, help). Each module registers its own arguments; its work runs only for its subcommand.
SUBCOMMANDS = [
    ("info", "scalevec.info", "parameter counts of a preset and strategy (built on the meta device)"),
    ("prepare-data", "scalevec.data.prepared",
     "tokenize a corpus into memory-mapped shards and a manifest (--workers N, --verify)"),
    ("train", "scalevec.training.command", "train one run into a run directory"),
    ("compare", "scalevec.experiments.compare",
     "train strategies × seeds on one config and print the paired comparison"),
    ("sweep", "scalevec.experiments.sweep", "run a grid of runs from a YAML file (resumable, --jobs N, --dry-run)"),
    ("study", "scalevec.experiments.study",
     "tune lr per strategy until the best is inside the grid, then add seeds (resumable)"),
    ("report", "scalevec.experiments.report",
     "rebuild report.md, results.csv and figures from a sweep's run directories"),
    ("plot", "scalevec.experiments.gamma_plot",
     "draw a run's γ trajectories: rms(γ) of every scale vector over the steps, one panel per role"),
    ("theory", "scalevec.experiments.theory.lab",
     "run a DESIGN.md §4 theory experiment (fold, precondition, ..., all)"),
    ("convert", "scalevec.hf.convert",
     "turn a Hugging Face model or a run into another strategy, no training: a run at step 0 or an export"),
    ("export", "scalevec.hf.export", "fold the scales and write a run as a Hugging Face checkpoint (--verify)"),
    ("generate", "scalevec.hf.generate", "sample text from a run directory or an exported Hugging Face directory"),
    ("eval", "scalevec.hf.evaluation",
     "score a run or an exported directory on lm-evaluation-harness tasks (eval.json)"),
    ("bench", "scalevec.bench.command",
     "time a training step, peak memory and folded inference per strategy, vs HF Llama; --count: a CUDA step's "
     "kernels and bytes per block, no GPU needed"),
]


BROKEN_PIPE_EXIT = 141  # what a shell reports for a process killed by SIGPIPE

# a negative number in scientific notation (`--lr -1e-3`) is taken for an option by argparse: joined to its flag
_NEGATIVE = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line naming the problem and where the help is (argparse's
    own printed 17 lines of usage before the error of `train --lr 1e-3,1e-2`), exit 2 as every bad input."""

    def error(self, message: str):
        hint = ""
        if "invalid float value" in message and "," in message:
            hint = " (one number; several lrs are tuned by `scalevec compare --lr a,b,c` or a sweep file)"
        self.exit(2, clip_message(f"{self.prog}: error: {message}{hint}; see {self.prog} --help") + "\n")


LONG_WORD = 400  # an error message's word (a value quoted from a file) longer than this is cut to a prefix


def clip_message(text: str) -> str:
    """``text`` with every run of more than ``LONG_WORD`` non-blank characters cut to its first 200 and ``...``: a
    message quotes at most a short prefix of a value (else a 200 KB ``strategy:`` would be printed whole), while
    the paths and names it gives stay whole."""
    return re.sub(rf"\S{{{LONG_WORD + 1},}}", lambda m: m.group()[:200] + "...", text)


def join_negative_values(argv: list[str]) -> list[str]:
    """``[--flag, -1e-3]`` -> ``[--flag=-1e-3]``, so that a negative number reaches the flag's own check (which
    names the value and its range) instead of argparse's "expected one argument"."""
    out: list[str] = []
    for item in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE.match(item):
            out[-1] = f"{out[-1]}={item}"
        else:
            out.append(item)
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while the command's modules (torch) still import: no traceback
        print("scalevec: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    parser = OneLineParser(prog="scalevec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module, help_text in SUBCOMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    args, extra = parser.parse_known_args(join_negative_values(sys.argv[1:] if argv is None else list(argv)))
    # key=value overrides may stand between flags (`train a=1 --steps 3 b=2`): argparse leaves the later ones over
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        dashed = [e for e in extra if e.startswith("--") and "." in e.split("=")[0]]
        hint = f" (a config field is set as {dashed[0][2:]}, without the dashes)" if dashed else ""
        parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    from scalevec.training.exits import PREEMPTED_EXIT, Preempted

    try:
        return importlib.import_module(args._module).run(args) or 0
    except BrokenPipeError:  # the reader went away (`scalevec study X --dry-run | head`): stop quietly, as a
        # program killed by SIGPIPE does (exit 128 + 13); stdout goes to /dev/null so the final flush cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
    except Preempted as e:  # SIGTERM to a sweep, compare or study: its trainers checkpointed; rerun to resume
        print(f"scalevec {args.command}: {e}", file=sys.stderr)
        return PREEMPTED_EXIT
    except (ValueError, OSError) as e:  # bad input, an unusable file or directory (FileNotFoundError, a full disk)
        from scalevec.outpath import os_error_line  # a bare "[Errno 30] ..." as the path, the problem and a fix

        print(clip_message(f"scalevec {args.command}: error: {os_error_line(e) if isinstance(e, OSError) else e}"),
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"scalevec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
