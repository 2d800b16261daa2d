"""Typed configuration: dataclasses, YAML files and ``key=value`` overrides (DESIGN.md §2, §3, §12).

Every knob of a run lives in one of these dataclasses. ``RunConfig`` groups them; it is what a run
directory stores as ``config.yaml`` and what ``--config FILE.yaml`` and ``section.field=value``
overrides edit. Validation raises ``ValueError`` naming the offending field and what to use instead.
This module builds nothing: models, optimizers and data read these objects.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

# --------------------------------------------------------------------------------------------- model


@dataclass
class MoEConfig:
    """Mixture-of-experts MLP (DESIGN.md §6). ``d_expert`` is each expert's SwiGLU width."""

    n_experts: int = 8
    top_k: int = 2
    d_expert: int = 128
    n_shared_experts: int = 0
    lb_coef: float = 0.01  # switch-style load-balancing loss E * sum_i f_i P_i
    z_loss_coef: float = 0.0  # router z-loss mean(logsumexp(logits)^2)
    first_dense: int = 0  # the first `first_dense` blocks keep a dense MLP (0: every block is MoE)

    def validate(self) -> None:
        _positive(self, "n_experts", "d_expert", "top_k")
        if self.top_k > self.n_experts:
            raise ValueError(f"moe.top_k={self.top_k} exceeds moe.n_experts={self.n_experts}; use top_k <= n_experts")
        if self.n_shared_experts < 0 or self.first_dense < 0:
            raise ValueError("moe.n_shared_experts and moe.first_dense must be >= 0")
        if self.lb_coef < 0 or self.z_loss_coef < 0:
            raise ValueError("moe.lb_coef and moe.z_loss_coef must be >= 0")


@dataclass
class RopeScalingConfig:
    """Llama 3's RoPE frequency scaling (``rope_type: llama3`` in Hugging Face configs; Llama 3.1 paper).

    With ``λ = 2π / inv_freq`` (wavelength) and ``L = original_max_position_embeddings``: wavelengths
    shorter than ``L / high_freq_factor`` keep their frequency, longer than ``L / low_freq_factor`` are
    divided by ``factor``, and those in between are interpolated with
    ``smooth = (L / λ - low_freq_factor) / (high_freq_factor - low_freq_factor)``:
    ``(1 - smooth) · inv_freq / factor + smooth · inv_freq`` (transformers' ``_compute_llama3_parameters``).
    """

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def validate(self) -> None:
        if not (0 < self.factor < math.inf and 0 < self.low_freq_factor < self.high_freq_factor < math.inf):
            raise ValueError(f"model.rope_scaling: factor={self.factor} must be > 0 and 0 < low_freq_factor="
                             f"{self.low_freq_factor} < high_freq_factor={self.high_freq_factor} (Llama 3.1: 8, 1, 4)")
        if self.original_max_position_embeddings <= 0:
            raise ValueError("model.rope_scaling.original_max_position_embeddings must be > 0 (Llama 3.1: 8192)")


class _DerivedHeadDim(int):
    """A head_dim derived as ``d_model // n_heads`` (not set explicitly); ``to_dict`` writes it as None."""


class _HeadDimField:
    """``ModelConfig.head_dim``: the explicit value, or ``d_model // n_heads`` when it is None (the default).

    The derived value is a ``_DerivedHeadDim``: assigning one back (``dataclasses.replace``, which copies
    fields through their getters) keeps the field derived, so ``replace(cfg, d_model=...)`` re-derives it.
    """

    def __get__(self, obj, owner=None):
        if obj is None:
            return None  # the dataclass default
        explicit = obj.__dict__.get("_head_dim")
        return explicit if explicit is not None else _DerivedHeadDim(obj.d_model // obj.n_heads)

    def __set__(self, obj, value) -> None:
        obj.__dict__["_head_dim"] = None if isinstance(value, _DerivedHeadDim) else value


@dataclass
class ModelConfig:
    """Llama-style decoder shape (DESIGN.md §2). ``head_dim``: None means ``d_model // n_heads``; an explicit
    value (Qwen3: 128 with d_model 1024 and 16 heads) makes the attention width ``n_heads · head_dim``.
    ``rope_scaling``: Llama 3's frequency scaling, or None (plain RoPE). ``init_width``: None keeps
    ``init_std`` at every width; a width W makes ``init_std`` the std at d_model = W and scales it as
    ``1/√d_model`` (``weight_std``), so that ``std·√d_model`` is the same at every width (DESIGN.md §2,
    "the init regime": the CPU ladder sets W = 640, the 0.12B model's d_model)."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    head_dim: int | None = _HeadDimField()  # type: ignore[assignment]
    d_ff: int = 344
    vocab_size: int = 256
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    rope_scaling: RopeScalingConfig | None = None
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    layout: str = "pre"  # pre | peri
    qk_norm: bool = False
    init_std: float = 0.02
    init_width: int | None = None
    moe: MoEConfig | None = None

    @property
    def weight_std(self) -> float:
        """The std of the embedding, the LM head and every input-side matrix (W_o and W_down take it over
        ``√(2·n_layers)``): ``init_std · √(init_width / d_model)`` under ``init_width``, else ``init_std``."""
        return self.init_std if self.init_width is None else self.init_std * math.sqrt(self.init_width / self.d_model)

    def validate(self) -> None:
        _positive(self, "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "max_seq_len",
                  "head_dim")
        if self.__dict__.get("_head_dim") is None and self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                             f"change one or set model.head_dim explicitly")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads={self.n_heads} is not a multiple of "
                             f"model.n_kv_heads={self.n_kv_heads} (GQA)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE; change model.d_model or model.n_heads")
        if self.layout not in ("pre", "peri"):
            raise ValueError(f"model.layout={self.layout!r} is unknown; use 'pre' or 'peri'")
        if not (0 < self.rope_theta < math.inf and 0 < self.norm_eps < math.inf and 0 < self.init_std < math.inf):
            raise ValueError(f"model.rope_theta={self.rope_theta}, model.norm_eps={self.norm_eps} and "
                             f"model.init_std={self.init_std} must be finite and > 0 (defaults 10000, 1e-6, 0.02)")
        if self.init_width is not None and (isinstance(self.init_width, bool) or not isinstance(self.init_width, int)
                                            or self.init_width <= 0):
            raise ValueError(f"model.init_width={self.init_width!r} must be a positive integer (the d_model at which "
                             f"init_std holds, e.g. 640) or null (init_std at every width)")
        if self.rope_scaling is not None:
            self.rope_scaling.validate()
        if self.moe is not None:
            self.moe.validate()
            if self.moe.first_dense > self.n_layers:
                raise ValueError(f"moe.first_dense={self.moe.first_dense} exceeds model.n_layers={self.n_layers}")


# --------------------------------------------------------------------------------------------- scales

SCALE_CHOICES = {
    "scale": ("none", "shared", "branch"),
    "placement": ("input", "dual", "dual_norm"),
    "param": ("direct", "magdir", "magdir_exp"),
    "wd": ("none", "all", "input", "output", "direction"),
    "apply": ("weight", "activation", "fused"),
}

PRESET_NAMES = ("none", "baseline", "iwd", "hg", "dp", "dnp", "or", "er", "unified", "unified_foldable")


@dataclass
class ScaleConfig:
    """A scale-vector strategy: the four switches of DESIGN.md §3 plus where they act.

    - ``scale``: ``none`` (γ ≡ 1, no parameter), ``shared`` (one γ per norm), ``branch`` (HG: one γ
      per linear map that reads the norm).
    - ``placement``: ``input``, ``dual`` (DP: also an output-side scale s, ``diag(s) W diag(γ)``),
      ``dual_norm`` (DNP: as DP, and the outputs of ``norm_sites`` are RMS-normalized before s).
    - ``param``: ``direct``, ``magdir`` (OR: ``γ = β α / rms(α)``), ``magdir_exp`` (ER: ``exp(b) α/rms(α)``).
    - ``wd``: which scales get weight decay: ``none``, ``all``, ``input`` (IWD), ``output``; ``direction``: OR/ER's
      direction α of every scale and no magnitude (our variant of "does decay hit β or α", DESIGN.md §3).
    - ``weight_decay``: the decayed scales' coefficient (None: ``optim.weight_decay``, the matrices' one; our
      choice, DESIGN.md §3, a switch so that the reproduction study can vary it).
    - ``lr_mult``: every scale parameter's peak lr over ``optim.lr`` (AdamW groups of the scale roles; 1 by
      default, our choice; a switch of issue 23, since a scale vector's Adam step of about lr per step is
      a relative change of lr, unlike a matrix entry's of size 0.02-0.1).
    - ``direction_init``: the constant OR/ER's direction α starts at (γ = 1 whatever it is, since γ does not
      depend on α's norm; under Adam a smaller α turns faster: α moves by about lr per step, so its direction by
      about lr / direction_init). 1 by default (our choice, DESIGN.md §3).
    - ``per_expert``: under ``branch``, every MoE expert gets its own gate/up scale vectors.
    - ``dual_sites`` / ``norm_sites``: the projections that get an output-side scale / normalization.
    - ``apply``: ``weight`` applies the shared γ inside the norm's own pass and folds each branch's γ and
      s into its weight on the fly (``W' = diag(s) W diag(γ)``); ``activation`` multiplies activations
      (the reference form); same function and gradients (DESIGN.md §3 note). ``fused``: as ``weight``, and
      each norm's branches run as one matmul and the MLP (gate, up, DNP's norms, SwiGLU, down) as one
      autograd node (``model/fused.py``): faster on CPU, equal to ``weight`` only to rounding, so opt-in
      (docs/performance.md).
    - ``folded``: the result of ``fold_scales``: no Input-Norm scales, QK-norm scale vectors kept as
      plain vectors (Qwen3's q_norm/k_norm). Not a research strategy; set by ``fold_scales``.
    """

    scale: str = "shared"
    placement: str = "input"
    param: str = "direct"
    wd: str = "none"
    weight_decay: float | None = None
    lr_mult: float = 1.0
    direction_init: float = 1.0
    per_expert: bool = False
    dual_sites: tuple[str, ...] = ("q", "k", "v", "gate", "up")
    norm_sites: tuple[str, ...] = ("gate", "up")
    apply: str = "weight"
    folded: bool = False

    @classmethod
    def preset(cls, name: str) -> ScaleConfig:
        """The named strategy of DESIGN.md §3. Raises ``ValueError`` for an unknown name."""
        presets = {
            "none": dict(scale="none"),
            "baseline": dict(),
            "iwd": dict(wd="input"),
            "hg": dict(scale="branch"),
            "dp": dict(placement="dual"),
            "dnp": dict(placement="dual_norm"),
            "or": dict(param="magdir"),
            "er": dict(param="magdir_exp"),
            "unified": dict(scale="branch", placement="dual_norm", param="magdir", wd="input"),
            "unified_foldable": dict(scale="branch", placement="dual", param="magdir", wd="input"),
        }
        if name not in presets:
            raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(PRESET_NAMES)}")
        cfg = cls(**presets[name])
        cfg.validate()
        return cfg

    @property
    def foldable(self) -> bool:
        """True when every scale folds into an adjacent linear map of a ``pre`` model (no DNP)."""
        return self.placement != "dual_norm"

    def validate(self) -> None:
        for name, choices in SCALE_CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"scale.{name}={value!r} is unknown; use one of {', '.join(choices)}")
        if self.scale == "none":
            for name, plain in (("placement", "input"), ("param", "direct"), ("wd", "none")):
                if getattr(self, name) != plain:
                    raise ValueError(
                        f"scale.{name}={getattr(self, name)!r} needs scale vectors, but scale.scale='none'; "
                        f"set scale.{name}={plain!r} or choose scale.scale='shared'/'branch'"
                    )
        if self.wd == "direction" and self.param == "direct":
            raise ValueError("scale.wd='direction' decays OR/ER's direction α, but scale.param='direct' has none; "
                             "set scale.param='magdir' (or 'magdir_exp') or choose another scale.wd")
        if not (math.isfinite(self.direction_init) and self.direction_init > 0):
            raise ValueError(f"scale.direction_init={self.direction_init} must be a positive number (default 1)")
        if self.direction_init != 1.0 and self.param == "direct":
            raise ValueError("scale.direction_init sets OR/ER's direction α, but scale.param='direct' has none; "
                             "set scale.param='magdir' (or 'magdir_exp') or leave scale.direction_init at 1")
        if self.weight_decay is not None and not self.weight_decay >= 0:
            raise ValueError(f"scale.weight_decay={self.weight_decay} must be >= 0 (or null: optim.weight_decay)")
        if not (isinstance(self.lr_mult, (int, float)) and math.isfinite(self.lr_mult) and self.lr_mult > 0):
            raise ValueError(f"scale.lr_mult={self.lr_mult!r} must be a positive number (default 1: optim.lr)")
        if self.per_expert and self.scale != "branch":
            raise ValueError("scale.per_expert=True needs scale.scale='branch' (HG)")
        for site in self.dual_sites:
            if site not in ("q", "k", "v", "gate", "up"):
                raise ValueError(f"scale.dual_sites has {site!r}; allowed: q, k, v, gate, up")
        for site in self.norm_sites:
            if site not in ("gate", "up"):
                raise ValueError(f"scale.norm_sites has {site!r}; allowed: gate, up")


# --------------------------------------------------------------------------------------------- training


@dataclass
class OptimConfig:
    """Optimizer (DESIGN.md §5). ``lr`` is the AdamW peak lr; Muon's matrices use ``muon_lr`` or ``lr``."""

    name: str = "adamw"  # adamw | muon
    lr: float = 3e-3
    muon_lr: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    embedding_wd: bool = False
    router_wd: bool = False
    muon_momentum: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    fused: str = "auto"  # AdamW kernel: auto (fused on CUDA, foreach on CPU) | true | false (foreach); optim.py

    def validate(self) -> None:
        if self.name not in ("adamw", "muon"):
            raise ValueError(f"optim.name={self.name!r} is unknown; use 'adamw' or 'muon'")
        betas = self.betas
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2 and all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
            shown = list(betas) if isinstance(betas, (list, tuple)) else betas
            raise ValueError(f"optim.betas={shown!r} must be two numbers in [0, 1), written [a,b] "
                             "(e.g. optim.betas=[0.9,0.95])")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"optim.lr={self.lr} must be finite and > 0 (try 3e-3)")
        if self.muon_lr is not None and not 0 < self.muon_lr < math.inf:
            raise ValueError(f"optim.muon_lr={self.muon_lr} must be finite and > 0")
        for name in ("lr", "muon_lr"):
            # AdamW's first step moves a weight by lr / (1 - beta1) (bias correction); with the per-role
            # multipliers (x1e3 margin) that must stay a float32 number, or the update overflows to inf
            value = getattr(self, name)
            if value is not None and value * 1e3 / max(1 - betas[0], 1e-12) > 3.4e38:
                raise ValueError(f"optim.{name}={value} overflows float32 in the optimizer update; use an lr "
                                 f"below 1e30 (try 3e-3)")
        if not (0 <= self.weight_decay < math.inf and 0 <= self.grad_clip < math.inf):
            raise ValueError("optim.weight_decay and optim.grad_clip must be finite and >= 0")
        if not 0 < self.eps < math.inf:
            raise ValueError(f"optim.eps={self.eps} must be finite and > 0 (default 1e-8)")
        if not 0 <= self.muon_momentum < 1:
            raise ValueError(f"optim.muon_momentum={self.muon_momentum} must be in [0, 1) (default 0.95)")
        if str(self.fused).lower() not in ("auto", "true", "false"):
            raise ValueError(f"optim.fused={self.fused!r} is unknown; use auto, true or false")


@dataclass
class ScheduleConfig:
    """lr(step) (DESIGN.md §7). ``warmup`` in steps, or ``warmup_frac`` of the run's steps when that is set
    (``warmup_steps``); ``decay_frac`` is WSD's decay share of the run."""

    name: str = "cosine"  # cosine | wsd | linear | constant
    warmup: int = 50
    warmup_frac: float | None = None  # e.g. 0.05: warmup over 5 % of the steps, replacing `warmup`
    min_lr_ratio: float = 0.1  # the last step's multiplier (cosine, linear; wsd: 0 unless given, resolve.py)
    decay_frac: float = 0.2
    decay_shape: str = "linear"  # WSD decay: linear | cosine | 1-sqrt

    def validate(self) -> None:
        if self.name not in ("cosine", "wsd", "linear", "constant"):
            raise ValueError(f"schedule.name={self.name!r} is unknown; use cosine, wsd, linear or constant")
        if self.decay_shape not in ("linear", "cosine", "1-sqrt"):
            raise ValueError(f"schedule.decay_shape={self.decay_shape!r} is unknown; use linear, cosine or 1-sqrt")
        if self.warmup < 0:
            raise ValueError(f"schedule.warmup={self.warmup} must be >= 0")
        if self.warmup_frac is not None and not 0 <= self.warmup_frac < 1:
            raise ValueError(f"schedule.warmup_frac={self.warmup_frac} must be in [0, 1) (e.g. 0.05), or null "
                             f"to use schedule.warmup steps")
        if not 0 <= self.min_lr_ratio <= 1 or not 0 < self.decay_frac <= 1:
            raise ValueError("schedule.min_lr_ratio must be in [0, 1] and schedule.decay_frac in (0, 1]")

    def warmup_steps(self, total_steps: int) -> int:
        """The warmup in steps for a run of ``total_steps``: ``round(warmup_frac · total_steps)`` (at least 1
        when the fraction is > 0) when ``warmup_frac`` is set, else ``warmup``."""
        if self.warmup_frac is None:
            return self.warmup
        return max(1, round(self.warmup_frac * total_steps)) if self.warmup_frac > 0 else 0


@dataclass
class DataConfig:
    """Corpus and tokenizer (DESIGN.md §8). ``source`` is ``shakespeare``, ``kjv``, a path or ``hf:NAME[:CONFIG]``."""

    source: str = "shakespeare"
    tokenizer: str = "bytes"  # bytes | bpe:N | path/to/tokenizer.json
    val_frac: float = 0.1
    val_tokens: int = 131072  # fixed validation set: the same for every run of a comparison
    cache_dir: str = ""  # "" -> ~/.cache/scalevec

    def validate(self) -> None:
        if not 0 < self.val_frac < 1:
            raise ValueError(f"data.val_frac={self.val_frac} must be in (0, 1)")
        if self.val_tokens <= 0:
            raise ValueError(f"data.val_tokens={self.val_tokens} must be > 0")
        for name in ("source", "tokenizer"):
            if not str(getattr(self, name)).strip():
                raise ValueError(f"data.{name} is empty; give e.g. --data shakespeare / --tokenizer bytes")


COMPILE_CHOICES = ("auto", "true", "false")  # train.compile; what auto decides: training/autocompile.py


def normalize_compile(value) -> str:
    """``train.compile`` as one of ``auto | true | false`` (YAML booleans of older runs accepted).

    Raises ``ValueError`` naming the choices for anything else."""
    if isinstance(value, bool):
        return "true" if value else "false"
    v = str(value).strip().lower()
    v = {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(v, v)
    if v not in COMPILE_CHOICES:
        raise ValueError(f"train.compile={value!r} is unknown; use auto, true or false")
    return v


@dataclass
class TrainConfig:
    """The training loop (DESIGN.md §8). One step = ``batch_size`` sequences of ``seq_len`` tokens."""

    steps: int = 800
    tokens: int = 0  # if > 0, overrides steps: steps = ceil(tokens / (batch_size * seq_len))
    batch_size: int = 16  # global batch, in sequences
    micro_batch_size: int = 0  # 0 -> batch_size (no accumulation)
    seq_len: int = 128
    seed: int = 0
    eval_every: int = 100
    eval_batch_size: int = 32
    log_every: int = 10
    ckpt_every: int = 0  # 0 -> only at the end
    compile: str = "auto"  # auto | true | false: torch.compile each block (training/autocompile.py decides for auto)
    peak_flops: float = 0.0  # FLOP/s for the mfu metric; 0 -> a known GPU's spec, else a cached matmul measurement
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 autocast on cuda, fp32 on cpu) | float32 | bfloat16
    dist: str = "none"  # none | ddp | fsdp2
    # CPU threads for torch's kernels (0: every CPU this process may use). fp32 sums are split across
    # threads, so the thread count is part of what makes a run bitwise reproducible (README, "Reproducibility")
    threads: int = 0
    probe_every: int = 0
    sharpness_every: int = 0
    # memory (docs/performance.md): recompute blocks' activations in the backward: none | all | every_K
    # (blocks 0, K, 2K, ...) | a list of block indices (e.g. 0,2,5); and the LM head + cross-entropy
    # in chunks of this many tokens (0: off). Both off: the plain path, bitwise.
    activation_checkpointing: str = "none"
    loss_chunk_tokens: int = 0
    tracker: str = "none"  # none | tensorboard | wandb: mirrors metrics.jsonl (tracking.py; optional packages)
    # the health guard (training/: trainer.py, rundir.py; besides the always-on non-finite check): a dead model is this
    # many steps in a row at loss ln(vocab) with a gradient norm below 1e-6 (0: off); a spike is a loss
    # above guard_spike_ratio x the mean of the last guard_spike_window losses and above their mean + 6
    # std (OLMo-core's stability monitor uses a mean + k std rule; 0: off). Both stop the run (DIVERGED).
    guard_dead_steps: int = 10
    guard_spike_ratio: float = 2.0
    guard_spike_window: int = 50

    def validate(self) -> None:
        _positive(self, "steps", "batch_size", "seq_len", "eval_every", "eval_batch_size", "log_every")
        if self.loss_chunk_tokens < 0:
            raise ValueError(f"train.loss_chunk_tokens={self.loss_chunk_tokens} must be >= 0 (0: off; try 4096)")
        if self.tokens < 0 or self.micro_batch_size < 0 or self.ckpt_every < 0:
            raise ValueError("train.tokens, train.micro_batch_size and train.ckpt_every must be >= 0")
        if self.threads < 0:
            raise ValueError(f"train.threads={self.threads} must be >= 0 (0: every CPU this process may use)")
        if self.seed < 0 or self.probe_every < 0 or self.sharpness_every < 0:
            raise ValueError(f"train.seed={self.seed}, train.probe_every={self.probe_every} and "
                             f"train.sharpness_every={self.sharpness_every} must be >= 0")
        mb = self.micro_batch_size or self.batch_size
        if self.batch_size % mb:
            raise ValueError(f"train.batch_size={self.batch_size} is not a multiple of train.micro_batch_size={mb}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"train.device={self.device!r} is unknown; use auto, cpu or cuda")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"train.dtype={self.dtype!r} is unknown; use auto, float32 or bfloat16")
        if self.dist not in ("none", "ddp", "fsdp2"):
            raise ValueError(f"train.dist={self.dist!r} is unknown; use none, ddp or fsdp2")
        if self.tracker not in ("none", "tensorboard", "wandb"):
            raise ValueError(f"train.tracker={self.tracker!r} is unknown; use none, tensorboard or wandb")
        if self.guard_dead_steps < 0 or self.guard_spike_window < 2 or not (
                self.guard_spike_ratio == 0 or 1 < self.guard_spike_ratio < math.inf):
            raise ValueError(f"train.guard_dead_steps={self.guard_dead_steps} must be >= 0, train.guard_spike_window="
                             f"{self.guard_spike_window} >= 2 and train.guard_spike_ratio={self.guard_spike_ratio} "
                             f"0 (off) or > 1 (defaults 10, 50, 2.0)")
        self.compile = normalize_compile(self.compile)  # older runs stored a YAML boolean
        if self.peak_flops < 0:
            raise ValueError(f"train.peak_flops={self.peak_flops} must be >= 0 (0: measured or the GPU's spec figure)")


@dataclass
class RunConfig:
    """Everything one run needs; stored as the run directory's ``config.yaml``."""

    preset: str = "small"
    strategy: str = "baseline"
    model: ModelConfig = field(default_factory=ModelConfig)
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        for part in (self.model, self.scale, self.optim, self.schedule, self.data, self.train):
            part.validate()
        checkpoint_blocks(self.train.activation_checkpointing, self.model.n_layers)  # ValueError if malformed
        if self.train.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"train.seq_len={self.train.seq_len} exceeds the model's max_seq_len={self.model.max_seq_len}; "
                f"lower --seq-len or set model.max_seq_len"
            )
        if (self.train.sharpness_every or self.train.probe_every) and self.train.dist == "fsdp2":
            # rank 0 alone runs them, and FSDP2's sharded parameters need every rank for each gather
            raise ValueError("--probe-every and --sharpness-every need the whole model on one process; "
                             "use --dist ddp or drop them")


def checkpoint_blocks(spec: str, n_layers: int) -> list[int]:
    """The block indices that ``train.activation_checkpointing`` names: ``none`` -> [], ``all`` -> every
    block, ``every_K`` -> 0, K, 2K, ..., a comma list (``0,2,5``, YAML ``[0, 2, 5]``) -> those blocks.
    Raises ``ValueError`` for another spelling or an index outside ``0 .. n_layers - 1``."""
    s = str(spec).strip().lower().strip("[]()").replace(" ", "")
    if s in ("none", "", "false"):
        return []
    if s in ("all", "true"):
        return list(range(n_layers))
    try:
        if s.startswith("every_"):
            k = int(s[len("every_"):])
            if k <= 0:
                raise ValueError
            return list(range(0, n_layers, k))
        blocks = sorted({int(v) for v in s.split(",") if v})
    except ValueError:
        raise ValueError(f"train.activation_checkpointing={spec!r} is unknown; use none, all, every_K (e.g. every_2) "
                         f"or block indices (e.g. 0,2,5)") from None
    bad = [b for b in blocks if not 0 <= b < n_layers]
    if bad:
        raise ValueError(f"train.activation_checkpointing names block(s) {bad}, but the model has blocks "
                         f"0..{n_layers - 1}")
    return blocks


# How a run executes, not what it computes: these may differ when a run is resumed or a sweep is rerun
# (DESIGN.md §8: the same global batch gives the same losses on 1 or N processes; the thread count and
# compile change the last bits of fp32 sums, which meta.json records, not the experiment).
EXECUTION_FIELDS = ("train.dist", "train.device", "train.compile", "train.tracker", "train.threads")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask): the thread count `scalevec train` and a one-job
    sweep use when ``train.threads`` is 0. Explicit rather than torch's default, which counts physical
    cores and so differs on a machine with SMT from what a parent's ``OMP_NUM_THREADS`` gives: a run's
    numbers then depended on how it was started (issue 12)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------- derived


def tokens_per_step(cfg: RunConfig) -> int:
    """Tokens of one optimizer step: the global batch, ``train.batch_size × train.seq_len``."""
    return cfg.train.batch_size * cfg.train.seq_len


def total_steps(cfg: RunConfig) -> int:
    """Optimizer steps of the run (the one step counter): ``ceil(train.tokens / tokens per step)`` when
    ``train.tokens`` is set, else ``train.steps``."""
    if cfg.train.tokens > 0:
        return math.ceil(cfg.train.tokens / tokens_per_step(cfg))
    return cfg.train.steps


def run_tokens(cfg: RunConfig) -> int:
    """Training tokens of the run: its steps × tokens per step (``train.tokens`` rounded up to whole steps)."""
    return total_steps(cfg) * tokens_per_step(cfg)


def budget_tokens(tokens_per_param: float, params: int) -> int:
    """A token budget of ``tokens_per_param`` tokens per parameter (DESIGN.md §9: a cell's budget uses the
    baseline strategy's ``params`` so that every strategy trains on the same tokens), for ``train.tokens``.
    Raises ``ValueError`` for a ratio that is not > 0 or a budget below one token."""
    if not float(tokens_per_param) > 0:
        raise ValueError(f"tokens_per_param={tokens_per_param} must be > 0 (e.g. 20)")
    tokens = round(float(tokens_per_param) * params)
    if tokens < 1:
        raise ValueError(f"tokens_per_param={tokens_per_param} gives {tokens} tokens for {params:,} parameters; "
                         f"raise it (e.g. 20)")
    return tokens


def fit_vocab(cfg: RunConfig, vocab_size: int) -> RunConfig:
    """``cfg`` with ``model.vocab_size`` grown to ``vocab_size`` when it is smaller: a preset's vocabulary
    (256, the bytes) is a default, not a constraint, so a ``bpe:N`` or tokenizer.json run gets an embedding
    that fits its tokenizer (the trainer, with the tokenizer's size; a sweep, with a stored run's size, so
    that a rerun sees the config the trainer resolved). Never shrinks."""
    if vocab_size <= cfg.model.vocab_size:
        return cfg
    return replace(cfg, model=replace(cfg.model, vocab_size=vocab_size))


def config_diff(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
    """The fields that differ between two configs (``RunConfig`` or their ``to_dict`` mappings), execution
    fields (``EXECUTION_FIELDS``) excepted: ``{dotted name: (value in a, value in b)}``, sorted by name.

    A section that is a mapping on one side and not on the other (``model.moe: None`` vs experts) is one
    entry under the section's name. Resuming a run and rerunning a sweep both refuse a non-empty diff."""
    da = a if isinstance(a, dict) else to_dict(a)
    db = b if isinstance(b, dict) else to_dict(b)
    out: dict[str, tuple[Any, Any]] = {}

    def walk(x: dict, y: dict, prefix: str) -> None:
        for k in sorted(set(x) | set(y)):
            vx, vy = x.get(k), y.get(k)
            if isinstance(vx, dict) and isinstance(vy, dict):
                walk(vx, vy, f"{prefix}{k}.")
            elif vx != vy and f"{prefix}{k}" not in EXECUTION_FIELDS:
                out[f"{prefix}{k}"] = (vx, vy)

    walk(da, db, "")
    return out


def format_diff(diff: dict[str, tuple[Any, Any]]) -> str:
    """``config_diff``'s result as one line: ``optim.lr: 0.003 -> 0.01, train.steps: 10 -> 20``."""
    return ", ".join(f"{k}: {va!r} -> {vb!r}" for k, (va, vb) in diff.items())


# --------------------------------------------------------------------------------------------- I/O


def to_dict(cfg: Any) -> dict:
    """A dataclass as plain YAML-safe dicts, lists and scalars."""

    def plain(v: Any) -> Any:
        if isinstance(v, _DerivedHeadDim):
            return None  # derived, not chosen: stays derived when d_model or n_heads change
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in fields(v)}
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    return plain(cfg)


def from_dict(cls: type, data: dict, where: str = "") -> Any:
    """Build dataclass ``cls`` from a dict, checking keys and types (an int field takes an int, never a
    float; a float field a number; a bool field a boolean; a str field a scalar). Raises ``ValueError``
    naming the key, its value and the value's type."""
    if not isinstance(data, dict):
        raise ValueError(f"{where.rstrip('.') or 'config'} must be a mapping, got {type(data).__name__}")
    hints = _type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(sorted(where + k for k in unknown))}; "
                         f"known: {', '.join(sorted(known))}")
    kwargs = {k: _coerce(hints[k], v, where + k) for k, v in data.items()}
    return cls(**kwargs)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # resolving the string annotations (``from __future__ import annotations``) compiles each one: it was
    # most of the time of a sweep's expansion (1,844 configs of the shipped sweep files), so once per class
    return typing.get_type_hints(cls)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(options[0], value, key)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key + ".")
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.replace(" ", "").split(",") if v] if value else []
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]  # one number is a one-item list, as one word is: the section's validate judges its length
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}={value!r} is not a list; write it as [a,b] or a,b")
        args = typing.get_args(tp)
        item = args[0]
        return tuple(_coerce(item, v, key) for v in value)
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
                return bool(value)
            raise TypeError
        if tp is int:
            # an int field takes an int (or its digits): a float, even 8.0 or 1e+30, is refused rather than
            # truncated or turned into a 31-digit step count
            if isinstance(value, str):
                return int(value.strip())
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise TypeError
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError
            return float(value)
        if tp is str:
            if isinstance(value, (list, tuple, dict)) or value is None:
                raise TypeError
            return str(value)
    except (TypeError, ValueError):
        name = getattr(tp, "__name__", tp)
        hint = "; write a whole number" if tp is int and isinstance(value, (float, str)) else ""
        raise ValueError(f"{key}={value!r} is not a valid {name} (it is a {type(value).__name__}){hint}") from None
    return value


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``section.field=value`` overrides (e.g. ``model.d_model=256``, ``moe.n_experts=4``).

    ``moe.*`` edits ``model.moe`` (creating it with defaults if absent); ``model.rope_scaling.*``
    likewise. Raises ``ValueError`` for a
    malformed item or an unknown key.
    """
    data = to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value (example: model.d_model=256)")
        key, value = item.split("=", 1)
        path = key.strip().split(".")
        if path[0] == "moe":
            path = ["model", *path]
        node = data
        for part in path[:-1]:
            if part == "moe" and node.get("moe") is None:
                node["moe"] = to_dict(MoEConfig())
            if part == "rope_scaling" and node.get("rope_scaling", 0) is None:
                node["rope_scaling"] = to_dict(RopeScalingConfig())
            if part not in node or not isinstance(node[part], dict):
                sections = ", ".join(k for k, v in data.items() if isinstance(v, dict))
                raise ValueError(f"unknown config key {key!r}; sections: {sections}")
            node = node[part]
        if path[-1] not in node:
            raise ValueError(f"unknown config key {key!r}; known in this section: {', '.join(sorted(node))}")
        try:
            parsed = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            parsed = value  # not YAML: the type check below names the key
        # a string field keeps the text as given unless it is a YAML string ('"x"'): paths like
        # 'a: b', '#x', 'hf:', 'yes'
        node[path[-1]] = value if isinstance(node[path[-1]], str) and not isinstance(parsed, str) else parsed
    return from_dict(RunConfig, data)


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping; ``ValueError`` with the path if it is missing or malformed."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"config file {p} is a directory; pass a YAML file")
    if not p.is_file():
        raise ValueError(f"config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"config file {p} is not UTF-8 text; save it as UTF-8 YAML") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"config file {p} is not valid YAML{where} ({problem}); fix the syntax there") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {p} must hold a mapping")
    return data


def save_yaml(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


# --------------------------------------------------------------------------------------------- help


@dataclass(frozen=True)
class FieldDoc:
    """One row of ``config_fields``: a field's dotted ``name`` (``model.moe.n_experts``), its ``type`` as
    annotated (``float | None``), its ``default`` as YAML-safe data (``to_dict``'s form) and ``doc``, one line
    taken from this module's source ("" where there is none)."""

    name: str
    type: str
    default: Any
    doc: str


def config_fields(cfg: RunConfig | None = None) -> list[FieldDoc]:
    """Every field of ``RunConfig``, derived from the dataclasses (issue 26: what ``scalevec train --help``
    lists), in declaration order. A section (``model``, ``scale``, ...) is no row of its own; an optional
    one (``model.moe``, ``model.rope_scaling``: None or a section) is a row, followed by its fields.

    ``default``: the value in ``cfg`` (default ``RunConfig()``); the fields of an optional section that is
    None there take their class's defaults (what ``moe.n_experts=4`` starts from). ``doc``: the field's
    trailing comment, else the comment block right above it, else the clause of its class's docstring
    (or of a comment block in the class) that starts with its name: one sentence, cut to about 110
    characters."""
    rows: list[FieldDoc] = []

    def walk(cls: type, values: dict, prefix: str) -> None:
        docs, hints = _field_docs(cls), _type_hints(cls)
        for f in fields(cls):
            tp = hints[f.name]
            section = next((a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)), None)
            value = values[f.name]
            if section is not None and section is tp:  # a section that is always there: only its fields
                walk(section, value, f"{prefix}{f.name}.")
                continue
            rows.append(FieldDoc(prefix + f.name, str(f.type), value, docs.get(f.name, "")))
            if section is not None:
                walk(section, value if isinstance(value, dict) else to_dict(section()), f"{prefix}{f.name}.")

    walk(RunConfig, to_dict(RunConfig() if cfg is None else cfg), "")
    return rows


_DOC_WIDTH = 110  # a description's length before it is cut at a clause or a word
_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "cf")


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """``{field: one-line description}`` for a dataclass of this module, read from its source (config_fields)."""
    import ast
    import io
    import tokenize

    source = Path(__file__).read_text(encoding="utf-8")
    node = next((n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
    if node is None:
        return {}
    comments: dict[int, tuple[str, bool]] = {}  # line -> (comment text, whether the line is only a comment)
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and node.lineno <= tok.start[0] <= node.end_lineno:
            row = tok.start[0]
            comments[row] = (tok.string.lstrip("#").strip(), not lines[row - 1][:tok.start[1]].strip())
    names = [f.name for f in fields(cls)]
    clauses = [_clean(c) for c in _docstring_clauses(ast.get_docstring(node) or "")]
    block_clauses: list[str] = []  # of the comment blocks above fields
    out: dict[str, str] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)) or stmt.target.id not in names:
            continue
        name = stmt.target.id
        trailing = comments.get(stmt.end_lineno)
        block, row = [], stmt.lineno - 1
        while row in comments and comments[row][1]:
            block.insert(0, comments[row][0])
            row -= 1
        if block:
            block_clauses.extend(_clean(c) for c in _split_top(" ".join(block), "; "))
        if trailing and not trailing[1] and not trailing[0].startswith("type:"):
            out[name] = _one_line(trailing[0])
        elif block:
            out[name] = _one_line(" ".join(block))
    for name in names:  # the clauses "``name``: ..." / "``name`` is ...", then a comment's clause that names it
        if name in out:
            continue
        for clause in clauses:
            m = re.match(r"(\w+(?: / \w+)*)(:?) (.*)", clause)  # "scale: ...", "dual_sites / norm_sites: ..."
            if m and name in m.group(1).split(" / "):
                out[name] = _one_line(m.group(3) if m.group(2) else clause)
                break
        else:  # an identifier, not a word that prose may use ("steps")
            named = [c for c in block_clauses if "_" in name and re.search(rf"\b{name}\b", c)]
            if named:
                out[name] = _one_line(named[0])
    return out


def _docstring_clauses(doc: str) -> list[str]:
    """A docstring as clauses: each ``- `` bullet whole, the rest as sentences split at top-level ``; ``."""
    items, prose = [], []
    for line in doc.splitlines():
        if line.lstrip().startswith("- "):
            items.append(line.lstrip()[2:])
        elif items and line.startswith(" ") and line.strip():
            items[-1] += " " + line.strip()
        else:
            prose.append(line.strip())
    sentences = _split_top(" ".join(prose), ". ")
    return items + [c for s in sentences for c in _split_top(s, "; ")]


def _clean(text: str) -> str:
    return " ".join(text.replace("``", "").split())


def _one_line(text: str) -> str:
    """``text`` as one line of at most about ``_DOC_WIDTH`` characters: its first sentence, then its first
    clause (top-level ``;``), then cut at a word; a cut inside the sentence ends in `` …``."""
    text = _clean(text)
    text = _split_top(text, ". ")[0].rstrip(".")
    if len(text) > _DOC_WIDTH and len(_split_top(text, "; ")) > 1:
        text = _split_top(text, "; ")[0] + " …"
    if len(text) > _DOC_WIDTH:
        text = text[:_DOC_WIDTH].rsplit(" ", 1)[0].rstrip(" …") + " …"
    return text


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets; a ``. `` after an abbreviation (e.g.) does not split."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if depth == 0 and text.startswith(sep, i):
            if sep == ". " and text[:i].rsplit(" ", 1)[-1].lstrip("(").lower() in _ABBREVIATIONS:
                continue
            parts.append(text[start:i])
            start = i + len(sep)
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()] or [""]


def _positive(obj: Any, *names: str) -> None:
    section = type(obj).__name__.replace("Config", "").lower()
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{section}.{name}={value!r} must be a positive integer")


__all__ = [
    "MoEConfig", "RopeScalingConfig", "ModelConfig", "ScaleConfig", "OptimConfig", "ScheduleConfig", "DataConfig",
    "TrainConfig", "RunConfig", "PRESET_NAMES", "apply_overrides", "from_dict", "to_dict",
    "load_yaml", "save_yaml", "replace", "EXECUTION_FIELDS", "usable_cpus", "tokens_per_step", "total_steps",
    "run_tokens", "budget_tokens", "config_diff", "fit_vocab", "format_diff", "FieldDoc", "config_fields",
]
