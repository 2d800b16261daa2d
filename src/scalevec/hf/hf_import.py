"""Start from existing weights: Hugging Face checkpoints and scalevec runs, into any strategy (DESIGN.md §1, §3, §10).

Every conversion goes through one strategy-independent *plain* form (``PlainWeights``): the linear
maps under our parameter names (which do not depend on the strategy) and one γ per normalization
site, as a Llama holds it::

    Hugging Face dir ──read_hf──┐                         ┌──load_plain──> model of any strategy
                                ├──> PlainWeights ────────┤
    scalevec model ──plain_from_model (folds)──┘          (shared γ -> each branch's γ, output scales 1,
                                                           magdir: β = rms(γ), α = γ / rms(γ); ER: b = log rms(γ))

Loading sets every scale so that the effective γ of each Input-Norm is the site's γ: a foldable
strategy then computes the same function as the source (to fp32 rounding; tests/test_hf_import.py).
DNP (``dnp``, ``unified``) normalizes the outputs of W_gate/W_up and so changes the function: the
trainer says so and logs the loss at step 0 before and after. The ``peri`` layout adds Output-Norms
that no plain model has: it is refused. Under strategy ``none`` the site's γ is folded into the
weights (exact up to rounding), except the QK-norm γ, which has no slot there.

Name maps: the matrices use ``names.name_map`` read backwards (one home per map: ``hf/names.py``); the
norm sites are ``names.NORM_SITES`` (export writes them as ones). Reading Hugging Face files needs only
``safetensors`` (no transformers).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from scalevec.config import ModelConfig, MoEConfig, RopeScalingConfig
from scalevec.hf.names import FORMATS, NORM_SITES, name_map
from scalevec.model.scales import NormLinear, OutputNorm, ScaleVector
from scalevec.model.transformer import Transformer

MATRIX_ROLES = ("matrix", "embedding", "lm_head", "router")


@dataclass
class PlainWeights:
    """The strategy-independent form of a pre-layout model (module docstring).

    ``matrices``: ``{our parameter name: tensor}`` for every matrix (embedding, q/k/v/o, gate/up/down,
    router, expert banks ``(E, d_out, d_in)``, LM head). ``norms``: ``{site: γ (d,)}`` for the sites of
    ``NORM_SITES`` (a missing site means γ = 1). ``cfg``: the model shape.
    """

    cfg: ModelConfig
    matrices: dict[str, Tensor]
    norms: dict[str, Tensor] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------- Hugging Face


def is_hf_dir(path: str | Path) -> bool:
    """True when ``path`` looks like a Hugging Face model directory (``config.json`` with a ``model_type``)."""
    p = Path(path) / "config.json"
    if not p.is_file():
        return False
    try:
        return "model_type" in json.loads(p.read_text())
    except (OSError, ValueError):
        return False


def model_config_from_hf(conf: dict) -> tuple[str, ModelConfig]:
    """``(family, ModelConfig)`` of a transformers ``config.json`` dict (Llama, Qwen3, Mixtral, Qwen3-MoE).

    Reads sizes, GQA heads, an explicit ``head_dim``, ``rope_theta`` and Llama 3 rope scaling (transformers
    4 ``rope_scaling`` or 5 ``rope_parameters``), ``rms_norm_eps``, tied embeddings, QK-norm (Qwen3) and the
    MoE routing. Raises ``ValueError`` naming a feature our model does not compute (biases, sliding
    window, another activation or rope type, un-renormalized top-k, interleaved dense layers).
    """
    fmt = conf.get("model_type")
    if fmt not in FORMATS:
        raise ValueError(f"model_type {fmt!r} is not supported for --init-from; supported: {', '.join(FORMATS)}")
    for key, bad in (("hidden_act", lambda v: v not in (None, "silu")), ("attention_bias", bool), ("mlp_bias", bool),
                     ("use_sliding_window", bool), ("sliding_window", lambda v: fmt == "mixtral" and v is not None)):
        if key in conf and bad(conf[key]):
            raise ValueError(f"config.json has {key}={conf[key]!r}, which scalevec's model does not compute "
                             f"(SwiGLU, no biases, full causal attention)")
    rope = dict(conf.get("rope_scaling") or {})
    rope.update(conf.get("rope_parameters") or {})
    theta = rope.get("rope_theta", conf.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope.get("partial_rotary_factor", conf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("config.json has partial_rotary_factor != 1; scalevec rotates the whole head")
    scaling = None
    if rope_type == "llama3":
        scaling = RopeScalingConfig(
            factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope.get("original_max_position_embeddings",
                                                          conf["max_position_embeddings"])))
    elif rope_type not in ("default", None):
        raise ValueError(f"rope type {rope_type!r} is not supported; scalevec has default RoPE and llama3 scaling")
    d, heads = conf["hidden_size"], conf["num_attention_heads"]
    head_dim = conf.get("head_dim")
    moe = None
    d_ff = conf["intermediate_size"]
    if fmt == "mixtral":
        moe = MoEConfig(n_experts=conf["num_local_experts"], top_k=conf["num_experts_per_tok"], d_expert=d_ff,
                        lb_coef=conf.get("router_aux_loss_coef", 0.01))
    elif fmt == "qwen3_moe":
        if not conf.get("norm_topk_prob", False):
            raise ValueError("config.json has norm_topk_prob=false; scalevec's router renormalizes the top-k "
                             "weights (Mixtral convention), so only norm_topk_prob=true models convert exactly")
        dense = sorted(conf.get("mlp_only_layers") or [])
        if conf.get("decoder_sparse_step", 1) != 1 or dense != list(range(len(dense))):
            raise ValueError(f"config.json has decoder_sparse_step={conf.get('decoder_sparse_step')} / mlp_only_layers="
                             f"{dense}; scalevec's dense MoE layers are the first k (moe.first_dense)")
        moe = MoEConfig(n_experts=conf.get("num_experts", conf.get("num_local_experts")),
                        top_k=conf["num_experts_per_tok"], d_expert=conf["moe_intermediate_size"],
                        lb_coef=conf.get("router_aux_loss_coef", 0.01), first_dense=len(dense))
    cfg = ModelConfig(
        d_model=d, n_layers=conf["num_hidden_layers"], n_heads=heads,
        n_kv_heads=conf.get("num_key_value_heads") or heads,
        head_dim=None if head_dim in (None, d // heads) and d % heads == 0 else head_dim,
        d_ff=d_ff, vocab_size=conf["vocab_size"], max_seq_len=conf.get("max_position_embeddings", 2048),
        rope_theta=float(theta), rope_scaling=scaling, norm_eps=float(conf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(conf.get("tie_word_embeddings", False)), layout="pre",
        qk_norm=fmt in ("qwen3", "qwen3_moe"), init_std=float(conf.get("initializer_range", 0.02)), moe=moe)
    cfg.validate()
    return fmt, cfg


def read_safetensors(hf_dir: str | Path) -> dict[str, Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards named by ``model.safetensors.index.json``,
    as float32 on CPU. Raises ``FileNotFoundError`` when the directory holds neither."""
    from safetensors.torch import load_file

    d = Path(hf_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (d / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{d} has no model.safetensors (nor an index of shards); save the model with "
                                f"save_pretrained(..., safe_serialization=True)")
    state: dict[str, Tensor] = {}
    for f in files:
        state.update({k: v.float() for k, v in load_file(str(d / f)).items()})
    return state


def _template_regex(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)") + "$")


def plain_from_hf_state(fmt: str, cfg: ModelConfig, hf_state: dict[str, Tensor]) -> PlainWeights:
    """The ``PlainWeights`` of a Hugging Face state dict of family ``fmt`` (``names.name_map`` read backwards).

    Per-expert tensors are stacked into our banks ``(E, d_out, d_in)``. A tied model may omit
    ``lm_head.weight``. Raises ``ValueError`` naming unknown or missing tensors.
    """
    rules = []  # (regex on the HF name, our template, is a norm site)
    for ours, theirs in name_map(fmt).items():
        if ours.endswith("_norm.scale.weight"):
            continue  # QK-norm: a norm site (NORM_SITES)
        rules.append((_template_regex(theirs), ours, False))
    rules += [(_template_regex(theirs), site, True) for site, theirs in NORM_SITES.items()]
    matrices: dict[str, Tensor] = {}
    norms: dict[str, Tensor] = {}
    experts: dict[str, dict[int, Tensor]] = {}
    unknown = []
    for key, t in hf_state.items():
        for rx, ours, is_norm in rules:
            m = rx.match(key)
            if m is None:
                continue
            name = ours.format(i=m.groupdict().get("i"))
            if is_norm:
                norms[name] = t
            elif "j" in m.groupdict():
                experts.setdefault(name, {})[int(m.group("j"))] = t
            else:
                matrices[name] = t
            break
        else:
            if not key.endswith("rotary_emb.inv_freq"):  # a buffer some old checkpoints hold
                unknown.append(key)
    if unknown:
        raise ValueError(f"{len(unknown)} tensor(s) of the checkpoint have no place in scalevec's {fmt} model "
                         f"(e.g. {', '.join(unknown[:3])}); the model has a feature scalevec does not compute")
    for name, bank in experts.items():
        if sorted(bank) != list(range(len(bank))):
            raise ValueError(f"the checkpoint's experts for {name} are incomplete: {sorted(bank)}")
        matrices[name] = torch.stack([bank[j] for j in range(len(bank))])
    if cfg.tie_embeddings:
        head = matrices.pop("head.branches.lm_head.weight", None)
        if head is not None and not torch.equal(head, matrices["embed.weight"]):
            raise ValueError("config.json says tie_word_embeddings=true but lm_head.weight differs from the embedding")
    return PlainWeights(cfg, matrices, norms)


def read_hf(hf_dir: str | Path) -> tuple[str, PlainWeights]:
    """``(family, PlainWeights)`` of a Hugging Face model directory (config.json + safetensors)."""
    d = Path(hf_dir)
    if not is_hf_dir(d):
        raise FileNotFoundError(f"{d} is not a Hugging Face model directory (no config.json with a model_type)")
    fmt, cfg = model_config_from_hf(json.loads((d / "config.json").read_text()))
    return fmt, plain_from_hf_state(fmt, cfg, read_safetensors(d))


# --------------------------------------------------------------------------------------------- scalevec models


def plain_from_model(model: Transformer) -> PlainWeights:
    """The ``PlainWeights`` of one of our models: every scale folded into its matrices (``fold.py``'s
    protocol: ``folded_state``), except the final norm's γ, which stays a norm (the LM head stays the
    embedding of a tied model) and QK-norm γ. Raises ``ValueError`` for a model that cannot fold (DNP,
    ``peri``), naming its scales."""
    from scalevec.model.fold import unfoldable_scales

    bad = unfoldable_scales(model)
    if bad:
        raise ValueError(f"cannot convert this model (DNP or peri) to another strategy: "
                         f"{', '.join(bad[:4])} cannot fold. Branch it with the same strategy and model "
                         f"(its weights then load as they are)")
    roles = model.param_roles()
    with torch.no_grad():
        matrices = {n: p.detach().clone() for n, p in model.named_parameters() if roles[n] in MATRIX_ROLES}
        norms = {}
        for name, m in model.named_modules():
            if isinstance(m, OutputNorm):
                if m.scale is not None:
                    norms[name] = m.scale().detach().clone()
            elif name == "head":
                g = _effective_input_scale(m, "lm_head")
                if g is not None:
                    norms["head"] = g
                if m.branches["lm_head"].out_scale is not None:
                    raise ValueError("an output scale on the LM head cannot convert")
            elif hasattr(m, "folded_state"):
                for key, value in m.folded_state().items():
                    matrices[f"{name}.{key}"] = value.detach().clone()
    return PlainWeights(model.cfg, matrices, norms)


def _effective_input_scale(m: NormLinear, branch: str) -> Tensor | None:
    g = m.scale() if m.scale is not None else None
    b = m.branches[branch]
    if b.in_scale is not None:
        g = b.in_scale() if g is None else g * b.in_scale()
    return None if g is None else g.detach().clone()


def set_scale(sv: ScaleVector, gamma: Tensor) -> None:
    """Set ``sv`` so that its effective γ is ``gamma`` (broadcast to its shape, e.g. per expert): direct γ;
    OR β = rms(γ), α = γ / rms(γ); ER b = log rms(γ), α = γ / rms(γ) (``ScaleVector.assign``, rms over the
    last dim). Raises ``ValueError`` for a γ whose rms is 0 (no magnitude-direction form)."""
    sv.assign(gamma)


def _input_side(site_module) -> tuple[list[ScaleVector], list[Tensor], list[ScaleVector]]:
    """``(input scales, weights that read the site, output scales)`` of a NormLinear or an MoE."""
    if isinstance(site_module, NormLinear):
        branches = list(site_module.branches.values())
    else:  # moe.MoE
        branches = [site_module.router, site_module.experts.gate, site_module.experts.up]
        if site_module.shared_experts is not None:
            branches += [site_module.shared_experts.gate, site_module.shared_experts.up]
    ins = [site_module.scale] if site_module.scale is not None else []
    ins += [b.in_scale for b in branches if b.in_scale is not None]
    outs = [b.out_scale for b in branches if b.out_scale is not None]
    return ins, [b.weight for b in branches], outs


def load_plain(model: Transformer, plain: PlainWeights) -> list[str]:
    """Load ``plain`` into ``model`` (any strategy of the same shape, ``pre`` layout), in place.

    Matrices are copied; each Input-Norm site's γ goes to its shared γ or to every branch's γ (HG),
    output scales are set to 1, QK-norm γ to the Output-Norm. Where the strategy has no scale vector
    (``none``) γ is folded into the weights. Returns the sites whose γ could not be represented (QK-norm
    γ ≠ 1 under ``none``: the function changes). Raises ``ValueError`` for the ``peri`` layout, a
    missing tensor or a shape mismatch (naming it).
    """
    if model.cfg.layout != "pre":
        raise ValueError("--init-from needs model.layout=pre: the peri layout adds Output-Norms that the source "
                         "model does not have")
    roles = model.param_roles()
    params = dict(model.named_parameters())
    lost = []
    with torch.no_grad():
        for name, p in params.items():
            if roles[name] not in MATRIX_ROLES:
                continue
            src = plain.matrices.get(name)
            if src is None and name == "head.branches.lm_head.weight" and plain.cfg.tie_embeddings:
                src = plain.matrices.get("embed.weight")  # a tied source into an untied model
            if src is None:
                raise ValueError(f"the source has no tensor for {name}; is it the same model shape?")
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"{name}: the source has shape {tuple(src.shape)}, this model {tuple(p.shape)}; "
                                 f"the model config must match the source's")
            p.copy_(src)
        missing = set(plain.matrices) - set(params)
        if model.cfg.tie_embeddings:
            missing.discard("head.branches.lm_head.weight")
        if missing:
            raise ValueError(f"this model has no slot for {', '.join(sorted(missing)[:3])}; the model config must "
                             f"match the source's")
        for m in model.modules():
            if isinstance(m, ScaleVector):
                set_scale(m, torch.ones(()))  # output scales (and everything not set below) start at 1
        modules = dict(model.named_modules())
        for name, m in modules.items():
            site = name[:-len(".proj")] if name.endswith(".proj") else name
            gamma = plain.norms.get(site)
            if isinstance(m, OutputNorm):
                if gamma is not None and m.scale is not None:
                    set_scale(m.scale, gamma)
                elif gamma is not None and not torch.equal(gamma, torch.ones_like(gamma)):
                    lost.append(name)
                continue
            if not (isinstance(m, NormLinear) or type(m).__name__ == "MoE") or gamma is None:
                continue
            ins, weights, _ = _input_side(m)
            if ins:
                for sv in ins:
                    set_scale(sv, gamma)
            else:  # no scale vector here (strategy none): γ folds into every weight that reads the site
                if name == "head" and model.cfg.tie_embeddings and not torch.equal(gamma, torch.ones_like(gamma)):
                    raise ValueError("strategy none with tied embeddings cannot hold the final norm's γ; "
                                     "choose a strategy with scale vectors or untie (model.tie_embeddings=false)")
                for w in weights:
                    w.mul_(gamma.to(w.dtype))
    return lost


def import_hf(hf_dir: str | Path, scfg, device: str | torch.device = "cpu") -> tuple[str, Transformer]:
    """``(family, model)``: the Hugging Face model in ``hf_dir`` converted into strategy ``scfg``
    (``ScaleConfig``). For a foldable strategy the model computes the same logits as the source in fp32."""
    from scalevec.model.transformer import build_model

    fmt, plain = read_hf(hf_dir)
    model = build_model(plain.cfg, scfg, seed=0, device=device)
    load_plain(model, plain)
    return fmt, model


def function_preserved(scfg) -> bool:
    """True when conversion into ``scfg`` keeps the source's function (every foldable strategy)."""
    return scfg.foldable


__all__ = ["PlainWeights", "is_hf_dir", "model_config_from_hf", "read_safetensors",
           "plain_from_hf_state", "read_hf", "plain_from_model", "set_scale", "load_plain", "import_hf",
           "function_preserved"]
