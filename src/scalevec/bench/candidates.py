"""The models ``scalevec bench`` measures, built side by side from the same matrices (DESIGN.md §3, §5).

Candidates: strategy names (DESIGN.md §3), ``NAME:activation`` / ``NAME:weight`` / ``NAME:fused`` to force
the way a strategy applies its scales, ``hf-llama`` (``transformers.LlamaForCausalLM`` from the same shape,
SDPA attention, holding the baseline's initial weights, trained with the same loss, clipping and a torch
AdamW with the same settings: decay on matrices and LM head, none on embedding and norm gains), and
``dense-active`` (an MoE preset's dense twin with the same active matmul parameters, less the router).
``NAME+metrics`` is candidate ``NAME`` with the per-scale-vector telemetry (``training/telemetry.py``)
captured and collected on every step: its cost at ``train.log_every=1``, the most it can cost.
Every candidate starts from the same matrices, so their initial losses agree (a check on equal work).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalevec.config import PRESET_NAMES, SCALE_CHOICES, ModelConfig, OptimConfig, ScaleConfig
from scalevec.hf.export import hf_config, hf_state_dict
from scalevec.model.fold import fold_scales
from scalevec.model.transformer import Transformer, build_model
from scalevec.training.optim import build_optimizers, param_groups
from scalevec.training.telemetry import ScaleTelemetry

HF = "hf-llama"
DENSE = "dense-active"  # an MoE preset's dense twin with the same active matmul parameters (less the router)
DEFAULT_STRATEGIES = "baseline,hg,dp,or,er,iwd,unified_foldable,unified,hf-llama"
GPU_STRATEGIES = "baseline,unified,unified_foldable,hf-llama"  # the GPU set: few compilations
METRICS = "+metrics"  # NAME+metrics: NAME with the per-vector telemetry on every step


@dataclass
class Candidate:
    """One model + optimizer under test. ``step()`` takes one training step and returns the loss."""

    name: str
    model: nn.Module
    optimizers: list[torch.optim.Optimizer]
    step: Callable[[], Tensor]
    forward: Callable[[], Tensor]  # inference: logits of the batch under inference_mode
    params: int
    times: list[float] = field(default_factory=list)
    loss_init: float = math.nan
    peak_bytes: int = 0
    state_bytes: int = 0


def parse_candidates(spec: str) -> list[str]:
    """Split ``a,b,...`` and check every name; ``ValueError`` names the unknown one and the choices."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("--strategies is empty; give a comma-separated list, e.g. --strategies baseline,unified")
    for n in names:
        bare = n.removesuffix(METRICS)
        base, _, apply = bare.partition(":")
        if bare not in (HF, DENSE) and (base not in PRESET_NAMES or (apply and apply not in SCALE_CHOICES["apply"])):
            raise ValueError(f"unknown candidate {n!r} in --strategies; use {HF}, {DENSE} (MoE presets), a strategy "
                             f"({', '.join(PRESET_NAMES)}) or STRATEGY:APPLY ({' / '.join(SCALE_CHOICES['apply'])}), "
                             f"each optionally +metrics")
    if len(set(names)) != len(names):
        raise ValueError(f"--strategies lists a candidate twice: {spec}; list each once")
    return names


def strategy_config(name: str) -> ScaleConfig:
    """The ``ScaleConfig`` of candidate ``STRATEGY`` or ``STRATEGY:APPLY`` (the strategy's preset, ``apply`` forced)."""
    base, _, apply = name.partition(":")
    scfg = ScaleConfig.preset(base)
    return dataclasses.replace(scfg, apply=apply) if apply else scfg


def dense_active(cfg: ModelConfig) -> ModelConfig:
    """The dense twin of MoE config ``cfg``: every MoE MLP becomes a SwiGLU of width ``d_expert · (top_k +
    n_shared_experts)``, the matmul width one token uses, so both do the same matmul FLOPs per token but the
    router's (``flops.matmul_params_per_token``). Raises ``ValueError`` for a dense ``cfg``."""
    if cfg.moe is None:
        raise ValueError(f"{DENSE} compares an MoE preset with its dense twin; use it with a moe-* --preset")
    m = cfg.moe
    return dataclasses.replace(cfg, moe=None, d_ff=m.d_expert * (m.top_k + m.n_shared_experts))


def hf_llama(cfg: ModelConfig, init_from: Transformer | None):
    """``LlamaForCausalLM`` of shape ``cfg`` with SDPA attention; weights copied from a baseline model if given.

    Raises ``ValueError`` for a shape Llama cannot hold (MoE, QK-norm, peri, tied) or without transformers."""
    if cfg.moe is not None or cfg.qk_norm or cfg.layout != "pre" or cfg.tie_embeddings:
        raise ValueError(f"{HF} holds only a dense pre-norm model without QK-norm or tied embeddings; "
                         f"drop {HF} from --strategies for this preset")
    try:
        import transformers

        hcfg = hf_config(cfg, "llama")  # export's config: the same Llama that export writes
    except ImportError:
        raise ValueError(f"{HF} needs transformers; pip install 'scalevec[hf]' or drop {HF} "
                         "from --strategies") from None
    hcfg.use_cache = False  # training: no KV cache
    model = transformers.AutoModelForCausalLM.from_config(hcfg, attn_implementation="sdpa")
    if init_from is not None:
        model.load_state_dict(hf_state(init_from), strict=True)
    return model


def hf_state(model: Transformer) -> dict[str, Tensor]:
    """A baseline model's weights under Hugging Face Llama names, through export's one name map (``hf_state_dict``).

    The model is folded first (``fold_scales``), as export does: the norm weights become ones and γ moves
    into the matrices. Candidates start at initialization, where γ = 1, so the matrices are the model's own
    bit for bit and the Llama starts from exactly the baseline's weights."""
    return hf_state_dict(fold_scales(model), "llama")


def hf_optimizer(model: nn.Module, ocfg: OptimConfig) -> torch.optim.Optimizer:
    """torch AdamW with our settings: wd on 2-D weights except the embedding (as our roles), none on norm gains."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim == 2 and "embed_tokens" not in name else plain).append(p)
    groups = [{"params": decay, "weight_decay": ocfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps, foreach=True)


def make_candidate(name: str, cfg: ModelConfig, x: Tensor, y: Tensor, device: torch.device, autocast, compile: bool,
                   seed: int, ocfg: OptimConfig) -> Candidate:
    """Build candidate ``name`` on ``device`` with its optimizers and its step / forward closures.

    ``x``, ``y``: the (batch, seq) input and target ids every step reuses; ``autocast``: a context manager
    (bf16 autocast or a null context); ``compile``: compile each block, as the trainer does."""
    full, metrics = name, name.endswith(METRICS)
    name = name.removesuffix(METRICS)
    if name == HF:
        model = hf_llama(cfg, build_model(cfg, ScaleConfig.preset("baseline"), seed=seed)).to(device)
        optimizers = [hf_optimizer(model, ocfg)]
        layers = model.model.layers

        def logits() -> Tensor:
            return model(input_ids=x, use_cache=False).logits

    else:
        mcfg = dense_active(cfg) if name == DENSE else cfg
        model = build_model(mcfg, strategy_config("baseline" if name == DENSE else name), seed=seed, device=device)
        optimizers = build_optimizers(param_groups(model, ocfg, model.scfg), ocfg)
        layers = model.layers

        def logits() -> Tensor:
            return model(x)

    if compile:
        for layer in layers:  # per block, as the trainer compiles (distributed.wrap)
            layer.compile()
    params = list(model.parameters())
    # hf-llama carries no roles: its +metrics has no per-layer part (and no scale vectors)
    telemetry = ScaleTelemetry(model, {} if name == HF else None).attach(optimizers, every=1) if metrics else None

    def step() -> Tensor:
        with autocast:
            if name == HF:
                ce, aux = F.cross_entropy(logits().float().flatten(0, 1), y.flatten(), reduction="sum"), 0.0
            else:
                ce, _, aux = model(x, y)  # aux: the MoE auxiliary loss (0 for a dense model)
        loss = ce / y.numel() + aux
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, ocfg.grad_clip)
        for opt in optimizers:
            opt.step()
        if telemetry is not None:
            telemetry.collect()  # captured by the optimizer pre-hook; one device-to-host transfer
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    def forward() -> Tensor:
        with torch.inference_mode(), autocast:
            return logits()

    return Candidate(full, model, optimizers, step, forward, sum(p.numel() for p in params))
