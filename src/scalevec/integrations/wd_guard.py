"""Refuse to step an optimizer whose weight decay breaks the strategy a model carries (DESIGN.md §5).

A strategy decides which scale vectors are decayed: ``unified``/IWD decay the Input-Norm scales, no strategy
decays an Output-Norm scale (QK-norm's, DNP's gate scale) or OR/ER's direction α (``scales.decayed_scale_roles``).
An optimizer built by another rule — ``transformers.Trainer``'s own (decay everything but biases and norm names it
knows), ``torch.optim.AdamW(model.parameters())`` (0.01 on everything), or any weight decay of 0 — silently trains
another method. ``apply_strategy`` calls ``guard_weight_decay(model)``; from then on, before the first step of any
torch optimizer that holds one of the model's scale vectors (torch's public global
``torch.optim.optimizer.register_optimizer_step_pre_hook``, so every loop is covered: HF ``Trainer``, accelerate,
Lightning, a hand-written one), the optimizer's groups are checked against the strategy and a wrong one raises
``WeightDecayMismatch`` naming the first wrong tensor and the fix. The check runs once per optimizer (a passing
optimizer is remembered, weakly, with its groups' layout), so a step costs a look at its groups after that; it runs
again after ``add_param_group``, a group's ``weight_decay`` turned on or off or a tensor moved between groups
(``_layout``), and after any model is guarded or opted out or back in (``_epoch``).

The opt-out, for a user who means it: ``allow_any_weight_decay(model)``. A model without a strategy (never applied,
or ``fold``-ed) is not checked. A ``copy.deepcopy`` of a guarded model (alone, or with its optimizer) is guarded
too, with the original's opt-out: the model carries a ``_GuardMark`` whose copy guards the model copy
(``__reduce__``: ``copy`` builds the copy's mark from the copied model). Not covered: an optimizer that holds
flattened copies of the parameters instead of the parameters (FSDP1 without ``use_orig_params``, DeepSpeed ZeRO):
nothing of the model is found in it, so it passes unchecked.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from scalevec.model.params import SCALE_ROLES
from scalevec.model.roles import model_roles
from scalevec.model.scales import decayed_scale_roles

OPT_OUT = "_scalevec_any_weight_decay"  # the model attribute allow_any_weight_decay sets
GUARD_MARK = "_scalevec_wd_guard"  # the model attribute guard_weight_decay sets: a _GuardMark

_guarded: weakref.WeakSet = weakref.WeakSet()  # models carrying a strategy
# optimizers already checked and found right -> (_epoch, their _layout) at that check
_passed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_epoch = 0  # bumped when the guarded models or their opt-outs change: every optimizer is checked again
_hook = None  # the one global step pre-hook, registered on the first guard_weight_decay


class WeightDecayMismatch(ValueError):
    """An optimizer's weight decay on a scale vector differs from what the model's strategy says (DESIGN.md §5)."""


class _GuardMark:
    """What a guarded model carries (``model.__dict__[GUARD_MARK]``) so that its copies are guarded too: a
    ``copy.deepcopy`` of the model copies the mark through ``__reduce__``, whose argument is the model, which
    ``copy`` has already replaced by the model's copy (its memo), so rebuilding the mark guards the copy. Holds the
    model weakly (the guard never keeps a model alive)."""

    def __init__(self, model: nn.Module):
        self.model = weakref.ref(model)

    def __reduce__(self):
        return guard_weight_decay, (self.model(),)


def guard_weight_decay(model: nn.Module) -> _GuardMark:
    """Check every optimizer that steps ``model``'s scale vectors against its strategy (``model.scalevec_info``)
    before its first step (module docstring); a ``copy.deepcopy`` of ``model`` is guarded too. Idempotent; holds
    ``model`` weakly. Returns the mark it leaves on ``model`` (``GUARD_MARK``)."""
    global _hook, _epoch
    _guarded.add(model)
    _epoch += 1
    if _hook is None:
        _hook = register_optimizer_step_pre_hook(_check_before_step)
    mark = _GuardMark(model)
    model.__dict__[GUARD_MARK] = mark  # copy sets the copy's attribute itself, from this return value
    return mark


def allow_any_weight_decay(model: nn.Module, allow: bool = True) -> nn.Module:
    """Opt ``model`` out of the check (``allow=True``) or back in; returns ``model``. For a user who decays the scale
    vectors differently from the strategy on purpose; an optimizer that stepped while opted out is checked again
    at its next step once opted back in."""
    global _epoch
    model.__dict__[OPT_OUT] = bool(allow)
    _epoch += 1
    return model


def weight_decay_mismatch(optimizer: torch.optim.Optimizer, model: nn.Module) -> str | None:
    """The message for the first scale vector of ``model`` whose decay in ``optimizer`` (a group's ``weight_decay``
    > 0, or not) differs from ``model.scalevec_info``'s strategy, in the optimizer's group order; ``None`` when all
    agree, ``model`` carries no strategy, or ``optimizer`` holds none of its scale vectors. Only whether a tensor is
    decayed is checked: the amount (``weight_decay``) is the user's, and so are the other roles."""
    info = getattr(model, "scalevec_info", None)
    if info is None:
        return None
    named = dict(model.named_parameters())
    scales = {id(named[n]): (n, r) for n, r in model_roles(model).items() if r in SCALE_ROLES}
    decayed = decayed_scale_roles(info.scale)
    for group in optimizer.param_groups:
        wd = group.get("weight_decay") or 0.0
        for p in group["params"]:
            if id(p) not in scales:
                continue
            name, role = scales[id(p)]
            if (wd > 0) == (role in decayed):
                continue
            return (f"{name} ({role}) has weight_decay={wd:g} in {type(optimizer).__name__}, but strategy "
                    f"{info.strategy} {'decays' if role in decayed else 'never decays'} {role} (DESIGN.md §5): build "
                    f"the optimizer from scalevec.param_groups(model, lr, weight_decay) (transformers: "
                    f"scalevec.integrations.hf_trainer.ScalevecTrainer), or call "
                    f"scalevec.allow_any_weight_decay(model) if you mean it")
    return None


def _steps_inner_optimizers(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is a container whose step steps optimizers of its own (torchtitan's
    ``OptimizersContainer``: its own param groups are one flat group without the inner groups' weight decay). Each
    inner optimizer's step passes this check itself, so the container is not judged by its flat group."""
    inner = getattr(optimizer, "optimizers", None)
    return isinstance(inner, (list, tuple)) and bool(inner) and all(
        isinstance(o, torch.optim.Optimizer) for o in inner)


def _layout(optimizer: torch.optim.Optimizer) -> tuple:
    """What a passing check depends on, cheap enough for every step: per group, whether it decays and how many
    tensors it holds. A ``weight_decay`` set on a group after the first step, or a tensor moved into a decayed
    group, changes it, and the optimizer is checked again."""
    return tuple(((g.get("weight_decay") or 0.0) > 0, len(g["params"])) for g in optimizer.param_groups)


def _check_before_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    if _passed.get(optimizer) == (_epoch, _layout(optimizer)) or _steps_inner_optimizers(optimizer):
        return
    for model in list(_guarded):
        if model.__dict__.get(OPT_OUT):
            continue
        problem = weight_decay_mismatch(optimizer, model)
        if problem is not None:
            raise WeightDecayMismatch(problem)
    _passed[optimizer] = (_epoch, _layout(optimizer))


__all__ = ["WeightDecayMismatch", "guard_weight_decay", "allow_any_weight_decay", "weight_decay_mismatch"]
