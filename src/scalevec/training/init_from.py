"""``train --init-from``: start a run from a Hugging Face model, or branch an existing run (DESIGN.md §8).

A source is one of

- a Hugging Face model directory (``config.json`` + safetensors as transformers writes them) of a family
  scalevec's model imports (``families.IMPORTS``: Llama, Mistral, Qwen3, Mixtral, Qwen3-MoE). The new run's
  model section is the checkpoint's shape and its tokenizer (``tokenizer.json``) is used unless ``--tokenizer``
  is given;
- a scalevec run directory (its newest checkpoint) or one of its checkpoints,
  ``RUN/checkpoints/step_N``: the new run starts from the parent's config, and any flag or
  ``key=value`` changes it (``--strategy``, ``--schedule``, ``--steps``, ...).

Weights go through ``hf_import``'s plain form when the strategy (or any parameter) differs, so every
foldable strategy starts with the source's function; with the same parameters they load as they
are. The optimizer state is carried over when the parameters match exactly, the optimizer is the
same and ``--reset-optimizer`` is not given (hyperparameters come from the new config). The schedule
restarts at step 0 (``--schedule-from restart``) or continues from the parent's step
(``continue``: the new run's steps count from there, as in a WSD decay from a stable checkpoint).
``meta.json`` records the parent under ``init_from``; ``report`` draws a branch on its parent's curve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from scalevec.config import RunConfig
from scalevec.config.codec import to_dict
from scalevec.hf_format.hf_import import (
    function_preserved,
    is_hf_dir,
    load_plain,
    plain_from_model,
    read_config_json,
    read_hf,
    read_hf_config,
)
from scalevec.hf_format.names import DATA_SOURCE
from scalevec.outpath import refuse_temporary
from scalevec.training import rundir
from scalevec.training.checkpoint import layout
from scalevec.training.checkpoint.integrity import model_checkpoint

SCHEDULE_FROM = ("restart", "continue")


@dataclass
class InitFrom:
    """A resolved ``--init-from`` source. ``kind``: ``hf`` or ``run``; for a run, ``run_dir``, ``ckpt``
    (a checkpoint directory), ``step`` (its completed steps) and ``parent`` (its ``RunConfig``)."""

    source: Path
    kind: str
    reset_optimizer: bool = False
    schedule_from: str = "restart"
    run_dir: Path | None = None
    ckpt: Path | None = None
    step: int = 0
    parent: RunConfig | None = None
    family: str | None = None
    info: dict = field(default_factory=dict)  # what happened, for meta.json (filled by load_weights)

    @property
    def start_step(self) -> int:
        """The new run's first step: the parent's under ``--schedule-from continue``, else 0."""
        return self.step if self.schedule_from == "continue" else 0


def resolve(source: str | Path, reset_optimizer: bool = False, schedule_from: str = "restart",
            flag: str = "--init-from") -> InitFrom:
    """Classify ``source`` (module docstring). Raises ``FileNotFoundError`` for a missing or unknown
    directory (naming ``source`` as ``flag``: ``convert`` calls it SRC) and ``ValueError`` for a bad
    ``schedule_from`` or ``continue`` from a Hugging Face model."""
    if schedule_from not in SCHEDULE_FROM:
        raise ValueError(f"--schedule-from {schedule_from!r} is unknown; use restart or continue")
    p = Path(source)
    if p.exists() and not p.is_dir():
        raise FileNotFoundError(f"{flag} {p} is a file, not a directory (give a Hugging Face model directory, a run "
                                f"directory or RUN/checkpoints/step_N)")
    if not p.is_dir():
        raise FileNotFoundError(f"{flag} {p} does not exist (give a Hugging Face model directory, a run "
                                f"directory or RUN/checkpoints/step_N)")
    refuse_temporary(p)  # an interrupted export's folder: complete maybe, but never verified
    if is_hf_dir(p):
        if schedule_from == "continue":
            raise ValueError("--schedule-from continue needs a scalevec run to continue; a Hugging Face model "
                             "starts at step 0 (drop --schedule-from)")
        return InitFrom(p, "hf", reset_optimizer, schedule_from)
    if rundir.has_config(p):
        run_dir, ckpt = p, model_checkpoint(p)[0]
    elif (p / layout.MODEL_FILE).is_file() and rundir.has_config(p.parent.parent):
        run_dir, ckpt = p.parent.parent, p
    else:
        raise FileNotFoundError(f"{flag} {p} is neither a Hugging Face model (config.json + safetensors), a "
                                f"scalevec run directory (config.yaml) nor one of its checkpoints/step_N")
    if not layout.is_step_name(ckpt.name):
        raise FileNotFoundError(f"{ckpt} is not a checkpoint directory (step_N)")
    parent = rundir.load_config(run_dir)
    return InitFrom(p, "run", reset_optimizer, schedule_from, run_dir, ckpt, layout.step_of(ckpt), parent)


def base_sections(init: InitFrom, preset: str | None, strategy: str | None, tokenizer: str | None) -> dict:
    """The config sections a run from ``init`` starts from, before ``--config``, flags and ``key=value``.

    Run: the parent's config, less its ``scale`` section when ``--strategy`` is given and its ``model``
    section when ``--preset`` is. Hugging Face: the checkpoint's model shape, its ``tokenizer.json``
    unless ``--tokenizer`` is given; the directory is checked before anything is built or loaded
    (``hf_import.read_hf_config``: config.json's values, the size against memory, the tensors' shapes).
    Raises ``ValueError`` / ``FileNotFoundError`` naming what is wrong with a Hugging Face directory.
    """
    if init.kind == "run":
        data = to_dict(init.parent)  # a label preset (hf-llama) is read by presets.model_base
        if strategy:
            data.pop("scale")
            data.pop("strategy")
        if preset:
            data.pop("model")
            data.pop("preset")
        return data
    init.family, model_cfg = read_hf_config(init.source)  # no tensor read yet: load_weights reads them
    data = {"model": to_dict(model_cfg)}
    if not tokenizer and (init.source / "tokenizer.json").is_file():
        data["data"] = {"tokenizer": str(init.source / "tokenizer.json")}
    return data


def tokenizer_note(init: InitFrom, cfg: RunConfig) -> str | None:
    """The console line for a Hugging Face source without ``tokenizer.json`` whose run takes the default
    tokenizer (without it the run would train on bytes of Shakespeare unannounced): which tokenizer and data the run
    uses and how to choose others; ``None`` otherwise (a run source, the model's own tokenizer, or one the
    user chose)."""
    from scalevec.config import DataConfig

    if init.kind != "hf" or (init.source / "tokenizer.json").is_file() or cfg.data.tokenizer != DataConfig.tokenizer:
        return None
    return (f"{init.source} holds no tokenizer.json, so this run uses the {cfg.data.tokenizer} tokenizer on "
            f"{cfg.data.source}, not the model's own; pass --tokenizer PATH/tokenizer.json (the one the model was "
            f"trained with) and --data SOURCE (your text)")


def corpus_note(init: InitFrom, cfg: RunConfig) -> str | None:
    """The console line when the run made from ``init`` trains on another corpus than its source was trained on:
    a run's ``data.source``, or the one a scalevec export recorded in config.json (``names.DATA_SOURCE``); for a
    Hugging Face model that records none, which corpus the run takes. ``None`` when it is the source's own."""
    if init.kind == "run":
        theirs = init.parent.data.source
    else:
        theirs = read_config_json(init.source).get(DATA_SOURCE)
    if theirs == cfg.data.source:
        return None
    if not isinstance(theirs, str):
        return (f"{init.source} does not record the corpus it was trained on; this run trains on "
                f"{cfg.data.source}: pass --data SOURCE to train on your text")
    return (f"{init.source} was trained on {theirs}, this run trains on {cfg.data.source}; pass --data {theirs} "
            f"to train on the source's corpus")


def preset_label(init: InitFrom, preset: str | None, resolved: str) -> str:
    """The ``preset`` a run from ``init`` records: ``--preset`` if given, else ``hf-<family>`` for a Hugging
    Face model and the parent's for a branch (a label: the model section holds the shape)."""
    if preset:
        return resolved
    return f"hf-{init.family}" if init.kind == "hf" else init.parent.preset


def _parent_model(init: InitFrom):
    from safetensors.torch import load_model

    from scalevec.model.transformer import build_model

    model = build_model(init.parent.model, init.parent.scale, seed=0)
    load_model(model, str(init.ckpt / layout.MODEL_FILE))
    return model


def load_weights(init: InitFrom, cfg: RunConfig, model: torch.nn.Module, batch=None) -> list[str]:
    """Load the source's weights into ``model`` (built from ``cfg``, not yet wrapped) in place; return the
    lines to print. ``batch``: ``(x, y)`` on the model's device, for the step-0 loss before and after a
    conversion that changes the function (DNP, or QK-norm γ under strategy ``none``). Fills ``init.info``.
    Raises ``ValueError`` when shapes do not match or the source cannot convert (naming why)."""
    lines, device = [], next(model.parameters()).device
    if init.kind == "hf":
        fmt, plain = read_hf(init.source)
        init.family = fmt
        exact, source_desc = False, f"{fmt} checkpoint {init.source}"
        source_model = None
    else:
        source_model = _parent_model(init)
        source_desc = f"run {init.run_dir} at step {init.step} (strategy {init.parent.strategy})"
        same = _same_parameters(source_model, model) and to_dict(init.parent.scale) == to_dict(cfg.scale)
        exact = same
        plain = None if same else plain_from_model(source_model)
    if exact:
        model.load_state_dict(source_model.state_dict())
        lost = []
    else:
        lost = load_plain(model, _to(plain, device))
    preserved = exact or (function_preserved(cfg.scale) and not lost)
    init.info = {"source": str(init.source.resolve()), "kind": init.kind,
                 "weights": "as saved" if exact else "converted",
                 "function_preserved": preserved}
    if init.kind == "run":
        init.info.update(run_dir=str(init.run_dir.resolve()), checkpoint=str(init.ckpt.resolve()), step=init.step,
                         strategy=init.parent.strategy, schedule_from=init.schedule_from)
    else:
        init.info["family"] = init.family
    how = "as saved" if exact else "converted through the plain form"
    lines.append(f"init-from: {source_desc} -> strategy {cfg.strategy}: weights {how}; "
                 + ("the function is unchanged" if preserved else "THE FUNCTION CHANGES"))
    if not preserved:
        why = ("DNP normalizes the outputs of W_gate/W_up, which the source does not" if not cfg.scale.foldable
               else f"strategy {cfg.strategy} has no slot for the QK-norm γ of {', '.join(lost[:2])}")
        lines.append(f"init-from: {why}")
        if batch is not None:
            before = _reference_loss(init, cfg, plain, source_model, batch)
            after = _loss(model, batch)
            init.info.update(loss_before=before, loss_after=after)
            lines.append(f"init-from: loss at step 0 on the first validation batch: {before:.4f} (source) -> "
                         f"{after:.4f} nats/token (converted)")
    return lines


def _to(plain, device):
    plain.matrices = {k: v.to(device) for k, v in plain.matrices.items()}
    plain.norms = {k: v.to(device) for k, v in plain.norms.items()}
    return plain


def _same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pa = {k: tuple(v.shape) for k, v in a.state_dict().items()}
    pb = {k: tuple(v.shape) for k, v in b.state_dict().items()}
    return pa == pb


@torch.no_grad()
def _loss(model, batch) -> float:
    x, y = batch
    ce, n, _ = model(x, y)
    return (ce / n).item()


def _reference_loss(init, cfg, plain, source_model, batch) -> float:
    """The source's loss: the parent model itself, or (Hugging Face) the plain weights in the baseline
    strategy, which computes the HF model's function (tests/test_hf_import.py)."""
    from scalevec.config import ScaleConfig
    from scalevec.model.transformer import build_model

    x, y = batch
    if source_model is None:
        ref = build_model(cfg.model, ScaleConfig.preset("baseline"), seed=0, device=x.device)
        load_plain(ref, plain)
    else:
        ref = source_model.to(x.device)
    return _loss(ref, batch)


def carry_optimizer(init: InitFrom, cfg: RunConfig, model, optimizers: list, device) -> str:
    """Load the parent's optimizer state into ``optimizers`` when allowed (module docstring); every
    group's hyperparameters (lr, betas, weight decay, ...) stay the new config's. Returns what was done:
    ``carried``, ``reset`` (``--reset-optimizer``) or ``fresh (why)``. All ranks call."""
    from scalevec.training.checkpoint.save_load import load_checkpoint

    if init.kind != "run":
        return "fresh (a Hugging Face model has no optimizer state)"
    if init.reset_optimizer:
        return "reset"
    if init.info.get("weights") != "as saved":
        return "fresh (the parameters differ from the parent's)"
    if init.parent.optim.name != cfg.optim.name:
        return f"fresh (the parent used {init.parent.optim.name})"
    if init.step == 0:  # `scalevec convert`'s checkpoint: torch filled its untouched optimizer with a zero step
        return "fresh (a step-0 checkpoint holds no optimizer state)"
    hyper = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in optimizers]
    load_checkpoint(init.ckpt, model, optimizers, device)
    for opt, groups in zip(optimizers, hyper):
        for g, h in zip(opt.param_groups, groups):
            g.update(h)
    return "carried"


__all__ = ["InitFrom", "SCHEDULE_FROM", "resolve", "base_sections", "preset_label", "load_weights", "carry_optimizer",
           "tokenizer_note"]
