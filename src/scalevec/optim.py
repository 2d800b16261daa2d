"""Optimizer parameter groups built from parameter roles, never from names (DESIGN.md §5).

``build_optimizers(model, optim_cfg, scale_cfg)`` returns the optimizers (AdamW alone, or Muon for
``matrix`` parameters plus AdamW for every other role) and a printable group table. Weight decay per
role: ``matrix`` and ``lm_head`` get ``weight_decay``; ``embedding`` and ``router`` only if configured;
``input_scale`` / ``output_scale`` as the strategy's ``wd`` switch says (IWD = input scales only);
``scale_direction`` (OR/ER's α, scale-invariant) never. Every parameter is in exactly one group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .config import OptimConfig, ScaleConfig

ROLE_ORDER = ("matrix", "embedding", "lm_head", "router", "input_scale", "output_scale", "scale_direction")


def role_weight_decay(role: str, cfg: OptimConfig, scfg: ScaleConfig) -> float:
    """Decoupled weight decay of a role (DESIGN.md §3 ``wd`` switch, §5)."""
    decayed = {
        "matrix": True,
        "lm_head": True,
        "embedding": cfg.embedding_wd,
        "router": cfg.router_wd,
        "input_scale": scfg.wd in ("all", "input"),
        "output_scale": scfg.wd in ("all", "output"),
        "scale_direction": False,
    }[role]
    return cfg.weight_decay if decayed else 0.0


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


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` that also takes 3-D expert banks ``(E, d_out, d_in)`` and orthogonalizes each
    expert's matrix on its own (DESIGN.md §5, §6): a bank is handed to torch's update as E 2-D views."""

    def __init__(self, params, **kwargs):
        groups = list(params)
        super().__init__([nn.Parameter(torch.zeros(1, 1))], **kwargs)  # torch's check rejects 3-D; we add below
        self.param_groups.clear()
        for g in groups:
            for p in g["params"]:
                if p.ndim not in (2, 3):
                    raise ValueError(f"Muon takes 2-D matrices or 3-D expert banks, got shape {tuple(p.shape)}")
            self.add_param_group(g)

    def _init_group(self, group, params_with_grad, grads, muon_momentum_bufs):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            if p.ndim == 3:  # one 2-D problem per expert; views write through to the bank
                params_with_grad.extend(p.unbind(0))
                grads.extend(p.grad.unbind(0))
                muon_momentum_bufs.extend(buf.unbind(0))
            else:
                params_with_grad.append(p)
                grads.append(p.grad)
                muon_momentum_bufs.append(buf)
        return False


def param_groups(model: nn.Module, cfg: OptimConfig, scfg: ScaleConfig, roles: dict[str, str] | None = None) -> list[Group]:
    """One group per role (and optimizer); asserts every parameter lands in exactly one group."""
    roles = roles if roles is not None else model.param_roles()
    named = dict(model.named_parameters())
    if set(named) != set(roles):
        raise AssertionError(f"roles and parameters differ: {sorted(set(named) ^ set(roles))[:5]}")
    groups = []
    for role in ROLE_ORDER:
        names = [n for n in named if roles[n] == role]
        if not names:
            continue
        muon = cfg.name == "muon" and role == "matrix"
        lr = (cfg.muon_lr or cfg.lr) if muon else cfg.lr
        groups.append(Group(role, "muon" if muon else "adamw", lr, role_weight_decay(role, cfg, scfg), names,
                            [named[n] for n in names]))
    covered = [n for g in groups for n in g.names]
    assert sorted(covered) == sorted(named) and len(covered) == len(set(covered)), "a parameter is not in exactly one group"
    return groups


def build_optimizers(groups: list[Group], cfg: OptimConfig) -> list[torch.optim.Optimizer]:
    """AdamW over the ``adamw`` groups and Muon (``match_rms_adamw`` lr adjustment, so AdamW-tuned lr and
    wd carry over) over the ``muon`` groups. Each torch param group keeps ``role`` and ``peak_lr``."""
    def torch_groups(kind):
        return [{"params": g.params, "lr": g.lr, "peak_lr": g.lr, "weight_decay": g.weight_decay, "role": g.role}
                for g in groups if g.optimizer == kind]

    opts = []
    adamw = torch_groups("adamw")
    if adamw:
        opts.append(torch.optim.AdamW(adamw, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=0.0,
                                      foreach=True))
    muon = torch_groups("muon")
    if muon:
        opts.append(Muon(muon, lr=cfg.muon_lr or cfg.lr, momentum=cfg.muon_momentum, weight_decay=0.0,
                         adjust_lr_fn="match_rms_adamw"))
    return opts


def set_lr(optimizers: list[torch.optim.Optimizer], multiplier: float) -> None:
    """Set every group's lr to ``peak_lr · multiplier`` (multiplier = schedule lr / peak)."""
    for opt in optimizers:
        for g in opt.param_groups:
            g["lr"] = g["peak_lr"] * multiplier


def group_table(groups: list[Group]) -> str:
    """The resolved group table printed at start-up and saved as ``optim_groups.txt``."""
    lines = [f"{'role':<16}{'optimizer':<10}{'lr':>10}{'wd':>8}{'tensors':>9}{'params':>14}"]
    for g in groups:
        lines.append(f"{g.role:<16}{g.optimizer:<10}{g.lr:>10.2e}{g.weight_decay:>8.3g}{len(g.params):>9}{g.numel:>14,}")
    lines.append(f"{'total':<44}{sum(len(g.params) for g in groups):>9}{sum(g.numel for g in groups):>14,}")
    return "\n".join(lines)
