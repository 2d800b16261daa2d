"""``scalevec train``: the command line of one run (README "Train one run"; DESIGN.md §8, §12).

Flags and ``key=value`` overrides become a ``RunConfig`` through ``resolve.resolve_config`` (the one
resolution; ``--resume`` resolves the stored config with execution flags only), then
``trainer.train`` runs it. Exit codes: 0 done, 2 bad input or an unusable run directory (``cli.py``
prints the one-line error), 3 the run diverged (``DIVERGED``) or failed during training, 75 SIGTERM
(EX_TEMPFAIL: stopped with a checkpoint, continue with ``--resume``), 130 Ctrl-C (also checkpointed).
``sweep`` reads the same codes from its trainer subprocesses, and ``sweep``, ``compare`` and ``study``
exit with the same 75 on SIGTERM and 130 on Ctrl-C (``trainer.Preempted``, mapped in ``cli.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from dataclasses import replace

import yaml

from scalevec.config import EXECUTION_FIELDS, RunConfig
from scalevec.config.codec import to_dict
from scalevec.config.fieldhelp import config_fields
from scalevec.config.files import load_yaml
from scalevec.config.run_budget import usable_cpus
from scalevec.resolve import fit_vocab, resolve_config
from scalevec.training import init_from, rundir
from scalevec.training.exits import DIVERGED_EXIT, FAILED_EXIT, PREEMPTED_EXIT, Preempted  # the one contract
from scalevec.training.trainer import TrainingDiverged, TrainingFailed, train

FLAG_FIELDS = {  # --flag -> config field
    "optimizer": "optim.name", "lr": "optim.lr", "schedule": "schedule.name", "warmup": "schedule.warmup",
    "steps": "train.steps", "tokens": "train.tokens", "batch_size": "train.batch_size",
    "micro_batch_size": "train.micro_batch_size", "seq_len": "train.seq_len", "seed": "train.seed",
    "data": "data.source", "tokenizer": "data.tokenizer", "device": "train.device", "dtype": "train.dtype",
    "dist": "train.dist", "probe_every": "train.probe_every", "sharpness_every": "train.sharpness_every",
    "eval_every": "train.eval_every", "tracker": "train.tracker", "threads": "train.threads",
}


FIELDS_EPILOG = "<config fields>"  # train --help's epilog: replaced by fields_help() when the help is printed


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter with ``FIELDS_EPILOG`` expanded to ``fields_help()`` (only when help is printed, not
    on every command line) and kept as written (one field a line)."""

    def add_text(self, text):
        super().add_text(fields_help() if text == FIELDS_EPILOG else text)


def fields_help() -> str:
    """Every config field as ``section.field  type  default  [--flag] description``, derived from the
    dataclasses (``config.fieldhelp.config_fields``), one block per section. Defaults are those of a run
    with no options (preset small, strategy baseline); an optional section's (``model.moe``,
    ``model.rope_scaling``) are its class's."""
    flags = {key: "--" + name.replace("_", "-") for name, key in FLAG_FIELDS.items()}
    flags.update({"preset": "--preset", "strategy": "--strategy", "train.compile": "--compile"})
    blocks: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for f in config_fields(resolve_config()):
        default = "{...}" if isinstance(f.default, dict) else yaml.safe_dump(
            f.default, default_flow_style=True, width=1 << 16).removesuffix("...\n").strip()
        doc = " ".join(x for x in (f"[{flags[f.name]}]" if f.name in flags else "", f.doc) if x)
        blocks[f.name.rpartition(".")[0]].append((f.name, f.type, default, doc))
    out = ["config fields: section.field  type  default  [--flag] description",
           "  set any as key=value (e.g. optim.lr=0.01), in a --config YAML file or with its --flag (preset and",
           "  strategy: --flag or the file only); the defaults are a run's with no options (--preset small",
           "  --strategy baseline: model.* follow --preset, scale.* --strategy); model.moe.* (also moe.*) and",
           "  model.rope_scaling.* start from the values shown once one of them is set. --print-config prints the",
           "  resolved config of a command line."]
    for rows in blocks.values():
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        out.append("")
        out.extend("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + ("  " + r[3] if r[3] else "")
                   for r in rows)
    return "\n".join(line.rstrip() for line in out)


def flag_help(name: str) -> str:
    """The --help of a flag that only sets a config field: which field, described in the list below (one home
    for the description: the field's docstring in config/schema.py)."""
    return f"sets {FLAG_FIELDS[name]} (config fields, below)"


def add_arguments(p) -> None:
    p.formatter_class = _HelpFormatter
    p.epilog = FIELDS_EPILOG
    p.add_argument("--config", help="YAML file with any RunConfig fields (preset, strategy, model, scale, optim, ...)")
    p.add_argument("--preset", help="model preset (default small; see `scalevec info`)")
    p.add_argument("--strategy", help="scale-vector strategy (default baseline)")
    p.add_argument("--optimizer", choices=["adamw", "muon"], help=flag_help("optimizer"))
    p.add_argument("--schedule", choices=["cosine", "wsd", "linear", "constant"],
                   help="wsd decays to 0 unless schedule.min_lr_ratio is given")
    for flag, kind in (("lr", float), ("warmup", int), ("steps", int), ("tokens", int), ("batch-size", int),
                       ("micro-batch-size", int), ("seq-len", int), ("seed", int), ("eval-every", int),
                       ("probe-every", int), ("sharpness-every", int)):
        p.add_argument(f"--{flag}", type=kind, help=flag_help(flag.replace("-", "_")))
    p.add_argument("--data", help="shakespeare (default), kjv, a .txt file or folder, .jsonl, .parquet, "
                                  "hf:NAME[:CONFIG], "
                                   "a folder written by `scalevec prepare-data` (memory-mapped shards), or token files "
                                   "as they are: nanogpt:DIR (train.bin/val.bin), olmo-core:PATH (.npy token "
                                   "files) with --tokenizer the tokenizer.json that wrote them")
    p.add_argument("--tokenizer", help="bytes (default), bpe:N, or a path to tokenizer.json")
    p.add_argument("--device", help="auto (default), cpu, cuda")
    p.add_argument("--threads", type=int, help="CPU threads (default: every CPU this process may use); the "
                   "thread count changes the last bits of fp32 sums, so reproduce a run with the same one")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], help=flag_help("dtype"))
    p.add_argument("--dist", choices=["none", "ddp", "fsdp2"], help="data parallelism under torchrun")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each block (--no-compile: eager); default train.compile=auto: compiled on "
                        "CUDA for runs of 1000+ steps, eager on CPU (docs/performance.md)")
    p.add_argument("--out", help="run directory (default runs/<preset>-<strategy>-seed<seed>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.add_argument("--init-from", metavar="DIR",
                   help="start from a Hugging Face model directory (Llama, Mistral, Qwen3, Mixtral, Qwen3-MoE) or "
                        "branch a run: RUN_DIR or RUN_DIR/checkpoints/step_N (its config is the base; flags change it)")
    p.add_argument("--reset-optimizer", action="store_true",
                   help="with --init-from RUN: do not carry the optimizer state")
    p.add_argument("--schedule-from", choices=list(init_from.SCHEDULE_FROM), default="restart",
                   help="with --init-from RUN: restart the schedule at step 0 (default) or continue from the "
                        "parent's step")
    p.add_argument("--tracker", choices=["none", "tensorboard", "wandb"],
                   help="mirror metrics.jsonl to TensorBoard (RUN/tensorboard) or Weights & Biases (default none)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines (warnings and notes still go to stderr; metrics.jsonl is written as always)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (the config.yaml this command would store) as YAML and exit "
                        "without training or writing anything")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any config field, e.g. model.d_model=256")


def config_from_args(args, base: dict | None = None) -> RunConfig:
    """The RunConfig of a ``train``-style command line (precedence: preset/strategy < file < flags < key=value),
    through ``resolve.resolve_config``. ``base``: sections below the file (``--init-from``:
    ``init_from.base_sections``). Raises ``ValueError`` when ``--preset`` meets a model section (of the
    ``--config`` file or of ``base``), naming which, and as ``resolve_config``."""
    file_data = load_yaml(args.config) if args.config else {}
    if args.preset and "model" in file_data:
        raise ValueError("--preset conflicts with the model section of --config; drop one of them")
    if args.preset and base and "model" in base:
        raise ValueError(preset_conflict(getattr(args, "init_from", None)))
    if base:
        file_data = {**base, **{k: {**base[k], **v} if isinstance(base.get(k), dict) and isinstance(v, dict) else v
                                for k, v in file_data.items()}}
    flags = [f"{key}={getattr(args, name)}" for name, key in FLAG_FIELDS.items()
             if getattr(args, name, None) is not None]
    if getattr(args, "compile", None) is not None:
        flags.append(f"train.compile={'true' if args.compile else 'false'}")
    return absolute_paths(resolve_config(args.preset, args.strategy, flags + list(args.overrides), file_data))


def absolute_paths(cfg: RunConfig) -> RunConfig:
    """``cfg`` with a relative ``data.source`` / ``data.tokenizer`` that names an existing file or folder made
    absolute, as ``config.yaml`` stores it: ``train --resume`` then finds the data from any working directory
    (``sweep`` and ``study`` resolve theirs too). Names (``shakespeare``, ``kjv``, ``hf:NAME``,
    ``bytes``, ``bpe:N``) and paths that do not exist (refused later, naming them) are kept as written."""
    import os
    from pathlib import Path

    from scalevec.data.documents import BUNDLED

    data = cfg.data
    changes = {}
    for key in ("source", "tokenizer"):
        value = getattr(data, key)
        if (not isinstance(value, str) or not value or value in BUNDLED or value == "bytes" or ":" in value
                or Path(value).is_absolute() or value.startswith("~")):
            continue
        try:
            if Path(value).exists():
                changes[key] = os.path.abspath(value)
        except OSError:  # not a usable path (too long): left as written, refused by the data's own check
            continue
    return replace(cfg, data=replace(data, **changes)) if changes else cfg


# a model whose weights alone pass this machine's memory fails in the allocator with a traceback (e.g.
# model.d_model 10^9 in a run's config.yaml on resume); refused first, one line
def check_fits_memory(cfg: RunConfig) -> None:
    """Raise ``ValueError`` when ``cfg``'s model cannot exist here: its matrices and embedding alone (a lower
    bound on its parameters, ``flops.matmul_params_per_token`` + the embedding) in float32, or a step's token
    indices (the global batch's sample indices, one micro-batch's inputs and targets), need more bytes than
    this machine's physical memory and every visible GPU's together. Lenient by design: it refuses only the
    impossible, never a model that offloading or sharding could fit."""
    import os

    import torch

    from scalevec.model.flops import matmul_params_per_token

    m, t = cfg.model, cfg.train
    params = matmul_params_per_token(m) + m.d_model * m.vocab_size
    # every process builds the global batch's sample indices (int64) and one micro-batch's inputs and targets
    # (int64, at least one sequence: data/sampler.py); train.batch_size 10**13 failed in numpy's allocator
    batch = 8 * t.batch_size + 16 * (t.micro_batch_size or 1) * t.seq_len
    need = 4 * params + batch
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    if torch.cuda.is_available():
        have += sum(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    if batch > have:
        raise ValueError(f"a step's batch (train.batch_size {t.batch_size:,}, micro_batch_size {t.micro_batch_size:,}, "
                         f"seq_len {t.seq_len:,}) needs at least {batch / 2**30:,.0f} GiB for its token indices, more "
                         f"than this machine's {have / 2**30:,.0f} GiB of memory; use a smaller batch (for --resume: "
                         f"the train section of the run's config.yaml)")
    if need > have:
        raise ValueError(f"the model (d_model {m.d_model:,}, {m.n_layers:,} layers, d_ff {m.d_ff:,}, vocabulary "
                         f"{m.vocab_size:,}) has at least {params:.3g} parameters, {need / 2**30:,.0f} GiB in float32, "
                         f"more than this machine's {have / 2**30:,.0f} GiB of memory; choose a smaller model (for "
                         f"--resume: the model section of the run's config.yaml)")


def preset_conflict(source) -> str:
    """The message for ``--preset`` with an ``--init-from`` source that fixes the model's shape."""
    return (f"--preset conflicts with --init-from {source}: the model's shape comes from that source (a Hugging "
            f"Face model's config.json); drop --preset (the run is labelled after the source's family)")


def check_threads(threads: int, flag: int | None) -> None:
    """Refuse a thread count this machine cannot run: ``--threads`` must be in [1, CPUs] (0 is no count: leave the
    flag out for every CPU this process may use), ``train.threads`` at most the machine's CPUs (``os.cpu_count``;
    torch crashed with a segmentation fault on 100000). One-line ``ValueError`` naming the value and the fix."""
    cpus = os.cpu_count() or 1
    if flag is not None and flag < 1:
        raise ValueError(f"--threads {flag} must be >= 1; leave --threads out to use every CPU this process may use "
                         f"({usable_cpus()})")
    if threads > cpus:
        what = f"--threads {threads}" if flag is not None else f"train.threads={threads}"
        raise ValueError(f"{what} is more than this machine's {cpus} CPUs; use at most {cpus} (a run reproduces "
                         f"bitwise with the thread count it was trained with: resume it on a machine that has them)")


def run(args) -> int:
    init = None
    if getattr(args, "init_from", None):
        if args.resume:
            raise ValueError("--resume continues the run in --out; drop --init-from (the branch's origin is in "
                             "its meta.json)")
        init = init_from.resolve(args.init_from, args.reset_optimizer, args.schedule_from)
        if init.kind == "hf" and args.preset:  # before init_from.base_sections reads the model's weights
            raise ValueError(preset_conflict(args.init_from))
    if args.resume and args.out and not args.config and rundir.has_config(args.out):
        execution = {n: key for n, key in FLAG_FIELDS.items() if key in EXECUTION_FIELDS}  # --compile aside
        if (args.overrides or args.preset or args.strategy
                or any(getattr(args, n, None) is not None for n in FLAG_FIELDS if n not in execution)):
            kept = ", ".join("--" + n.replace("_", "-") for n in execution)
            raise ValueError(f"--resume continues the stored config; drop the other options except {kept} and "
                             f"--compile (or start a new --out)")
        overrides = [f"{key}={getattr(args, n)}" for n, key in execution.items() if getattr(args, n, None) is not None]
        if args.compile is not None:
            overrides.append(f"train.compile={'true' if args.compile else 'false'}")
        cfg = resolve_config(base=rundir.load_config(args.out), overrides=overrides)
    else:
        cfg = config_from_args(args, init_from.base_sections(init, args.preset, args.strategy, args.tokenizer)
                               if init is not None else None)
        if init is not None:
            cfg.preset = init_from.preset_label(init, args.preset, cfg.preset)
    check_threads(cfg.train.threads, getattr(args, "threads", None))
    if not cfg.train.threads:  # explicit, so that the same command gives the same numbers however it is started
        cfg = replace(cfg, train=replace(cfg.train, threads=usable_cpus()))  # a positive count: still valid
    if getattr(args, "print_config", False):
        print_config(cfg)
        return 0
    check_fits_memory(cfg)
    if not cfg.train.ckpt_every:
        print(f"note: train.ckpt_every=0: checkpoints only at the end (step {cfg.train.steps}); a run killed "
              f"before it resumes from step 0", file=sys.stderr, flush=True)
    note = init_from.tokenizer_note(init, cfg) if init is not None else None
    if note:  # even with --quiet: a default that the user did not see is the point
        print(f"note: {note}", file=sys.stderr, flush=True)
    out = args.out or f"runs/{cfg.preset}-{cfg.strategy}-seed{cfg.train.seed}"
    try:
        train(cfg, out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet, init=init)
    except TrainingDiverged as e:
        print(f"scalevec train: {e}", file=sys.stderr)
        return DIVERGED_EXIT
    except TrainingFailed as e:
        print(f"scalevec train: error: {e}", file=sys.stderr)
        return FAILED_EXIT
    except Preempted as e:
        print(f"scalevec train: {e}", file=sys.stderr)
        return PREEMPTED_EXIT
    return 0


def print_config(cfg: RunConfig) -> None:
    """``--print-config``: ``cfg`` as the YAML of ``config.yaml``, with ``model.vocab_size`` fitted to the
    tokenizer's declared size as the trainer fits it (``resolve.fit_vocab``; ``bpe:N``: N, an upper bound the
    trained tokenizer may stay under, said in a comment). Reads a tokenizer.json at most; writes nothing."""
    from scalevec.data.tokenizer import declared_vocab_size

    cfg = fit_vocab(cfg, declared_vocab_size(cfg.data.tokenizer))
    if cfg.data.tokenizer.startswith("bpe:"):
        print(f"# model.vocab_size: {cfg.data.tokenizer} declares at most {cfg.model.vocab_size} tokens; the "
              f"trainer fits the trained tokenizer's size")
    sys.stdout.write(yaml.safe_dump(to_dict(cfg), sort_keys=False))


__all__ = ["DIVERGED_EXIT", "FAILED_EXIT", "FLAG_FIELDS", "PREEMPTED_EXIT", "absolute_paths", "add_arguments",
           "check_fits_memory", "config_from_args",
           "fields_help", "print_config", "run"]
