"""scalevec's optimizer groups in OLMo-core 3.0.0, through its own extension point (DESIGN.md §5).

OLMo-core's ``OptimConfig.group_overrides`` (``OptimGroupOverride``: parameter names and the options of their group)
is where its users move tensors out of the default group. ``group_overrides(model, optim_config)`` gives one override
per role of ``scalevec.param_groups`` except ``matrix`` (which stays OLMo-core's default group, at the config's
``lr`` and ``weight_decay``), each naming its tensors exactly (OLMo-core's strict matching then fails loudly if a
name is missing): the embedding and the scale vectors at the decay the strategy and the user's choice say, the
output head at the config's decay, and the scale roles' lr times the strategy's ``lr_mult`` where it is not 1.
The model is OLMo-core's own ``Transformer`` (``TransformerConfig.llama_like(...).build()``), with a strategy put in by
``scalevec.apply_strategy`` or plain. Needs ai2-olmo-core (``frameworks`` extra and scripts/setup.sh).
"""

from __future__ import annotations

from olmo_core.optim import OptimGroupOverride
from torch import nn

from scalevec.integrations.groups import param_groups, strategy_of


def group_overrides(model: nn.Module, optim_config, embedding_wd: bool = False) -> list[OptimGroupOverride]:
    """OLMo-core group overrides putting ``model``'s tensors in scalevec's role groups (module docstring).

    ``optim_config``: an OLMo-core ``OptimConfig`` (``AdamWConfig``, ...) whose ``lr`` and ``weight_decay`` are the
    matrices'; ``embedding_wd``: decay the embedding too (default not). Use::

        optim_config.group_overrides = group_overrides(model, optim_config)
        optimizer = optim_config.build(model)

    Raises ``ValueError`` for an lr or weight decay ``param_groups`` refuses.
    """
    groups = param_groups(model, lr=optim_config.lr, weight_decay=optim_config.weight_decay,
                          strategy=strategy_of(model), embedding_wd=embedding_wd)
    overrides = []
    for g in groups:
        if g["role"] == "matrix":
            continue  # OLMo-core's default group: the config's own lr and weight decay
        opts = {"weight_decay": g["weight_decay"]}
        if g["lr"] != optim_config.lr:
            opts["lr"] = g["lr"]
        overrides.append(OptimGroupOverride(params=list(g["names"]), opts=opts))
    return overrides


__all__ = ["group_overrides"]
