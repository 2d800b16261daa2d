"""``scalevec convert``: a Hugging Face model or a run, turned into another strategy with no training (docs/guide.md,
"Convert a model into another strategy").

``SRC`` is what ``train --init-from`` takes (DESIGN.md §10): a Hugging Face model directory (``families.IMPORTS``:
Llama, Mistral, Qwen3, Mixtral, Qwen3-MoE; ``config.json`` + safetensors) or a scalevec run (``RUN`` or
``RUN/checkpoints/step_N``).
The conversion and its report are ``train --init-from``'s, not a copy of them: the converted model is built
by the trainer's own set-up (``trainer.Trainer``: data, vocabulary fit, model, ``init_from.load_weights``
through the plain form) and the report is what that prints: "the function is unchanged" for a foldable
strategy, else "THE FUNCTION CHANGES", why, and the loss at step 0 on the first validation batch before and
after. Then, instead of training:

- ``--format run`` (default): ``--out`` becomes a run directory as ``train`` writes it, at step 0 of its
  config (flags and ``key=value`` set that config: ``train.steps``, ``optim.lr``, ...): ``config.yaml``,
  ``meta.json`` (``init_from``: the source), ``optim_groups.txt``, ``tokenizer/`` and
  ``checkpoints/step_0000000``, no ``DONE``. ``scalevec train --resume --out OUT`` trains it, the same run
  as ``train --init-from SRC`` with the same options (a step-0 checkpoint resumes as a fresh start:
  ``Trainer.load``); ``train --init-from OUT`` branches it; ``export``, ``eval`` and ``generate`` read it.
- ``--format hf``: ``--out`` becomes what ``scalevec export`` writes from that run (``export.plan_export``
  and ``write_export``, ``--verify`` as export's), without the run.

Refusals, each one line with exit 2 and nothing written: an existing non-empty ``--out`` (with
``--overwrite`` a run directory there is emptied by rundir's rule, only what scalevec wrote; a Hugging Face
directory is never deleted, since nothing tells an export scalevec wrote from any other model), an
``--out`` that is ``SRC`` or holds it, and a Hugging Face source with custom code (an ``auto_map``, which
defines what its weights compute) unless ``--trust-remote-code`` (``generate.custom_code_trusted``, the rule
``generate`` and ``eval`` apply). No code from ``SRC`` runs here in any case: only its config.json,
safetensors and tokenizer.json are read.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from scalevec import outpath
from scalevec.config.run_budget import total_steps, usable_cpus
from scalevec.hf_format.hf_import import read_config_json
from scalevec.model.forward_check import check_forward
from scalevec.training import distributed, init_from, rundir
from scalevec.training.command import config_from_args
from scalevec.training.trainer import Trainer

FORMATS = ("run", "hf")


def check_paths(source: Path, out: Path, fmt: str, overwrite: bool) -> None:
    """Refuse an ``--out`` that is ``source`` or a folder above it (``--overwrite`` would delete the source),
    and an existing non-empty ``--out`` unless ``overwrite`` with ``--format run`` (then the trainer applies
    rundir's rule: only a run directory is emptied, and only of what scalevec wrote). Before any work, as every
    refusal here: a symbolic link that leads nowhere or loops, as ``--out`` or a folder above it, and a path under
    a file (``outpath.check_out_path``: ``FileNotFoundError`` / ``NotADirectoryError``), and with ``--format hf`` an
    ``--out`` that is any link (``export.refuse_link``: an export is never written through one; ``FileExistsError``).
    Raises ``ValueError`` / ``FileExistsError`` / ``FileNotFoundError`` / ``NotADirectoryError`` naming the fix."""
    outpath.check_out_path(out)  # first: resolve() below cannot follow a link loop
    if fmt == "hf":
        from scalevec.hf.export import refuse_link

        refuse_link(out)
    src, dst = source.resolve(), out.resolve()
    if src == dst or dst in src.parents:
        raise ValueError(f"--out {out} is the source {source} or holds it; choose another --out (the source is "
                         f"never written)")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is an existing file, not a directory; choose a new --out (convert writes "
                              f"a directory and never replaces a file)")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if fmt == "hf":
        raise FileExistsError(f"--out {out} already exists and is not empty; choose a new directory or remove it "
                              f"(scalevec cannot tell an export it wrote from any other Hugging Face directory, so "
                              f"--format hf never deletes one)")
    if not overwrite:
        raise FileExistsError(f"--out {out} already exists and is not empty; choose a new --out, or pass --overwrite "
                              f"to replace the run there (only what scalevec wrote is deleted)")
    rundir.check_out_dir(out, resume=False, overwrite=True)  # before any work; the trainer checks again under the lock


def convert(args: argparse.Namespace) -> Path:
    """Convert ``args.source`` into strategy ``args.strategy`` and write ``args.out`` in ``args.format``
    (module docstring); return ``args.out``. Raises ``ValueError`` / ``FileNotFoundError`` /
    ``FileExistsError`` for bad input before anything is written, as ``train --init-from`` does."""
    source, out = Path(args.source), Path(args.out)
    if args.format not in FORMATS:
        raise ValueError(f"--format {args.format!r} is unknown; use run or hf")
    if args.verify and args.format != "hf":
        raise ValueError("--verify checks a Hugging Face export: pass --format hf, or verify a run's export with "
                         "scalevec export RUN --out DIR --verify")
    check_paths(source, out, args.format, args.overwrite)
    init = init_from.resolve(source, flag="SRC")
    if init.kind == "hf":
        from scalevec.hf.generate import custom_code_trusted

        read_config_json(source)  # a config.json it cannot read named as such, not as custom code below
        try:
            custom_code_trusted(source, args.trust_remote_code)
        except ValueError as e:
            raise ValueError(f"{source} has custom code that defines what its weights compute, and convert reads "
                             f"them as a standard model: {e}") from None
    cfg = config_from_args(args, init_from.base_sections(init, None, args.strategy, args.tokenizer))
    cfg.preset = init_from.preset_label(init, None, cfg.preset)
    if not cfg.train.threads:  # as train: explicit, so that `train --resume` of the result runs as configured
        cfg = replace(cfg, train=replace(cfg.train, threads=usable_cpus()))
    note = init_from.tokenizer_note(init, cfg) or init_from.corpus_note(init, cfg)
    if note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    if args.format == "run":
        _write_run(cfg, out, init, args.overwrite)
        print(f"converted {source} -> run {out} (strategy {cfg.strategy}, step 0 of {total_steps(cfg)}); train it: "
              f"scalevec train --resume --out {out}; export it: scalevec export {out} --out DIR")
    else:
        fmt = _write_export(cfg, out, init, args.verify)
        print(f"converted {source} -> Hugging Face {fmt} {out} (strategy {cfg.strategy})")
    return out


def check_finite(model, source: Path) -> None:
    """Refuse a converted model whose weights hold a NaN or an infinity (a damaged source), or whose logits are not
    finite on a fixed probe although every weight is (``forward_check.check_forward``: a weight that overflows its
    matmul): ``ValueError`` naming the first such tensor or layer, before anything is written."""
    from scalevec.hf.generate import nonfinite_tensor

    bad = nonfinite_tensor(model.named_parameters())
    if bad is not None:
        raise ValueError(f"the converted model's {bad} holds non-finite values (NaN or inf): the weights of {source} "
                         f"are damaged; convert a healthy checkpoint (nothing was written)")
    check_forward(model, model.cfg.vocab_size, model.cfg.max_seq_len, f"the model converted from {source}",
                  "convert a healthy checkpoint (nothing was written)")


def _trainer(cfg, out: Path, init, overwrite: bool = False) -> Trainer:
    """The trainer's set-up for ``cfg`` from ``init`` (the converted model, the report printed); nothing written."""
    return Trainer(cfg, out, overwrite=overwrite, quiet=True, init=init)


def _write_run(cfg, out: Path, init, overwrite: bool) -> None:
    """The run directory of a step-0 trainer: its run files (``Trainer.setup_run_dir``: lock, the rundir
    checks again, ``--overwrite``'s emptying) and one checkpoint, ``step_0000000``. When the checkpoint cannot
    be written (a full disk), the run this command set up is removed (scalevec's entries only, and the folder
    if this command made it), so that no run without its converted weights is left to train from a random
    init; ``OSError`` names the cause and the fix."""
    created = not out.exists()
    trainer = _trainer(cfg, out, init, overwrite)
    try:
        check_finite(trainer.model, init.source)
    except ValueError:
        trainer.release()
        distributed.teardown(trainer.dist)
        raise
    failed = None
    try:
        trainer.setup_run_dir()  # from here the run is ours (locked): removing it on failure touches no other
        try:
            trainer.checkpoint()
        except OSError as e:
            failed = e
            rundir.remove_run(out)
    finally:
        trainer.release()
        distributed.teardown(trainer.dist)
    if failed is not None:
        if created:
            (out / rundir.LOCK).unlink(missing_ok=True)
            if not any(out.iterdir()):
                out.rmdir()
        raise OSError(f"cannot write the converted run {out} ({rundir.one_line(failed)}); free space or choose "
                      f"another --out, then convert again (the partial run was removed)") from None


def _write_export(cfg, out: Path, init, verify: bool) -> str:
    """What ``scalevec export`` writes from the converted model with its tokenizer (saved as a run saves
    ``tokenizer/``); returns the format. The trainer is built on a path that is never created."""
    from scalevec.hf.export import plan_export, record_run, write_export
    from scalevec.hf.generate import nonfinite_tensor
    from scalevec.hf.verify import verify_tokens

    with tempfile.TemporaryDirectory(prefix="scalevec-convert-") as tmp:
        trainer = _trainer(cfg, Path(tmp) / "run", init)
        try:
            tok_dir = Path(tmp) / "tokenizer"
            trainer.data.tokenizer.save(tok_dir)
            model = trainer.model.eval()
            check_finite(model, init.source)
            plan = plan_export(model, out, tok_dir)
            record_run(plan.config, cfg)  # the windows and corpus a run of this config would train on
            bad = nonfinite_tensor(plan.state.items())
            if bad is not None:  # finite weights whose fold overflows
                raise ValueError(f"the export of {init.source} would hold non-finite values in {bad} (the folded "
                                 f"scale vectors overflow float32); nothing was written")
            tokens = None
            if verify:
                tokens, where = verify_tokens(cfg)
                print(f"verify tokens: {where}")
            write_export(plan, model=model, verify_tokens=tokens)
        finally:
            trainer.release()
            distributed.teardown(trainer.dist)
    return plan.fmt


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SRC",
                   help="a Hugging Face model directory (Llama, Mistral, Qwen3, Mixtral, Qwen3-MoE) or a scalevec run: "
                        "RUN_DIR or RUN_DIR/checkpoints/step_N")
    p.add_argument("--strategy", required=True, help="the scale-vector strategy to convert into (see scalevec info)")
    p.add_argument("--out", required=True, help="the new run directory (--format run) or Hugging Face directory")
    p.add_argument("--format", choices=list(FORMATS), default="run",
                   help="run (default): a run directory at step 0 (train --resume trains it; export, eval, generate "
                        "read it); hf: what scalevec export writes from it")
    p.add_argument("--overwrite", action="store_true",
                   help="--format run: replace the run in --out (only what scalevec wrote is deleted)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="convert a Hugging Face directory that declares custom code (auto_map); the code is never "
                        "run, its weights are read as the standard model config.json names")
    p.add_argument("--verify", action="store_true",
                   help="--format hf: load the export with transformers and compare it with the converted model "
                        "(every logit within 1e-4, custom code 1e-5, times the largest |logit|; the loss; greedy "
                        "ids); a mismatch writes nothing and exits 1")
    p.add_argument("--data", help="the run's data (default shakespeare): the first validation batch of the report")
    p.add_argument("--tokenizer", help="bytes, bpe:N or a tokenizer.json (default: the Hugging Face model's own "
                                       "tokenizer.json, else bytes)")
    p.add_argument("--threads", type=int, help="CPU threads (default: every CPU this process may use)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="any config field of the run, e.g. train.steps=2000 optim.lr=3e-3")
    p.set_defaults(config=None, preset=None)


def run(args: argparse.Namespace) -> int:
    from scalevec.hf.verify import VerifyError

    try:
        convert(args)
    except VerifyError as e:
        print(f"scalevec convert: {e}; nothing was written", file=sys.stderr)
        return 1
    return 0


__all__ = ["FORMATS", "add_arguments", "check_paths", "convert", "run"]
