"""Parameter roles and parameter counts: the one list of roles and the one way to count (DESIGN.md §5, §11).

Every parameter carries exactly one role, given where it is made (``scales.new_param``); optimizer groups
(``optim.py``), weight decay, telemetry, ``scalevec info``, the trainer's summary and the sweep's token
budgets all read roles from here. This module imports nothing else of scalevec, so any layer may use it.
"""

from __future__ import annotations

from torch import nn

# In the order of the optimizer group table. matrix: hidden linear maps and expert banks; input_scale: a
# foldable scale vector (or the magnitude of one under OR/ER); output_scale: a non-foldable one (QK-norm,
# peri output norms, DNP's gate scale); scale_direction: OR/ER's direction α (DESIGN.md §5).
ROLES = ("matrix", "embedding", "lm_head", "router", "input_scale", "output_scale", "scale_direction")
SCALE_ROLES = ("input_scale", "output_scale", "scale_direction")  # the scale-vector parameters
EMBEDDING_ROLES = ("embedding", "lm_head")  # excluded from the non-embedding count (Kaplan et al.)


def count_params(model: nn.Module) -> dict:
    """Parameter figures of ``model`` (a ``Transformer``; works on the meta device, instant at 2B).

    Returns ``params`` (total), ``embedding_params`` (embedding + LM head), ``non_embedding_params``,
    ``params_by_role``, ``scale_params`` and ``scale_params_by_role`` (every role of ``SCALE_ROLES``,
    zeros included), and ``active_params`` (per token: ``model.active_params()`` for MoE, else the total).
    """
    roles = model.param_roles()
    by_role: dict[str, int] = {}
    for name, p in model.named_parameters():
        by_role[roles[name]] = by_role.get(roles[name], 0) + p.numel()
    total = sum(by_role.values())
    embedding = sum(by_role.get(r, 0) for r in EMBEDDING_ROLES)
    scale_by_role = {r: by_role.get(r, 0) for r in SCALE_ROLES}
    out = {
        "params": total,
        "embedding_params": embedding,
        "non_embedding_params": total - embedding,
        "params_by_role": by_role,
        "scale_params": sum(scale_by_role.values()),
        "scale_params_by_role": scale_by_role,
    }
    active = getattr(model, "active_params", None)
    out["active_params"] = active() if callable(active) else total
    return out


__all__ = ["ROLES", "SCALE_ROLES", "EMBEDDING_ROLES", "count_params"]
