"""Parameter bookkeeping: the one list of roles, how a parameter gets its role and init, the one count
(DESIGN.md §5, §6, §11).

Every parameter carries exactly one role and one initializer, given where it is made (``new_param``, which
records both on the owning module so that they survive wrapping); ``param_roles`` reads the roles back,
``init_params`` runs the inits (on the CPU generator, whatever the device: ``draw``), ``count_params`` counts by
role. Optimizer groups (``optim.py``), weight decay, telemetry, ``scalevec info``, the trainer's summary and the
sweep's token budgets all read roles and counts from here. This module imports nothing else of scalevec, so any
layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

# In the order of the optimizer group table. matrix: hidden linear maps and expert banks; input_scale: a
# foldable scale vector (or the magnitude of one under OR/ER); output_scale: a non-foldable one (QK-norm,
# peri output norms, DNP's gate scale); scale_direction: OR/ER's direction α (DESIGN.md §5).
ROLES = ("matrix", "embedding", "lm_head", "router", "input_scale", "output_scale", "scale_direction")
SCALE_ROLES = ("input_scale", "output_scale", "scale_direction")  # the scale-vector parameters
EMBEDDING_ROLES = ("embedding", "lm_head")  # excluded from the non-embedding count (Kaplan et al.)


def new_param(module: nn.Module, name: str, shape: tuple[int, ...], role: str,
              init: Callable[[Tensor], None]) -> nn.Parameter:
    """Create parameter ``name`` on ``module`` with its role (one of ``ROLES``) and its initializer (DESIGN.md §5).

    Roles and inits are recorded on the owning module (``module._roles``, ``module._inits``) so that
    they survive wrapping (DDP, FSDP2, compile), which may replace the Parameter objects.
    """
    assert role in ROLES, role
    p = nn.Parameter(torch.empty(shape))
    module.register_parameter(name, p)
    module.__dict__.setdefault("_roles", {})[name] = role
    module.__dict__.setdefault("_inits", {})[name] = init
    return p


def normal_init(std: float) -> Callable[[Tensor], None]:
    """The initializer N(0, std²), for ``new_param``."""
    return lambda t: nn.init.normal_(t, mean=0.0, std=std)


def const_init(value: float) -> Callable[[Tensor], None]:
    """The initializer that fills a tensor with ``value``, for ``new_param``."""
    return lambda t: nn.init.constant_(t, value)


def param_roles(model: nn.Module) -> dict[str, str]:
    """``{parameter name: role}`` for every parameter of ``model``, in ``named_parameters`` order.

    Raises ``KeyError`` if a parameter was not created by ``new_param`` (no role).
    """
    modules = dict(model.named_modules())
    roles = {}
    for name, _ in model.named_parameters():
        owner, _, local = name.rpartition(".")
        roles[name] = modules[owner].__dict__.get("_roles", {})[local]
    return roles


def draw(t: Tensor, init: Callable[[Tensor], None]) -> None:
    """Run initializer ``init`` on ``t`` with the CPU generator, whatever ``t``'s device: in place on the
    CPU (and on meta, where nothing is drawn), else into a CPU buffer of ``t``'s shape and dtype that is then
    copied to ``t``. The CUDA RNG is never used, so the same seed draws the same numbers on every device."""
    if t.device.type in ("cpu", "meta"):
        init(t)
        return
    buf = torch.empty(t.shape, dtype=t.dtype, device="cpu")
    init(buf)
    t.copy_(buf)


def init_params(model: nn.Module) -> None:
    """Initialize every parameter with the init recorded at creation, in ``named_parameters`` order, each drawn on
    the CPU generator (``draw``): seed k is the same model on CPU and GPU. Fails loudly on an unknown parameter."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, p in model.named_parameters():
            owner, _, local = name.rpartition(".")
            inits = modules[owner].__dict__.get("_inits", {})
            if local not in inits:
                raise KeyError(f"parameter {name} has no initializer; create it with params.new_param")
            draw(p, inits[local])


def count_params(model: nn.Module) -> dict:
    """Parameter figures of ``model`` (a ``Transformer``, or any module whose parameters were made by
    ``new_param``; works on the meta device, instant at 2B). The only parameter counter.

    Returns ``params`` (total; a tied LM head counts once), ``embedding_params`` (embedding + LM head),
    ``non_embedding_params`` (for scaling fits, Kaplan et al.), ``params_by_role``, ``scale_params`` and
    ``scale_params_by_role`` (every role of ``SCALE_ROLES``, zeros included), and ``active_params``: the
    parameters one token uses (DESIGN.md §6), the total less what every MoE block's ``inactive_params()``
    reports (the routed experts a token is not sent to); the total for a dense model.
    Raises ``KeyError`` for a parameter without a role (``param_roles``).
    """
    roles = param_roles(model)
    by_role: dict[str, int] = {}
    for name, p in model.named_parameters():
        by_role[roles[name]] = by_role.get(roles[name], 0) + p.numel()
    total = sum(by_role.values())
    embedding = sum(by_role.get(r, 0) for r in EMBEDDING_ROLES)
    scale_by_role = {r: by_role.get(r, 0) for r in SCALE_ROLES}
    inactive = sum(m.inactive_params() for m in model.modules() if hasattr(m, "inactive_params"))
    return {
        "params": total,
        "embedding_params": embedding,
        "non_embedding_params": total - embedding,
        "params_by_role": by_role,
        "scale_params": sum(scale_by_role.values()),
        "scale_params_by_role": scale_by_role,
        "active_params": total - inactive,
    }


__all__ = ["ROLES", "SCALE_ROLES", "EMBEDDING_ROLES", "new_param", "normal_init", "const_init", "param_roles",
           "draw", "init_params", "count_params"]
