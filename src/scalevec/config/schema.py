"""The config schemas: one dataclass per section, each field with its description (DESIGN.md §2, §3, §12).

Every knob of a run lives in one of these dataclasses. ``RunConfig`` groups them; it is what a run
directory stores as ``config.yaml`` and what ``--config FILE.yaml`` and ``section.field=value``
overrides edit. Each field is followed by its description (an attribute docstring whose first line is
what ``scalevec train --help`` shows; tests/test_help.py requires one for every field). Validation raises
``ValueError`` naming the offending field and what to use instead. Also here: the strategy table
(``STRATEGIES``, DESIGN.md §3), and which fields say how a run executes rather than what it computes
(``EXECUTION_FIELDS``).

This module builds nothing and reads no file: the codec (dicts, overrides, diffs) is ``codec.py``, files and
YAML ``files.py``, the field listing ``fieldhelp.py``, the run arithmetic (steps, tokens, budgets, CPUs)
``run_budget.py``, the resolution of a run's inputs ``scalevec.resolve``; models, optimizers and data read these
objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from scalevec.config.typed import is_int, is_number, short

# --------------------------------------------------------------------------------------------- model


@dataclass
class MoEConfig:
    """Mixture-of-experts MLP (DESIGN.md §6): top-k routing over fine-grained SwiGLU experts, dropless."""

    n_experts: int = 8
    """Routed experts per MoE block."""
    top_k: int = 2
    """Experts each token is sent to: the top k of the router's softmax, their weights renormalized."""
    d_expert: int = 128
    """Each expert's SwiGLU width (its d_ff)."""
    n_shared_experts: int = 0
    """Always-on shared experts, run as one SwiGLU of width d_expert · n_shared_experts (0: none)."""
    lb_coef: float = 0.01
    """Coefficient of the switch-style load-balancing loss E · Σ_i f_i P_i added to the loss (0: off)."""
    z_loss_coef: float = 0.0
    """Coefficient of the router z-loss mean(logsumexp(router logits)²) added to the loss (0: off)."""
    first_dense: int = 0
    """The first first_dense blocks keep a dense MLP (0: every block is MoE)."""

    def validate(self) -> None:
        _positive(self, "n_experts", "d_expert", "top_k")
        if self.top_k > self.n_experts:
            raise ValueError(f"moe.top_k={self.top_k} exceeds moe.n_experts={self.n_experts}; use top_k <= n_experts")
        _nonnegative(self, "n_shared_experts", "first_dense", "lb_coef", "z_loss_coef")


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
    """Divisor of the low frequencies, those of wavelength above L / low_freq_factor (Llama 3.1: 8)."""
    low_freq_factor: float = 1.0
    """Wavelengths above L / low_freq_factor are divided by factor; below, interpolated (Llama 3.1: 1)."""
    high_freq_factor: float = 4.0
    """Wavelengths below L / high_freq_factor keep their frequency (Llama 3.1: 4)."""
    original_max_position_embeddings: int = 8192
    """L: the context length of the unscaled model, in tokens (Llama 3.1: 8192)."""

    def validate(self) -> None:
        if not (0 < self.factor < math.inf and 0 < self.low_freq_factor < self.high_freq_factor < math.inf):
            raise ValueError(f"model.rope_scaling: factor={self.factor} must be > 0 and 0 < low_freq_factor="
                             f"{self.low_freq_factor} < high_freq_factor={self.high_freq_factor} (Llama 3.1: 8, 1, 4)")
        if self.original_max_position_embeddings <= 0:
            raise ValueError("model.rope_scaling.original_max_position_embeddings must be > 0 (Llama 3.1: 8192)")


class Derived:
    """Marks a field value derived from other fields, not chosen: ``codec.to_dict`` writes it as None,
    so that it is derived again when the fields it comes from change."""


class _DerivedHeadDim(int, Derived):
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
    """Llama-style decoder shape (DESIGN.md §2); the presets (presets.py) fill it."""

    d_model: int = 128
    """Width of the residual stream (hidden size)."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Attention (query) heads."""
    n_kv_heads: int = 4
    """Key/value heads (GQA: n_heads is a multiple of it; equal to n_heads: plain multi-head attention)."""
    head_dim: int | None = _HeadDimField()  # type: ignore[assignment]
    """Width of one attention head (even, for RoPE); null: d_model // n_heads.

    An explicit value (Qwen3: 128 with d_model 1024 and 16 heads) makes the attention width n_heads · head_dim."""
    d_ff: int = 344
    """Hidden width of the dense SwiGLU MLP (W_gate, W_up: d_model -> d_ff; W_down back)."""
    vocab_size: int = 256
    """Embedding rows and LM-head outputs; grown to the tokenizer's size when smaller (resolve.fit_vocab)."""
    max_seq_len: int = 256
    """The longest sequence the model takes, in tokens (RoPE tables, KV cache; train.seq_len fits in it)."""
    rope_theta: float = 10000.0
    """RoPE's base θ: pair i of a head rotates by position · θ^(-2i/head_dim) (DESIGN.md §2)."""
    rope_scaling: RopeScalingConfig | None = None
    """Llama 3's RoPE frequency scaling (its fields below), or null: plain RoPE."""
    norm_eps: float = 1e-6
    """ε of every RMSNorm, n(x) = x / sqrt(mean(x²) + ε) (DESIGN.md §1)."""
    tie_embeddings: bool = False
    """The LM head reuses the embedding matrix (default untied, DESIGN.md §2)."""
    layout: str = "pre"
    """Block layout (DESIGN.md §2): pre (Pre-Norm, Llama) | peri (also an Output-Norm on each sublayer's output)."""
    qk_norm: bool = False
    """RMSNorm on each head's q and k before RoPE, one γ of size head_dim for all heads (Qwen3; an Output-Norm)."""
    init_std: float = 0.02
    """Std of every matrix's normal init (at d_model = init_width, if set); W_o and W_down: / √(2·n_layers)."""
    init_width: int | None = None
    """null: init_std at every width; W: init_std holds at d_model = W and scales as 1/√d_model (weight_std).

    Then std·√d_model is the same at every width (DESIGN.md §2, "the init regime": the CPU ladder sets W = 640,
    the 0.12B model's d_model)."""
    moe: MoEConfig | None = None
    """The MoE MLP (DESIGN.md §6; its fields below), or null: every block has the dense SwiGLU MLP."""

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
        if self.init_width is not None and not is_int(self.init_width, least=1):
            raise ValueError(f"model.init_width={self.init_width!r} must be a positive integer (the d_model at which "
                             f"init_std holds, e.g. 640) or null (init_std at every width)")
        if self.rope_scaling is not None:
            self.rope_scaling.validate()
        if self.moe is not None:
            self.moe.validate()
            if self.moe.first_dense > self.n_layers:
                raise ValueError(f"moe.first_dense={self.moe.first_dense} exceeds model.n_layers={self.n_layers}")
        # torch cannot make a tensor of 2**63 bytes or more, even on the meta device (`scalevec info` and a sweep's
        # parameter count build there): model.d_model=10**20 was a TypeError from torch.empty, not a message
        widths = {"vocab_size": self.vocab_size, "d_ff": self.d_ff, "n_heads·head_dim": self.n_heads * self.head_dim,
                  "max_seq_len": self.max_seq_len}
        if self.moe is not None:
            widths["moe.n_experts·d_expert"] = self.moe.n_experts * self.moe.d_expert
            widths["moe.n_shared_experts·d_expert"] = self.moe.n_shared_experts * self.moe.d_expert
        name, width = max(widths.items(), key=lambda kv: kv[1])
        if self.d_model * width >= TENSOR_LIMIT:
            raise ValueError(f"model.d_model={self.d_model:,} × {name}={width:,} is a weight of "
                             f"{self.d_model * width:.3g} values, past torch's largest tensor (2**60); choose "
                             f"smaller sizes")


# --------------------------------------------------------------------------------------------- scales

SCALE_CHOICES = {
    "scale": ("none", "shared", "branch"),
    "placement": ("input", "dual", "dual_norm"),
    "param": ("direct", "magdir", "magdir_exp"),
    "wd": ("none", "all", "input", "output", "direction"),
    "apply": ("weight", "activation", "fused"),
}

# The named strategies of DESIGN.md §3, each the switches it changes from ScaleConfig's defaults (baseline). The one
# table: PRESET_NAMES, ScaleConfig.preset and every test that builds all strategies read it. It lives here, below
# the model, because the config layer resolves a run's `strategy` into its `scale` section (resolve.py) and config
# may not import the model (tests/test_layout.py); what each switch means is the model's (scales.scale_plan).
STRATEGIES: dict[str, dict[str, str]] = {
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
PRESET_NAMES = tuple(STRATEGIES)  # the strategy names, in the table's order


@dataclass
class ScaleConfig:
    """A scale-vector strategy: the four switches of DESIGN.md §3 (``scale``, ``placement``, ``param``, ``wd``)
    plus how they act. A named strategy is a row of ``STRATEGIES`` (``preset``); ``scales.scale_plan`` is the
    one reader of these switches (what they build)."""

    scale: str = "shared"
    """none (γ ≡ 1, no parameter) | shared (one γ per norm) | branch (HG: one γ per linear map reading the norm)."""
    placement: str = "input"
    """input | dual (DP: also an output-side s, W' = diag(s) W diag(γ)) | dual_norm (DNP: DP, outputs normalized).

    DNP normalizes the outputs of ``norm_sites`` before s: ``y = s ⊙ n(W (γ ⊙ u))``, n over d_ff (DESIGN.md §3)."""
    param: str = "direct"
    """direct (γ is the parameter) | magdir (OR: γ = β·α/rms(α)) | magdir_exp (ER: γ = exp(b)·α/rms(α))."""
    wd: str = "none"
    """Which scales get weight decay: none | all | input (IWD) | output | direction (OR/ER's α, no magnitude).

    Under OR/ER a decayed scale's magnitude β (or b) is decayed, not its direction α (our choice);
    ``direction`` is the other answer to "does decay hit β or α", a variant (DESIGN.md §3)."""
    weight_decay: float | None = None
    """The decayed scales' weight-decay coefficient; null: optim.weight_decay, the matrices' (our choice, §3)."""
    lr_mult: float = 1.0
    """Peak lr of every scale parameter over optim.lr (AdamW groups of the scale roles; our choice).

    A switch because a scale vector's Adam step of about lr per step is a relative change of lr, unlike a
    matrix entry's of size 0.02-0.1."""
    direction_init: float = 1.0
    """The constant OR/ER's direction α starts at; γ = 1 whatever it is (our choice, DESIGN.md §3).

    γ does not depend on α's norm; under Adam a smaller α turns faster: α moves by about lr per step, so its
    direction by about lr / direction_init."""
    per_expert: bool = False
    """Under scale=branch, every MoE expert gets its own gate/up scale vectors (else the experts share one set)."""
    dual_sites: tuple[str, ...] = ("q", "k", "v", "gate", "up")
    """The projections that get DP/DNP's output-side scale s (among q, k, v, gate, up, o, down).

    ``o`` and ``down`` (the residual writers W_o and W_down; MoE: every expert's and the shared experts' W_down)
    are opt-in: their s folds into W's rows like the others' (DESIGN.md §3)."""
    norm_sites: tuple[str, ...] = ("gate", "up")
    """The projections whose outputs DNP normalizes before s (among gate, up)."""
    apply: str = "weight"
    """weight (γ, s folded into W on the fly) | activation (γ, s on the activations) | fused (opt-in, to rounding).

    ``weight`` applies the shared γ inside the norm's own pass and folds each branch's γ and s into its weight
    (``W' = diag(s) W diag(γ)``); ``activation`` multiplies activations (the reference form); same function and
    gradients (DESIGN.md §3 note). ``fused``: as ``weight``, and each norm's branches run as one matmul and the
    MLP (gate, up, DNP's norms, SwiGLU, down) as one autograd node (``model/fused.py``): faster on CPU, equal
    to ``weight`` only to rounding, so opt-in (docs/performance.md)."""
    folded: bool = False
    """Set by fold_scales on its output, not a research switch: no Input-Norm scales, QK-norm's γ a plain vector."""

    @classmethod
    def preset(cls, name: str) -> ScaleConfig:
        """The named strategy of DESIGN.md §3 (its row of ``STRATEGIES``). Raises ``ValueError`` for an unknown
        name."""
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(PRESET_NAMES)}")
        cfg = cls(**STRATEGIES[name])
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
        if self.weight_decay is not None and not is_number(self.weight_decay, least=0):  # inf made the scales NaN
            raise ValueError(f"scale.weight_decay={self.weight_decay!r} must be a finite number >= 0 (or null: "
                             f"optim.weight_decay)")
        if not is_number(self.lr_mult, above=0):
            raise ValueError(f"scale.lr_mult={self.lr_mult!r} must be a positive number (default 1: optim.lr)")
        if self.per_expert and self.scale != "branch":
            raise ValueError("scale.per_expert=True needs scale.scale='branch' (HG)")
        for site in self.dual_sites:
            if site not in ("q", "k", "v", "gate", "up", "o", "down"):
                raise ValueError(f"scale.dual_sites has {site!r}; allowed: q, k, v, gate, up, o, down")
        for site in self.norm_sites:
            if site not in ("gate", "up"):
                raise ValueError(f"scale.norm_sites has {site!r}; allowed: gate, up")


# --------------------------------------------------------------------------------------------- training


@dataclass
class OptimConfig:
    """Optimizer (DESIGN.md §5): param groups by role, AdamW, or Muon on the matrices with AdamW on the rest."""

    name: str = "adamw"
    """adamw | muon (Muon on the matrix role, expert banks per expert; AdamW on every other role)."""
    lr: float = 3e-3
    """Peak learning rate of the AdamW groups (and of Muon's, unless muon_lr); the schedule multiplies it."""
    muon_lr: float | None = None
    """Muon's peak lr on the matrices; null: lr (Muon's update is scaled to AdamW's RMS, match_rms_adamw)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's (β1, β2): the decay rates of its running means of the gradient and of its square."""
    eps: float = 1e-8
    """AdamW's ε, added to the root of the second-moment estimate in the update's denominator."""
    weight_decay: float = 0.1
    """Decoupled weight decay of the matrix and lm_head roles (the scales: as scale.wd says; DESIGN.md §5)."""
    embedding_wd: bool = False
    """Decay the embedding too (default: no weight decay on it, DESIGN.md §5)."""
    router_wd: bool = False
    """Decay the MoE router too (default: no weight decay on it, DESIGN.md §5)."""
    muon_momentum: float = 0.95
    """Muon's (Nesterov) momentum coefficient."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    fused: str = "auto"
    """AdamW kernel: auto (fused on CUDA, foreach on CPU) | true | false (foreach); training/optim.py."""

    def validate(self) -> None:
        if self.name not in ("adamw", "muon"):
            raise ValueError(f"optim.name={self.name!r} is unknown; use 'adamw' or 'muon'")
        betas = self.betas
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2
                and all(is_number(b, least=0) and b < 1 for b in betas)):
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
    """The lr multiplier of a step (DESIGN.md §7; training/schedule.py): linear warmup, then the named decay."""

    name: str = "cosine"
    """The decay after warmup: cosine | wsd (warmup-stable-decay) | linear | constant."""
    warmup: int = 50
    """Linear warmup in steps, unless warmup_frac is set; when neither is set, min(50, steps // 10) (resolve.py)."""
    warmup_frac: float | None = None
    """Warmup as a share of the run's steps (e.g. 0.05: 5 %), replacing warmup; null: warmup steps."""
    min_lr_ratio: float = 0.1
    """The last step's multiplier (cosine, linear; wsd: 0 unless given, resolve.py)."""
    decay_frac: float = 0.2
    """WSD's decay share of the run: the multiplier decays over the last decay_frac of the steps."""
    decay_shape: str = "linear"
    """WSD's decay curve: linear | cosine | 1-sqrt."""

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


VAL_SPLITS = ("tail", "strided", "random")  # data.val_split; the rules: data/split.py
VAL_WINDOWS = ("head", "per_document")  # data.val_windows; the rules: data/sampler.py (val_window_starts)


@dataclass
class DataConfig:
    """Corpus, tokenizer and validation split (DESIGN.md §8; data/)."""

    source: str = "shakespeare"
    """The corpus: shakespeare | kjv (bundled), a .txt/.jsonl/.parquet file or folder, or hf:NAME[:CONFIG]."""
    tokenizer: str = "bytes"
    """bytes (vocab 256) | bpe:N (a byte-level BPE of N tokens, trained locally and cached) | a tokenizer.json."""
    val_frac: float = 0.1
    """The share held out for validation: of the characters (val_split tail), else of the documents (data/split.py)."""
    val_split: str = "tail"
    """Which documents are validation: tail (the last ones) | strided (every 1/val_frac-th) | random (seeded)."""
    val_seed: int = 0
    """The seed of val_split=random (not train.seed, so that every seed of a study sees the same split)."""
    val_tokens: int = 131072
    """Tokens of the fixed validation set: the same for every run of a comparison."""
    val_windows: str = "head"
    """Which validation windows are scored: head (the stream's first val_tokens) | per_document (some of every doc).

    head is what every study before the packages corpus used; per_document gives every validation document at least
    one window, the rest in proportion to its length (data/sampler.py)."""
    cache_dir: str = ""
    """Where tokenized corpora and trained tokenizers are cached; "": $SCALEVEC_CACHE, else ~/.cache/scalevec."""

    def validate(self) -> None:
        if not 0 < self.val_frac < 1:
            raise ValueError(f"data.val_frac={self.val_frac} must be in (0, 1)")
        if self.val_split not in VAL_SPLITS:
            raise ValueError(f"data.val_split={self.val_split!r} is unknown; use {', '.join(VAL_SPLITS)}")
        if self.val_tokens <= 0:
            raise ValueError(f"data.val_tokens={self.val_tokens} must be > 0")
        if self.val_windows not in VAL_WINDOWS:
            raise ValueError(f"data.val_windows={self.val_windows!r} is unknown; use {', '.join(VAL_WINDOWS)}")
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
    """Optimizer steps of the run (unless tokens is set)."""
    tokens: int = 0
    """Training tokens; if > 0, replaces steps: steps = ceil(tokens / (batch_size · seq_len)) (run_budget.py)."""
    batch_size: int = 16
    """The global batch, in sequences per optimizer step (over all processes and micro-batches)."""
    micro_batch_size: int = 0
    """Sequences per forward/backward pass of a process; 0: batch_size (no gradient accumulation)."""
    seq_len: int = 128
    """Tokens per training and validation sequence (at most model.max_seq_len)."""
    seed: int = 0
    """Seed of the initial matrices and of the data order: every strategy gets the same ones for a seed."""
    eval_every: int = 100
    """Evaluate on the fixed validation set every this many steps, and at the last step."""
    eval_batch_size: int = 32
    """Sequences per validation forward pass."""
    log_every: int = 10
    """Write a training row (loss, lr, gradient norm, scale statistics) to metrics.jsonl every this many steps."""
    ckpt_every: int = 100
    """Checkpoint every this many steps, at least every 30 minutes, and at the end (0: only at the end).

    The 30 minutes (trainer.CKPT_MINUTES) count training time: the checkpoint is written after the first step that
    ends 30 minutes or more after the last one. The two newest checkpoints are kept."""
    compile: str = "auto"
    """auto | true | false: torch.compile each block (training/autocompile.py decides for auto)."""
    peak_flops: float = 0.0
    """FLOP/s for the mfu metric; 0: a known GPU's spec figure, else a cached matmul measurement."""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda | cuda:N."""
    dtype: str = "auto"
    """auto (bf16 autocast on cuda, fp32 on cpu) | float32 | bfloat16."""
    dist: str = "none"
    """none | ddp | fsdp2: data parallelism across the processes of torchrun (DESIGN.md §8)."""
    threads: int = 0
    """CPU threads for torch's kernels (0: every CPU this process may use).

    fp32 sums are split across threads, so the thread count is part of what makes a run bitwise reproducible
    (README, "Reproducibility")."""
    probe_every: int = 0
    """Log each scale vector's preconditioner spectrum every this many steps (DESIGN.md §4; 0: off)."""
    sharpness_every: int = 0
    """Log the top Hessian eigenvalue on a validation batch every this many steps (DESIGN.md §4; 0: off)."""
    activation_checkpointing: str = "none"
    """Blocks recomputed in the backward to save memory: none | all | every_K | indices (e.g. 0,2,5).

    ``every_K``: blocks 0, K, 2K, ...; docs/performance.md. Off (with loss_chunk_tokens 0): the plain path, bitwise."""
    loss_chunk_tokens: int = 0
    """Run the final norm, LM head and cross-entropy in chunks of this many tokens, never whole logits (0: off)."""
    tracker: str = "none"
    """none | tensorboard | wandb: mirrors metrics.jsonl (training/tracking.py; optional packages)."""
    guard_dead_steps: int = 10
    """Stop as dead after this many steps in a row at loss ln(vocab) with gradient norm below 1e-6 (0: off).

    The health guard (training/health.py, besides the always-on non-finite check): a stop writes DIVERGED,
    naming the newest checkpoint from before the first bad step (DESIGN.md §8)."""
    guard_spike_ratio: float = 2.0
    """A spike is a loss above this × the mean of the last guard_spike_window losses (and their mean + 6 std; 0: off).

    OLMo-core's stability monitor uses a mean + k std rule; a spike stops the run (DIVERGED)."""
    guard_spike_window: int = 50
    """The recent losses whose mean and std the spike guard compares a loss with (at least 2)."""

    def validate(self) -> None:
        _positive(self, "steps", "batch_size", "seq_len", "eval_every", "eval_batch_size", "log_every")
        if self.loss_chunk_tokens < 0:
            raise ValueError(f"train.loss_chunk_tokens={self.loss_chunk_tokens} must be >= 0 (0: off; try 4096)")
        _nonnegative(self, "tokens", "micro_batch_size", "ckpt_every", "seed", "probe_every", "sharpness_every")
        if self.seed >= SEED_LIMIT:
            raise ValueError(f"train.seed={self.seed} must be below 2**63 = {SEED_LIMIT:,}")
        for name in ("steps", "tokens"):  # int64 counters (the sampler's sample index, the checkpoint's step)
            if getattr(self, name) >= COUNT_LIMIT:
                raise ValueError(f"train.{name}={short(getattr(self, name))} must be below 2**63 = {COUNT_LIMIT:,}")
        if self.threads < 0:
            raise ValueError(f"train.threads={self.threads} must be >= 0 (0: every CPU this process may use)")
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
        if not 0 <= self.peak_flops < math.inf:  # NaN fell back to the measured peak and inf gave an mfu of 0
            raise ValueError(f"train.peak_flops={self.peak_flops} must be finite and >= 0 (0: measured or the GPU's "
                             f"spec figure)")


@dataclass
class RunConfig:
    """Everything one run needs; stored as the run directory's ``config.yaml``."""

    preset: str = "small"
    """The model preset the model section starts from (presets.py; `scalevec info` lists them)."""
    strategy: str = "baseline"
    """The strategy the scale section starts from: a STRATEGIES name (DESIGN.md §3) or a sweep variant's label."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model's shape (DESIGN.md §2)."""
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    """The scale-vector strategy's switches (DESIGN.md §3)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer (DESIGN.md §5)."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The lr schedule (DESIGN.md §7)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The corpus, tokenizer and validation split (DESIGN.md §8)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop (DESIGN.md §8)."""

    def validate(self) -> None:
        for part in (self.model, self.scale, self.optim, self.schedule, self.data, self.train):
            part.validate()
        checkpoint_blocks(self.train.activation_checkpointing, self.model.n_layers)  # ValueError if malformed
        if self.train.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"train.seq_len={self.train.seq_len} exceeds the model's max_seq_len={self.model.max_seq_len}; "
                f"set train.seq_len={self.model.max_seq_len} or less (train: --seq-len; convert and the rest: the "
                f"key=value) or raise model.max_seq_len"
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


SEED_LIMIT = 2**63  # seeds are below it: torch's generators take a 64-bit seed, and derived seeds stay below 2**64
COUNT_LIMIT = 2**63  # train.steps and train.tokens are below it: int64 counters
TENSOR_LIMIT = 2**60  # values of a model's largest weight: 8 bytes each stay below torch's 2**63-byte storage

# How a run executes, not what it computes: these may differ when a run is resumed or a sweep is rerun
# (DESIGN.md §8: the same global batch gives the same losses on 1 or N processes; the thread count and
# compile change the last bits of fp32 sums, which meta.json records, not the experiment).
EXECUTION_FIELDS = ("train.dist", "train.device", "train.compile", "train.tracker", "train.threads", "train.ckpt_every")


def _positive(obj: Any, *names: str) -> None:
    section = type(obj).__name__.replace("Config", "").lower()
    for name in names:
        value = getattr(obj, name)
        if not is_int(value, least=1):
            raise ValueError(f"{section}.{name}={value!r} must be a positive integer")


def _nonnegative(obj: Any, *names: str) -> None:
    """Raise naming the first of ``names`` below 0, NaN or infinite (0 means off or automatic for each)."""
    section = type(obj).__name__.replace("Config", "").lower()
    for name in names:
        value = getattr(obj, name)
        if not value >= 0:  # NaN too
            raise ValueError(f"{section}.{name}={value!r} must be >= 0")
        if value == math.inf:
            raise ValueError(f"{section}.{name}={value!r} must be finite")


__all__ = [
    "MoEConfig", "RopeScalingConfig", "Derived", "ModelConfig", "SCALE_CHOICES", "STRATEGIES", "PRESET_NAMES",
    "ScaleConfig", "OptimConfig", "ScheduleConfig", "DataConfig", "VAL_SPLITS", "VAL_WINDOWS", "COMPILE_CHOICES",
    "normalize_compile", "TrainConfig", "RunConfig", "checkpoint_blocks", "EXECUTION_FIELDS", "SEED_LIMIT",
]
