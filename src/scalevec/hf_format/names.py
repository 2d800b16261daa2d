"""Our parameter names <-> Hugging Face names, per checkpoint family: the one name map (DESIGN.md §10), built from
the family records (``families.py``: where each family's modules sit).

``hf/export.py`` writes checkpoints with it (the plain families and the custom architecture ``scalevec``),
``hf_import.py`` reads them with it backwards, and ``scalevec bench`` builds its Hugging Face Llama through
export. Templates: ``"{i}"`` is the layer index, ``"{j}"`` an expert index. Only names live here: no
tensors, no files, no transformers.
"""

from __future__ import annotations

from scalevec.hf_format.families import FAMILIES, module_map

HF_CONFIG = "config.json"  # a Hugging Face model directory's config (transformers' name), beside its safetensors
REMOTE_FORMAT = "scalevec"  # the custom architecture (config.json auto_map + trust_remote_code)
# what an export records of its run in config.json (transformers keeps unknown fields as they are): the windows of
# its validation loss (eval --text scores an export as its run) and the corpus it was trained on (convert names it)
TRAIN_SEQ_LEN = "scalevec_train_seq_len"
DATA_SOURCE = "scalevec_data_source"
# Hugging Face model_type -> the architecture class an export declares in config.json: the plain families that
# scalevec writes from its own model (their records in families.py say ``export_with="scalevec"``)
FORMATS = {f.name: f.classes[0].rsplit(".", 1)[1] for f in FAMILIES.values() if f.export_with == "scalevec"}


def _dense_names(family: str) -> dict[str, str]:
    """Our parameter names -> Hugging Face names of a dense layer of ``family``, from its record's module map (the
    norm sites are ``NORM_SITES``', the MoE router and experts ``MOE_NAMES``')."""
    sites = ("layers.{i}.attn.proj", "layers.{i}.mlp", "head", "layers.{i}.mlp.router", "layers.{i}.mlp.experts")
    return {(f"{ours}.scale.weight" if ours.endswith("_norm") else f"{ours}.weight"): f"{theirs}.weight"
            for ours, theirs in module_map(FAMILIES[family]).items() if ours not in sites}


# Our parameter names -> Hugging Face names; "{i}" is the layer index, "{j}" an expert index (the
# tensor is an expert bank (E, d_out, d_in) split into E tensors). Qwen3's: Llama's with QK-norm (the custom
# architecture's dense names and the QK-norm norm sites).
DENSE_NAMES = _dense_names("qwen3")
# MoE blocks (moe.py): the router (E, d_model) and expert banks (E, d_out, d_in), split per expert, in
# each family's canonical checkpoint layout (what its published checkpoints hold; transformers >= 5 fuses
# the experts on load; the records' ``checkpoint_experts``). Dense blocks of an MoE model (moe.first_dense) keep
# DENSE_NAMES (Qwen3-MoE's mlp_only_layers).
MOE_NAMES = {f.name: dict(f.checkpoint_experts) for f in FAMILIES.values() if f.checkpoint_experts}
_LLAMA = module_map(FAMILIES["llama"])
# The folded input norms: no parameter on our side, a weight of ones on theirs.
ONES_NAMES = (f"{_LLAMA['layers.{i}.attn.proj']}.weight", f"{_LLAMA['layers.{i}.mlp']}.weight")
# Our normalization sites <- Hugging Face norm weights, for reading checkpoints (``hf_import``): "layers.{i}.mlp"
# is the MLP's Input-Norm, dense (MLP.proj) or MoE (the MoE module's own norm); QK-norm sites are Output-Norms.
NORM_SITES = {
    "layers.{i}.attn": ONES_NAMES[0],
    "layers.{i}.mlp": ONES_NAMES[1],
    "layers.{i}.attn.q_norm": DENSE_NAMES["layers.{i}.attn.q_norm.scale.weight"],
    "layers.{i}.attn.k_norm": DENSE_NAMES["layers.{i}.attn.k_norm.scale.weight"],
    "head": f"{_LLAMA['head']}.weight",
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
    """Our parameter-name templates -> Hugging Face name templates for family ``fmt`` (a ``families.FAMILIES`` key,
    litgpt-style), from its record; ``fmt="scalevec"``: the custom architecture's (``REMOTE_NAMES``)."""
    if fmt == REMOTE_FORMAT:
        return dict(REMOTE_NAMES)
    return {**_dense_names(fmt), **MOE_NAMES.get(fmt, {})}


def template_of(key: str) -> tuple[str, int | None]:
    """``(name template, layer index)`` of one of our parameter names: ``"layers.3.attn.o.weight"`` ->
    ``("layers.{i}.attn.o.weight", 3)``; a name outside the layers is its own template, index None."""
    head, _, rest = key.partition(".")
    if head == "layers":
        i, _, tail = rest.partition(".")
        if i.isdigit():
            return f"layers.{{i}}.{tail}", int(i)
    return key, None
