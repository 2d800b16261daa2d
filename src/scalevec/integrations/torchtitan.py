"""scalevec's strategies in torchtitan 0.3.0, through its own extension points (DESIGN.md §3, §5).

- ``ScalevecConverter``: a ``ModelConfigConverter`` (torchtitan's converter mechanism, like its Float8 and LoRA
  converters). A job config names it with the strategy in ``model_registry(flavor, converters=[...])``; it
  converts the model config so that ``build()`` returns the model with the strategy applied
  (``scalevec.apply_strategy``), so the trainer parallelizes, compiles and checkpoints the converted model
  (the converter runs before parallelization). The converted model initializes (``init_states``) every matrix it
  kept with torchtitan's own initializer (its depth-scaled ``param_init``), the fused ``wqkv`` drawn once and split
  into the strategy's q/k/v maps, every γ = 1, in torchtitan's order: the same seed gives the unconverted model's
  weights. It skips scalevec's modules in ``verify_module_protocol`` (they are plain ``nn.Module``s).
- ``ScalevecOptimizers``: an ``OptimizersContainer`` (torchtitan's optimizer builder) whose param groups are
  ``scalevec.param_groups`` of each model part (roles by module type and position: embeddings and the output head
  found as such, norms and scale vectors as the strategy says) instead of regex patterns, each group with its
  ``param_names`` as torchtitan's checkpointer needs them.
- ``scalevec_job(config, strategy)``: a torchtitan ``Trainer.Config`` with both plugged in.

Tested on CPU (tests/test_torchtitan.py): the converter and the groups on torchtitan's Llama3 ``debugmodel``;
forward only, because torchtitan's flex attention has no CPU backward. Not done here: tensor, context and pipeline
parallelism of a converted model (torchtitan's TP plans name the modules the strategy replaces), Float8/LoRA
converters after this one, Muon (``DistMuon``). Needs torchtitan (``frameworks`` extra and scripts/setup.sh).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torchtitan.components.checkpointer.utils import canonical_fqn
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.protocols.model import ModelConfigConverter
from torchtitan.protocols.module import Module

from scalevec.integrations.groups import param_groups, strategy_of
from scalevec.integrations.hf_model import apply_strategy, scale_config

_config_classes: dict[tuple[type, str], type] = {}
_model_classes: dict[type, type] = {}


def _titan_init_order(model: nn.Module) -> list[tuple[nn.Module, str, object]]:
    """``(module, parameter name, init)`` in the order torchtitan's ``Module.init_states`` visits them: children
    first (depth first, through plain ``nn.Module`` wrappers), then the module's own ``_param_init`` entries."""
    order = []

    def visit(module: nn.Module) -> None:
        queue = list(module.children())
        while queue:
            child = queue.pop(0)
            if isinstance(child, Module):
                visit(child)
            else:
                queue.extend(child.children())
        if isinstance(module, Module) and module._param_init:
            order.extend((module, n, module._param_init[n]) for n, _ in module.named_parameters(recurse=False)
                         if n in module._param_init)

    visit(model)
    return order


def _owner_and_name(model: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    return {id(p): (m, n) for m in model.modules() for n, p in m.named_parameters(recurse=False)}


class _Converted:
    """Mixed into the class of a converted torchtitan model (``convert_model``)."""

    def init_states(self, *, buffer_device: torch.device | None = None) -> None:
        """torchtitan's ``init_states`` for the buffers (and the modules it still reaches, under a forked RNG so that
        its draws leave no trace), then every parameter in the order ``convert_model`` listed (torchtitan's)."""
        cuda = sorted({p.device.index or 0 for p in self.parameters() if p.device.type == "cuda"})
        with torch.random.fork_rng(devices=cuda):
            super().init_states(buffer_device=buffer_device)
        with torch.no_grad():
            for module, name, init in self._scalevec_inits:
                init(getattr(module, name))

    def verify_module_protocol(self) -> None:
        """torchtitan's check that every submodule is a ``Module``, less scalevec's modules (plain ``nn.Module``s that
        replaced its norms and projections) and what they hold."""
        scalevec = {id(m) for m in self.modules() if type(m).__module__.startswith("scalevec.")}
        inside = {id(c) for m in self.modules() if id(m) in scalevec for c in m.modules()}
        bad = [(n, type(m).__name__) for n, m in self.named_modules()
               if not isinstance(m, Module) and id(m) not in inside]
        if bad:
            raise RuntimeError(f"modules that do not satisfy torchtitan's Module protocol: {bad[:5]}")


def convert_model(model: nn.Module, strategy: str) -> nn.Module:
    """Apply ``strategy`` to a torchtitan model in place (``scalevec.apply_strategy``; on the meta device too, where
    torchtitan's trainer builds it) and give it ``init_states`` / ``verify_module_protocol`` for what changed
    (module docstring); returns it.

    The initializers are listed in torchtitan's order of the unconverted model: a parameter the strategy kept with
    its torchtitan init where it was, a replaced module's new parameters (their recorded inits: the fused ``wqkv``
    drawn once and split; γ = 1) where the replaced module's were, the rest (constant scale vectors) after. So the
    same seed draws the same matrices as the unconverted model's ``init_states``. Raises ``ValueError`` if the
    strategy made a parameter with no initializer."""
    before = [(m, getattr(m, n), init) for m, n, init in _titan_init_order(model)]
    apply_strategy(model, strategy)
    owners = _owner_and_name(model)
    replaced_at = {id(sub): path for path, orig in model.scalevec_info.originals.items() for sub in orig.modules()}
    made = [(path, m, n, m.__dict__["_inits"][n]) for path, m in model.named_modules()
            for n, p in m.named_parameters(recurse=False) if n in m.__dict__.get("_inits", {})]
    kept = {id(p) for _, p, _ in before if id(p) in owners}
    made = [(path, m, n, init) for path, m, n, init in made if id(getattr(m, n)) not in kept]
    inits, done, placed = [], set(), set()
    for m, p, init in before:
        if id(p) in owners:
            inits.append((*owners[id(p)], init))
            continue
        path = replaced_at.get(id(m))
        if path is not None and path not in placed:  # the new parameters of the module that replaced m's owner
            placed.add(path)
            for mpath, mm, n, minit in made:
                if (mpath == path or mpath.startswith(path + ".")) and (id(mm), n) not in done:
                    inits.append((mm, n, minit))
                    done.add((id(mm), n))
    inits += [(mm, n, minit) for _, mm, n, minit in made if (id(mm), n) not in done]
    covered = {id(getattr(m, n)) for m, n, _ in inits}
    missing = [n for n, p in model.named_parameters() if id(p) not in covered]
    if missing:
        raise ValueError(f"convert_model: no initializer for {missing[:3]}; the strategy made parameters neither "
                         f"torchtitan nor scalevec initializes")
    model._scalevec_inits = inits
    cls = type(model)
    if cls not in _model_classes:
        _model_classes[cls] = type(f"Scalevec{cls.__name__}", (_Converted, cls), {})
    model.__class__ = _model_classes[cls]
    return model


def converted_config(model_config: Module.Config, strategy: str) -> Module.Config:
    """A copy of ``model_config`` whose ``build()`` returns the model with ``strategy`` applied (``convert_model``);
    it still passes torchtitan's checks for the original config type (a subclass, as LoRA's frozen configs)."""
    key = (type(model_config), strategy)
    if key not in _config_classes:
        base = type(model_config)

        class ScalevecConfig(base):  # type: ignore[valid-type, misc]
            def build(self, **kwargs):
                return convert_model(base.build(self, **kwargs), strategy)

        ScalevecConfig.__name__ = f"Scalevec{base.__name__}"
        ScalevecConfig.__qualname__ = f"Scalevec{base.__qualname__}"
        _config_classes[key] = ScalevecConfig
    return _config_classes[key](**{f.name: getattr(model_config, f.name) for f in dataclasses.fields(model_config)
                                   if f.init})


class ScalevecConverter(ModelConfigConverter):
    """torchtitan model converter putting a scalevec strategy into the model (module docstring).

    ``Config.strategy``: a name of DESIGN.md §3's table (``unified``, ``iwd``, ``unified_foldable``, ...).
    Raises ``ValueError`` for an unknown strategy when the converter is built.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        strategy: str = "unified"

    def __init__(self, config: Config, **kwargs):
        scale_config(config.strategy)  # an unknown name fails here, before the model is built
        self.config = config

    def convert(self, model_config: Module.Config) -> Module.Config:
        return converted_config(model_config, self.config.strategy)


class ScalevecOptimizers(OptimizersContainer):
    """torchtitan's ``OptimizersContainer`` over ``scalevec.param_groups`` of each model part (module docstring).

    ``Config``: ``lr``, ``weight_decay`` (the matrices' and output head's; the scale vectors' as the model's strategy
    says), ``betas``, ``eps``, ``embedding_wd`` (decay the embedding too; default not) and ``optimizer_name``
    (``AdamW`` or ``Adam``), beside torchtitan's ``implementation``; ``param_groups`` (regex patterns) is not used.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        lr: float = 8e-4
        weight_decay: float = 0.1
        betas: tuple[float, float] = (0.9, 0.95)
        eps: float = 1e-8
        embedding_wd: bool = False
        optimizer_name: str = "AdamW"

    def __init__(self, config: Config, *, model_parts: list[nn.Module]) -> None:
        if config.optimizer_name not in ("AdamW", "Adam"):
            raise ValueError(f"ScalevecOptimizers takes optimizer_name AdamW or Adam, not {config.optimizer_name!r}")
        if config.param_groups:
            raise ValueError("ScalevecOptimizers builds its groups by role; leave param_groups empty")
        self.scalevec_config = config
        super().__init__(config, model_parts=model_parts)

    def _build_param_groups(self, model: nn.Module, param_group_configs: list,
                            impl_kwargs: dict) -> tuple[dict[str, list[dict]], dict[str, list[str]]]:
        """scalevec's role groups of ``model`` as torchtitan's builder returns its own: param group dicts (with
        ``param_names``) and one label per group (its role) for torchtitan's log."""
        c = self.scalevec_config
        groups = param_groups(model, lr=c.lr, weight_decay=c.weight_decay, strategy=strategy_of(model),
                              embedding_wd=c.embedding_wd)
        torch_groups = [{"params": g["params"], "param_names": [canonical_fqn(n) for n in g["names"]], **impl_kwargs,
                         "lr": g["lr"], "weight_decay": g["weight_decay"], "betas": tuple(c.betas), "eps": c.eps}
                        for g in groups]
        return {c.optimizer_name: torch_groups}, {c.optimizer_name: [f"role {g['role']}" for g in groups]}


def scalevec_job(config, strategy: str = "unified", lr: float | None = None, weight_decay: float = 0.1):
    """torchtitan ``Trainer.Config`` ``config`` with ``ScalevecConverter(strategy)`` last among its model
    converters and ``ScalevecOptimizers`` (``lr``: default the first param group's of ``config.optimizer``).
    Rebuilds ``config.model_spec`` through its model's registry, as torchtitan's own configs do."""
    spec = config.model_spec
    spec.model = ScalevecConverter(ScalevecConverter.Config(strategy=strategy)).convert(spec.model)
    first = config.optimizer.param_groups[0].optimizer_kwargs if config.optimizer.param_groups else {}
    config.optimizer = ScalevecOptimizers.Config(lr=lr if lr is not None else first.get("lr", 8e-4),
                                                 weight_decay=weight_decay,
                                                 betas=tuple(first.get("betas", (0.9, 0.95))),
                                                 eps=first.get("eps", 1e-8),
                                                 implementation=config.optimizer.implementation)
    return config


def hf_config(model: nn.Module):
    """The transformers ``LlamaConfig`` of a torchtitan Llama3 model (converted or plain): the shape as
    ``apply_strategy`` reads it from the modules (``hf_model.read_shape``), RoPE from the model's ``ComplexRoPE``
    config (theta; ``llama`` scaling as transformers' ``llama3`` rope type). Raises ``ValueError`` for another
    RoPE scaling."""
    import transformers

    from scalevec.integrations.hf_model import model_family, read_shape

    cfg = read_shape(model, model_family(model))
    rope = model.config.layers[0].attention.rope
    rope_parameters = {"rope_type": "default", "rope_theta": float(rope.theta)}
    if rope.scaling == "llama":
        rope_parameters = {"rope_type": "llama3", "rope_theta": float(rope.theta), "factor": float(rope.scaling_factor),
                           "low_freq_factor": float(rope.low_freq_factor),
                           "high_freq_factor": float(rope.high_freq_factor),
                           "original_max_position_embeddings": int(rope.original_max_position_embeddings)}
    elif rope.scaling not in (None, "none"):
        raise ValueError(f"torchtitan RoPE scaling {rope.scaling!r} has no transformers Llama equivalent here; "
                         f"export models with scaling 'llama' or none")
    return transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim or cfg.d_model // cfg.n_heads, rms_norm_eps=cfg.norm_eps,
        max_position_embeddings=int(rope.max_seq_len), rope_parameters=rope_parameters,
        tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False)


def export_hf(model: nn.Module, out_dir, dtype: torch.dtype = torch.float32):
    """Write a torchtitan Llama3 model carrying a foldable strategy (or none) as a plain transformers
    ``LlamaForCausalLM`` in ``out_dir``, without changing ``model``: a folded copy (``scalevec.fold``) through
    torchtitan's own HF converter (``Llama3StateDictAdapter.to_hf``: its names and RoPE permutation) into
    ``hf_config(model)``'s model, ``save_pretrained``. Returns the HF model. Raises ``ValueError`` for a strategy
    that cannot fold (DNP: ``unified``) and ``FileExistsError`` for a non-empty ``out_dir``."""
    from pathlib import Path

    import transformers
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

    from scalevec.integrations.hf_model import folded_copy

    out = Path(out_dir)
    plain = folded_copy(model, out)
    state = {k: v.detach().to("cpu", dtype) for k, v in plain.state_dict().items()}
    hf_state = Llama3StateDictAdapter(plain.config, hf_assets_path=None).to_hf(state)
    hf = transformers.LlamaForCausalLM(hf_config(model)).to(dtype)
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    if unexpected or [k for k in missing if not (k == "lm_head.weight" and hf.config.tie_word_embeddings)]:
        raise ValueError(f"export_hf: torchtitan's converter gave {len(unexpected)} unexpected and {len(missing)} "
                         f"missing tensors for LlamaForCausalLM ({(unexpected or missing)[:3]})")
    hf.save_pretrained(out, safe_serialization=True)
    return hf.eval()


__all__ = ["ScalevecConverter", "ScalevecOptimizers", "convert_model", "converted_config", "export_hf", "hf_config",
           "scalevec_job"]
