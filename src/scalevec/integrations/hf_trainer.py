"""``ScalevecTrainer``: ``transformers.Trainer`` whose optimizer is built from scalevec's role groups (DESIGN.md §5).

Trainer's own optimizer decays every tensor its name rule does not exempt, which breaks a strategy's weight-decay
rule (``wd_guard`` refuses to step it). ``ScalevecTrainer`` overrides ``create_optimizer``, the hook transformers
itself names for a custom optimizer and the only one it allows under FSDP (it refuses ``optimizers=`` there), so the
groups are ``scalevec.param_groups`` of the model Trainer prepared (the FSDP-wrapped one when it delays the
optimizer), with Trainer's optimizer class and hyperparameters (``args.optim``, betas, eps) and ``args.weight_decay``
as the matrices' decay. Its logs carry each group's lr (``learning_rate.<role>``) beside Trainer's
``learning_rate`` (the first group's). Needs transformers (the ``hf`` extra).
"""

from __future__ import annotations

import os

import torch
import transformers
from transformers.trainer_optimizer import is_optimizer_factory

from scalevec.integrations.groups import param_groups, strategy_of

# what Trainer's get_optimizer_cls_and_kwargs returns for optimizers that bring their own parameter layout
# (GaLore's params, LOMO's model, layer-wise optimizer_dict): they cannot take role groups
_OWN_LAYOUT = ("params", "model", "optimizer_dict")
# a Trainer checkpoint of a model carrying an unfolded strategy: its live state under this name, which
# resume_from_checkpoint reads back and which no from_pretrained mistakes for a plain checkpoint
STRATEGY_STATE = "scalevec_strategy_model.safetensors"


class ScalevecTrainer(transformers.Trainer):
    """``transformers.Trainer`` with scalevec's optimizer groups (module docstring).

    Keyword arguments beside Trainer's: ``embedding_wd`` (decay the embedding too; default not),
    ``scale_lr_mult`` and ``scale_weight_decay`` (override the strategy's lr multiplier and decay of the scale
    roles), as ``scalevec.param_groups`` takes them. ``create_optimizer`` raises ``ValueError`` for an
    ``args.optim`` that builds its own parameter layout (GaLore, LOMO, layer-wise) or is a factory (Muon, Dion).
    """

    def __init__(self, *args, embedding_wd: bool = False, scale_lr_mult: float | None = None,
                 scale_weight_decay: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.group_options = {"embedding_wd": embedding_wd, "scale_lr_mult": scale_lr_mult,
                              "scale_weight_decay": scale_weight_decay}

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """The optimizer over ``scalevec.param_groups`` of ``model`` (Trainer passes the prepared model under FSDP)
        or ``self.model``, the strategy read from ``self.model``; built once, as Trainer's."""
        if self.optimizer is not None:
            return self.optimizer
        opt_model = self.model if model is None else model
        groups = param_groups(opt_model, lr=self.args.learning_rate, weight_decay=self.args.weight_decay,
                              strategy=strategy_of(self.model), **self.group_options)
        cls, kwargs = self.optimizer_cls_and_kwargs or self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        own = sorted(set(kwargs) & set(_OWN_LAYOUT))
        if own or is_optimizer_factory(cls):
            raise ValueError(f"optim={self.args.optim} builds its own parameter groups, which cannot carry "
                             f"scalevec's roles; use an AdamW-type optim (adamw_torch, adamw_torch_fused)")
        self.optimizer = cls(groups, **kwargs)
        return self.optimizer

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Trainer's ``_save`` (checkpoints and ``save_model``); a model carrying an unfolded strategy, whose
        ``save_pretrained`` scalevec refuses (a plain checkpoint cannot hold its scale vectors), is written as its live
        state (``STRATEGY_STATE``, the strategy's parameter names; tied tensors once) for ``resume_from_checkpoint``,
        with the tokenizer and the training arguments as Trainer writes them. The deployable model is
        ``scalevec.fold(model)`` then ``save_pretrained``, or ``scalevec.save(model, DIR)``. One process or DDP
        (FSDP's sharded state is Trainer's own path, not this one)."""
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if getattr(model, "scalevec_info", None) is None:
            return super()._save(output_dir, state_dict)
        if not self.args.should_save:
            return None
        from safetensors.torch import save_model

        out = output_dir if output_dir is not None else self.args.output_dir
        os.makedirs(out, exist_ok=True)
        save_model(model, os.path.join(out, STRATEGY_STATE))
        if self.processing_class is not None:
            self.processing_class.save_pretrained(out)
        torch.save(self.args, os.path.join(out, transformers.trainer.TRAINING_ARGS_NAME))
        return None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Trainer's resume, and the live state of a model carrying a strategy (``_save``) loaded back strictly."""
        path = os.path.join(resume_from_checkpoint, STRATEGY_STATE)
        if not os.path.isfile(path):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        from safetensors.torch import load_model

        load_model(self.model if model is None else model, path)
        return None

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        """Trainer's ``log`` with ``learning_rate.<role>``: each optimizer group's lr now (its peak lr × the
        scheduler's factor), when the row carries ``learning_rate``."""
        if "learning_rate" in logs and self.optimizer is not None:
            groups = self.optimizer.param_groups
            logs = {**logs, **{f"learning_rate.{g['role']}": g["lr"] for g in groups if "role" in g}}
        super().log(logs, *args, **kwargs)


__all__ = ["ScalevecTrainer", "STRATEGY_STATE"]
