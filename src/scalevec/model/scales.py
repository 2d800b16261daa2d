"""The research object: normalization, scale vectors, and the linear maps that read a normalized input.

DESIGN.md §1 and §3. A normalization layer is ``γ ⊙ n(x)``: ``n`` is RMSNorm without affine and γ a
learnable scale vector. This module holds, in reading order:

1. **The formulas**, as plain torch (``rms_norm``, ``or_gamma``, ``er_gamma``, ``fold_weight``,
   ``scaled_linear``, ``dnp_swiglu``), collected in ``PLAIN``. ``kernels.FAST`` is the same five functions
   with hand-written backward passes (same values and gradients, less time and memory; tested against
   these in tests/test_kernels.py and tests/test_scale_plan.py). Which one a model uses is chosen when it
   is built (``ScalePlan.fast``), never in ``forward``.
2. **The plan**: ``scale_plan(ScaleConfig, ModelConfig)`` is the one place that reads the strategy's
   switches. It says which scale vector sits where (an Input-Norm's own γ, a branch's input side γ_b,
   a branch's output side s, an Output-Norm's γ), its role, its parameterization and its weight decay,
   and which branch outputs DNP normalizes. Dense blocks, MoE experts, fold and export consume it.
3. **The modules**, one small class per parameterization (``DirectScale``, ``ORScale``, ``ERScale``) and
   per placement (``Branch`` / ``NormedBranch``, ``NormLinear`` / ``SwiGLUProj`` / ``DNPSwiGLUProj``,
   ``Projection`` for the residual writers W_o and W_down, ``OutputNorm``; MoE's ``ExpertProj`` /
   ``NormedExpertProj`` live in moe.py), chosen by the plan::

    x ──n──> u ──(γ)──┬──(γ_q)── W_q ──(s_q)──> q        scale=shared: γ only
                      ├──(γ_k)── W_k ──(s_k)──> k        scale=branch (HG): γ_q, γ_k, γ_v only
                      └──(γ_v)── W_v ──(s_v)──> v        placement=dual (DP): s_* too
                                                          placement=dual_norm (DNP): s ⊙ n(W ...) on gate/up
    attention(q, k, v) ── W_o ──(s_o)──> (+ x)             dual_sites o, down (opt-in): s on the residual writers

Each branch computes ``y_b = s_b ⊙ [n](W_b diag(γ γ_b) u)``. Every parameter gets its role (DESIGN.md §5)
where it is made, by ``params.new_param`` (roles, inits and counts are ``params.py``'s). This module does not
build a Transformer (``transformer.py``) nor optimizers (``training/optim.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalevec.config import ModelConfig, ScaleConfig
from scalevec.model.params import const_init, new_param, normal_init

# ============================================================================================ the formulas


def rms_norm(x: Tensor, eps: float, weight: Tensor | None = None) -> Tensor:
    """``n(x) = x / sqrt(mean(x², -1) + eps)`` computed in float32 (float64 stays float64), cast back to
    ``x.dtype`` (DESIGN.md §1), then times ``weight`` (a vector over the last dim) if given. Shape kept.
    DNP's output normalization is this function too: ``s ⊙ n(y) = rms_norm(y, eps, s)``."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y * weight.to(y.dtype) if weight is not None else y


def or_gamma(magnitude: Tensor, direction: Tensor) -> Tensor:
    """OR (DESIGN.md §3 ``magdir``): ``γ = β · α / rms(α)``, rms over the last dim. ``β: (..., 1)``,
    ``α: (..., d)`` -> ``(..., d)``."""
    return magnitude * (direction * torch.rsqrt(direction.pow(2).mean(-1, keepdim=True)))


def er_gamma(log_magnitude: Tensor, direction: Tensor) -> Tensor:
    """ER (DESIGN.md §3 ``magdir_exp``): ``γ = exp(b) · α / rms(α)``, rms over the last dim."""
    return log_magnitude.exp() * (direction * torch.rsqrt(direction.pow(2).mean(-1, keepdim=True)))


def fold_weight(w: Tensor, c: Tensor | None = None, s: Tensor | None = None) -> Tensor:
    """The fold ``diag(s) W diag(c)`` (DESIGN.md §1, §4): ``W: (..., d_out, d_in)`` (a matrix or an expert
    bank ``(E, d_out, d_in)``), input-side ``c: (..., d_in)``, output-side ``s: (..., d_out)``; None counts
    as ones. ``u (diag(s) W diag(c))ᵀ = s ⊙ (W (c ⊙ u))``. The only place this product is written."""
    if c is not None:
        w = w * c.to(w.dtype).unsqueeze(-2)
    if s is not None:
        w = s.to(w.dtype).unsqueeze(-1) * w
    return w


def scaled_linear(u: Tensor, w: Tensor, c: Tensor | None = None, s: Tensor | None = None) -> Tensor:
    """``s ⊙ (W (c ⊙ u))``, ``u: (..., d_in)``, ``W: (d_out, d_in)`` -> ``(..., d_out)``: one branch's linear
    map with its scale vectors on the activations (§3's reference form). The fast path
    (``kernels.folded_linear``) computes ``u fold_weight(W, c, s)ᵀ`` instead: the same function."""
    if c is not None:
        u = u * c.to(u.dtype)
    y = F.linear(u, w.to(u.dtype))
    return y * s.to(y.dtype) if s is not None else y


def dnp_swiglu(yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None, eps: float) -> Tensor:
    """SwiGLU over DNP outputs (DESIGN.md §3 ``dual_norm``): ``silu(z_g) ⊙ z_u`` with ``z = s ⊙ n(y)`` for a
    normalized branch (its ``s`` given) and ``z = y`` otherwise; ``y`` are the raw ``W diag(γ) u``."""
    zg = rms_norm(yg, eps, sg) if sg is not None else yg
    zu = rms_norm(yu, eps, su) if su is not None else yu
    return F.silu(zg) * zu


@dataclass(frozen=True)
class Ops:
    """One implementation of each formula above, all with the signatures of the plain ones. ``PLAIN`` (here)
    or ``kernels.FAST``; a model is built with one of them (``ScalePlan.fast``)."""

    name: str
    rms_norm: Callable[..., Tensor]
    or_gamma: Callable[[Tensor, Tensor], Tensor]
    er_gamma: Callable[[Tensor, Tensor], Tensor]
    linear: Callable[..., Tensor]  # (u, W, c, s) -> s ⊙ (W (c ⊙ u))
    dnp_swiglu: Callable[..., Tensor]
    matmul_input: Callable[[Tensor], Tensor] = lambda u: u  # a norm's output as its linear maps read it


PLAIN = Ops("plain", rms_norm, or_gamma, er_gamma, scaled_linear, dnp_swiglu)

# The one DNP refusal (fold, export, conversion say it with these words).
DNP_CANNOT_FOLD = "DNP normalizes the outputs of W_gate/W_up, which no linear map can absorb"


def refuse_unfoldable(names: list[str]) -> None:
    """Raise ``ValueError`` naming the DNP-normalized projections ``names``, if any: they cannot fold (§4)."""
    if names:
        raise ValueError(f"cannot fold {', '.join(names)}: {DNP_CANNOT_FOLD}")


def multiply(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """``a ⊙ b`` of two optional scale vectors (None counts as ones): a branch's γ_b times its norm's γ."""
    return b if a is None else a if b is None else a * b


# ============================================================================================ the plan


def decayed_scale_roles(scfg: ScaleConfig) -> frozenset[str]:
    """The scale roles that get weight decay under the ``wd`` switch (DESIGN.md §3, §5): ``input`` (IWD) the
    foldable ``input_scale``, ``output`` the ``output_scale``, ``all`` both; under OR/ER that is the magnitude
    β (or b) and not the direction α (``scale_direction``; our choice): γ does not depend on α's norm, so
    decay on α changes only α's effective learning rate, not γ. ``direction`` is the other answer, as a
    variant: decay on every α and on no magnitude."""
    return frozenset({"none": (), "input": ("input_scale",), "output": ("output_scale",),
                      "all": ("input_scale", "output_scale"), "direction": ("scale_direction",)}[scfg.wd])


@dataclass(frozen=True)
class ScaleSpec:
    """One scale vector of the plan: its parameterization class (``DirectScale``, ``ORScale``, ``ERScale``),
    its role (``input_scale`` if it folds into an adjacent linear map, else ``output_scale``, §1), whether
    its magnitude (or itself, if direct) gets weight decay, whether it has one row per MoE expert, and (OR/ER)
    the constant its direction α starts at."""

    kind: type[ScaleVector]
    role: str
    weight_decay: bool
    per_expert: bool = False
    direction_init: float = 1.0

    def build(self, shape: tuple[int, ...], ops: Ops) -> ScaleVector:
        if issubclass(self.kind, MagDirScale):
            return self.kind(shape, self.role, ops, self.direction_init)
        return self.kind(shape, self.role, ops)


@dataclass(frozen=True)
class BranchPlan:
    """One linear map reading a normalized input, ``y = s ⊙ [n](W diag(γ_b) u)``: its input-side γ_b (HG), its
    output-side s (DP/DNP) and whether DNP normalizes ``W diag(γ_b) u`` before s."""

    gamma: ScaleSpec | None = None
    s: ScaleSpec | None = None
    normalized: bool = False


@dataclass(frozen=True)
class NormPlan:
    """An Input-Norm: its own γ (``scale=shared``) and the branches that read it, by module name."""

    gamma: ScaleSpec | None
    branches: dict[str, BranchPlan] = field(default_factory=dict)

    @property
    def normalized(self) -> bool:
        """True if DNP normalizes the output of one of the branches."""
        return any(b.normalized for b in self.branches.values())


@dataclass(frozen=True)
class OutputNormPlan:
    """An Output-Norm (QK-norm, peri): its γ, or None (no scale vector, strategy ``none``)."""

    gamma: ScaleSpec | None


@dataclass(frozen=True)
class ScalePlan:
    """Where every scale vector of a model sits (DESIGN.md §3), made by ``scale_plan``.

    ``attn``: the attention's Input-Norm (branches q, k, v). ``mlp``: the dense MLP's (gate, up). ``moe``:
    the MoE MLP's (router, experts.gate, experts.up and, with shared experts, shared_experts.gate/up), or
    None without MoE. ``head``: the final norm (lm_head). ``qk_norm`` / ``peri``: the Output-Norms of
    QK-norm and of the peri layout, or None where the model has none. ``fast``: build with the fast
    kernels (``kernels.FAST``, ``apply='weight'``) or with the plain formulas (``PLAIN``, ``'activation'``).
    ``fused`` (``apply='fused'``, opt-in): also the fused projections and MLP (``model/fused.py``), equal to
    the fast path to rounding, not to the bit.

    The linear maps that read no Input-Norm, the residual writers, are planned like the branches
    (``Projection``, ``moe.ExpertProj``): ``o`` (W_o), ``down`` (the dense MLP's and the shared experts'
    W_down) and ``expert_down`` (the experts' down bank, s per expert). An empty ``BranchPlan`` is a plain
    ``y = W x``.
    """

    attn: NormPlan
    mlp: NormPlan
    moe: NormPlan | None
    head: NormPlan
    qk_norm: OutputNormPlan | None
    peri: OutputNormPlan | None
    fast: bool
    fused: bool = False
    o: BranchPlan = BranchPlan()
    down: BranchPlan = BranchPlan()
    expert_down: BranchPlan = BranchPlan()

    def sites(self) -> list[tuple[str, str, ScaleSpec]]:
        """``(site, side, spec)`` for every scale vector of one block and the head: ``side`` is ``norm`` (the
        Input-Norm's γ), ``input`` (a branch's γ_b), ``output`` (a branch's s) or ``output_norm``."""
        rows = []
        for where, norm in (("attn", self.attn), ("mlp", self.mlp), ("moe", self.moe), ("head", self.head)):
            if norm is None:
                continue
            if norm.gamma is not None:
                rows.append((where, "norm", norm.gamma))
            for name, b in norm.branches.items():
                rows += [(f"{where}.{name}", side, spec) for side, spec in (("input", b.gamma), ("output", b.s))
                         if spec is not None]
        writers = [("attn.o", self.o), ("mlp.down", self.down)]
        if self.moe is not None:
            writers += [("moe.experts.down", self.expert_down)]
            if any(name.startswith("shared_experts.") for name in self.moe.branches):
                writers += [("moe.shared_experts.down", self.down)]
        for site, b in writers:
            rows += [(site, side, spec) for side, spec in (("input", b.gamma), ("output", b.s)) if spec is not None]
        for where, out in (("qk_norm", self.qk_norm), ("peri", self.peri)):
            if out is not None and out.gamma is not None:
                rows.append((where, "output_norm", out.gamma))
        return rows


def _spec(scfg: ScaleConfig, role: str, per_expert: bool = False) -> ScaleSpec:
    return ScaleSpec(SCALE_KINDS[scfg.param], role, role in decayed_scale_roles(scfg), per_expert, scfg.direction_init)


def branch_plan(scfg: ScaleConfig, site: str, hg: bool, expert: bool = False) -> BranchPlan:
    """The ``BranchPlan`` of projection ``site`` (q, k, v, gate, up, router, lm_head; the writers o, down) under
    ``scfg``; ``hg``: it gets its own γ_b; ``expert``: it is a bank of MoE experts (s per expert, γ_b per expert if
    ``per_expert``)."""
    has_scale = scfg.scale != "none" and not scfg.folded
    dual = has_scale and scfg.placement != "input" and site in scfg.dual_sites
    normalized = dual and scfg.placement == "dual_norm" and site in scfg.norm_sites
    # DNP's s on W_gate feeds SiLU: an Output-Norm scale; on W_up it folds into W_down; DP's s into W's rows
    s_role = "output_scale" if normalized and site == "gate" else "input_scale"
    return BranchPlan(gamma=_spec(scfg, "input_scale", expert and scfg.per_expert) if hg else None,
                      s=_spec(scfg, s_role, expert) if dual else None, normalized=normalized)


def norm_plan(scfg: ScaleConfig, sites: dict[str, str], experts: tuple[str, ...] = ()) -> NormPlan:
    """The ``NormPlan`` of an Input-Norm read by ``sites`` (``{branch module name: projection site}``);
    ``experts``: the names among them that are MoE expert banks. HG applies where two or more branches read
    the norm; otherwise (and under ``scale=shared``) the norm has its own γ."""
    has_scale = scfg.scale != "none" and not scfg.folded
    hg = has_scale and scfg.scale == "branch" and len(sites) > 1
    return NormPlan(gamma=_spec(scfg, "input_scale") if has_scale and not hg else None,
                    branches={name: branch_plan(scfg, site, hg, name in experts) for name, site in sites.items()})


def scale_plan(scfg: ScaleConfig, cfg: ModelConfig) -> ScalePlan:
    """The placement plan of strategy ``scfg`` in a model of shape ``cfg`` (DESIGN.md §3's table). With its two
    helpers ``norm_plan`` and ``branch_plan``, the only reader of the strategy's switches:

    - ``scale``: ``shared`` puts γ on each Input-Norm; ``branch`` (HG) one γ_b per branch instead, where two or
      more branches read the norm (the final norm feeds only the LM head: it keeps its own γ); ``none`` no
      scale vector at all, Output-Norms included.
    - ``placement``: ``dual`` (DP) adds an output-side s on the ``dual_sites`` among q, k, v, gate, up (MoE:
      gate and up of the experts and of the shared experts; never the router or the LM head) and, opt-in, on
      the residual writers o and down (MoE: every expert's down, s per expert, and the shared experts'); a
      writer's s folds into W's rows, it never gets a γ_b (it reads no norm); ``dual_norm``
      (DNP) also normalizes the outputs of ``norm_sites`` before s. DNP's s on gate feeds SiLU: an
      ``output_scale``; on up it multiplies the SwiGLU product that W_down reads: an ``input_scale``.
    - ``param``: ``direct`` / ``magdir`` (OR) / ``magdir_exp`` (ER) for every vector.
    - ``wd``: ``decayed_scale_roles``. ``per_expert``: MoE gate/up γ_b has one row per expert.
    - ``folded`` (the output of ``fold_scales``): no Input-Norm scales; Output-Norms keep a direct γ.
    - ``apply``: ``fast`` (``weight``) or the plain formulas (``activation``); ``fused``: fast, and the fused
      projections and MLP of ``model/fused.py`` (``fused.FusedNormLinear``, ``transformer.FusedMLP``).
    """
    moe = None
    if cfg.moe is not None:
        shared = {f"shared_experts.{s}": s for s in ("gate", "up")} if cfg.moe.n_shared_experts else {}
        moe = norm_plan(scfg, {"router": "router", "experts.gate": "gate", "experts.up": "up", **shared},
                        experts=("experts.gate", "experts.up"))
    if scfg.folded:  # fold_scales' output keeps QK-norm's γ as a plain vector (Qwen3's q_norm / k_norm)
        out_gamma = ScaleSpec(DirectScale, "output_scale", "output_scale" in decayed_scale_roles(scfg))
    else:
        out_gamma = _spec(scfg, "output_scale") if scfg.scale != "none" else None
    return ScalePlan(
        attn=norm_plan(scfg, {"q": "q", "k": "k", "v": "v"}),
        mlp=norm_plan(scfg, {"gate": "gate", "up": "up"}),
        moe=moe,
        head=norm_plan(scfg, {"lm_head": "lm_head"}),
        qk_norm=OutputNormPlan(out_gamma) if cfg.qk_norm else None,
        peri=OutputNormPlan(out_gamma) if cfg.layout == "peri" else None,
        fast=scfg.apply in ("weight", "fused"),
        fused=scfg.apply == "fused",
        o=branch_plan(scfg, "o", hg=False),
        down=branch_plan(scfg, "down", hg=False),
        expert_down=branch_plan(scfg, "down", hg=False, expert=True),
    )


# ============================================================================================ scale vectors


class ScaleVector(nn.Module):
    """A learnable scale γ of shape ``shape`` (usually ``(d,)``; ``(E, d)`` per expert), γ = 1 at init.

    ``forward()`` returns the effective γ, shape ``shape``. ``role`` is ``input_scale`` (foldable) or
    ``output_scale`` (not), by the §1 rule; it is the role of γ itself (direct) or of its magnitude (OR, ER).
    Subclasses: ``DirectScale``, ``ORScale``, ``ERScale``; ``param`` names the ``ScaleConfig.param`` value.
    """

    param: str

    def __init__(self, shape: tuple[int, ...], role: str, ops: Ops = PLAIN):
        super().__init__()
        assert role in ("input_scale", "output_scale"), role
        self.shape, self.ops = tuple(shape), ops

    def forward(self) -> Tensor:
        # set by ``batched_scales`` for the duration of one forward; traced code (torch.compile) computes its own
        cached = None if torch.compiler.is_compiling() else self.__dict__.get("_gamma")
        return cached if cached is not None else self.gamma()

    def gamma(self) -> Tensor:
        raise NotImplementedError

    def assign(self, gamma: Tensor) -> None:
        """Set the parameters so that ``forward()`` is ``gamma`` (broadcast to ``shape``); no autograd."""
        raise NotImplementedError


class DirectScale(ScaleVector):
    """γ is the parameter ``weight`` (role ``role``, init 1)."""

    param = "direct"

    def __init__(self, shape: tuple[int, ...], role: str, ops: Ops = PLAIN):
        super().__init__(shape, role, ops)
        new_param(self, "weight", self.shape, role, const_init(1.0))

    def gamma(self) -> Tensor:
        return self.weight

    def assign(self, gamma: Tensor) -> None:
        with torch.no_grad():
            self.weight.copy_(gamma.to(torch.float32).expand(self.shape))


class MagDirScale(ScaleVector):
    """γ = m · α / rms(α) with a magnitude (one per row, role ``role``) and a direction α (``scale_direction``,
    init ``direction_init``, 1 by default: ``ScaleConfig.direction_init``). ``ORScale``: m = β; ``ERScale``:
    m = exp(b). ``parts()`` is ``(magnitude parameter, α)``."""

    MAGNITUDE: str  # the magnitude parameter's name
    MAGNITUDE_INIT: float

    def __init__(self, shape: tuple[int, ...], role: str, ops: Ops = PLAIN, direction_init: float = 1.0):
        super().__init__(shape, role, ops)
        self.direction_init = direction_init
        new_param(self, self.MAGNITUDE, (*self.shape[:-1], 1), role, const_init(self.MAGNITUDE_INIT))
        new_param(self, "direction", self.shape, "scale_direction", const_init(direction_init))

    def parts(self) -> tuple[Tensor, Tensor]:
        return getattr(self, self.MAGNITUDE), self.direction

    def formula(self, magnitude: Tensor, direction: Tensor) -> Tensor:
        raise NotImplementedError

    def gamma(self) -> Tensor:
        return self.formula(*self.parts())

    def assign(self, gamma: Tensor) -> None:
        """α = direction_init · γ / rms(γ) and the magnitude from rms(γ) (rms over the last dim). Raises
        ``ValueError`` for a γ whose rms is 0 (it has no magnitude-direction form)."""
        g = gamma.to(torch.float32).expand(self.shape)
        rms = g.pow(2).mean(-1, keepdim=True).sqrt()
        if not bool((rms > 0).all()):
            raise ValueError("a norm weight is all zeros: it has no magnitude-direction form (OR/ER)")
        with torch.no_grad():
            self.direction.copy_(g / rms * self.direction_init)
            getattr(self, self.MAGNITUDE).copy_(self.magnitude_of(rms))

    def magnitude_of(self, rms: Tensor) -> Tensor:
        raise NotImplementedError


class ORScale(MagDirScale):
    """OR: ``γ = β · α / rms(α)``, ``magnitude`` β init 1 (``or_gamma``)."""

    param, MAGNITUDE, MAGNITUDE_INIT = "magdir", "magnitude", 1.0

    def formula(self, magnitude: Tensor, direction: Tensor) -> Tensor:
        return self.ops.or_gamma(magnitude, direction)

    def magnitude_of(self, rms: Tensor) -> Tensor:
        return rms


class ERScale(MagDirScale):
    """ER: ``γ = exp(b) · α / rms(α)``, ``log_magnitude`` b init 0 (``er_gamma``)."""

    param, MAGNITUDE, MAGNITUDE_INIT = "magdir_exp", "log_magnitude", 0.0

    def formula(self, magnitude: Tensor, direction: Tensor) -> Tensor:
        return self.ops.er_gamma(magnitude, direction)

    def magnitude_of(self, rms: Tensor) -> Tensor:
        return rms.log()


SCALE_KINDS: dict[str, type[ScaleVector]] = {"direct": DirectScale, "magdir": ORScale, "magdir_exp": ERScale}


@contextmanager
def batched_scales(module: nn.Module):
    """Within the block, every OR/ER vector of ``module`` returns a γ computed once, together with the others
    of its class and width: one formula call (one autograd node on the fast path) on their magnitudes and
    directions concatenated row-wise, instead of one per vector (``unified`` has ~10 per block; each costs
    more in dispatch, kernel launches and autograd bookkeeping than in arithmetic, docs/performance.md).
    ``Transformer.forward`` batches the whole model's vectors this way, once per step; a block batches its own
    where the model does not (checkpointed blocks, a chunked loss: their recomputation in the backward must
    repeat the forward's ops); inside a batch already open, nothing is redone.

    The same numbers to the bit, values and gradients: every op of the formula is elementwise or a reduction
    over the last dim, which torch computes row by row the same way whatever the number of rows
    (tests/test_scales_batched.py checks it on the models). Vectors alone in their group, direct γ, traced
    code (``torch.compile`` fuses these small ops itself) and parameters sharded by FSDP2 (a DTensor outside
    its block's forward) are left as they are. The cache is dropped on exit, so calls outside the block
    (telemetry, fold) compute γ afresh.
    """
    groups = module.__dict__.get("_magdir_groups")
    if groups is None:  # the module tree does not change: group its vectors once
        by_kind: dict[tuple[type, int], list[MagDirScale]] = {}
        for m in module.modules():
            if isinstance(m, MagDirScale):
                by_kind.setdefault((type(m), m.shape[-1]), []).append(m)
        groups = module.__dict__["_magdir_groups"] = [g for g in by_kind.values() if len(g) > 1]
    if (not groups or torch.compiler.is_compiling() or "_gamma" in groups[0][0].__dict__
            or _sharded(groups[0][0].direction)):
        yield
        return
    try:
        for vectors in groups:
            parts = [v.parts() for v in vectors]
            d = vectors[0].shape[-1]
            rows = [a.numel() // d for _, a in parts]
            mags = torch.cat([m.reshape(-1, 1) for m, _ in parts])
            gammas = vectors[0].formula(mags, torch.cat([a.reshape(-1, d) for _, a in parts])).split(rows)
            for v, g in zip(vectors, gammas):
                v.__dict__["_gamma"] = g.view(v.shape)
        yield
    finally:
        for vectors in groups:
            for v in vectors:
                v.__dict__.pop("_gamma", None)


def _sharded(p: Tensor) -> bool:
    """True for a parameter sharded by FSDP2 (a DTensor): outside its block's forward it holds one shard."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)


def gamma_of(vector: ScaleVector | None) -> Tensor | None:
    """The effective γ of an optional scale vector (None where the plan put none)."""
    return vector() if vector is not None else None


# ============================================================================================ placements


class Branch(nn.Module):
    """One linear map reading a normalized input: ``y = s ⊙ (W diag(γ_b) u)`` (DESIGN.md §3), every vector foldable.

    ``weight: (d_out, d_in)``; ``in_scale`` γ_b ``(d_in,)`` (HG) or None; ``out_scale`` s ``(d_out,)`` (DP) or None.
    ``linear(u: (..., d_in)) -> (..., d_out)``; ``finish(y)`` is the output side that is not in the weight (none
    here; ``NormedBranch``: DNP's normalization).
    """

    out_norm = False  # DNP's output normalization (``NormedBranch``): for readers (fold, export), never for forward

    def __init__(self, d_in: int, d_out: int, plan: BranchPlan, eps: float, ops: Ops = PLAIN, role: str = "matrix",
                 std: float = 0.02):
        super().__init__()
        self.eps, self.ops = eps, ops
        new_param(self, "weight", (d_out, d_in), role, normal_init(std))
        self.in_scale = plan.gamma.build((d_in,), ops) if plan.gamma is not None else None
        self.out_scale = plan.s.build((d_out,), ops) if plan.s is not None else None

    def fold_vectors(self) -> tuple[Tensor | None, Tensor | None]:
        """``(γ_b or None, s or None)``: this branch's vectors that fold into W."""
        return gamma_of(self.in_scale), gamma_of(self.out_scale)

    def linear(self, u: Tensor) -> Tensor:
        return self.ops.linear(u, self.weight, *self.fold_vectors())

    def finish(self, y: Tensor) -> Tensor:
        return y

    def dnp_scale(self) -> Tensor | None:
        """The s that DNP applies after its normalization (``NormedBranch``); None here."""
        return None

    def folded_weight(self, shared: Tensor | None = None) -> Tensor:
        """``diag(s) W diag(γ_b ⊙ shared)`` with the vectors that fold (``shared``: the norm's γ)."""
        g, s = self.fold_vectors()
        return fold_weight(self.weight, multiply(g, shared), s)


class Projection(Branch):
    """A linear map that reads no Input-Norm, planned like a branch: the residual writers W_o and W_down (dense
    MLP, shared experts; the experts' bank is ``moe.ExpertProj``). ``forward(x: (..., d_in)) -> (..., d_out)``,
    ``s ⊙ (W x)`` with the vectors of its ``BranchPlan`` (``ScalePlan.o``, ``.down``); an empty plan is exactly
    ``x Wᵀ``. Its vectors fold into W, so it carries its own fold protocol (``folded_state``, ``fold.py``)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def folded_state(self) -> dict[str, Tensor]:
        """Local state of the equivalent scale-free map: ``{"weight": diag(s) W}`` (§4)."""
        return {"weight": self.folded_weight()}


class NormedBranch(Branch):
    """DNP's branch (DESIGN.md §3 ``dual_norm``): ``y = s ⊙ n(W diag(γ_b) u)``, n over d_out; s acts after the
    norm, so it does not fold (``fold_vectors`` leaves it out, ``finish`` applies it)."""

    out_norm = True

    def fold_vectors(self) -> tuple[Tensor | None, Tensor | None]:
        return gamma_of(self.in_scale), None

    def finish(self, y: Tensor) -> Tensor:
        return self.ops.rms_norm(y, self.eps, self.out_scale())

    def dnp_scale(self) -> Tensor | None:
        return self.out_scale()


def make_branch(d_in: int, d_out: int, plan: BranchPlan, eps: float, ops: Ops = PLAIN, role: str = "matrix",
                std: float = 0.02) -> Branch:
    """The ``Branch`` or ``NormedBranch`` (DNP) of ``plan``."""
    return (NormedBranch if plan.normalized else Branch)(d_in, d_out, plan, eps, ops, role, std)


class NormLinear(nn.Module):
    """An Input-Norm and the linear maps (branches) that read it (DESIGN.md §1, §3).

    ``norm(x: (..., d_in)) -> u``: ``γ ⊙ n(x)`` (γ: the norm's own scale, in the norm's own pass).
    ``forward(u) -> list of (..., d_out_b)``, one per branch in ``outputs`` order:
    ``s_b ⊙ [n](W_b diag(γ_b) u)``. ``outputs``: ``{branch name: d_out}``, e.g. ``{"q": 512, "k": 128,
    "v": 128}``, the branch names of ``plan`` (a ``NormPlan``). ``role``: the branches' weight role
    (``matrix``, ``lm_head``).
    """

    def __init__(self, d_in: int, outputs: dict[str, int], plan: NormPlan, eps: float, ops: Ops = PLAIN,
                 role: str = "matrix", std: float = 0.02):
        super().__init__()
        assert list(outputs) == list(plan.branches), (list(outputs), list(plan.branches))
        self.eps, self.ops = eps, ops
        self.scale = plan.gamma.build((d_in,), ops) if plan.gamma is not None else None
        self.branches = nn.ModuleDict({name: make_branch(d_in, d_out, plan.branches[name], eps, ops, role, std)
                                       for name, d_out in outputs.items()})

    def norm(self, x: Tensor) -> Tensor:
        return self.ops.matmul_input(self.ops.rms_norm(x, self.eps, gamma_of(self.scale)))

    def project(self, u: Tensor) -> list[Tensor]:
        """``s ⊙ (W diag(γ_b) u)`` of every branch, before DNP's normalization (s left out where DNP has it)."""
        return [b.linear(u) for b in self.branches.values()]

    def forward(self, u: Tensor) -> list[Tensor]:
        return [b.finish(y) for b, y in zip(self.branches.values(), self.project(u))]

    def folded_state(self) -> dict[str, Tensor]:
        """Local state of the equivalent scale-free map: ``{"branches.<b>.weight": diag(s) W diag(γ γ_b)}`` (§4).

        Raises ``ValueError`` naming the branches whose output normalization (DNP) cannot fold.
        """
        refuse_unfoldable([name for name, b in self.branches.items() if b.out_norm])
        shared = gamma_of(self.scale)
        return {f"branches.{name}.weight": b.folded_weight(shared) for name, b in self.branches.items()}


class SwiGLUProj(NormLinear):
    """The MLP's Input-Norm with branches ``gate`` and ``up``; ``forward(u) -> silu(gate) ⊙ up`` (DESIGN.md §2)."""

    def forward(self, u: Tensor) -> Tensor:
        gate, up = self.project(u)
        return F.silu(gate) * up


class DNPSwiGLUProj(SwiGLUProj):
    """``SwiGLUProj`` under DNP: ``silu(z_gate) ⊙ z_up``, ``z = s ⊙ n(W diag(γ_b) u)`` on the normalized branches,
    the normalizations fused into the SwiGLU (``ops.dnp_swiglu``: on the fast path it keeps less for backward)."""

    def forward(self, u: Tensor) -> Tensor:
        gate, up = self.branches.values()
        yg, yu = self.project(u)
        return self.ops.dnp_swiglu(yg, yu, gate.dnp_scale(), up.dnp_scale(), self.eps)


def swiglu_proj(d_in: int, d_ff: int, plan: NormPlan, eps: float, ops: Ops = PLAIN, std: float = 0.02) -> SwiGLUProj:
    """The ``SwiGLUProj`` of ``plan``, or its DNP form where a branch is normalized."""
    return (DNPSwiGLUProj if plan.normalized else SwiGLUProj)(d_in, {"gate": d_ff, "up": d_ff}, plan, eps, ops, std=std)


class OutputNorm(nn.Module):
    """An Output-Norm (DESIGN.md §1): ``γ ⊙ n(x)`` whose output feeds no linear map (QK-norm, peri).

    ``forward(x: (..., d)) -> (..., d)``. γ (role ``output_scale``) as ``plan`` (an ``OutputNormPlan``) says:
    absent under strategy ``none``, a direct vector in a folded model.
    """

    def __init__(self, d: int, plan: OutputNormPlan, eps: float, ops: Ops = PLAIN):
        super().__init__()
        self.eps, self.ops = eps, ops
        self.scale = plan.gamma.build((d,), ops) if plan.gamma is not None else None

    def forward(self, x: Tensor) -> Tensor:
        return self.ops.rms_norm(x, self.eps, gamma_of(self.scale))

    def folded_state(self) -> dict[str, Tensor]:
        """The γ a folded model keeps in this slot (QK-norm: Qwen3's q_norm/k_norm): materialized, or 1."""
        return {"scale.weight": self.scale()} if self.scale is not None else {}


def scale_vectors(model: nn.Module) -> dict[str, Tensor]:
    """``{module name: effective γ (detached)}`` for every ``ScaleVector`` of ``model`` (for telemetry)."""
    with torch.no_grad():
        return {name: m().detach() for name, m in model.named_modules() if isinstance(m, ScaleVector)}


__all__ = [
    "rms_norm", "or_gamma", "er_gamma", "fold_weight", "scaled_linear", "dnp_swiglu", "Ops", "PLAIN",
    "DNP_CANNOT_FOLD", "refuse_unfoldable", "multiply", "decayed_scale_roles", "ScaleSpec", "BranchPlan", "NormPlan",
    "OutputNormPlan", "ScalePlan", "branch_plan", "norm_plan", "scale_plan",
    "ScaleVector", "DirectScale", "MagDirScale", "ORScale", "ERScale", "SCALE_KINDS",
    "batched_scales", "Branch", "Projection", "NormedBranch",
    "make_branch", "NormLinear", "SwiGLUProj", "DNPSwiGLUProj",
    "swiglu_proj", "OutputNorm", "gamma_of", "scale_vectors",
]
