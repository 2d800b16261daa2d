"""A strategy's scale vectors put into a transformers model in place, and taken out again (issue 36; DESIGN.md §3, §10).

``apply_strategy(model, strategy, **switches)`` takes a ``LlamaForCausalLM``, ``Qwen3ForCausalLM``,
``MixtralForCausalLM`` or ``Qwen3MoeForCausalLM`` (or scalevec's own ``Transformer``) and replaces, in place,
the modules that read a normalized input by scalevec's own placement modules, built from the strategy's
``scales.scale_plan`` exactly as scalevec's model builds them. The object keeps its class, ``forward``,
``generate()``, loss and gradient checkpointing (the decoder layers are untouched: only their norm and
projection submodules change)::

    HF module (layer i)          becomes                                          scalevec name
    input_layernorm              SiteNorm: γ ⊙ n(x), γ = plan.attn's own γ         layers.i.attn.proj(.scale)
    self_attn.{q,k,v}_proj       scales.Projection: s ⊙ (W diag(γ_b) u)           layers.i.attn.proj.branches.*
    self_attn.o_proj             scales.Projection (plan.o)                       layers.i.attn.o
    self_attn.{q,k}_norm         scales.OutputNorm (Qwen3's QK-norm γ)            layers.i.attn.{q,k}_norm
    post_attention_layernorm     SiteNorm (plan.mlp, or plan.moe)                 layers.i.mlp.proj (MoE: layers.i.mlp)
    mlp.{gate,up}_proj           Projection / ProjNormedBranch (DNP: s ⊙ n(...))  layers.i.mlp.proj.branches.*
    mlp.down_proj                scales.Projection (plan.down)                    layers.i.mlp.down
    mlp.gate (MoE router)        kept; γ_router as ``in_scale`` on its input      layers.i.mlp.router
    mlp.experts (MoE)            scalevec's ``moe.Experts`` (banks with γ_b, s)   layers.i.mlp.experts
    model.norm                   SiteNorm (plan.head)                             head

The embedding and ``lm_head`` keep their HF modules. Every parameter gets its
§5 role (``params.new_param``'s record), so ``params.param_roles`` and ``count_params`` read the model and
``param_groups`` groups it. The HF norm weights become the strategy's γ by ``hf_import``'s rule (the one
``convert`` and ``train --init-from`` use): shared γ -> the norm's γ, HG -> every branch's γ_b, output
scales s = 1, magnitude-direction by ``ScaleVector.assign``, strategy ``none`` folds γ into the weights.
A foldable strategy therefore computes the source's function (to fp32 rounding, tests/test_integrations.py);
DNP (``dnp``, ``unified``) changes it, and so does ``none`` on a Qwen3 (QK-norm γ has no slot): both are
said in a ``UserWarning`` and in ``model.scalevec_info``.

``to_scalevec(model)`` is the scalevec ``Transformer`` holding the same parameters (the name map above), which
is how ``fold`` and ``save`` reuse ``model/fold.py`` and ``hf/export.py``: ``fold(model)`` turns a foldable
model back into a plain HF model in place (``save_pretrained`` then writes an ordinary checkpoint), ``save``
writes what ``scalevec export`` writes (a plain family, or the custom-code ``ScalevecForCausalLM`` for DNP).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from scalevec.config import PRESET_NAMES, ModelConfig, ScaleConfig
from scalevec.hf_format.hf_import import load_plain, model_config_from_hf, plain_from_model
from scalevec.hf_format.names import FORMATS
from scalevec.integrations.wd_guard import guard_weight_decay
from scalevec.model.fold import fold_scales
from scalevec.model.kernels import FAST
from scalevec.model.moe import Experts
from scalevec.model.scales import (
    PLAIN,
    Branch,
    NormedBranch,
    OutputNorm,
    OutputNormPlan,
    Projection,
    ScaleVector,
    gamma_of,
    scale_plan,
)
from scalevec.model.transformer import Transformer, build_model

# ------------------------------------------------------------------------------------------ the modules put in


class ProjNormedBranch(NormedBranch):
    """``scales.NormedBranch`` (DNP: ``s ⊙ n(W diag(γ_b) u)``, n over d_out) with the ``nn.Linear`` call
    signature; in an HF MLP ``act(gate_proj(u)) * up_proj(u)`` is then ``scales.dnp_swiglu``'s function."""

    def forward(self, u: Tensor) -> Tensor:
        return self.finish(self.linear(u))


class SiteNorm(OutputNorm):
    """An Input-Norm of an HF layer: ``γ ⊙ n(x)`` with the plan's γ for the site (None: no γ, as under HG where
    each branch has its own, or strategy ``none``). The arithmetic is ``scales.OutputNorm``'s (``rms_norm``),
    the role of γ the plan's (``input_scale``)."""


def _router_pre_hook(module: nn.Module, args: tuple) -> tuple:
    """HG's γ_router on an HF router's input: ``W (γ_router ⊙ u) = (W diag γ_router) u`` (the router computes
    ``F.linear(u, W)`` itself; its outputs and the HF auxiliary loss are unchanged in form)."""
    x = args[0]
    return (x * module.in_scale().to(x.dtype), *args[1:])


# ------------------------------------------------------------------------------------------ the record


@dataclass
class StrategyInfo:
    """What ``apply_strategy`` did, kept on the model as ``model.scalevec_info``.

    ``scale``: the strategy (a ``ScaleConfig``), ``strategy`` its name (``unified``, ``unified(lr_mult=0.5)``,
    ``custom`` for a ``ScaleConfig``); ``cfg``: the model shape as scalevec reads it; ``family``: the
    HF model_type (``llama``, ``qwen3``, ``mixtral``, ``qwen3_moe``); ``function_preserved``: False when the
    strategy changed the function (DNP; QK-norm γ ≠ 1 under ``none``); ``notes``: the lines saying what
    changed; ``originals``: module path -> the HF class it replaced (``fold`` puts that class back).
    """

    scale: ScaleConfig
    cfg: ModelConfig
    family: str
    function_preserved: bool
    strategy: str = "custom"
    notes: list[str] = field(default_factory=list)
    originals: dict[str, type] = field(default_factory=dict)



def scale_config(strategy: str | ScaleConfig = "baseline", **switches) -> ScaleConfig:
    """The ``ScaleConfig`` of ``strategy`` (a name of DESIGN.md §3's table or a ``ScaleConfig``) with ``switches``
    (any ``ScaleConfig`` field: ``lr_mult=0.5``, ``per_expert=True``, ``apply='activation'``) set. Raises
    ``ValueError`` for an unknown strategy, an unknown switch (naming the valid ones) or an invalid value."""
    if isinstance(strategy, ScaleConfig):
        scfg = strategy
    elif isinstance(strategy, str):
        scfg = ScaleConfig.preset(strategy)
    else:
        raise ValueError(f"strategy must be a name ({', '.join(PRESET_NAMES)}) or a ScaleConfig, got "
                         f"{type(strategy).__name__}")
    known = {f.name for f in dataclasses.fields(ScaleConfig)} - {"folded"}
    bad = sorted(set(switches) - known)
    if bad:
        raise ValueError(f"unknown strategy switch {', '.join(bad)}; the switches are: {', '.join(sorted(known))}")
    scfg = dataclasses.replace(scfg, **switches)
    scfg.validate()
    if scfg.apply == "fused":
        raise ValueError("apply='fused' fuses scalevec's own attention and MLP, which a Hugging Face model does not "
                         "have; use apply='weight' (the default) or 'activation'")
    return scfg


# ------------------------------------------------------------------------------------------ apply


def hf_shape(model: nn.Module) -> tuple[str, ModelConfig]:
    """``(family, ModelConfig)`` of a transformers causal LM of a family scalevec computes. Raises ``ValueError``
    naming the model and the supported families (or the feature scalevec does not compute: biases, sliding
    window, another activation or RoPE type, ...)."""
    config = getattr(model, "config", None)
    fmt = getattr(config, "model_type", None)
    if fmt not in FORMATS or not hasattr(model, "model") or not hasattr(model.model, "layers"):
        raise ValueError(f"apply_strategy takes a {', '.join(FORMATS.values())} or a scalevec Transformer, not "
                         f"{type(model).__name__}")
    try:
        _, cfg = model_config_from_hf(config.to_dict())
    except ValueError as e:
        raise ValueError(f"{type(model).__name__}: {e}") from None
    return fmt, cfg


def _materialize(m: nn.Module | None, device: torch.device, dtype: torch.dtype) -> None:
    """A scale vector built on the meta device, allocated on ``device`` in ``dtype`` (values set by ``assign``)."""
    if m is not None:
        m.to_empty(device=device)
        m.to(dtype)


def _set_gamma(sv: ScaleVector | None, gamma: Tensor) -> None:
    if sv is not None:
        sv.assign(gamma)  # direct: γ; OR/ER: the magnitude from rms(γ), the direction γ/rms(γ) (hf_import's rule)


def _branch(linear: nn.Linear, plan, eps: float, ops) -> Branch:
    """The ``scales.Projection`` (or DNP's ``ProjNormedBranch``) of ``plan`` (a ``BranchPlan``) around ``linear``'s own
    weight Parameter, so that its name (``q_proj.weight``) does not change; its scale vectors at γ = s = 1
    (``assign`` sets γ after)."""
    w = linear.weight  # no bias (_check)
    cls = ProjNormedBranch if plan.normalized else Projection
    with torch.device("meta"):
        b = cls(w.shape[1], w.shape[0], plan, eps, ops)
    b.weight = w  # the HF Parameter itself: same object, same name; its role stays ``matrix``
    for sv in (b.in_scale, b.out_scale):
        _materialize(sv, w.device, w.dtype)
        _set_gamma(sv, torch.ones(()))
    return b


def _site_norm(hf_norm: nn.Module, spec, d: int, eps: float, ops, cls: type = SiteNorm) -> OutputNorm:
    """The ``cls`` (``SiteNorm`` or, for QK-norm, ``scales.OutputNorm``) of scale spec ``spec`` (or None) in place of
    ``hf_norm``, its γ allocated like ``hf_norm.weight`` (set by ``assign`` after)."""
    ref = hf_norm.weight
    with torch.device("meta"):
        m = cls(d, OutputNormPlan(spec), eps, ops)
    _materialize(m.scale, ref.device, ref.dtype)
    return m


def _roles(module: nn.Module, **roles: str) -> None:
    """Record §5 roles for parameters an HF module keeps (``params.new_param``'s record), so that
    ``params.param_roles`` reads the whole model."""
    module.__dict__.setdefault("_roles", {}).update(roles)


def _norm_weight(hf_norm: nn.Module) -> Tensor:
    return hf_norm.weight.detach().to(torch.float32).clone()


def strategy_name(strategy: str | ScaleConfig, switches: dict) -> str:
    """How ``StrategyInfo`` names the strategy: the table's name, with the switches set on it."""
    name = strategy if isinstance(strategy, str) else "custom"
    return name + (f"({', '.join(f'{k}={v!r}' for k, v in switches.items())})" if switches else "")


def _apply_hf(model: nn.Module, scfg: ScaleConfig, name: str) -> StrategyInfo:
    fmt, cfg = hf_shape(model)
    plan = scale_plan(scfg, cfg)
    ops = FAST if plan.fast else PLAIN
    eps = cfg.norm_eps
    info = StrategyInfo(scfg, cfg, fmt, function_preserved=scfg.foldable, strategy=name)
    if not scfg.foldable:
        info.notes.append("DNP normalizes the outputs of W_gate/W_up, which the source does not")
    base = model.model
    _check(model, cfg, plan)  # every refusal before the first module is replaced: no half-converted model
    lost = []

    def replace(parent: nn.Module, name: str, new: nn.Module, path: str) -> None:
        info.originals[path] = type(getattr(parent, name))
        setattr(parent, name, new)

    with torch.no_grad():
        _roles(base.embed_tokens, weight="embedding")
        for i, layer in enumerate(base.layers):
            p = f"model.layers.{i}"
            attn = layer.self_attn
            # attention: its Input-Norm, q/k/v, QK-norm
            gamma = _norm_weight(layer.input_layernorm)
            norm = _site_norm(layer.input_layernorm, plan.attn.gamma, cfg.d_model, eps, ops)
            branches = {s: _branch(getattr(attn, f"{s}_proj"), plan.attn.branches[s], eps, ops) for s in "qkv"}
            _set_gamma(norm.scale, gamma)
            for b in branches.values():
                _set_gamma(b.in_scale, gamma)
                if norm.scale is None and b.in_scale is None:  # strategy none: γ folds into the weights
                    b.weight.mul_(gamma.to(b.weight.dtype))
            replace(layer, "input_layernorm", norm, f"{p}.input_layernorm")
            for s, b in branches.items():
                replace(attn, f"{s}_proj", b, f"{p}.self_attn.{s}_proj")
            replace(attn, "o_proj", _branch(attn.o_proj, plan.o, eps, ops), f"{p}.self_attn.o_proj")
            if cfg.qk_norm:
                for s in ("q_norm", "k_norm"):
                    hf = getattr(attn, s)
                    g = _norm_weight(hf)
                    qk = _site_norm(hf, plan.qk_norm.gamma, cfg.head_dim, eps, ops, OutputNorm)
                    if qk.scale is not None:
                        _set_gamma(qk.scale, g)
                    elif not torch.equal(g, torch.ones_like(g)):
                        lost.append(f"{p}.self_attn.{s}")
                    replace(attn, s, qk, f"{p}.self_attn.{s}")
            # the MLP: dense or MoE
            gamma = _norm_weight(layer.post_attention_layernorm)
            mlp = layer.mlp
            if hasattr(mlp, "experts"):
                norm = _site_norm(layer.post_attention_layernorm, plan.moe.gamma, cfg.d_model, eps, ops)
                _set_gamma(norm.scale, gamma)
                info.originals[f"{p}.mlp.experts"] = _put_moe(mlp, cfg, plan, ops, gamma, norm.scale is not None)
            else:
                norm = _site_norm(layer.post_attention_layernorm, plan.mlp.gamma, cfg.d_model, eps, ops)
                _set_gamma(norm.scale, gamma)
                branches = {s: _branch(getattr(mlp, f"{s}_proj"), plan.mlp.branches[s], eps, ops)
                            for s in ("gate", "up")}
                for b in branches.values():
                    _set_gamma(b.in_scale, gamma)
                    if norm.scale is None and b.in_scale is None:
                        b.weight.mul_(gamma.to(b.weight.dtype))
                for s, b in branches.items():
                    replace(mlp, f"{s}_proj", b, f"{p}.mlp.{s}_proj")
                replace(mlp, "down_proj", _branch(mlp.down_proj, plan.down, eps, ops), f"{p}.mlp.down_proj")
            replace(layer, "post_attention_layernorm", norm, f"{p}.post_attention_layernorm")
        # the final Input-Norm and the LM head
        gamma = _norm_weight(base.norm)
        norm = _site_norm(base.norm, plan.head.gamma, cfg.d_model, eps, ops)
        head = model.lm_head
        if norm.scale is not None:
            _set_gamma(norm.scale, gamma)
        elif not torch.equal(gamma, torch.ones_like(gamma)):  # strategy none, untied (_check): into the head
            head.weight.mul_(gamma.to(head.weight.dtype))
        replace(base, "norm", norm, "model.norm")
        if head.weight is not base.embed_tokens.weight:
            _roles(head, weight="lm_head")
    if lost:
        info.function_preserved = False
        info.notes.append(f"strategy {info.strategy} has no slot for the QK-norm γ of {', '.join(lost[:2])}"
                          + (f" (and {len(lost) - 2} more)" if len(lost) > 2 else ""))
    return info


def _check(model: nn.Module, cfg: ModelConfig, plan) -> None:
    """Raise ``ValueError`` for what ``_apply_hf`` cannot put in, before it changes anything: a projection with a
    bias, MoE experts in another layout, scale vectors on the LM head's own branch, the final norm's γ ≠ 1 with
    no vector to hold it (``none``) and a tied LM head to fold it into."""
    base = model.model
    for layer in base.layers:
        linears = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj]
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            ex = mlp.experts
            if getattr(ex, "gate_up_proj", None) is None or ex.gate_up_proj.dim() != 3 or \
                    getattr(ex, "is_transposed", False) or not getattr(ex, "is_concatenated", True):
                raise ValueError(f"{type(ex).__name__}: expert weights in a layout scalevec does not read (it reads "
                                 f"gate_up_proj (E, 2·d_expert, d) concatenated, as transformers 5 holds Mixtral and "
                                 f"Qwen3-MoE)")
        else:
            linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if any(getattr(m, "bias", None) is not None for m in linears):
            raise ValueError("a projection with a bias is not supported (scalevec's model has none)")
    head = plan.head.branches["lm_head"]
    if head.gamma is not None or head.s is not None:
        raise ValueError("a strategy with scale vectors on the LM head's own branch is not supported here")
    gamma = base.norm.weight
    if plan.head.gamma is None and not torch.equal(gamma, torch.ones_like(gamma)) and \
            model.lm_head.weight is base.embed_tokens.weight:
        raise ValueError("strategy none with tied embeddings cannot hold the final norm's γ; choose a strategy with "
                         "scale vectors (or untie the LM head)")


def _put_moe(mlp: nn.Module, cfg: ModelConfig, plan, ops, gamma: Tensor, norm_has_scale: bool) -> type:
    """The MoE block's router and experts (in place): HG's γ_router on the router's input (``_router_pre_hook``), the
    experts replaced by scalevec's ``moe.Experts`` (the HF fused ``gate_up_proj (E, 2F, d)`` split into the gate and
    up banks). ``gamma``: the site's γ, given to every branch γ_b (HG) or, when the strategy has no vector for
    it (``none``: ``norm_has_scale`` False and no γ_b), folded into the router and the banks. Returns the HF
    experts class it replaced."""
    router, hf = mlp.gate, mlp.experts
    w = router.weight
    _roles(router, weight="router")
    rplan = plan.moe.branches["router"]
    if rplan.gamma is not None:
        with torch.device("meta"):
            sv = rplan.gamma.build((cfg.d_model,), ops)
        _materialize(sv, w.device, w.dtype)
        _set_gamma(sv, gamma)
        router.in_scale = sv
        router.register_forward_pre_hook(_router_pre_hook)
    gate_up, down = hf.gate_up_proj, hf.down_proj  # the layout _check accepted
    f = cfg.moe.d_expert
    with torch.device("meta"):
        ex = Experts(cfg, plan, ops)
    ex.to_empty(device=w.device)
    ex.to(w.dtype)
    ex.gate.weight.copy_(gate_up[:, :f])
    ex.up.weight.copy_(gate_up[:, f:])
    ex.down.weight.copy_(down)
    for proj in (ex.gate, ex.up, ex.down):
        _set_gamma(proj.out_scale, torch.ones(()))
        _set_gamma(proj.in_scale, gamma)
    if not norm_has_scale:
        for weight, branch_scale in ((router.weight, rplan.gamma), (ex.gate.weight, ex.gate.in_scale),
                                     (ex.up.weight, ex.up.in_scale)):
            if branch_scale is None:  # strategy none: γ folds into the weights that read the site
                weight.mul_(gamma.to(weight.dtype))
    mlp.experts = ex
    return type(hf)


def apply_strategy(model: nn.Module, strategy: str | ScaleConfig = "unified", **switches) -> nn.Module:
    """Put strategy ``strategy``'s scale vectors into ``model`` in place (module docstring; DESIGN.md §3) and return it.

    ``model``: a transformers ``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``MixtralForCausalLM`` or
    ``Qwen3MoeForCausalLM`` (any device and dtype; the scale vectors take the dtype of the norm weights they
    replace), or a scalevec ``Transformer`` (converted through ``hf_import``'s plain form, as ``convert`` does).
    ``strategy``: a name of DESIGN.md §3's table (``none``, ``baseline``, ``iwd``, ``hg``, ``dp``, ``dnp``, ``or``,
    ``er``, ``unified``, ``unified_foldable``) or a ``ScaleConfig``; ``switches``: any ``ScaleConfig`` field
    (``lr_mult=0.5``, ``per_expert=True``, ``apply='activation'``).

    A foldable strategy computes the source's function (fp32 rounding); one that is not (DNP: ``dnp``,
    ``unified``) changes it, as ``scalevec convert`` says: a ``UserWarning`` names what changes, and
    ``model.scalevec_info`` (``StrategyInfo``) keeps it. Apply to a plain model once; ``fold(model)`` first to
    change a foldable strategy. Raises ``ValueError`` for an unsupported model or feature, an unknown strategy
    or switch, or a model that already carries an unfoldable strategy.
    """
    scfg = scale_config(strategy, **switches)
    if isinstance(model, Transformer):
        return _apply_scalevec(model, scfg)
    prior = getattr(model, "scalevec_info", None)
    if prior is not None:
        if not prior.scale.foldable:
            raise ValueError(f"this model already carries strategy {prior.strategy}, which cannot fold; apply a "
                             f"strategy to the plain model instead")
        fold(model)
    info = _apply_hf(model, scfg, strategy_name(strategy, switches))
    model.scalevec_info = info
    guard_weight_decay(model)  # no optimizer may step it with weight decay that breaks the strategy (wd_guard.py)
    if not info.function_preserved:
        warnings.warn(f"apply_strategy: strategy {info.strategy} -> THE FUNCTION CHANGES: {'; '.join(info.notes)}",
                      UserWarning, stacklevel=2)
    return model


def _apply_scalevec(model: Transformer, scfg: ScaleConfig) -> Transformer:
    """A scalevec ``Transformer`` into strategy ``scfg`` in place, through the plain form (``convert``'s path)."""
    ref = next(model.parameters())
    plain = plain_from_model(model)  # ValueError for DNP / peri: they cannot convert
    new = build_model(model.cfg, scfg, seed=0, device=ref.device).to(ref.dtype)
    lost = load_plain(new, plain)
    model.scfg, model.plan = new.scfg, new.plan
    for name, child in new.named_children():
        setattr(model, name, child)
    if not scfg.foldable or lost:
        why = ("DNP normalizes the outputs of W_gate/W_up, which the source does not" if not scfg.foldable
               else f"the strategy has no slot for the QK-norm γ of {', '.join(lost[:2])}")
        warnings.warn(f"apply_strategy: THE FUNCTION CHANGES: {why}", UserWarning, stacklevel=3)
    return model


# ------------------------------------------------------------------------------------------ back out


_PREFIXES = [  # (HF module path regex, scalevec module path); {i} the layer; first match wins
    (r"model\.embed_tokens", "embed"),
    (r"model\.layers\.(\d+)\.input_layernorm", "layers.{i}.attn.proj"),
    (r"model\.layers\.(\d+)\.self_attn\.([qkv])_proj", "layers.{i}.attn.proj.branches.{b}"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj", "layers.{i}.attn.o"),
    (r"model\.layers\.(\d+)\.self_attn\.([qk])_norm", "layers.{i}.attn.{b}_norm"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm", None),  # dense: mlp.proj; MoE: mlp
    (r"model\.layers\.(\d+)\.mlp\.(gate|up)_proj", "layers.{i}.mlp.proj.branches.{b}"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj", "layers.{i}.mlp.down"),
    (r"model\.layers\.(\d+)\.mlp\.gate", "layers.{i}.mlp.router"),
    (r"model\.layers\.(\d+)\.mlp\.experts", "layers.{i}.mlp.experts"),
    (r"model\.norm", "head"),
    (r"lm_head", "head.branches.lm_head"),
]
_RULES = [(re.compile(rx + r"\.(.+)$"), ours) for rx, ours in _PREFIXES]


def scalevec_name(name: str, cfg: ModelConfig) -> str:
    """The scalevec ``Transformer`` parameter name of parameter ``name`` of a model ``apply_strategy`` touched
    (``model.layers.0.self_attn.q_proj.in_scale.weight`` -> ``layers.0.attn.proj.branches.q.in_scale.weight``).
    Raises ``KeyError`` for a name outside the map."""
    for rx, ours in _RULES:
        m = rx.match(name)
        if m is None:
            continue
        groups = m.groups()
        rest = groups[-1]
        i = groups[0] if len(groups) > 1 else None
        if ours is None:  # the MLP's Input-Norm: the dense MLP's proj, or the MoE block itself
            moe = cfg.moe is not None and int(i) >= cfg.moe.first_dense
            ours = "layers.{i}.mlp" if moe else "layers.{i}.mlp.proj"
        b = groups[1] if len(groups) > 2 else None
        return f"{ours.format(i=i, b=b)}.{rest}"
    raise KeyError(f"{name} has no place in scalevec's model")


def _info(model: nn.Module) -> StrategyInfo:
    info = getattr(model, "scalevec_info", None)
    if info is None:
        raise ValueError(f"this {type(model).__name__} carries no scalevec strategy; call "
                         f"scalevec.apply_strategy(model, STRATEGY) first")
    return info


def to_scalevec(model: nn.Module) -> Transformer:
    """The scalevec ``Transformer`` (strategy and shape of ``model.scalevec_info``) holding a copy of the parameters
    of a model ``apply_strategy`` touched (``scalevec_name``), on the model's device, in float32. It computes the
    same function (fp32 rounding: the HF attention and MoE dispatch differ from ours in summation order).
    Raises ``ValueError`` for a model without a strategy."""
    info = _info(model)
    ref = next(model.parameters())
    sv = build_model(info.cfg, info.scale, seed=0, device=ref.device)
    state = {}
    for name, t in model.state_dict().items():
        state[scalevec_name(name, info.cfg)] = t.detach().to(torch.float32)
    if info.cfg.tie_embeddings:
        state.setdefault("head.branches.lm_head.weight", state["embed.weight"])
    sv.load_state_dict(state, strict=True)
    return sv


def fold(model: nn.Module) -> nn.Module:
    """Fold every scale vector of a model ``apply_strategy`` touched back into its weights, in place (DESIGN.md §4):
    the result is the plain HF model again (its class, modules and parameter names; ``save_pretrained`` writes an
    ordinary checkpoint), computing the same function (fp32 rounding). ``diag(s) W diag(γ γ_b)`` goes into each
    projection (``model/fold.py``'s ``fold_scales``), the final norm's γ into ``model.norm.weight`` (so a tied LM
    head stays tied), QK-norm's γ into ``q_norm``/``k_norm``; the other norm weights are 1. A scalevec
    ``Transformer`` is returned folded (``fold_scales``). Raises ``ValueError`` for a strategy that cannot fold
    (DNP: ``dnp``, ``unified``; save those with ``save``, the custom-code export) or a model without a strategy."""
    if isinstance(model, Transformer):
        return fold_scales(model)
    info = _info(model)
    if not info.scale.foldable:
        raise ValueError(f"cannot fold strategy {info.strategy}: DNP normalizes the outputs of W_gate/W_up, which no "
                         f"linear map can absorb; save it with scalevec.save(model, DIR) (the custom-code export, "
                         f"loaded with trust_remote_code=True) or train unified_foldable")
    sv = to_scalevec(model)
    head_gamma = gamma_of(sv.head.scale)
    head_weight = sv.head.branches["lm_head"].weight.detach()
    folded = fold_scales(sv)
    state = dict(folded.state_dict())
    base, cfg = model.model, info.cfg
    ref = next(model.parameters())
    dtype, device = ref.dtype, ref.device

    def param(t: Tensor) -> nn.Parameter:
        return nn.Parameter(t.detach().to(device=device, dtype=dtype).clone())

    def norm_module(path: str, d: int, weight: Tensor | None) -> nn.Module:
        cls = info.originals[path]
        with torch.device("meta"):
            m = cls(d, eps=cfg.norm_eps)
        m.weight = param(weight if weight is not None else torch.ones(d))
        return m

    def linear(weight: Tensor) -> nn.Linear:
        with torch.device("meta"):
            m = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        m.weight = param(weight)
        return m

    with torch.no_grad():
        for i, layer in enumerate(base.layers):
            p, q = f"model.layers.{i}", f"layers.{i}"
            attn = layer.self_attn
            layer.input_layernorm = norm_module(f"{p}.input_layernorm", cfg.d_model, None)
            for s in "qkv":
                setattr(attn, f"{s}_proj", linear(state[f"{q}.attn.proj.branches.{s}.weight"]))
            attn.o_proj = linear(state[f"{q}.attn.o.weight"])
            if cfg.qk_norm:
                for s in ("q_norm", "k_norm"):
                    setattr(attn, s, norm_module(f"{p}.self_attn.{s}", cfg.head_dim,
                                                 state.get(f"{q}.attn.{s}.scale.weight")))
            layer.post_attention_layernorm = norm_module(f"{p}.post_attention_layernorm", cfg.d_model, None)
            mlp = layer.mlp
            if hasattr(mlp, "experts"):
                router = mlp.gate
                _remove_router_scale(router)
                router.weight = param(state[f"{q}.mlp.router.weight"])
                with torch.device("meta"):
                    hf = info.originals[f"{p}.mlp.experts"](model.config)
                hf.gate_up_proj = param(torch.cat([state[f"{q}.mlp.experts.gate.weight"],
                                                   state[f"{q}.mlp.experts.up.weight"]], dim=1))
                hf.down_proj = param(state[f"{q}.mlp.experts.down.weight"])
                mlp.experts = hf
            else:
                mlp.gate_proj = linear(state[f"{q}.mlp.proj.branches.gate.weight"])
                mlp.up_proj = linear(state[f"{q}.mlp.proj.branches.up.weight"])
                mlp.down_proj = linear(state[f"{q}.mlp.down.weight"])
        base.norm = norm_module("model.norm", cfg.d_model, head_gamma)
        if model.lm_head.weight is not base.embed_tokens.weight:
            model.lm_head.weight.copy_(head_weight)
    for m in model.modules():
        m.__dict__.pop("_roles", None)
    del model.scalevec_info
    return model


def _remove_router_scale(router: nn.Module) -> None:
    """Take HG's γ_router (and its input hook) off an HF router."""
    for key, hook in list(router._forward_pre_hooks.items()):
        if hook is _router_pre_hook:
            del router._forward_pre_hooks[key]
    if "in_scale" in router._modules:
        del router._modules["in_scale"]


def save(model: nn.Module, out_dir: str | Path, tokenizer=None, dtype: str = "float32") -> Path:
    """Write a model ``apply_strategy`` touched (or a scalevec ``Transformer``) as ``scalevec export`` does, without
    changing it: a foldable strategy as a plain checkpoint of its family (``LlamaForCausalLM``, ...), one that
    cannot fold (DNP) as the custom-code ``ScalevecForCausalLM`` (``AutoModelForCausalLM.from_pretrained(out,
    trust_remote_code=True)``; README "Reliability and safety"). ``tokenizer``: a directory holding
    ``tokenizer.json`` or a transformers tokenizer (saved with the export), or None. ``dtype``: ``float32`` or
    ``bfloat16``. Returns ``out_dir``. Raises ``FileExistsError`` for a non-empty ``out_dir`` and as
    ``hf.export.export_model``."""
    import tempfile

    from scalevec.hf.export import export_model

    sv = model if isinstance(model, Transformer) else to_scalevec(model)
    with tempfile.TemporaryDirectory(prefix="scalevec-save-") as tmp:
        tok_dir = None
        if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
            tokenizer.save_pretrained(tmp)  # a transformers tokenizer: tokenizer.json lands in tmp
            tok_dir = tmp
        elif tokenizer is not None:
            tok_dir = tokenizer
        return export_model(sv.eval(), out_dir, tok_dir, dtype=dtype)


__all__ = ["ProjNormedBranch", "SiteNorm", "StrategyInfo", "scale_config", "strategy_name", "hf_shape",
           "apply_strategy", "scalevec_name", "to_scalevec", "fold", "save"]
