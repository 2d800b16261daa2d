"""Optimizer parameter groups by role for any model, as torch param group dicts (DESIGN.md §5).

``param_groups(model, lr, weight_decay)`` is the trainer's rule (``training/optim.param_groups``, the one home of
it) called with keyword arguments instead of scalevec's configs, for a model trained in another loop: scalevec's,
one ``apply_strategy`` touched, or any plain ``nn.Module`` (Hugging Face, torchtitan, OLMo-core, nanoGPT), whose
roles ``model/roles.model_roles`` finds by module type and position (embeddings, the tied or untied output head,
norm gains, biases). One torch param group per role, each with ``role`` and ``names`` beside ``params``, ``lr`` and
``weight_decay``.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from scalevec.config import OptimConfig, ScaleConfig
from scalevec.config.typed import read_flag, read_number
from scalevec.integrations.wd_guard import OPT_OUT
from scalevec.model.roles import BIAS, model_roles
from scalevec.model.scales import decayed_scale_roles
from scalevec.training import optim

EXTRA_ROLES = (BIAS,)  # a plain model's biases and other 1-D parameters outside norms: never decayed


class ParamGroups(list):
    """A list of torch param group dicts (``params``, ``lr``, ``weight_decay``, ``role``, ``names``), which any
    ``torch.optim`` optimizer takes; ``table()`` is their one-line summary."""

    def table(self) -> str:
        """One line: each group's role, tensors, parameters, lr and weight decay."""
        parts = [f"{g['role']} {len(g['params'])}×/{sum(p.numel() for p in g['params']):,} lr {g['lr']:.3g} "
                 f"wd {g['weight_decay']:.3g}" for g in self]
        return "param groups: " + " | ".join(parts)

    def __str__(self) -> str:
        return self.table()


def strategy_of(model: nn.Module) -> ScaleConfig:
    """The strategy ``model`` carries: ``apply_strategy``'s, a scalevec ``Transformer``'s, else ``baseline``."""
    info = getattr(model, "scalevec_info", None)
    if info is not None:
        return info.scale
    scfg = getattr(model, "scfg", None)
    return scfg if isinstance(scfg, ScaleConfig) else ScaleConfig()


def param_groups(model: nn.Module, lr: float, weight_decay: float = 0.1, *, strategy: str | ScaleConfig | None = None,
                 scale_lr_mult: float | None = None, scale_weight_decay: float | None = None,
                 embedding_wd: bool = False, router_wd: bool = False) -> ParamGroups:
    """Torch optimizer param groups of ``model`` by role (``training/optim.param_groups``; DESIGN.md §5).

    ``lr``: the peak lr of every group (the scale roles': ``lr × scale_lr_mult``, default the strategy's
    ``lr_mult``); ``weight_decay``: the decoupled weight decay of ``matrix`` and ``lm_head`` (and of the decayed
    scales unless ``scale_weight_decay`` or the strategy's ``weight_decay`` sets theirs); ``embedding_wd`` /
    ``router_wd`` decay those roles too (default: not). ``strategy``: whose ``wd`` switch decides the scales'
    decay; default the model's (``apply_strategy``'s, a scalevec model's) or, for a plain model, ``baseline`` (no
    decay on norm gains). Every trainable parameter is in exactly one group (asserted); tied parameters count once.
    Returns a ``ParamGroups`` (a list; ``.table()`` prints it). Raises ``ValueError`` for an lr or weight decay
    that is not a finite number >= 0 (lr > 0), an ``embedding_wd`` / ``router_wd`` that is not a bool, or a
    ``strategy`` that is neither a name nor a ``ScaleConfig``, and for a model carrying a strategy that decays a scale
    role given a weight decay of 0 for it (``wd_guard`` would refuse its first step).
    """
    read_number(lr, "lr", above=0, like="3e-3")
    read_number(weight_decay, "weight_decay", least=0, like="0.1")
    read_flag(embedding_wd, "embedding_wd")  # the text "no" would decay the embedding
    read_flag(router_wd, "router_wd")
    if strategy is None:
        scfg = strategy_of(model)
    else:
        from scalevec.integrations.hf_model import scale_config

        scfg = strategy if isinstance(strategy, ScaleConfig) else scale_config(strategy)  # a non-name: one line
    if scale_lr_mult is not None or scale_weight_decay is not None:
        scfg = dataclasses.replace(scfg, **({"lr_mult": scale_lr_mult} if scale_lr_mult is not None else {}),
                                   **({"weight_decay": scale_weight_decay} if scale_weight_decay is not None else {}))
        scfg.validate()
    ocfg = OptimConfig(lr=float(lr), weight_decay=float(weight_decay), embedding_wd=embedding_wd, router_wd=router_wd)
    groups = ParamGroups({"params": g.params, "lr": g.lr, "weight_decay": g.weight_decay, "role": g.role,
                          "names": g.names} for g in optim.param_groups(model, ocfg, scfg, model_roles(model)))
    _check_guarded_decay(model, scfg, groups)
    return groups


def _check_guarded_decay(model: nn.Module, scfg: ScaleConfig, groups: list[dict]) -> None:
    """Refuse groups that ``wd_guard`` would refuse at the first step for a reason only these arguments can fix:
    the model's strategy decays a scale role (``unified``, ``iwd``: the Input-Norm scales) but its weight decay
    here is 0 (``weight_decay=0`` and no ``scale_weight_decay``; transformers' ``TrainingArguments`` default is 0),
    so the guard's advice, "build the optimizer from param_groups", would send the user back here."""
    if getattr(model, "scalevec_info", None) is None or model.__dict__.get(OPT_OUT):
        return
    decayed = decayed_scale_roles(scfg)
    for g in groups:
        if g["role"] in decayed and g["params"] and not g["weight_decay"] > 0:
            raise ValueError(f"strategy {model.scalevec_info.strategy} decays {g['role']} (DESIGN.md §5), but its "
                             f"weight decay here is 0: pass weight_decay > 0 (transformers: TrainingArguments("
                             f"weight_decay=0.1); its default is 0) or scale_weight_decay > 0, or call "
                             f"scalevec.allow_any_weight_decay(model) to train it undecayed on purpose")


__all__ = ["EXTRA_ROLES", "ParamGroups", "model_roles", "param_groups", "strategy_of"]
