"""Optimizer parameter groups by role for any model: scalevec's, one ``apply_strategy`` touched, or a plain HF model
(issue 36; DESIGN.md §5).

``param_groups(model, lr, weight_decay)`` is ``training/optim.py``'s rule outside scalevec's trainer: one torch
param group per role (``matrix``, ``embedding``, ``lm_head``, ``router``, ``input_scale``, ``output_scale``,
``scale_direction``, and ``bias`` for a plain model's biases), the weight decay of each role as the strategy's
``wd`` switch says (``optim.role_weight_decay``: IWD decays the foldable scales, never OR/ER's direction), the
scale roles' lr times ``scale.lr_mult``. Roles come from the model (``params.new_param``'s record; a model
``apply_strategy`` touched has one for every parameter) or, for a plain HF model, from its structure: norm gains
are scale vectors (``input_scale``; QK-norm's ``output_scale``), the input embedding ``embedding``, the output
embedding ``lm_head``, an MoE router ``router``, biases and other 1-D parameters ``bias`` (no decay), the rest
``matrix``. So norm gains, embeddings and biases stay out of weight decay unless the strategy says otherwise.
"""

from __future__ import annotations

import math

from torch import nn

from scalevec.config import OptimConfig, ScaleConfig
from scalevec.model.params import ROLES, SCALE_ROLES
from scalevec.training.optim import role_weight_decay

EXTRA_ROLES = ("bias",)  # a plain model's biases and other 1-D parameters outside norms: never decayed


def _infer_role(model: nn.Module, name: str, owner: nn.Module, p: nn.Parameter) -> str:
    """The §5 role of a parameter that carries none (a plain HF model's), from where it sits."""
    local = name.rpartition(".")[2]
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if local == "bias":
        return "bias"
    if inp is not None and p is getattr(inp, "weight", None):
        return "embedding"
    if out is not None and p is getattr(out, "weight", None):
        return "lm_head"
    kind = type(owner).__name__.lower()
    if "norm" in kind:  # RMSNorm / LayerNorm gain: a scale vector (§1); QK-norm's is an Output-Norm
        owner_name = name.rpartition(".")[0].rpartition(".")[2]
        return "output_scale" if owner_name in ("q_norm", "k_norm") else "input_scale"
    if "router" in kind or (name.endswith("mlp.gate.weight") and p.dim() == 2):
        return "router"
    return "matrix" if p.dim() >= 2 else "bias"


def model_roles(model: nn.Module) -> dict[str, str]:
    """``{name: role}`` of every trainable parameter of ``model`` (``named_parameters`` order, tied ones once): the
    recorded role where there is one, else the one its place gives (module docstring)."""
    modules = dict(model.named_modules())
    roles = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        owner_name, _, local = name.rpartition(".")
        owner = modules[owner_name]
        recorded = owner.__dict__.get("_roles", {}).get(local)
        roles[name] = recorded if recorded is not None else _infer_role(model, name, owner, p)
    return roles


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


def _strategy_of(model: nn.Module) -> ScaleConfig:
    info = getattr(model, "scalevec_info", None)
    if info is not None:
        return info.scale
    scfg = getattr(model, "scfg", None)
    return scfg if isinstance(scfg, ScaleConfig) else ScaleConfig()


def param_groups(model: nn.Module, lr: float, weight_decay: float = 0.1, *, strategy: str | ScaleConfig | None = None,
                 scale_lr_mult: float | None = None, scale_weight_decay: float | None = None,
                 embedding_wd: bool = False, router_wd: bool = False) -> ParamGroups:
    """Torch optimizer param groups of ``model`` by role (module docstring; DESIGN.md §5).

    ``lr``: the peak lr of every group (the scale roles': ``lr × scale_lr_mult``, default the strategy's
    ``lr_mult``); ``weight_decay``: the decoupled weight decay of ``matrix`` and ``lm_head`` (and of the decayed
    scales unless ``scale_weight_decay`` or the strategy's ``weight_decay`` sets theirs); ``embedding_wd`` /
    ``router_wd`` decay those roles too. ``strategy``: whose ``wd`` switch decides the scales' decay; default
    the model's (``apply_strategy``'s, a scalevec model's) or, for a plain model, ``baseline`` (no decay on
    norm gains). Every trainable parameter is in exactly one group (asserted); tied parameters count once.
    Returns a ``ParamGroups`` (a list; ``.table()`` prints it). Raises ``ValueError`` for an lr or weight decay
    that is not a finite number >= 0 (lr > 0).
    """
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr={lr!r} must be a finite number > 0 (try 3e-3)")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay={weight_decay!r} must be a finite number >= 0 (try 0.1)")
    if strategy is None:
        scfg = _strategy_of(model)
    else:
        from scalevec.integrations.hf_model import scale_config

        scfg = scale_config(strategy) if isinstance(strategy, str) else strategy
    if scale_lr_mult is not None or scale_weight_decay is not None:
        import dataclasses

        scfg = dataclasses.replace(scfg, **({"lr_mult": scale_lr_mult} if scale_lr_mult is not None else {}),
                                   **({"weight_decay": scale_weight_decay} if scale_weight_decay is not None else {}))
        scfg.validate()
    ocfg = OptimConfig(lr=float(lr), weight_decay=float(weight_decay), embedding_wd=embedding_wd, router_wd=router_wd)
    roles = model_roles(model)
    named = dict(model.named_parameters())
    groups = ParamGroups()
    for role in (*ROLES, *EXTRA_ROLES):
        names = [n for n, r in roles.items() if r == role]
        if not names:
            continue
        wd = 0.0 if role in EXTRA_ROLES else role_weight_decay(role, ocfg, scfg)
        group_lr = lr * scfg.lr_mult if role in SCALE_ROLES else lr
        groups.append({"params": [named[n] for n in names], "lr": group_lr, "weight_decay": wd, "role": role,
                       "names": names})
    covered = [n for g in groups for n in g["names"]]
    trainable = [n for n, p in named.items() if p.requires_grad]
    assert sorted(covered) == sorted(trainable) and len(covered) == len(set(covered)), \
        "a trainable parameter is not in exactly one group"
    assert len({id(p) for g in groups for p in g["params"]}) == len(covered), "a parameter sits in two groups"
    return groups


__all__ = ["EXTRA_ROLES", "ParamGroups", "model_roles", "param_groups"]
