"""One record per model family: where its norms, projections and experts sit (DESIGN.md §10, §12).

A ``Family`` says, in module paths, everything the drop-in API (``integrations/hf_model.py``: ``apply_strategy``,
``fold``, ``to_scalevec``) and the checkpoint name map (``names.py``: import and export) need to know about a
layout: the classes it accepts, the layer list, the embedding, the final norm and LM head, per layer the attention's
and the MLP's Input-Norms, q/k/v/o, gate/up/down, the Output-Norms (QK-norm, the post-norms of OLMo 2/3 and
Gemma 3), MoE router and experts, the norm-gain convention and the norm order. Those modules loop over the record;
no other file spells a family's layout. A new family with a known layout is one more record here.

Norm order (where the Input-Norms are)::

    pre (Llama, Qwen, Mistral, Gemma 3,       x = x + o(attn(n_a(x)))       n_a, n_m: Input-Norms (γ folds into W)
         torchtitan, OLMo-core llama_like)    x = x + down(mlp(n_m(x)))     (Gemma 3 adds Output-Norms after attn/mlp)
    reordered (OLMo 2, OLMo 3)               x = x + n_a(o(attn(x)))       n_a, n_m: Output-Norms (γ stays a norm)
                                             x = x + n_m(down(mlp(x)))     q/k/v/gate/up read the raw residual

Gain convention: ``w`` (the norm computes ``w ⊙ n(x)``) or ``1+w`` (Gemma: ``(1 + w) ⊙ n(x)``, w = 0 at init).
scalevec's scale vectors hold the *effective* gain γ (``1 + w`` for Gemma), so init (γ = 1) and fold act on it.

Only names and strings live here (no torch, no transformers): ``hf_format`` sits below the model (test_layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """Where one family's modules sit (module docstring). Paths under a layer are relative to it.

    ``name``: the HF ``model_type`` or the framework's name. ``classes``: qualified class names (module.Class) of
    the models it accepts (a subclass is accepted too). ``layers``, ``embed``, ``final_norm``, ``lm_head``: paths
    from the model. ``attn_norm`` / ``mlp_norm``: the Input-Norms (None in the ``reordered`` order). ``qkv``, ``o``,
    ``gate_up``, ``down``: the projections. ``qk_norm``: the QK-norm pair or None; ``qk_norm_over``: ``head``
    (one γ of head_dim, per head: Qwen3, Gemma 3) or ``all`` (one γ over all heads: OLMo 2/3). ``attn_out_norm`` /
    ``mlp_out_norm``: Output-Norms on the attention / MLP outputs (OLMo 2/3 post-norms, Gemma 3 post-norms).
    ``router`` / ``experts``: an MoE layer's (transformers 5's fused ``gate_up_proj`` layout), present only in
    layers that have them. ``fused_qkv``: torchtitan's fused ``wqkv`` module, split into ``qkv`` while a strategy
    is on. ``gain``: ``w`` or ``1+w``. ``order``: ``pre`` or ``reordered``. ``qkv_bias``: q/k/v carry biases
    (Qwen2). ``act``: the gated MLP's activation (``silu``: SwiGLU; ``gelu_tanh``: GeGLU). ``extras``: what else
    the family computes that scalevec's ``Transformer`` does not, in words (features outside this record's
    vocabulary: Gemma 3's embedding scale). ``moe_keys``: where an MoE family's config.json holds the routing
    (``n_experts``, ``d_expert``; optional ``renormalize`` (a flag that must be true: scalevec renormalizes the
    top-k weights), ``dense_layers`` and ``sparse_step`` (Qwen3-MoE's dense layers)); ``a|b``: the first of these
    keys that config.json holds (transformers 5 writes Qwen3-MoE's ``num_local_experts``, its published
    checkpoints hold ``num_experts``). ``checkpoint_experts``: the
    per-expert tensor names of its published checkpoints (our name -> theirs; ``{j}`` the expert).
    ``export_with``: how a folded model is written (``scalevec``: ``hf/export.py`` from scalevec's own model, a
    ``names.FORMATS`` key; ``save_pretrained``: the HF class itself; ``torchtitan`` / ``olmo_core``: the
    framework's own HF converter). Whether scalevec's own model imports the family (``to_scalevec``,
    ``scalevec convert``, ``train --init-from``) is read from the record: ``lacks`` and ``import_refusal``.
    """

    name: str
    classes: tuple[str, ...]
    layers: str
    embed: str
    final_norm: str
    lm_head: str
    attn_norm: str | None
    qkv: tuple[str, str, str]
    o: str
    mlp_norm: str | None
    gate_up: tuple[str, str]
    down: str
    qk_norm: tuple[str, str] | None = None
    qk_norm_over: str = "head"
    attn_out_norm: str | None = None
    mlp_out_norm: str | None = None
    router: str | None = None
    experts: str | None = None
    fused_qkv: str | None = None
    gain: str = "w"
    order: str = "pre"
    qkv_bias: bool = False
    act: str = "silu"
    extras: tuple[str, ...] = ()
    moe_keys: dict[str, str] = field(default_factory=dict)
    checkpoint_experts: dict[str, str] = field(default_factory=dict)
    export_with: str = "save_pretrained"

    def input_norms(self) -> tuple[str, ...]:
        """The per-layer Input-Norm paths (their γ folds into the projections that read them)."""
        return tuple(p for p in (self.attn_norm, self.mlp_norm) if p is not None)

    def output_norms(self) -> tuple[str, ...]:
        """The per-layer Output-Norm paths (their γ stays a norm: nothing linear reads them alone)."""
        return tuple(p for p in (*(self.qk_norm or ()), self.attn_out_norm, self.mlp_out_norm) if p is not None)

    def lacks(self) -> tuple[str, ...]:
        """What scalevec's own ``Transformer`` (DESIGN.md §2: pre-norm, SwiGLU, no biases, per-head QK-norm, full
        causal attention) does not compute of this family, in words; empty where it computes the family exactly.
        Output-Norms after attention and MLP in the pre order are scalevec's ``peri`` layout, which the import
        (``hf_import.load_plain``: pre layout only) does not read: they count as lacking too."""
        lacking = []
        if self.order == "reordered":
            lacking.append("the post-norm order (a norm after attention and MLP, none before)")
        elif self.attn_out_norm is not None or self.mlp_out_norm is not None:
            lacking.append("norms after attention and MLP (the import reads pre-layout models only)")
        if self.qk_norm is not None and self.qk_norm_over == "all":
            lacking.append("QK-norm over all heads at once (scalevec's is per head)")
        if self.qkv_bias:
            lacking.append("q/k/v biases (scalevec's attention has none)")
        if self.act != "silu":
            lacking.append(f"the {self.act} gated MLP (scalevec's is SwiGLU)")
        return (*lacking, *self.extras)

    def import_refusal(self) -> str | None:
        """The one-line refusal of importing this family into scalevec's own ``Transformer`` (``to_scalevec``,
        ``scalevec convert``, ``train --init-from``), naming what it lacks and what to do instead; None where the
        family imports (an HF config.json family that ``lacks`` nothing)."""
        if self.export_with in FRAMEWORKS:
            return (f"{self.name}: scalevec's Transformer imports Hugging Face checkpoints; write this model as one "
                    f"with scalevec.integrations.{self.export_with}.export_hf(model, DIR), then scalevec convert DIR")
        if self.lacks():
            return (f"{self.name}: scalevec's Transformer does not compute {'; '.join(self.lacks())}; use the drop-in "
                    f"scalevec.apply_strategy(model, STRATEGY) on the Hugging Face model instead (it keeps the "
                    f"family's own modules)")
        return None


def _hf(model_type: str, cls: str, module: str | None = None, **kw) -> Family:
    """An HF causal-LM family with Llama's module names (``model.layers.{i}.self_attn.q_proj`` ...) unless ``kw``
    says otherwise."""
    module = module or model_type
    base = dict(
        name=model_type, classes=(f"transformers.models.{module}.modeling_{module}.{cls}",),
        layers="model.layers", embed="model.embed_tokens", final_norm="model.norm", lm_head="lm_head",
        attn_norm="input_layernorm", qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        o="self_attn.o_proj", mlp_norm="post_attention_layernorm", gate_up=("mlp.gate_proj", "mlp.up_proj"),
        down="mlp.down_proj")
    base.update(kw)
    return Family(**base)


_QK = ("self_attn.q_norm", "self_attn.k_norm")
_MOE = dict(router="mlp.gate", experts="mlp.experts")
FRAMEWORKS = ("torchtitan", "olmo_core")  # export_with values of the framework records: their own HF converter
_ALTERNATING = "alternating sliding-window and global attention layers"

FAMILIES: dict[str, Family] = {f.name: f for f in (
    _hf("llama", "LlamaForCausalLM", export_with="scalevec"),
    _hf("qwen3", "Qwen3ForCausalLM", qk_norm=_QK, export_with="scalevec"),
    _hf("mixtral", "MixtralForCausalLM", **_MOE, export_with="scalevec",
        moe_keys={"n_experts": "num_local_experts", "d_expert": "intermediate_size"}, checkpoint_experts={
        "layers.{i}.mlp.router.weight": "model.layers.{i}.block_sparse_moe.gate.weight",
        "layers.{i}.mlp.experts.gate.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight",
        "layers.{i}.mlp.experts.up.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w3.weight",
        "layers.{i}.mlp.experts.down.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight"}),
    _hf("qwen3_moe", "Qwen3MoeForCausalLM", qk_norm=_QK, **_MOE, export_with="scalevec",
        moe_keys={"n_experts": "num_local_experts|num_experts", "d_expert": "moe_intermediate_size",
                  "renormalize": "norm_topk_prob",
                  "dense_layers": "mlp_only_layers", "sparse_step": "decoder_sparse_step"},
        checkpoint_experts={
            "layers.{i}.mlp.router.weight": "model.layers.{i}.mlp.gate.weight",
            "layers.{i}.mlp.experts.gate.weight": "model.layers.{i}.mlp.experts.{j}.gate_proj.weight",
            "layers.{i}.mlp.experts.up.weight": "model.layers.{i}.mlp.experts.{j}.up_proj.weight",
            "layers.{i}.mlp.experts.down.weight": "model.layers.{i}.mlp.experts.{j}.down_proj.weight"}),
    _hf("mistral", "MistralForCausalLM"),
    _hf("qwen2", "Qwen2ForCausalLM", qkv_bias=True),
    _hf("gemma3_text", "Gemma3ForCausalLM", module="gemma3", qk_norm=_QK, attn_out_norm="post_attention_layernorm",
        mlp_norm="pre_feedforward_layernorm", mlp_out_norm="post_feedforward_layernorm", gain="1+w", act="gelu_tanh",
        extras=("embeddings scaled by sqrt(d_model)", "attention scaled by query_pre_attn_scalar", _ALTERNATING)),
    _hf("olmo2", "Olmo2ForCausalLM", attn_norm=None, mlp_norm=None, qk_norm=_QK, qk_norm_over="all",
        attn_out_norm="post_attention_layernorm", mlp_out_norm="post_feedforward_layernorm", order="reordered"),
    _hf("olmo3", "Olmo3ForCausalLM", attn_norm=None, mlp_norm=None, qk_norm=_QK, qk_norm_over="all",
        attn_out_norm="post_attention_layernorm", mlp_out_norm="post_feedforward_layernorm", order="reordered",
        extras=(_ALTERNATING,)),
    Family(  # torchtitan 0.3.0 torchtitan.models.llama3 (Decoder); fused wqkv split into qkv_linear.w{q,k,v}
        name="torchtitan_llama3", classes=("torchtitan.models.llama3.model.Llama3Model",),
        layers="layers", embed="tok_embeddings", final_norm="norm", lm_head="lm_head",
        attn_norm="attention_norm", qkv=("attention.qkv_linear.wq", "attention.qkv_linear.wk",
                                         "attention.qkv_linear.wv"),
        o="attention.wo", mlp_norm="ffn_norm", gate_up=("feed_forward.w1", "feed_forward.w3"),
        down="feed_forward.w2", qk_norm=("attention.q_norm", "attention.k_norm"),
        fused_qkv="attention.qkv_linear", export_with="torchtitan"),
    Family(  # ai2-olmo-core 3.0.0 olmo_core.nn.transformer.Transformer, the default (pre-norm) block (llama_like)
        name="olmo_core", classes=("olmo_core.nn.transformer.model.Transformer",),
        layers="blocks", embed="embeddings", final_norm="lm_head.norm", lm_head="lm_head.w_out",
        attn_norm="attention_norm", qkv=("attention.w_q", "attention.w_k", "attention.w_v"), o="attention.w_out",
        mlp_norm="feed_forward_norm", gate_up=("feed_forward.w1", "feed_forward.w3"), down="feed_forward.w2",
        qk_norm=("attention.q_norm", "attention.k_norm"), export_with="olmo_core"),
)}


def family_of(classes: list[str]) -> Family | None:
    """The family whose class is one of ``classes`` (a model's MRO as qualified names), or None."""
    for f in FAMILIES.values():
        if any(c in f.classes for c in classes):
            return f
    return None


def supported_classes() -> list[str]:
    """The short class names of every family, for error messages."""
    return [c.rsplit(".", 1)[1] for f in FAMILIES.values() for c in f.classes]


def module_map(fam: Family) -> dict[str, str]:
    """scalevec's module path -> ``fam``'s module path, ``{i}`` the layer (the one correspondence both directions
    use: ``names.py`` builds the checkpoint name map from it, ``hf_model.scalevec_name`` reads it backwards). The
    Input-Norm sites map to scalevec's ``layers.{i}.attn.proj`` and ``layers.{i}.mlp`` (the dense MLP's
    ``mlp.proj`` or the MoE block), QK-norm to ``layers.{i}.attn.{q,k}_norm``, the final norm to ``head``."""
    layer = f"{fam.layers}.{{i}}"
    m = {"embed": fam.embed}
    if fam.attn_norm is not None:
        m["layers.{i}.attn.proj"] = f"{layer}.{fam.attn_norm}"
    for s, path in zip("qkv", fam.qkv):
        m[f"layers.{{i}}.attn.proj.branches.{s}"] = f"{layer}.{path}"
    m["layers.{i}.attn.o"] = f"{layer}.{fam.o}"
    if fam.qk_norm is not None:
        m["layers.{i}.attn.q_norm"], m["layers.{i}.attn.k_norm"] = (f"{layer}.{p}" for p in fam.qk_norm)
    if fam.mlp_norm is not None:
        m["layers.{i}.mlp"] = f"{layer}.{fam.mlp_norm}"
    for s, path in zip(("gate", "up"), fam.gate_up):
        m[f"layers.{{i}}.mlp.proj.branches.{s}"] = f"{layer}.{path}"
    m["layers.{i}.mlp.down"] = f"{layer}.{fam.down}"
    if fam.router is not None:
        m["layers.{i}.mlp.router"] = f"{layer}.{fam.router}"
        m["layers.{i}.mlp.experts"] = f"{layer}.{fam.experts}"
    m["head"] = fam.final_norm
    m["head.branches.lm_head"] = fam.lm_head
    return m


# the families scalevec's own Transformer imports (``Family.import_refusal`` is None): to_scalevec, scalevec convert
# and train --init-from read them
IMPORTS = tuple(f.name for f in FAMILIES.values() if f.import_refusal() is None)

__all__ = ["Family", "FAMILIES", "FRAMEWORKS", "IMPORTS", "family_of", "supported_classes", "module_map"]
