"""A strategy's scale vectors put into someone else's model in place, and taken out again (DESIGN.md §3, §10, §12).

``apply_strategy(model, strategy, **switches)`` takes a model of a family of ``hf_format/families.py`` (transformers
Llama, Qwen3, Mixtral, Qwen3-MoE, Mistral, Qwen2, Gemma 3, OLMo 2, OLMo 3; torchtitan's Llama 3; OLMo-core's
``Transformer``) or scalevec's own ``Transformer``, and replaces, in place, the modules at the record's sites by
scalevec's placement modules, built from the strategy's ``scales.scale_plan`` exactly as scalevec's model builds
them. The object keeps its class, ``forward``, ``generate()``, loss and gradient checkpointing (the decoder layers
are untouched: only their norm and projection submodules change). For the Llama record (the others differ in
paths, not in kind)::

    HF module (layer i)          becomes                                          scalevec name
    input_layernorm              SiteNorm: γ ⊙ n(x), γ = plan.attn's own γ         layers.i.attn.proj(.scale)
    self_attn.{q,k,v}_proj       scales.Projection: s ⊙ (W diag(γ_b) u)           layers.i.attn.proj.branches.*
    self_attn.o_proj             scales.Projection (plan.o)                       layers.i.attn.o
    self_attn.{q,k}_norm         scales.OutputNorm (QK-norm γ; any Output-Norm)   layers.i.attn.{q,k}_norm
    post_attention_layernorm     SiteNorm (plan.mlp, or plan.moe)                 layers.i.mlp.proj (MoE: layers.i.mlp)
    mlp.{gate,up}_proj           Projection / ProjNormedBranch (DNP: s ⊙ n(...))  layers.i.mlp.proj.branches.*
    mlp.down_proj                scales.Projection (plan.down)                    layers.i.mlp.down
    mlp.gate (MoE router)        kept; γ_router as ``in_scale`` on its input      layers.i.mlp.router
    mlp.experts (MoE)            scalevec's ``moe.Experts`` (banks with γ_b, s)   layers.i.mlp.experts
    model.norm                   SiteNorm (plan.head)                             head

The Output-Norms (QK-norm; the post-norms of OLMo 2/3 and Gemma 3) take the plan's Output-Norm γ (as ``peri``'s);
Qwen2's q/k/v biases ride in ``BiasedProjection``; torchtitan's fused ``wqkv`` is split into three maps
(``SplitQKV``) while the strategy is on. The embedding and LM head keep their modules. Every parameter gets its
§5 role (``params.new_param``'s record), so ``params.param_roles`` and ``count_params`` read the model and
``param_groups`` groups it. The norm weights become the strategy's γ by ``hf_import``'s rule (the one ``convert``
and ``train --init-from`` use), on the *effective* gain (Gemma's ``1 + w``): shared γ -> the norm's γ, HG -> every
branch's γ_b, output scales s = 1, magnitude-direction by ``ScaleVector.assign``, strategy ``none`` folds γ into
the weights. What the model computes is read from its modules (``read_shape``: ε, tying, head dim), an HF config
that disagrees is refused (``check_config``), and whether the function is kept is measured on a fixed input
(``probe``): a foldable strategy keeps it (to fp32 rounding, tests/test_integrations.py, tests/test_families.py);
DNP (``dnp``, ``unified``) changes it, and so does ``none`` where an Output-Norm γ ≠ 1 has no slot: both are said
in a ``UserWarning`` and in ``model.scalevec_info``.

``to_scalevec(model)`` is the scalevec ``Transformer`` holding the same parameters (the record's module map), for
the families scalevec's model imports (the record's ``import_refusal`` is None: Llama, Mistral, Qwen3, Mixtral,
Qwen3-MoE); ``save`` reuses ``hf/export.py`` through it. ``fold(model)`` turns a
foldable model back into the source model in place (the very modules it had, given the folded weights), whose own
``save_pretrained`` then writes an ordinary checkpoint; before that, ``save_pretrained`` is refused (a plain
checkpoint cannot hold the scale vectors). ``save`` writes what ``scalevec export`` writes (a plain family, or the
custom-code ``ScalevecForCausalLM`` for DNP).
"""

from __future__ import annotations

import dataclasses
import re
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from scalevec.config import PRESET_NAMES, ModelConfig, ScaleConfig
from scalevec.hf_format.families import FAMILIES, FRAMEWORKS, Family, family_of, module_map, supported_classes
from scalevec.hf_format.hf_import import load_plain, model_config_from_hf, plain_from_model
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
    fold_weight,
    gamma_of,
    multiply,
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
    ``custom`` for a ``ScaleConfig``); ``cfg``: the model shape as scalevec reads it from the modules; ``family``:
    the record's name (``families.FAMILIES``: the HF model_type, ``torchtitan_llama3``, ``olmo_core``);
    ``function_preserved``: whether the logits on the probe input stayed within ``probe_tolerance`` (measured; None
    for a model on the meta device, which has no function yet), ``logit_gap`` the largest change measured;
    ``notes``: the lines saying what changed; ``originals``: module path -> the module it replaced (``fold`` puts it
    back with the folded weights); ``reads``: projection path -> the path of the Input-Norm it reads.
    """

    scale: ScaleConfig
    cfg: ModelConfig
    family: str
    function_preserved: bool | None
    strategy: str = "custom"
    logit_gap: float = 0.0
    notes: list[str] = field(default_factory=list)
    originals: dict[str, nn.Module] = field(default_factory=dict)
    reads: dict[str, str] = field(default_factory=dict)


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


# ------------------------------------------------------------------------------------------ the family and its shape


def model_family(model: nn.Module) -> Family:
    """The ``families.Family`` record of ``model`` (its class or a parent class is the record's). Raises
    ``ValueError`` naming the model and the classes apply_strategy takes."""
    names = [f"{c.__module__}.{c.__qualname__}" for c in type(model).__mro__]
    fam = family_of(names)
    if fam is None:
        raise ValueError(f"apply_strategy takes a {', '.join(supported_classes())} or a scalevec Transformer, not "
                         f"{type(model).__name__}")
    return fam


def _layers(model: nn.Module, fam: Family) -> list[tuple[str, nn.Module]]:
    """``(path, layer)`` of every decoder layer, in order (a ModuleList's or a ModuleDict's children)."""
    return [(f"{fam.layers}.{name}", layer) for name, layer in model.get_submodule(fam.layers).named_children()]


def _find(root: nn.Module, path: str | None) -> nn.Module | None:
    """The submodule at ``path`` under ``root``, or None where the path is None or holds nothing (an optional
    QK-norm the model was built without, a dense layer's router)."""
    if path is None:
        return None
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def _put(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def norm_eps(norm: nn.Module) -> float:
    """The ε an RMSNorm module adds under its square root (``variance_epsilon`` in transformers' Llama family,
    ``eps`` in torch's ``nn.RMSNorm``, Gemma's and OLMo-core's; ``nn.RMSNorm``'s None is its dtype's machine ε)."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))  # scalevec's OutputNorm / SiteNorm: eps
    return float(torch.finfo(norm.weight.dtype).eps if eps is None else eps)


def _gain(fam: Family, norm: nn.Module) -> Tensor:
    """The effective γ (float32) of an HF norm module: its weight w, or ``1 + w`` (Gemma)."""
    w = norm.weight.detach().to(torch.float32).clone()
    return w + 1 if fam.gain == "1+w" else w


def _is_one(gamma: Tensor) -> bool:
    """True where γ is all ones, or unknown yet (the meta device: the framework's init sets every norm gain to 1)."""
    return gamma.is_meta or torch.equal(gamma, torch.ones_like(gamma))


def _stored(fam: Family, gamma: Tensor) -> Tensor:
    """The weight a norm module of ``fam`` stores for effective γ ``gamma``: γ, or ``γ - 1`` (Gemma)."""
    return gamma - 1 if fam.gain == "1+w" else gamma


def _heads(model: nn.Module, fam: Family, layer: nn.Module) -> tuple[int, int]:
    """``(n_heads, n_kv_heads)`` as the model computes them: an HF config's, or the framework attention module's."""
    config = getattr(model, "config", None)
    if hasattr(config, "num_attention_heads"):
        n = config.num_attention_heads
        return n, getattr(config, "num_key_value_heads", None) or n
    attn = layer.get_submodule(fam.o.rpartition(".")[0])
    return attn.n_heads, attn.n_kv_heads or attn.n_heads


def read_shape(model: nn.Module, fam: Family) -> ModelConfig:
    """The ``ModelConfig`` of ``model`` as its modules compute it: sizes from the weight shapes, ε from the norm
    modules, tying from whether the tensors are shared, head_dim from the q projection, QK-norm from the modules
    present. An MoE family's routing lives only in its config: it is read through ``hf_import.model_config_from_hf``
    (its refusals: un-renormalized top-k, ...) after ``check_config`` found the config true to the modules.
    Raises ``ValueError`` naming what scalevec cannot read."""
    config = getattr(model, "config", None)
    if fam.router is not None:
        return _imported_config(model)
    layers = _layers(model, fam)
    _, layer = layers[0]
    gate = layer.get_submodule(fam.gate_up[0])
    heads, kv = _heads(model, fam, layer)
    embed = model.get_submodule(fam.embed).weight
    q = _find(layer, fam.qkv[0])
    if q is not None:
        head_dim = q.weight.shape[0] // heads
    else:  # torchtitan's fused wqkv: (heads + 2·kv_heads)·head_dim rows
        head_dim = layer.get_submodule(fam.fused_qkv).wqkv.weight.shape[0] // (heads + 2 * kv)
    cfg = ModelConfig(
        d_model=embed.shape[1], n_layers=len(layers), n_heads=heads, n_kv_heads=kv,
        head_dim=None if head_dim * heads == embed.shape[1] else head_dim, d_ff=gate.weight.shape[0],
        vocab_size=embed.shape[0], max_seq_len=getattr(config, "max_position_embeddings", None) or 2048,
        norm_eps=norm_eps(model.get_submodule(fam.final_norm)),
        tie_embeddings=model.get_submodule(fam.lm_head).weight is embed,
        qk_norm=any(_find(layer, p) is not None for p in fam.output_norms()), layout="pre")
    cfg.validate()
    return cfg


def check_config(model: nn.Module, fam: Family) -> None:
    """Refuse an HF ``model.config`` that disagrees with the modules it describes (they are the function): the
    tying of the LM head to the embedding, every norm's ε, the head dim of q/k. Raises ``ValueError`` naming the
    field, both values and the fix (set the config field to what the modules compute)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads"):
        return  # a framework model: no second copy of the shape to disagree

    def refuse(field: str, said, computed, what: str):
        raise ValueError(f"model.config.{field}={said!r} but the modules compute {computed!r} ({what}); set "
                         f"model.config.{field} = {computed!r} (or rebuild the model from the config) and retry")

    embed, head = model.get_submodule(fam.embed).weight, model.get_submodule(fam.lm_head).weight
    tied = head is embed
    said = getattr(config, "tie_word_embeddings", None)
    if said is not None and bool(said) != tied:
        refuse("tie_word_embeddings", bool(said), tied, "whether lm_head.weight is the embedding's tensor")
    eps = getattr(config, "rms_norm_eps", None)
    if eps is not None:
        for path, m in model.named_modules():
            is_norm = isinstance(m, OutputNorm) or hasattr(m, "weight")  # a norm apply_strategy put in, or the source's
            if path.endswith(("norm", "layernorm")) and is_norm and norm_eps(m) != float(eps):
                refuse("rms_norm_eps", eps, norm_eps(m), f"the ε of {path}")
    _, layer = _layers(model, fam)[0]
    heads, kv = _heads(model, fam, layer)
    said_hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    for path, n in ((fam.qkv[0], heads), (fam.qkv[1], kv)):
        rows = layer.get_submodule(path).weight.shape[0]
        if rows != n * said_hd:
            refuse("head_dim", said_hd, rows // n, f"{path} has {rows} rows for {n} heads")


# ------------------------------------------------------------------------------------------ the modules put in


def _materialize(m: nn.Module | None, device: torch.device, dtype: torch.dtype) -> None:
    """A scale vector built on the meta device, allocated on ``device`` in ``dtype`` (values set by ``assign``)."""
    if m is not None:
        m.to_empty(device=device)
        m.to(dtype)


def _set_gamma(sv: ScaleVector | None, gamma: Tensor) -> None:
    """Set ``sv`` to effective γ ``gamma``; on the meta device nothing (its recorded init, γ = 1, sets it later)."""
    if sv is not None and not gamma.is_meta and not any(p.is_meta for p in sv.parameters()):
        sv.assign(gamma)  # direct: γ; OR/ER: the magnitude from rms(γ), the direction γ/rms(γ) (hf_import's rule)


class BiasedProjection(Projection):
    """A ``scales.Projection`` whose linear map has a bias (Qwen2's q/k/v): ``y = s ⊙ (W diag(γ_b) u + b)``; the fold
    is ``W' = diag(s) W diag(γ_b)``, ``b' = s ⊙ b``."""

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x)
        s = gamma_of(self.out_scale)
        return y + (self.bias if s is None else self.bias * s).to(y.dtype)


class SplitQKV(nn.Module):
    """torchtitan's fused ``wqkv`` as three linear maps ``wq, wk, wv`` (its own checkpoint layout, split by its
    ``FusedQKVLinear`` state-dict hook), so that each carries its branch's scale vectors. ``forward(x: (B, L, d))
    -> (xq, xk, xv)``, each ``(B, L, heads, head_dim)``, as torchtitan's ``QKVLinear`` returns them."""

    def __init__(self, fused: nn.Module):
        super().__init__()
        self.head_dim = fused.head_dim
        state = fused.state_dict()  # {"wq.weight", "wk.weight", "wv.weight"}: torchtitan's split
        for name in ("wq", "wk", "wv"):
            w = state[f"{name}.weight"]
            with torch.device("meta"):
                lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
            lin.weight = nn.Parameter(w.detach().clone(), requires_grad=fused.wqkv.weight.requires_grad)
            setattr(self, name, lin)
        self.heads_per_kv, self.r_dim = fused.heads_per_kv, fused.r_dim  # what torchtitan's split hook reads
        self._split = type(fused)._split_qkv_on_save
        init = (getattr(fused.wqkv, "_param_init", None) or {}).get("weight")
        if init is not None:  # on the meta device the framework initializes later (torchtitan's converter)
            self.wq.__dict__.setdefault("_inits", {})["weight"] = self._fused_init(init)
            for lin in (self.wk, self.wv):  # filled by wq's init, which draws the fused matrix once
                lin.__dict__.setdefault("_inits", {})["weight"] = lambda weight: None

    def _fused_init(self, init):
        """An init of ``wq.weight`` that draws the fused ``wqkv`` matrix with torchtitan's ``init`` (one draw, as the
        unconverted model's) and splits it into wq, wk, wv with torchtitan's own hook."""
        def init_qkv(_weight: Tensor) -> None:
            ws = [self.wq.weight, self.wk.weight, self.wv.weight]
            fused = torch.empty(sum(w.shape[0] for w in ws), ws[0].shape[1], device=ws[0].device, dtype=ws[0].dtype)
            init(fused)
            state = {"wqkv.weight": fused}
            self._split(self, state, "", None)
            with torch.no_grad():
                for w, name in zip(ws, ("wq", "wk", "wv")):
                    w.copy_(state[f"{name}.weight"])
        return init_qkv

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        return tuple(m(x).view(b, t, -1, self.head_dim) for m in (self.wq, self.wk, self.wv))


def _branch(linear: nn.Module, plan, eps: float, ops, bias: bool = False) -> Branch:
    """The ``scales.Projection`` (DNP's ``ProjNormedBranch``, ``BiasedProjection`` with ``bias``) of ``plan`` (a
    ``BranchPlan``) around ``linear``'s own weight Parameter, so that its name (``q_proj.weight``) does not change;
    its scale vectors at γ = s = 1 (``assign`` sets γ after)."""
    w = linear.weight
    cls = ProjNormedBranch if plan.normalized else BiasedProjection if bias else Projection
    with torch.device("meta"):
        b = cls(w.shape[1], w.shape[0], plan, eps, ops)
    b.weight = w  # the source's Parameter itself: same object, same name; its role stays ``matrix``
    if "weight" in linear.__dict__.get("_inits", {}):  # SplitQKV's maps: torchtitan's fused init, not scalevec's
        b.__dict__["_inits"]["weight"] = linear.__dict__["_inits"]["weight"]
    if bias:
        b.bias = linear.bias
    for sv in (b.in_scale, b.out_scale):
        _materialize(sv, w.device, w.dtype)
        _set_gamma(sv, torch.ones(()))
    return b


def _site_norm(ref: Tensor, spec, d: int, eps: float, ops, cls: type = SiteNorm) -> OutputNorm:
    """The ``cls`` (``SiteNorm`` or, for an Output-Norm, ``scales.OutputNorm``) of scale spec ``spec`` (or None), its
    γ allocated like ``ref`` (the replaced norm's weight; set by ``assign`` after)."""
    with torch.device("meta"):
        m = cls(d, OutputNormPlan(spec), eps, ops)
    _materialize(m.scale, ref.device, ref.dtype)
    return m


def _roles(module: nn.Module, **roles: str) -> None:
    """Record §5 roles for parameters a source module keeps (``params.new_param``'s record), so that
    ``params.param_roles`` reads the whole model."""
    module.__dict__.setdefault("_roles", {}).update(roles)


def strategy_name(strategy: str | ScaleConfig, switches: dict) -> str:
    """How ``StrategyInfo`` names the strategy: the table's name, with the switches set on it."""
    name = strategy if isinstance(strategy, str) else "custom"
    return name + (f"({', '.join(f'{k}={v!r}' for k, v in switches.items())})" if switches else "")


# ------------------------------------------------------------------------------------------ apply


def _plan(scfg: ScaleConfig, cfg: ModelConfig, fam: Family):
    """The strategy's ``ScalePlan`` for the family. The Output-Norms (QK-norm, OLMo 2/3's and Gemma 3's post-norms)
    all take the plan's Output-Norm spec (``plan.qk_norm``: one rule for every Output-Norm, as ``peri``'s)."""
    return scale_plan(scfg, dataclasses.replace(cfg, qk_norm=cfg.qk_norm or bool(fam.output_norms())))


def shared_gain_strategies() -> tuple[str, ...]:
    """The named strategies (``STRATEGIES``) that keep one γ per norm (``scale="shared"``): what a post-norm family
    carries where HG (one γ per branch) has no Input-Norm to split. Listed with commas only, never "a, b or c": one
    strategy is called ``or``."""
    return tuple(n for n in PRESET_NAMES if ScaleConfig.preset(n).scale == "shared")


def _check(model: nn.Module, fam: Family, cfg: ModelConfig, plan, scfg: ScaleConfig, name: str) -> None:
    """Raise ``ValueError`` for what ``_apply_family`` cannot put in, before it changes anything: a projection with a
    bias the family does not have, MoE experts in another layout,
    HG where the family has no Input-Norm to split (post-norm order), scale vectors on the LM head's own branch,
    the final norm's γ ≠ 1 with no vector to hold it (``none``) and a tied LM head to fold it into."""
    hg = any(b.gamma is not None for norm in (plan.attn, plan.mlp) for b in norm.branches.values())
    if hg and fam.order == "reordered":
        raise ValueError(f"{fam.name} cannot carry strategy {name}: HG splits an Input-Norm's γ per branch, and "
                         f"{fam.name} has none before attention and MLP (its norms follow them: post-norm order); use "
                         f"one of these strategies on it: {', '.join(shared_gain_strategies())}")
    for _, layer in _layers(model, fam):
        mlp_parent = fam.gate_up[0].rpartition(".")[0]
        experts = _find(layer, fam.experts)
        linears = {p: _find(layer, p) for p in (*fam.qkv, fam.o)} if not fam.fused_qkv else {fam.o: _find(layer, fam.o)}
        if experts is not None:
            if getattr(experts, "gate_up_proj", None) is None or experts.gate_up_proj.dim() != 3 or \
                    getattr(experts, "is_transposed", False) or not getattr(experts, "is_concatenated", True):
                raise ValueError(f"{type(experts).__name__}: expert weights in a layout scalevec does not read (it "
                                 f"reads gate_up_proj (E, 2·d_expert, d) concatenated, as transformers 5 holds Mixtral "
                                 f"and Qwen3-MoE)")
        else:
            linears.update({p: _find(layer, p) for p in (*fam.gate_up, fam.down)})
            if _find(layer, mlp_parent) is None:
                raise ValueError(f"{fam.name}: a layer without {mlp_parent}; scalevec reads gated MLPs only")
        for path, m in linears.items():
            allowed = fam.qkv_bias and path in fam.qkv
            if getattr(m, "bias", None) is not None and not allowed:
                raise ValueError(f"{fam.name}: {path} has a bias, which the family's record does not have (scalevec "
                                 f"computes biases only where the record says: q/k/v of Qwen2)")
    head = plan.head.branches["lm_head"]
    if head.gamma is not None or head.s is not None:
        raise ValueError("a strategy with scale vectors on the LM head's own branch is not supported here")
    final = model.get_submodule(fam.final_norm)
    gamma = _gain(fam, final)
    if plan.head.gamma is None and not _is_one(gamma) and \
            model.get_submodule(fam.lm_head).weight is model.get_submodule(fam.embed).weight:
        raise ValueError("strategy none with tied embeddings cannot hold the final norm's γ; choose a strategy with "
                         "scale vectors (or untie the LM head)")


def _logits(model: nn.Module, fam: Family, x: Tensor) -> Tensor:
    """The logits of ``model`` on token ids ``x: (B, T)``, called as the family's forward is called."""
    if fam.name == "torchtitan_llama3":
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        return model(x, positions, model.get_attention_masks(positions))
    out = model(x) if fam.name == "olmo_core" else model(input_ids=x)
    return out if isinstance(out, Tensor) else out.logits


PROBE_TOKENS = 8  # the fixed input on which apply_strategy measures whether the function is kept


def probe(model: nn.Module, fam: Family) -> Tensor:
    """The logits (float32, CPU) of ``model`` on a short fixed input: tokens ``0, 7, 14, ...`` (mod the vocabulary),
    one sequence of ``PROBE_TOKENS``, in eval mode and without gradients (the training mode is restored)."""
    ref = next(model.parameters())
    vocab = model.get_submodule(fam.embed).weight.shape[0]
    x = (torch.arange(PROBE_TOKENS, device=ref.device) * 7 % vocab).unsqueeze(0)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return _logits(model, fam, x).detach().to(device="cpu", dtype=torch.float32)
    finally:
        model.train(training)


def probe_tolerance(dtype: torch.dtype, ref: Tensor) -> float:
    """The largest logit change on the probe that still counts as the same function: 1e-4 of the logit scale
    (max(1, max|logit|)) in float32/64, where a foldable strategy's re-association moves the tiny models' logits
    by < 4e-7 and a real change (DNP, a lost γ) by > 1e-2; 5e-2 of it in a 16-bit dtype (bfloat16's 2^-8 relative
    rounding accumulates through the layers)."""
    rel = 5e-2 if torch.finfo(dtype).bits <= 16 else 1e-4
    return rel * max(1.0, ref.abs().max().item())


def _apply_family(model: nn.Module, fam: Family, scfg: ScaleConfig, name: str) -> StrategyInfo:
    cfg = read_shape(model, fam)
    plan = _plan(scfg, cfg, fam)
    ops = FAST if plan.fast else PLAIN
    out_spec = plan.qk_norm.gamma if plan.qk_norm is not None else None
    _check(model, fam, cfg, plan, scfg, name)  # every refusal before the first module is replaced
    info = StrategyInfo(scfg, cfg, fam.name, function_preserved=True, strategy=name)
    lost: list[str] = []

    def replace(root: nn.Module, prefix: str, path: str, new: nn.Module) -> None:
        full = f"{prefix}.{path}" if prefix else path
        info.originals[full] = root.get_submodule(path)
        _put(root, path, new)

    def input_norm(root, prefix, path, spec) -> tuple[Tensor | None, OutputNorm | None]:
        """An Input-Norm replaced by a SiteNorm of ``spec``: ``(its γ, the SiteNorm)``; (None, None) without one."""
        hf = _find(root, path)
        if hf is None:
            return None, None
        gamma = _gain(fam, hf)
        norm = _site_norm(hf.weight, spec, hf.weight.shape[0], norm_eps(hf), ops)
        _set_gamma(norm.scale, gamma)
        replace(root, prefix, path, norm)
        return gamma, norm

    def branches(root, prefix, norm_path, gamma, norm, paths: dict[str, str], nplan, bias=False) -> None:
        """The projections ``paths`` ({branch: path}) reading the Input-Norm at ``norm_path`` (γ ``gamma``)."""
        for s, path in paths.items():
            b = _branch(root.get_submodule(path), nplan.branches[s], cfg.norm_eps, ops, bias)
            if gamma is not None:
                _set_gamma(b.in_scale, gamma)
                if norm.scale is None and b.in_scale is None:  # strategy none: γ folds into the weights
                    b.weight.mul_(gamma.to(b.weight.dtype))
            replace(root, prefix, path, b)
            if norm_path is not None:
                info.reads[f"{prefix}.{path}"] = f"{prefix}.{norm_path}"

    def output_norm(root, prefix, path) -> None:
        hf = _find(root, path)
        if hf is None:
            return
        gamma = _gain(fam, hf)
        new = _site_norm(hf.weight, out_spec, hf.weight.shape[0], norm_eps(hf), ops, OutputNorm)
        if new.scale is not None:
            _set_gamma(new.scale, gamma)
        elif not _is_one(gamma):
            lost.append(f"{prefix}.{path}")
        replace(root, prefix, path, new)

    with torch.no_grad():
        embed = model.get_submodule(fam.embed)
        _roles(embed, weight="embedding")
        for prefix, layer in _layers(model, fam):
            if fam.fused_qkv is not None and _find(layer, fam.fused_qkv) is not None:
                fused = layer.get_submodule(fam.fused_qkv)
                replace(layer, prefix, fam.fused_qkv, SplitQKV(fused))
                fused.to("meta")  # its weight now lives in the split maps; fold fills it again
            gamma, norm = input_norm(layer, prefix, fam.attn_norm, plan.attn.gamma)
            branches(layer, prefix, fam.attn_norm, gamma, norm, dict(zip("qkv", fam.qkv)), plan.attn, fam.qkv_bias)
            replace(layer, prefix, fam.o, _branch(layer.get_submodule(fam.o), plan.o, cfg.norm_eps, ops))
            for path in (*(fam.qk_norm or ()), fam.attn_out_norm):
                output_norm(layer, prefix, path)
            experts = _find(layer, fam.experts)
            nplan = plan.moe if experts is not None else plan.mlp
            gamma, norm = input_norm(layer, prefix, fam.mlp_norm, nplan.gamma)
            if experts is not None:
                mlp = layer.get_submodule(fam.experts.rpartition(".")[0])
                info.originals[f"{prefix}.{fam.experts}"] = experts
                info.reads[f"{prefix}.{fam.experts}"] = f"{prefix}.{fam.mlp_norm}"  # router and banks read it
                _put_moe(mlp, cfg, plan, ops, gamma, norm.scale is not None)
                experts.to("meta")  # its banks now live in scalevec's Experts; fold fills them again
            else:
                branches(layer, prefix, fam.mlp_norm, gamma, norm, dict(zip(("gate", "up"), fam.gate_up)), plan.mlp)
                replace(layer, prefix, fam.down, _branch(layer.get_submodule(fam.down), plan.down, cfg.norm_eps, ops))
            output_norm(layer, prefix, fam.mlp_out_norm)
        # the final Input-Norm and the LM head
        final = model.get_submodule(fam.final_norm)
        gamma = _gain(fam, final)
        norm = _site_norm(final.weight, plan.head.gamma, final.weight.shape[0], norm_eps(final), ops)
        head = model.get_submodule(fam.lm_head)
        if norm.scale is not None:
            _set_gamma(norm.scale, gamma)
        elif not _is_one(gamma):  # strategy none, untied (_check): into the head
            head.weight.mul_(gamma.to(head.weight.dtype))
        replace(model, "", fam.final_norm, norm)
        if head.weight is not embed.weight:
            _roles(head, weight="lm_head")
    if not scfg.foldable:
        info.notes.append(f"DNP normalizes the outputs of the MLP's gate/up projections, which the source "
                          f"{fam.name} does not")
    if lost:
        info.notes.append(f"strategy {info.strategy} has no slot for the Output-Norm γ of {', '.join(lost[:2])}"
                          + (f" (and {len(lost) - 2} more)" if len(lost) > 2 else ""))
    return info


def _put_moe(mlp: nn.Module, cfg: ModelConfig, plan, ops, gamma: Tensor, norm_has_scale: bool) -> None:
    """The MoE block's router and experts (in place): HG's γ_router on the router's input (``_router_pre_hook``), the
    experts replaced by scalevec's ``moe.Experts`` (the HF fused ``gate_up_proj (E, 2F, d)`` split into the gate and
    up banks). ``gamma``: the site's γ, given to every branch γ_b (HG) or, when the strategy has no vector for
    it (``none``: ``norm_has_scale`` False and no γ_b), folded into the router and the banks."""
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


def _refused_save_pretrained(self: nn.Module, *args, **kwargs):
    """The ``save_pretrained`` of a model carrying an unfolded strategy (bound to the instance by ``apply_strategy``,
    taken off by ``fold``): a plain checkpoint of it would load with its norms re-initialized and its scale vectors
    dropped (transformers reports 5 missing and 42 unexpected keys on a 2-layer Llama and loads anyway), so it is
    refused with the command that writes a true one. Raises ``ValueError``."""
    info = self.scalevec_info
    how = ("scalevec.fold(model) first (in place; then save_pretrained writes the plain family), or "
           "scalevec.save(model, DIR)") if info.scale.foldable else \
        "scalevec.save(model, DIR) (the custom-code export; DNP cannot fold)"
    raise ValueError(f"{type(self).__name__}.save_pretrained: this model carries strategy {info.strategy} unfolded, "
                     f"which a plain checkpoint cannot hold (its norms would load freshly initialized); run {how}")


def apply_strategy(model: nn.Module, strategy: str | ScaleConfig = "unified", **switches) -> nn.Module:
    """Put strategy ``strategy``'s scale vectors into ``model`` in place (module docstring; DESIGN.md §3) and return it.

    ``model``: a model of a family of ``hf_format/families.py`` (transformers ``LlamaForCausalLM``, ``Qwen3...``,
    ``Mixtral...``, ``Qwen3Moe...``, ``Mistral...``, ``Qwen2...``, ``Gemma3ForCausalLM``, ``Olmo2...``,
    ``Olmo3ForCausalLM``; torchtitan's ``Llama3Model``; OLMo-core's ``Transformer``), on any device and dtype with
    its weights materialized (the scale vectors take the dtype of the norm weights they replace), or a scalevec
    ``Transformer`` (converted through ``hf_import``'s plain form, as ``convert`` does). ``strategy``: a name of
    DESIGN.md §3's table (``none``, ``baseline``, ``iwd``, ``hg``, ``dp``, ``dnp``, ``or``, ``er``, ``unified``,
    ``unified_foldable``) or a ``ScaleConfig``; ``switches``: any ``ScaleConfig`` field (``lr_mult=0.5``).

    What the model computes is read from its modules (ε, tying, head dim) and an HF ``model.config`` that disagrees
    is refused. Whether the function is kept is measured: the logits on a short fixed input (``probe``) before and
    after, within ``probe_tolerance``; a change is said in a ``UserWarning`` and kept in ``model.scalevec_info``
    (``StrategyInfo``). A foldable strategy keeps it (fp32 rounding); DNP (``dnp``, ``unified``) changes it.
    ``save_pretrained`` of the model is refused until ``fold`` (the message names the command). Apply to a plain model
    once; ``fold(model)`` first to change a foldable strategy. Raises ``ValueError`` for an unsupported model,
    feature or strategy of the family (one line naming what to use instead), an unknown strategy or switch, a config
    that disagrees with the modules, or a model that already carries an unfoldable strategy.
    """
    scfg = scale_config(strategy, **switches)
    if isinstance(model, Transformer):
        return _apply_scalevec(model, scfg)
    fam = model_family(model)
    prior = getattr(model, "scalevec_info", None)
    if prior is not None:
        if not prior.scale.foldable:
            raise ValueError(f"this model already carries strategy {prior.strategy}, which cannot fold; apply a "
                             f"strategy to the plain model instead")
        fold(model)
    check_config(model, fam)
    meta = any(p.is_meta for p in model.parameters())
    before = None if meta else probe(model, fam)
    info = _apply_family(model, fam, scfg, strategy_name(strategy, switches))
    if meta:  # nothing to measure: the framework initializes every γ and s to 1 later (torchtitan's converter)
        info.function_preserved, gap = None, float("nan")
        info.notes.append("not measured: the weights were on the meta device")
    else:
        gap = (probe(model, fam) - before).abs().max().item()
        info.logit_gap = gap
        info.function_preserved = gap <= probe_tolerance(next(model.parameters()).dtype, before)
        if not info.function_preserved:
            info.notes.append(f"the logits on the probe moved by {gap:.3g}")
    model.scalevec_info = info
    guard_weight_decay(model)  # no optimizer may step it with weight decay that breaks the strategy (wd_guard.py)
    model.save_pretrained = types.MethodType(_refused_save_pretrained, model)
    if info.function_preserved is False or (meta and not scfg.foldable):
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


def _rules(fam: Family) -> list[tuple[re.Pattern, str | None]]:
    """(regex on a module path of ``fam``'s model, scalevec's module path template) from the record's one map
    (``families.module_map``); None marks the MLP's Input-Norm (dense: ``mlp.proj``; MoE: ``mlp``)."""
    rules = []
    for ours, theirs in module_map(fam).items():
        rx = re.escape(theirs).replace(r"\{i\}", r"(?P<i>\d+)") + r"\.(?P<rest>.+)$"
        rules.append((re.compile(rx), None if ours == "layers.{i}.mlp" else ours))
    return rules


def scalevec_name(name: str, cfg: ModelConfig, family: str = "llama") -> str:
    """The scalevec ``Transformer`` parameter name of parameter ``name`` of a model ``apply_strategy`` touched
    (``model.layers.0.self_attn.q_proj.in_scale.weight`` -> ``layers.0.attn.proj.branches.q.in_scale.weight``) of
    family ``family`` (its record's module map). Raises ``KeyError`` for a name outside the map."""
    for rx, ours in _rules(FAMILIES[family]):
        m = rx.match(name)
        if m is None:
            continue
        i = m.group("i") if "i" in m.groupdict() else None
        if ours is None:  # the MLP's Input-Norm: the dense MLP's proj, or the MoE block itself
            moe = cfg.moe is not None and int(i) >= cfg.moe.first_dense
            ours = "layers.{i}.mlp" if moe else "layers.{i}.mlp.proj"
        return f"{ours.format(i=i)}.{m.group('rest')}"
    raise KeyError(f"{name} has no place in scalevec's model")


def _info(model: nn.Module) -> StrategyInfo:
    info = getattr(model, "scalevec_info", None)
    if info is None:
        raise ValueError(f"this {type(model).__name__} carries no scalevec strategy; call "
                         f"scalevec.apply_strategy(model, STRATEGY) first")
    return info


def _imported_config(model: nn.Module) -> ModelConfig:
    """The ``ModelConfig`` of scalevec's own model for HF ``model`` (``hf_import.model_config_from_hf`` on its config,
    the one reader of a family's config.json), prefixed with the class in its one-line refusal."""
    try:
        _, cfg = model_config_from_hf(model.config.to_dict())
    except ValueError as e:
        raise ValueError(f"{type(model).__name__}: {e}") from None
    return cfg


def to_scalevec(model: nn.Module) -> Transformer:
    """The scalevec ``Transformer`` (strategy of ``model.scalevec_info``, shape of its config read as ``scalevec
    convert`` reads config.json) holding a copy of the parameters of a model ``apply_strategy`` touched
    (``scalevec_name``: the record's module map), on the model's device, in float32. It computes the same function
    (fp32 rounding: the HF attention and MoE dispatch differ from ours in summation order). Raises ``ValueError``
    for a model without a strategy, a ``model.config`` edited to disagree with the modules (``check_config``), an
    embedding resized since ``apply_strategy``, a family scalevec's model does not import (its record's
    ``import_refusal``: Qwen2's biases, Gemma 3's GeGLU, OLMo 2/3's post-norm order, ...) or a feature of its config
    it does not compute (a sliding window shorter than the context, ...)."""
    info = _info(model)
    fam = FAMILIES[info.family]
    check_config(model, fam)
    if fam.import_refusal() is not None:
        raise ValueError(fam.import_refusal())
    cfg = _imported_config(model)
    rows = model.get_submodule(fam.embed).weight.shape[0]
    if rows != info.cfg.vocab_size:  # resize_token_embeddings after apply_strategy: the recorded shape is stale
        raise ValueError(f"the embedding has {rows} rows but {type(model).__name__} carried a vocabulary of "
                         f"{info.cfg.vocab_size} when apply_strategy ran (resize_token_embeddings since?); resize "
                         f"the plain model first, then apply the strategy")
    ref = next(model.parameters())
    sv = build_model(cfg, info.scale, seed=0, device=ref.device)
    state = {}
    for name, t in model.state_dict().items():
        state[scalevec_name(name, cfg, fam.name)] = t.detach().to(torch.float32)
    if cfg.tie_embeddings:
        state.setdefault("head.branches.lm_head.weight", state["embed.weight"])
    sv.load_state_dict(state, strict=True)
    return sv


def fold(model: nn.Module) -> nn.Module:
    """Fold every scale vector of a model ``apply_strategy`` touched back into its weights, in place (DESIGN.md §4):
    the result is the source model again (its classes, modules and parameter names: the very modules it had, given
    the folded weights; ``save_pretrained`` writes an ordinary checkpoint), computing the same function (fp32
    rounding). ``diag(s) W diag(γ γ_b)`` goes into each projection (``scales.Branch.folded_weight``; a bias becomes
    ``s ⊙ b``), the final norm's γ into the final norm (so a tied LM head stays tied), each Output-Norm's γ (QK-norm,
    post-norms) into its norm, as the family's gain convention stores it (w, or γ - 1 for Gemma's ``1 + w``); the
    other Input-Norms hold γ = 1. A scalevec ``Transformer`` is returned folded (``fold_scales``). Raises
    ``ValueError`` for a strategy that cannot fold (DNP: ``dnp``, ``unified``; save those with ``save``, the
    custom-code export) or a model without a strategy."""
    if isinstance(model, Transformer):
        return fold_scales(model)
    info = _info(model)
    if not info.scale.foldable:
        raise ValueError(f"cannot fold strategy {info.strategy}: DNP normalizes the outputs of W_gate/W_up, which no "
                         f"linear map can absorb; save it with scalevec.save(model, DIR) (the custom-code export, "
                         f"loaded with trust_remote_code=True) or train unified_foldable")
    fam = FAMILIES[info.family]
    ref = next(model.parameters())
    dtype, device = ref.dtype, ref.device

    def param(t: Tensor, like: Tensor) -> nn.Parameter:
        return nn.Parameter(t.detach().to(device=device, dtype=dtype).clone(), requires_grad=like.requires_grad)

    def shared(path: str) -> Tensor | None:
        """The γ of the SiteNorm that the projection at ``path`` reads (None: it reads none, or the norm has none)."""
        norm = info.reads.get(path)
        return gamma_of(model.get_submodule(norm).scale) if norm is not None else None

    with torch.no_grad():
        for path, orig in reversed(info.originals.items()):  # projections before the norms they read
            new = model.get_submodule(path)
            if isinstance(new, SplitQKV):  # torchtitan: fuse the folded wq/wk/wv back with its own load hook
                orig.to_empty(device=device)
                orig.load_state_dict({k: v.to(dtype) for k, v in new.state_dict().items()})
            elif isinstance(new, Branch):
                g, s = new.fold_vectors()
                c = multiply(g, shared(path))
                w = fold_weight(new.weight.to(torch.float32), None if c is None else c.to(torch.float32),
                                None if s is None else s.to(torch.float32))
                orig.weight = param(w, new.weight)
                if isinstance(new, BiasedProjection):
                    orig.bias = param(new.bias if s is None else new.bias * s, new.bias)
            elif isinstance(new, Experts):
                router = model.get_submodule(path.rpartition(".")[0]).gate
                gamma = shared(path)
                router_gamma = _remove_router_scale(router)
                router.weight = param(fold_weight(router.weight, multiply(router_gamma, gamma)), router.weight)
                orig.to_empty(device=device)
                orig.gate_up_proj = param(torch.cat([new.gate.folded_weight(gamma), new.up.folded_weight(gamma)],
                                                    dim=1), new.gate.weight)
                orig.down_proj = param(new.down.folded_weight(), new.down.weight)
            elif isinstance(new, OutputNorm):
                if path == fam.final_norm or type(new) is OutputNorm:  # the head's γ and Output-Norms: kept
                    gamma = gamma_of(new.scale)
                else:  # an Input-Norm inside a layer: its γ went into the projections
                    gamma = None
                d = orig.weight.shape[0]
                gamma = torch.ones(d) if gamma is None else gamma.to(torch.float32)
                orig.weight = param(_stored(fam, gamma), orig.weight)
            _put(model, path, orig)
    for m in model.modules():
        m.__dict__.pop("_roles", None)
    del model.scalevec_info
    model.__dict__.pop("save_pretrained", None)
    return model


def folded_copy(model: nn.Module, out: Path) -> nn.Module:
    """A folded copy of a framework model (torchtitan's, OLMo-core's) for export to ``out``, the model itself left
    as it is (DESIGN.md §10). Raises ``ValueError`` for a strategy that cannot fold (DNP) and ``FileExistsError``
    when ``out`` holds anything, before any copy is made."""
    import copy

    info = getattr(model, "scalevec_info", None)
    if info is not None and not info.scale.foldable:
        raise ValueError(f"strategy {info.strategy} cannot fold (DNP): no plain Llama computes it; train "
                         f"unified_foldable to export to Hugging Face")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose a new directory")
    plain = copy.deepcopy(model)
    if info is not None:
        fold(plain)
    return plain


def _remove_router_scale(router: nn.Module) -> Tensor | None:
    """Take HG's γ_router (and its input hook) off an HF router; returns that γ (None where it had none)."""
    for key, hook in list(router._forward_pre_hooks.items()):
        if hook is _router_pre_hook:
            del router._forward_pre_hooks[key]
    sv = router._modules.pop("in_scale", None)
    return gamma_of(sv)


def save(model: nn.Module, out_dir: str | Path, tokenizer=None, dtype: str = "float32") -> Path:
    """Write a model ``apply_strategy`` touched (or a scalevec ``Transformer``) as ``scalevec export`` does, without
    changing it. A family scalevec writes from its own model (``Family.export_with == "scalevec"``): a foldable
    strategy as a plain checkpoint of its family (``LlamaForCausalLM``, ...). Another HF family: a foldable strategy
    as a folded copy written by its own ``save_pretrained`` (Mistral stays a ``MistralForCausalLM``). A strategy that
    cannot fold (DNP) on a family scalevec's model imports (``Family.import_refusal`` None): the custom-code
    ``ScalevecForCausalLM`` (``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)``); on another
    family it is refused (no custom code computes it).
    torchtitan and OLMo-core models are refused, naming their ``export_hf`` (``integrations/torchtitan.py``,
    ``integrations/olmo_core.py``: the framework's own HF converter, the one home of that export).
    ``tokenizer``: a directory holding ``tokenizer.json`` or a transformers tokenizer (saved with the export), or None.
    ``dtype``: ``float32`` or ``bfloat16``. Returns ``out_dir``. Raises ``FileExistsError`` for a non-empty
    ``out_dir``, ``ValueError`` for a strategy the family cannot export, and as ``hf.export.export_model``."""
    import copy
    import tempfile

    from scalevec.hf.export import export_model

    out = Path(out_dir)
    if not isinstance(model, Transformer):
        info = _info(model)
        fam = FAMILIES[info.family]
        check_config(model, fam)  # what would be written must be what the modules compute
        if fam.export_with in FRAMEWORKS:  # the framework's own HF converter: the one home
            raise ValueError(f"a {fam.name} model is exported with scalevec.integrations.{fam.export_with}.export_hf("
                             f"model, DIR) (the framework's own HF converter), not scalevec.save")
        if fam.export_with == "save_pretrained" and (info.scale.foldable or fam.import_refusal() is not None):
            if not info.scale.foldable:
                raise ValueError(f"scalevec.save writes {fam.name} only folded: strategy {info.strategy} cannot fold "
                                 f"(DNP), and no custom code computes {fam.name}; train unified_foldable to export it")
            if out.exists() and any(out.iterdir()):
                raise FileExistsError(f"{out} exists and is not empty; choose a new directory")
            plain = fold(copy.deepcopy(model))
            plain.save_pretrained(out, safe_serialization=True)
            if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
                tokenizer.save_pretrained(out)
            return out
    sv = model if isinstance(model, Transformer) else to_scalevec(model)
    with tempfile.TemporaryDirectory(prefix="scalevec-save-") as tmp:
        tok_dir = None
        if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
            tokenizer.save_pretrained(tmp)  # a transformers tokenizer: tokenizer.json lands in tmp
            tok_dir = tmp
        elif tokenizer is not None:
            tok_dir = tokenizer
        return export_model(sv.eval(), out_dir, tok_dir, dtype=dtype)


__all__ = ["ProjNormedBranch", "SiteNorm", "BiasedProjection", "SplitQKV", "StrategyInfo", "scale_config",
           "strategy_name", "model_family", "read_shape", "check_config", "norm_eps", "probe", "probe_tolerance",
           "apply_strategy", "scalevec_name", "to_scalevec", "fold", "save"]
