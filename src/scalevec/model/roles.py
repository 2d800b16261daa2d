"""The DESIGN.md §5 role of every parameter of any ``nn.Module``: recorded where scalevec made it, else found by
module type and position (scalevec's model, one ``apply_strategy`` touched, a plain Hugging Face, torchtitan,
OLMo-core or nanoGPT model).

``model_roles(model)`` is what ``training/optim.param_groups`` groups by (so the trainer and the drop-in share one
rule), what the weight-decay guard checks against and what the scale telemetry reads. A parameter made by
``params.new_param`` keeps its recorded role. For the others, in this order:

- ``embedding``: the weight of an ``nn.Embedding`` (token and learned position embeddings: ``embed_tokens``,
  ``tok_embeddings``, ``wte``, ``wpe``, OLMo-core's ``embeddings``) or of ``get_input_embeddings()``.
  A tied output head shares that tensor and so is ``embedding`` too, as in scalevec's own model.
- ``lm_head``: the weight of the output head (``output_head``): ``get_output_embeddings()`` where the model
  has one, else the last ``nn.Linear`` whose weight is an embedding's or whose ``out_features`` is the vocabulary.
- a scale vector: the 1-D weight of a norm module (``is_norm``: torch's ``RMSNorm``/``LayerNorm``/``GroupNorm`` or
  any class whose name ends in ``Norm``: HF's ``LlamaRMSNorm``, OLMo-core's ``RMSNorm``, nanoGPT's ``LayerNorm``).
  QK-norm's (a module named in ``OUTPUT_NORM_NAMES``) is an Output-Norm (``output_scale``), the others
  Input-Norms (``input_scale``). Which other norms of a foreign layout are Output-Norms (Olmo2's and Gemma3's
  post-norms) only ``apply_strategy`` knows: it records their roles.
- ``router``: the weight of an MoE router (a class named ``*Router*``, or HF's ``mlp.gate`` Linear).
- ``bias``: biases and every other parameter of fewer than 2 dimensions (never decayed).
- ``matrix``: the rest (hidden linear maps and expert banks).

Frozen parameters (``requires_grad=False``) have no role here: no optimizer steps them.
"""

from __future__ import annotations

from torch import nn

from scalevec.model.params import ROLES

BIAS = "bias"  # a plain model's biases and other 1-D parameters outside norms: never decayed
GROUP_ROLES = (*ROLES, BIAS)  # every role a parameter can have, in the optimizer group table's order
OUTPUT_NORM_NAMES = ("q_norm", "k_norm")  # QK-norm (HF, torchtitan, OLMo-core): normalizes an output (§1)
NORM_TYPES = (nn.RMSNorm, nn.LayerNorm, nn.GroupNorm)


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalization layer: one of torch's, or a class named ``...Norm`` (HF's
    ``LlamaRMSNorm``, torchtitan's ``nn.RMSNorm``, OLMo-core's ``RMSNorm``/``LayerNorm``, nanoGPT's ``LayerNorm``)."""
    return isinstance(module, NORM_TYPES) or type(module).__name__.lower().endswith("norm")


def _embedding_weights(model: nn.Module) -> set[int]:
    ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if isinstance(getattr(inp, "weight", None), nn.Parameter):
        ids.add(id(inp.weight))
    return ids


def output_head(model: nn.Module) -> nn.Module | None:
    """The module whose weight maps hidden states to the vocabulary's logits, or ``None``.

    ``get_output_embeddings()`` where the model has it (Hugging Face); else the last ``nn.Linear`` (module
    order) whose weight is an ``nn.Embedding``'s (a tied head: nanoGPT's ``lm_head``) or whose ``out_features``
    is the vocabulary, the ``num_embeddings`` of the largest ``nn.Embedding`` (torchtitan's ``output``,
    OLMo-core's ``lm_head.w_out``).
    """
    if hasattr(model, "get_output_embeddings"):
        out = model.get_output_embeddings()
        if out is not None:
            return out
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    if not embeddings:
        return None
    vocab = max(m.num_embeddings for m in embeddings)
    tied = {id(m.weight) for m in embeddings}
    heads = [m for m in model.modules()
             if isinstance(m, nn.Linear) and (id(m.weight) in tied or m.out_features == vocab)]
    return heads[-1] if heads else None


def _found_role(name: str, owner_name: str, owner: nn.Module, p: nn.Parameter, embeddings: set[int],
                head: nn.Module | None) -> str:
    """The role of a parameter that carries none, from where it sits (module docstring)."""
    if id(p) in embeddings:
        return "embedding"
    if head is not None and p is getattr(head, "weight", None):
        return "lm_head"
    local = name.rpartition(".")[2]
    if is_norm(owner) and p.dim() == 1 and local != "bias":
        return "output_scale" if owner_name.rpartition(".")[2] in OUTPUT_NORM_NAMES else "input_scale"
    if local == "bias" or p.dim() < 2:
        return BIAS
    if "router" in type(owner).__name__.lower() or owner_name.endswith("mlp.gate"):
        return "router"
    return "matrix"


def model_roles(model: nn.Module) -> dict[str, str]:
    """``{name: role}`` of every trainable parameter of ``model`` (``named_parameters`` order, a tied tensor once
    under its first name): the role recorded by ``params.new_param`` where there is one, else the one its module
    type and position give (module docstring). Works through DDP/FSDP2/compile wrappers (names carry their
    prefixes; the roles are read from the owning modules)."""
    modules = dict(model.named_modules())
    embeddings, head = _embedding_weights(model), output_head(model)
    roles = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        owner_name, _, local = name.rpartition(".")
        owner = modules[owner_name]
        recorded = owner.__dict__.get("_roles", {}).get(local)
        roles[name] = recorded if recorded is not None else _found_role(name, owner_name, owner, p, embeddings, head)
    return roles


__all__ = ["BIAS", "GROUP_ROLES", "OUTPUT_NORM_NAMES", "is_norm", "output_head", "model_roles"]
