"""Fold every foldable scale vector into the adjacent linear weights (DESIGN.md §1, §4, §10).

In a ``pre`` model an Input-Norm scale is redundant: ``W (γ ⊙ u) = (W diag γ) u`` and likewise
``s ⊙ (W u) = (diag(s) W) u``. ``fold_scales`` returns the equivalent model without them (strategy
``none``; QK-norm scales stay, as Qwen3's q_norm/k_norm), which is a plain Llama/Qwen3 for export.
It refuses what cannot fold: DNP's output normalization and the Output-Norms of the ``peri`` layout.
"""

from __future__ import annotations

import dataclasses

import torch

from scalevec.config import PRESET_NAMES, ScaleConfig
from scalevec.model.scales import DNP_CANNOT_FOLD
from scalevec.model.transformer import Transformer, build_model


def foldable_strategies() -> list[str]:
    """The named strategies whose every scale folds in a ``pre`` model: the table's rule, ``ScaleConfig.foldable``."""
    return [n for n in PRESET_NAMES if ScaleConfig.preset(n).foldable]


def _dnp_projections(model: Transformer) -> list[str]:
    """The projections whose outputs DNP normalizes (``scales.NormedBranch``, ``moe.NormedExpertProj``)."""
    return [name for name, m in model.named_modules() if getattr(m, "out_norm", False)]


def _peri_norms(model: Transformer) -> list[str]:
    """The Output-Norms of the peri layout (``transformer.PeriBlock``): on the residual branch, no linear map after."""
    if model.plan.peri is None:
        return []
    return [f"layers.{i}.{n}" for i in range(model.cfg.n_layers) for n in ("attn_out", "mlp_out")]


def unfoldable_scales(model: Transformer) -> list[str]:
    """Names of the norms/scales that have no slot in a plain Llama (DNP output norms, peri output norms)."""
    return _dnp_projections(model) + _peri_norms(model)


def fold_scales(model: Transformer) -> Transformer:
    """The equivalent scale-free model: ``W' = diag(s) W diag(γ)`` for every foldable scale (§4 fold).

    Magnitude-direction scales are materialized first. With tied embeddings the LM head is untied
    (``head = E diag(γ_final)``) and the embedding is copied bitwise. The result is on the same device
    and dtype, has ``ScaleConfig(scale='none', folded=True)`` and no scale parameters except QK-norm's.
    Raises ``ValueError`` naming the scales that cannot fold (DNP output norms, ``peri`` output norms).
    """
    bad = unfoldable_scales(model)
    if bad:
        why = []
        if _peri_norms(model):
            why.append("the peri layout's output norms sit on the residual branch, with no linear map after them")
        if _dnp_projections(model):
            why.append(DNP_CANNOT_FOLD)
        shown = ", ".join(bad[:6]) + (f", ... ({len(bad)} in all)" if len(bad) > 6 else "")
        names = ", ".join(f"{n} (the exportable form of unified)" if n == "unified_foldable" else n
                          for n in foldable_strategies())
        raise ValueError(f"cannot fold {shown}: {'; '.join(why)}. Foldable strategies: {names}, in the pre layout")
    cfg = dataclasses.replace(model.cfg, tie_embeddings=False)
    ref = next(model.parameters())
    # a seeded build (fork of the RNG): folding must not advance the caller's global RNG stream
    folded = build_model(cfg, ScaleConfig(scale="none", folded=True), seed=0, device=ref.device).to(ref.dtype)
    state = folded.state_dict()
    old = model.state_dict()
    with torch.no_grad():
        for key in state:
            if key in old:
                state[key] = old[key]
        for name, module in model.named_modules():
            if hasattr(module, "folded_state"):
                for key, value in module.folded_state().items():
                    state[f"{name}.{key}" if name else key] = value.detach()
    folded.load_state_dict(state, strict=True)
    return folded
