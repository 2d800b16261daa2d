"""Optimizer parameter groups built from parameter roles, never from names (DESIGN.md §5): the one rule.

``param_groups(model, optim_cfg, scale_cfg, roles)`` makes one ``Group`` per role and optimizer (every trainable
parameter in exactly one group, asserted) and ``group_table`` prints them; ``build_optimizers(groups, optim_cfg)``
returns the optimizers (AdamW alone, or Muon for ``matrix`` parameters plus AdamW for every other role).
Roles are ``model.roles.model_roles``': recorded for scalevec's parameters, found by module type and position on
any other model (embeddings, the tied or untied output head, norm gains, biases). Weight decay per role
(``role_weight_decay``): ``matrix`` and ``lm_head`` get ``weight_decay``; ``embedding`` and ``router`` only if
configured (``optim.embedding_wd``/``router_wd``, default off); ``bias`` never; the scale roles (``input_scale``,
``output_scale``, ``scale_direction``) as the strategy's ``wd`` switch says through ``scales.decayed_scale_roles``
(IWD = input scales only; OR/ER's scale-invariant direction α only under ``wd: direction``), at
``scale.weight_decay`` when it is set. The scale roles' lr is ``optim.lr × scale.lr_mult``.
``scalevec.integrations.param_groups`` is this function for a model trained in another loop (torch param group
dicts from keyword arguments), and the Hugging Face ``Trainer`` subclass, torchtitan's optimizer builder and
OLMo-core's group overrides call it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from scalevec.config import OptimConfig, ScaleConfig
from scalevec.model.params import SCALE_ROLES
from scalevec.model.roles import BIAS, GROUP_ROLES, model_roles
from scalevec.model.scales import decayed_scale_roles


def role_weight_decay(role: str, cfg: OptimConfig, scfg: ScaleConfig) -> float:
    """Decoupled weight decay of a role (DESIGN.md §3 ``wd`` switch, §5): the scale roles as
    ``scales.decayed_scale_roles`` says (the strategy's plan), at ``scale.weight_decay`` when it is set; a plain
    model's ``bias`` never. ``KeyError`` for a role that is not in ``roles.GROUP_ROLES``."""
    if role == BIAS:
        return 0.0
    scale_decay = decayed_scale_roles(scfg)
    decayed = {
        "matrix": True,
        "lm_head": True,
        "embedding": cfg.embedding_wd,
        "router": cfg.router_wd,
        "input_scale": "input_scale" in scale_decay,
        "output_scale": "output_scale" in scale_decay,
        "scale_direction": "scale_direction" in scale_decay,
    }[role]
    if not decayed:
        return 0.0
    if role in SCALE_ROLES and scfg.weight_decay is not None:
        return scfg.weight_decay
    return cfg.weight_decay


@dataclass
class Group:
    role: str
    optimizer: str  # "adamw" | "muon"
    lr: float  # peak lr; the schedule multiplies it by lr(step)/peak
    weight_decay: float
    names: list[str]
    params: list[nn.Parameter]

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)


# ----------------------------------------------------------------------------------------------- Muon
# Our own ~60 lines instead of subclassing torch.optim.Muon (whose per-group hook is private): the same
# arithmetic as torch 2.9-2.13's ``_single_tensor_muon``, operation for operation, so results are
# bitwise those of torch.optim.Muon on 2-D weights (tests/test_optim.py), and expert banks are one
# Newton–Schulz problem per expert. Keller Jordan's Muon (kellerjordan.github.io/posts/muon), as in
# nanochat and torchtitan; the lr adjustment is Moonshot's (arXiv:2502.16982).

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # quintic Newton–Schulz (a, b, c): Keller Jordan's, torch's defaults
NS_STEPS = 5
NS_EPS = 1e-7


def zeropower_via_newtonschulz(g: torch.Tensor, coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                               steps: int = NS_STEPS, eps: float = NS_EPS) -> torch.Tensor:
    """Approximate orthogonalization ``U S' Vᵀ`` (S' ≈ 1, within about 0.5-1.5) of a 2-D ``g = U S Vᵀ``.

    ``g``: ``(d_out, d_in)``; returns a bfloat16 tensor of the same shape. Scaled to Frobenius norm ≤ 1
    (so the spectral norm is too), then ``steps`` quintic iterations ``X ← aX + (bA + cA²)X`` with
    ``A = XXᵀ`` on the wide orientation (the smaller Gram matrix). ``ValueError`` unless ``g`` is 2-D.
    """
    if g.ndim != 2:
        raise ValueError(f"Newton–Schulz takes a 2-D matrix, got shape {tuple(g.shape)}")
    a, b, c = coefficients
    x = g.to(torch.bfloat16, copy=True)  # a fresh tensor: the in-place scaling below never touches g
    if g.size(0) > g.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b·A + c·A²
        x = torch.addmm(x, poly, x, beta=a)  # a·X + (b·A + c·A²)·X
    return x.T if g.size(0) > g.size(1) else x


def muon_lr(lr: float, adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    """The lr applied to one orthogonalized ``(A, B)`` update (the last two dims of ``shape``).

    ``match_rms_adamw``: ``0.2·√max(A, B)·lr`` (update RMS ≈ AdamW's, so AdamW-tuned lr and wd carry
    over); ``original`` or ``None``: ``√max(1, A/B)·lr`` (Keller Jordan's).
    """
    A, B = shape[-2:]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        ratio = math.sqrt(max(1, A / B))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(A, B))
    else:
        raise ValueError(f"Muon adjust_lr_fn={adjust_lr_fn!r} is unknown; use 'original' or 'match_rms_adamw'")
    return lr * ratio


class Muon(torch.optim.Optimizer):
    """Muon (momentum, then Newton–Schulz orthogonalization) for 2-D matrices and 3-D expert banks
    ``(E, d_out, d_in)``, each expert's matrix orthogonalized on its own (DESIGN.md §5, §6).

    Per matrix ``W`` with gradient ``G`` and momentum buffer ``M`` (zeros at the first step)::

        M ← lerp(M, G, 1 - μ)                          # = μM + (1 - μ)G
        U ← lerp(G, M, μ) if nesterov else M
        O ← NS(U)                                      # zeropower_via_newtonschulz, bfloat16
        W ← (1 - lr·wd)·W - muon_lr(lr, adjust_lr_fn, W.shape)·O

    Hyperparameters and their defaults are ``torch.optim.Muon``'s, and so is the state (one
    ``momentum_buffer`` per parameter): its state dicts load here. ``ValueError`` for a parameter
    that is neither 2-D nor 3-D, or a bad hyperparameter.
    """

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                 eps: float = NS_EPS, ns_steps: int = NS_STEPS, adjust_lr_fn: str | None = None):
        if not (0 <= lr and 0 <= weight_decay and 0 <= momentum):
            raise ValueError(f"Muon needs lr, weight_decay and momentum >= 0, got {lr}, {weight_decay}, {momentum}")
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"Muon adjust_lr_fn={adjust_lr_fn!r} is unknown; use 'original' or 'match_rms_adamw'")
        if len(ns_coefficients) != 3 or not 0 < ns_steps < 100:
            raise ValueError("Muon needs 3 Newton–Schulz coefficients and 1-99 steps")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                    "ns_coefficients": ns_coefficients, "eps": eps, "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn}
        super().__init__(params, defaults)
        for g in self.param_groups:
            for p in g["params"]:
                if p.ndim not in (2, 3):
                    raise ValueError(f"Muon takes 2-D matrices or 3-D expert banks, got shape {tuple(p.shape)}")

    def matrices(self, p: torch.Tensor, buf: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``(weight, grad, momentum)`` per 2-D problem: the matrix itself, or one view per expert of a bank
        (views write through to the bank)."""
        if p.ndim == 3:
            return list(zip(p.unbind(0), p.grad.unbind(0), buf.unbind(0)))
        return [(p, p.grad, buf)]

    def orthogonalize(self, update: torch.Tensor, group: dict) -> torch.Tensor:
        """Newton–Schulz of one update as ``matrices`` yields it (a 2-D matrix here)."""
        return zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                for w, grad, buf in self.matrices(p, state["momentum_buffer"]):
                    buf.lerp_(grad, 1 - momentum)
                    update = grad.lerp(buf, momentum) if group["nesterov"] else buf
                    update = self.orthogonalize(update, group)
                    w.mul_(1 - lr * wd)
                    w.add_(update, alpha=-muon_lr(lr, group["adjust_lr_fn"], w.shape))
        return loss


def param_groups(model: nn.Module, cfg: OptimConfig, scfg: ScaleConfig,
                 roles: dict[str, str] | None = None) -> list[Group]:
    """One ``Group`` per role (and optimizer) of ``model``'s trainable parameters, in ``GROUP_ROLES`` order (module
    docstring; DESIGN.md §5). ``roles``: ``{name: role}``, default ``model_roles(model)``. ``AssertionError`` unless
    every trainable parameter is in exactly one group."""
    roles = roles if roles is not None else model_roles(model)
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(named) != set(roles):
        raise AssertionError(f"roles and parameters differ: {sorted(set(named) ^ set(roles))[:5]}")
    groups = []
    for role in GROUP_ROLES:  # the group table's order
        names = [n for n in named if roles[n] == role]
        if not names:
            continue
        muon = cfg.name == "muon" and role == "matrix"
        lr = (cfg.muon_lr or cfg.lr) if muon else cfg.lr
        if role in SCALE_ROLES and scfg.lr_mult != 1.0:
            lr *= scfg.lr_mult  # scale.lr_mult, a switch: 1 leaves every lr bitwise as it was
        groups.append(Group(role, "muon" if muon else "adamw", lr, role_weight_decay(role, cfg, scfg), names,
                            [named[n] for n in names]))
    covered = [n for g in groups for n in g.names]
    assert sorted(covered) == sorted(named) and len(covered) == len(set(covered)), \
        "a parameter is not in exactly one group"
    assert len({id(p) for g in groups for p in g.params}) == len(covered), "a tensor sits in two groups"
    return groups


def adamw_fused(fused: str | bool, device: torch.device) -> bool:
    """Whether AdamW runs torch's fused kernel (one pass per step) or the ``foreach`` one (``optim.fused``).

    ``auto``: fused on CUDA; foreach on CPU and elsewhere, because on CPU fused rounds differently
    (tests/golden, torch 2.13, AVX2: the 20-step losses leave foreach's bitwise at step 2-9 and differ by
    up to 3e-5 nats, 2e-3 with Muon's bfloat16 Newton–Schulz on the matrices), and the study's numbers
    are foreach's. ``true`` forces fused (3.3x faster AdamW step on CPU at ``small``; torch raises if the
    device has no fused AdamW); ``false`` forces foreach. The kernel is stored in the optimizer state, so
    a resumed run keeps the one it was checkpointed with.
    """
    choice = str(fused).lower()
    if choice == "auto":
        return device.type == "cuda"
    return choice == "true"


def build_optimizers(groups: list[Group], cfg: OptimConfig) -> list[torch.optim.Optimizer]:
    """AdamW over the ``adamw`` groups (fused or foreach: ``adamw_fused``) and Muon (``match_rms_adamw`` lr
    adjustment, so AdamW-tuned lr and wd carry over) over the ``muon`` groups. Each torch param group keeps
    ``role`` and ``peak_lr``."""
    def torch_groups(kind):
        return [{"params": g.params, "lr": g.lr, "peak_lr": g.lr, "weight_decay": g.weight_decay, "role": g.role}
                for g in groups if g.optimizer == kind]

    opts = []
    adamw = torch_groups("adamw")
    if adamw:
        fused = adamw_fused(cfg.fused, adamw[0]["params"][0].device)
        opts.append(torch.optim.AdamW(adamw, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=0.0,
                                      **({"fused": True} if fused else {"foreach": True})))
    muon = torch_groups("muon")
    if muon:
        opts.append(Muon(muon, lr=cfg.muon_lr or cfg.lr, momentum=cfg.muon_momentum, weight_decay=0.0,
                         adjust_lr_fn="match_rms_adamw"))
    return opts


def set_lr(optimizers: list[torch.optim.Optimizer], multiplier: float) -> None:
    """Set every group's lr to ``peak_lr · multiplier`` (the multiplier of ``schedule.lr_multiplier``)."""
    for opt in optimizers:
        for g in opt.param_groups:
            g["lr"] = g["peak_lr"] * multiplier


def group_lrs(optimizers: list[torch.optim.Optimizer]) -> dict[str, float]:
    """``{"lr.<role>": lr}``: the lr each optimizer group steps with now (its peak lr × the schedule's multiplier;
    Muon's lr and the scale roles' ``scale.lr_mult`` included), read from the optimizers themselves."""
    return {f"lr.{g['role']}": g["lr"] for opt in optimizers for g in opt.param_groups}


def group_table(groups: list[Group]) -> str:
    """The resolved group table printed at start-up and saved as ``optim_groups.txt``."""
    lines = [f"{'role':<16}{'optimizer':<10}{'lr':>10}{'wd':>8}{'tensors':>9}{'params':>14}"]
    for g in groups:
        lines.append(f"{g.role:<16}{g.optimizer:<10}{g.lr:>10.2e}{g.weight_decay:>8.3g}{len(g.params):>9}{g.numel:>14,}")
    lines.append(f"{'total':<44}{sum(len(g.params) for g in groups):>9}{sum(g.numel for g in groups):>14,}")
    return "\n".join(lines)
