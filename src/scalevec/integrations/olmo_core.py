"""scalevec's optimizer groups in OLMo-core 3.0.0, through its own extension point (DESIGN.md §5).

OLMo-core's ``OptimConfig.group_overrides`` (``OptimGroupOverride``: parameter names and the options of their group)
is where its users move tensors out of the default group. ``group_overrides(model, optim_config)`` gives one override
per role of ``scalevec.param_groups`` except ``matrix`` (which stays OLMo-core's default group, at the config's
``lr`` and ``weight_decay``), each naming its tensors exactly (OLMo-core's strict matching then fails loudly if a
name is missing): the embedding and the scale vectors at the decay the strategy and the user's choice say, the
output head at the config's decay, and the scale roles' lr times the strategy's ``lr_mult`` where it is not 1.
The model is OLMo-core's own ``Transformer`` (``TransformerConfig.llama_like(...).build()``), with a strategy put in by
``scalevec.apply_strategy`` or plain. ``export_hf`` writes such a model, folded, through OLMo-core's own HF
converter as a plain transformers ``LlamaForCausalLM``. Needs ai2-olmo-core (``frameworks`` extra and
scripts/setup.sh).
"""

from __future__ import annotations

import torch
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


def hf_config(model: nn.Module):
    """The transformers ``LlamaConfig`` of an OLMo-core ``llama_like`` Transformer (pre-norm blocks, SwiGLU, default
    RoPE): the shape as ``apply_strategy`` reads it from the modules (``hf_model.read_shape``), RoPE θ from the first
    block's rotary embedding. Raises ``ValueError`` for RoPE scaling (not read here)."""
    import transformers

    from scalevec.integrations.hf_model import model_family, read_shape

    cfg = read_shape(model, model_family(model))
    rope = next(iter(model.blocks.values())).attention.rope
    if getattr(rope, "scaling", None) is not None:
        raise ValueError("OLMo-core RoPE scaling is not exported here; export a model without rope_scaling")
    return transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim or cfg.d_model // cfg.n_heads, rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope.theta)},
        tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False)


def export_hf(model: nn.Module, out_dir, dtype: torch.dtype = torch.float32):
    """Write an OLMo-core ``llama_like`` Transformer carrying a foldable strategy (or none) as a plain transformers
    ``LlamaForCausalLM`` in ``out_dir``, without changing ``model``: a folded copy (``scalevec.fold``) through
    OLMo-core's own HF converter (``convert_state_to_hf`` for ``model_type="llama"``) into ``hf_config(model)``'s
    model, ``save_pretrained``. Returns the HF model. Raises ``ValueError`` for a strategy that cannot fold (DNP:
    ``unified``) or tensors the converter leaves unmatched, ``FileExistsError`` for a non-empty ``out_dir``."""
    from pathlib import Path

    import transformers
    from olmo_core.nn.hf.convert import convert_state_to_hf

    from scalevec.integrations.hf_model import folded_copy

    out = Path(out_dir)
    plain = folded_copy(model, out)
    config = hf_config(model)
    state = {k: v.detach().to("cpu", dtype) for k, v in plain.state_dict().items()}
    hf = transformers.LlamaForCausalLM(config).to(dtype)
    missing, unexpected = hf.load_state_dict(convert_state_to_hf(config, state), strict=False)
    if unexpected or [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]:
        raise ValueError(f"export_hf: OLMo-core's converter gave {len(unexpected)} unexpected and {len(missing)} "
                         f"missing tensors for LlamaForCausalLM ({(unexpected or missing)[:3]})")
    hf.save_pretrained(out, safe_serialization=True)
    return hf.eval()


__all__ = ["export_hf", "group_overrides", "hf_config"]
