"""Our parameter names <-> Hugging Face names, per checkpoint family: the one name map (DESIGN.md §10).

``hf/export.py`` writes checkpoints with it (the plain families and the custom architecture ``scalevec``),
``hf_import.py`` reads them with it backwards, and ``scalevec bench`` builds its Hugging Face Llama through
export. Templates: ``"{i}"`` is the layer index, ``"{j}"`` an expert index. Only names live here: no
tensors, no files, no transformers.
"""

from __future__ import annotations

HF_CONFIG = "config.json"  # a Hugging Face model directory's config (transformers' name), beside its safetensors
REMOTE_FORMAT = "scalevec"  # the custom architecture (config.json auto_map + trust_remote_code)
# Hugging Face model_type -> the architecture class an export declares in config.json (the plain families)
FORMATS = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}

# Our parameter names -> Hugging Face names; "{i}" is the layer index, "{j}" an expert index (the
# tensor is an expert bank (E, d_out, d_in) split into E tensors). Dense names are shared by all formats.
DENSE_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "layers.{i}.attn.proj.branches.q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attn.proj.branches.k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attn.proj.branches.v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attn.o.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.attn.q_norm.scale.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "layers.{i}.attn.k_norm.scale.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "layers.{i}.mlp.proj.branches.gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.mlp.proj.branches.up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.mlp.down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "head.branches.lm_head.weight": "lm_head.weight",
}
# MoE blocks (moe.py): the router (E, d_model) and expert banks (E, d_out, d_in), split per expert, in
# each family's canonical checkpoint layout (what its published checkpoints hold; transformers >= 5 fuses
# the experts on load). Dense blocks of an MoE model (moe.first_dense) keep DENSE_NAMES (Qwen3-MoE's
# mlp_only_layers).
MOE_NAMES = {
    "mixtral": {
        "layers.{i}.mlp.router.weight": "model.layers.{i}.block_sparse_moe.gate.weight",
        "layers.{i}.mlp.experts.gate.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight",
        "layers.{i}.mlp.experts.up.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w3.weight",
        "layers.{i}.mlp.experts.down.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight",
    },
    "qwen3_moe": {
        "layers.{i}.mlp.router.weight": "model.layers.{i}.mlp.gate.weight",
        "layers.{i}.mlp.experts.gate.weight": "model.layers.{i}.mlp.experts.{j}.gate_proj.weight",
        "layers.{i}.mlp.experts.up.weight": "model.layers.{i}.mlp.experts.{j}.up_proj.weight",
        "layers.{i}.mlp.experts.down.weight": "model.layers.{i}.mlp.experts.{j}.down_proj.weight",
    },
}
# The folded input norms: no parameter on our side, a weight of ones on theirs.
ONES_NAMES = ("model.layers.{i}.input_layernorm.weight", "model.layers.{i}.post_attention_layernorm.weight")
# Our normalization sites <- Hugging Face norm weights, for reading checkpoints (``hf_import``): "layers.{i}.mlp"
# is the MLP's Input-Norm, dense (MLP.proj) or MoE (the MoE module's own norm); QK-norm sites are Output-Norms.
NORM_SITES = {
    "layers.{i}.attn": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.mlp": "model.layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.attn.q_norm": "model.layers.{i}.self_attn.q_norm.weight",
    "layers.{i}.attn.k_norm": "model.layers.{i}.self_attn.k_norm.weight",
    "head": "model.norm.weight",
}


# The custom architecture (format "scalevec": hf/remote/modeling_scalevec.py, ScalevecForCausalLM), for what
# cannot fold. Its tensors are ours with every foldable scale folded in, so the keys are the names of our
# exported tensors: a matrix (folded), or a scale vector that is kept, named "<its module>.weight" (the name a
# direct γ has; OR/ER's γ is materialized) as fold_scales names the QK-norm γ it keeps. The dense names are
# the plain families'; expert banks stay whole (E, d_out, d_in). Kept beyond QK-norm: the peri Output-Norms'
# γ and DNP's gate scale s (DNP's s on up folds into down). tests/test_export_remote.py checks this table
# against the modeling file's parameters for every strategy, both ways.
REMOTE_NAMES = {
    **DENSE_NAMES,
    "layers.{i}.attn_out.scale.weight": "model.layers.{i}.attn_out_norm.weight",
    "layers.{i}.mlp_out.scale.weight": "model.layers.{i}.mlp_out_norm.weight",
    "layers.{i}.mlp.proj.branches.gate.out_scale.weight": "model.layers.{i}.mlp.gate_norm",
    "layers.{i}.mlp.router.weight": "model.layers.{i}.mlp.router.weight",
    "layers.{i}.mlp.experts.gate.weight": "model.layers.{i}.mlp.experts.gate_proj",
    "layers.{i}.mlp.experts.up.weight": "model.layers.{i}.mlp.experts.up_proj",
    "layers.{i}.mlp.experts.down.weight": "model.layers.{i}.mlp.experts.down_proj",
    "layers.{i}.mlp.experts.gate.out_scale.weight": "model.layers.{i}.mlp.experts.gate_norm",
    "layers.{i}.mlp.shared_experts.gate.weight": "model.layers.{i}.mlp.shared_experts.gate_proj.weight",
    "layers.{i}.mlp.shared_experts.up.weight": "model.layers.{i}.mlp.shared_experts.up_proj.weight",
    "layers.{i}.mlp.shared_experts.down.weight": "model.layers.{i}.mlp.shared_experts.down_proj.weight",
    "layers.{i}.mlp.shared_experts.gate.out_scale.weight": "model.layers.{i}.mlp.shared_experts.gate_norm",
}


def name_map(fmt: str) -> dict[str, str]:
    """Our parameter-name templates -> Hugging Face name templates for family ``fmt`` (litgpt-style);
    ``fmt="scalevec"``: the custom architecture's (``REMOTE_NAMES``)."""
    if fmt == REMOTE_FORMAT:
        return dict(REMOTE_NAMES)
    return {**DENSE_NAMES, **MOE_NAMES.get(fmt, {})}


def template_of(key: str) -> tuple[str, int | None]:
    """``(name template, layer index)`` of one of our parameter names: ``"layers.3.attn.o.weight"`` ->
    ``("layers.{i}.attn.o.weight", 3)``; a name outside the layers is its own template, index None."""
    head, _, rest = key.partition(".")
    if head == "layers":
        i, _, tail = rest.partition(".")
        if i.isdigit():
            return f"layers.{{i}}.{tail}", int(i)
    return key, None
