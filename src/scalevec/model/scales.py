"""The research object: normalization, scale vectors, and linear maps that read a normalized input.

DESIGN.md §1 and §3. A normalization layer is ``γ ⊙ n(x)``: ``n`` is RMSNorm without affine and γ a
learnable scale vector. Here γ is a ``ScaleVector`` (direct, magnitude-direction OR, or exponential ER),
and every place where a normalized vector enters linear maps is a ``NormLinear``:

    x ──n──> u ──(γ_shared)──┬──(γ_q)── W_q ──(s_q)──> q        scale=shared: γ_shared only
                             ├──(γ_k)── W_k ──(s_k)──> k        scale=branch (HG): γ_q, γ_k, γ_v only
                             └──(γ_v)── W_v ──(s_v)──> v        placement=dual (DP): s_* too
                                                                 dual_norm (DNP): s ⊙ n(W ...) on gate/up

All of it is the same function as ``y_b = s_b ⊙ [n](W_b diag(γ_shared γ_b) u)``; ``apply='weight'``
computes it with γ_shared inside the norm's own pass and each branch's γ_b, s_b folded into its
weight on the fly, ``apply='activation'`` by multiplying activations (the reference form). The
norm, the folded linear map, OR/ER and DNP's SwiGLU run through ``kernels.py`` (hand-written
backward passes: same function and gradients, less time and memory, docs/performance.md). Parameter roles (DESIGN.md §5)
are assigned here, where the parameters are created, by ``new_param``.

This module does not build a Transformer (``transformer.py``) nor optimizers (``training/optim.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalevec.config import ScaleConfig
from scalevec.model.kernels import dnp_swiglu, folded_linear, magdir, rms_norm
from scalevec.model.params import ROLES  # the one role list (params.py); re-exported here


def new_param(module: nn.Module, name: str, shape: tuple[int, ...], role: str, init: Callable[[Tensor], None]) -> nn.Parameter:
    """Create parameter ``name`` on ``module`` with its role and its initializer (DESIGN.md §5).

    Roles and inits are recorded on the owning module (``module._roles``, ``module._inits``) so that
    they survive wrapping (DDP, FSDP2, compile), which may replace the Parameter objects.
    """
    assert role in ROLES, role
    p = nn.Parameter(torch.empty(shape))
    module.register_parameter(name, p)
    module.__dict__.setdefault("_roles", {})[name] = role
    module.__dict__.setdefault("_inits", {})[name] = init
    return p


def normal_init(std: float) -> Callable[[Tensor], None]:
    return lambda t: nn.init.normal_(t, mean=0.0, std=std)


def const_init(value: float) -> Callable[[Tensor], None]:
    return lambda t: nn.init.constant_(t, value)


def param_roles(model: nn.Module) -> dict[str, str]:
    """``{parameter name: role}`` for every parameter of ``model``, in ``named_parameters`` order.

    Raises ``KeyError`` if a parameter was not created by ``new_param`` (no role).
    """
    modules = dict(model.named_modules())
    roles = {}
    for name, _ in model.named_parameters():
        owner, _, local = name.rpartition(".")
        roles[name] = modules[owner].__dict__.get("_roles", {})[local]
    return roles


def init_params(model: nn.Module) -> None:
    """Initialize every parameter with the init recorded at creation; fails loudly on an unknown one."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, p in model.named_parameters():
            owner, _, local = name.rpartition(".")
            inits = modules[owner].__dict__.get("_inits", {})
            if local not in inits:
                raise KeyError(f"parameter {name} has no initializer; create it with scales.new_param")
            inits[local](p)


class ScaleVector(nn.Module):
    """A learnable scale γ of shape ``shape`` (usually ``(d,)``; ``(E, d)`` per expert), γ = 1 at init.

    Parameterizations (DESIGN.md §3 ``param``):
    - ``direct``: γ is the parameter ``weight`` (role ``role``).
    - ``magdir`` (OR): ``γ = β · α / rms(α)``, ``magnitude`` β (one per vector, role ``role``, init 1)
      and ``direction`` α (role ``scale_direction``, init 1). rms over the last dim.
    - ``magdir_exp`` (ER): ``γ = exp(b) · α / rms(α)``, ``log_magnitude`` b (init 0).
    ``role`` is ``input_scale`` (foldable) or ``output_scale`` (not foldable), by the §1 rule.
    ``forward()`` returns the effective γ, shape ``shape``.
    """

    def __init__(self, shape: tuple[int, ...], param: str, role: str):
        super().__init__()
        assert role in ("input_scale", "output_scale"), role
        self.param = param
        if param == "direct":
            new_param(self, "weight", shape, role, const_init(1.0))
        elif param in ("magdir", "magdir_exp"):
            name, init = ("magnitude", 1.0) if param == "magdir" else ("log_magnitude", 0.0)
            new_param(self, name, (*shape[:-1], 1), role, const_init(init))
            new_param(self, "direction", shape, "scale_direction", const_init(1.0))
        else:
            raise ValueError(f"unknown scale parameterization {param!r}")

    def forward(self) -> Tensor:
        cached = self.__dict__.get("_gamma")  # set by ``batched_scales`` for the duration of one forward
        if cached is not None:
            return cached
        if self.param == "direct":
            return self.weight
        if self.param == "magdir":
            return magdir(self.magnitude, self.direction, exp=False)
        return magdir(self.log_magnitude, self.direction, exp=True)


@contextmanager
def batched_scales(module: nn.Module):
    """Within the block, every OR/ER ``ScaleVector`` of ``module`` returns a γ computed once, together with
    the others of its kind and width: one ``magdir`` call (one autograd node) on their magnitudes and
    directions concatenated row-wise, instead of one per vector (``unified`` has ~10 per block; at ``small``
    each costs more in dispatch and autograd bookkeeping than in arithmetic, docs/performance.md).

    The same numbers to the bit, values and gradients: every op of ``magdir`` is elementwise or a reduction
    over the last dim, which torch computes row by row the same way whatever the number of rows
    (tests/test_scales_batched.py checks it on the models). Vectors alone in their group, ``direct`` γ and
    traced code (``torch.compile`` fuses these small ops itself) are left as they are. The cache is dropped
    on exit, so calls outside the block (telemetry, fold) compute γ afresh.
    """
    groups = module.__dict__.get("_magdir_groups")
    if groups is None:  # the module tree does not change: group its vectors once
        by_kind: dict[tuple[bool, int], list[ScaleVector]] = {}
        for m in module.modules():
            if isinstance(m, ScaleVector) and m.param in ("magdir", "magdir_exp"):
                by_kind.setdefault((m.param == "magdir_exp", m.direction.shape[-1]), []).append(m)
        groups = module.__dict__["_magdir_groups"] = [(exp, g) for (exp, _), g in by_kind.items() if len(g) > 1]
    if not groups or torch.compiler.is_compiling():
        yield
        return
    try:
        for exp, vectors in groups:
            dirs = [v.direction for v in vectors]
            d = dirs[0].shape[-1]
            mags = [(v.log_magnitude if exp else v.magnitude).reshape(-1, 1) for v in vectors]
            rows = [a.numel() // d for a in dirs]
            gammas = magdir(torch.cat(mags), torch.cat([a.reshape(-1, d) for a in dirs]), exp=exp).split(rows)
            for v, a, g in zip(vectors, dirs, gammas):
                v.__dict__["_gamma"] = g.view(a.shape)
        yield
    finally:
        for _, vectors in groups:
            for v in vectors:
                v.__dict__.pop("_gamma", None)


def make_scale(cfg: ScaleConfig, shape: tuple[int, ...], role: str) -> ScaleVector:
    return ScaleVector(shape, cfg.param, role)


class Linear(nn.Module):
    """A bias-free linear map ``y = x Wᵀ``, ``W: (d_out, d_in)``, with its role and init std (§2, §5)."""

    def __init__(self, d_in: int, d_out: int, role: str = "matrix", std: float = 0.02):
        super().__init__()
        new_param(self, "weight", (d_out, d_in), role, normal_init(std))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


class Branch(nn.Module):
    """One linear map reading a normalized input: ``y = s ⊙ [n](W diag(γ) u)`` (DESIGN.md §3).

    ``in_scale`` γ: HG's branch scale (``(d_in,)``), or None. ``out_scale`` s: DP/DNP's output-side scale
    (``(d_out,)``), or None. ``out_norm``: DNP normalizes ``W diag(γ) u`` over d_out before s.
    """

    def __init__(self, d_in: int, d_out: int, cfg: ScaleConfig, role: str, std: float,
                 in_scale: bool, out_scale: bool, out_norm: bool, out_scale_role: str = "input_scale"):
        super().__init__()
        new_param(self, "weight", (d_out, d_in), role, normal_init(std))
        self.in_scale = make_scale(cfg, (d_in,), "input_scale") if in_scale else None
        self.out_scale = make_scale(cfg, (d_out,), out_scale_role) if out_scale else None
        self.out_norm = out_norm

    def fold_vectors(self) -> tuple[Tensor | None, Tensor | None]:
        """This branch's vectors that fold into W: ``(γ or None, s or None)``; s is None under ``out_norm``."""
        g = self.in_scale() if self.in_scale is not None else None
        s = self.out_scale() if self.out_scale is not None and not self.out_norm else None
        return g, s

    def folded_weight(self, shared: Tensor | None = None) -> Tensor:
        """``diag(s) W diag(γ_shared γ)``; s is left out when ``out_norm`` (it acts after the norm)."""
        w = self.weight
        g, s = self.fold_vectors()
        if shared is not None:
            g = shared if g is None else g * shared
        if g is not None:
            w = w * g.to(w.dtype)
        if s is not None:
            w = s.to(w.dtype).unsqueeze(-1) * w
        return w

    def finish(self, y: Tensor, eps: float) -> Tensor:
        """The output side that cannot live in the weight: DNP's ``s ⊙ n(y)``."""
        if self.out_norm:
            y = rms_norm(y, eps, self.out_scale() if self.out_scale is not None else None)
        return y


class NormLinear(nn.Module):
    """An Input-Norm and the linear maps (branches) that read it (DESIGN.md §1, §3).

    ``forward(x: (..., d_in)) -> list of (..., d_out_b)``, one per branch in ``outputs`` order.
    ``outputs``: ``{branch name: d_out}``, e.g. ``{"q": 512, "k": 128, "v": 128}``. The strategy
    ``cfg`` decides where scale vectors sit: a shared γ (scale=shared), one γ per branch
    (scale=branch), output scales on ``cfg.dual_sites`` (placement dual/dual_norm), output
    normalization on ``cfg.norm_sites`` (dual_norm). ``role`` is the branches' weight role
    (``matrix``, ``lm_head``). ``plain=True`` disables every branch-side scale (LM head, router's
    own site); under ``folded`` there are no scales at all.
    """

    def __init__(self, d_in: int, outputs: dict[str, int], cfg: ScaleConfig, eps: float, role: str = "matrix",
                 std: float = 0.02):
        super().__init__()
        self.eps, self.apply_mode = eps, cfg.apply
        has_scale = cfg.scale != "none" and not cfg.folded
        branch = has_scale and cfg.scale == "branch" and len(outputs) > 1
        self.scale = make_scale(cfg, (d_in,), "input_scale") if has_scale and not branch else None
        self.branches = nn.ModuleDict()
        for name, d_out in outputs.items():
            dual = has_scale and cfg.placement != "input" and name in cfg.dual_sites
            norm = dual and cfg.placement == "dual_norm" and name in cfg.norm_sites
            # DNP: s on W_up folds into W_down; s on W_gate feeds SiLU -> Output-Norm scale (§3).
            s_role = "output_scale" if norm and name == "gate" else "input_scale"
            self.branches[name] = Branch(d_in, d_out, cfg, role, std, in_scale=branch, out_scale=dual,
                                         out_norm=norm, out_scale_role=s_role)
        self.splits = list(outputs.values())

    def project(self, x: Tensor) -> list[Tensor]:
        """``diag(s) W diag(γ_shared γ) n(x)`` of every branch, before DNP's output normalization (see ``forward``).

        ``apply='weight'``: the shared γ rides in the norm's own pass (``rms_norm(x, eps, γ)``) and each
        branch's own vectors fold into its W on the fly (``kernels.folded_linear``), one matmul per branch:
        measured the fastest of the exact forms on CPU (docs/performance.md). ``'activation'``: the
        reference form, every scale multiplies an activation.
        """
        shared = self.scale() if self.scale is not None else None
        ys = []
        if self.apply_mode == "weight":
            u = rms_norm(x, self.eps, shared)
            for b in self.branches.values():
                g, s = b.fold_vectors()
                ys.append(folded_linear(u, b.weight, g, s))
        else:  # activation side: the reference form
            u = rms_norm(x, self.eps)
            if shared is not None:
                u = u * shared.to(u.dtype)
            for b in self.branches.values():
                ub = u * b.in_scale().to(u.dtype) if b.in_scale is not None else u
                y = F.linear(ub, b.weight.to(u.dtype))
                if b.out_scale is not None and not b.out_norm:
                    y = y * b.out_scale().to(y.dtype)
                ys.append(y)
        return ys

    def forward(self, x: Tensor) -> list[Tensor]:
        return [b.finish(y, self.eps) for b, y in zip(self.branches.values(), self.project(x))]

    def swiglu(self, x: Tensor) -> Tensor:
        """``silu(gate) ⊙ up`` of branches ``gate`` and ``up``: the MLP's SwiGLU (DESIGN.md §2) on
        ``forward(x)``. Under DNP the output normalizations are fused into it (``kernels.dnp_swiglu``)."""
        gate, up = self.branches["gate"], self.branches["up"]
        ys = dict(zip(self.branches, self.project(x)))
        if not (gate.out_norm or up.out_norm):
            return F.silu(ys["gate"]) * ys["up"]
        dnp_s = [b.out_scale() if b.out_norm else None for b in (gate, up)]
        return dnp_swiglu(ys["gate"], ys["up"], *dnp_s, self.eps)

    def folded_state(self) -> dict[str, Tensor]:
        """Local state of the equivalent scale-free map: ``{"branches.<b>.weight": diag(s) W diag(γ)}`` (§4 fold).

        Raises ``ValueError`` naming the branches whose output normalization (DNP) cannot fold.
        """
        bad = [name for name, b in self.branches.items() if b.out_norm]
        if bad:
            raise ValueError(f"DNP output normalization on {', '.join(bad)} cannot fold into a linear map")
        shared = self.scale() if self.scale is not None else None
        return {f"branches.{name}.weight": b.folded_weight(shared) for name, b in self.branches.items()}


class OutputNorm(nn.Module):
    """An Output-Norm (DESIGN.md §1): ``γ ⊙ n(x)`` whose output feeds no linear map (QK-norm, peri).

    ``forward(x: (..., d)) -> (..., d)``. γ has role ``output_scale``; it is absent under scale=none.
    Under ``folded`` (QK-norm of a folded model) γ stays as a plain ``direct`` vector.
    """

    def __init__(self, d: int, cfg: ScaleConfig, eps: float):
        super().__init__()
        self.eps = eps
        if cfg.folded:
            self.scale = ScaleVector((d,), "direct", "output_scale")
        else:
            self.scale = make_scale(cfg, (d,), "output_scale") if cfg.scale != "none" else None

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.eps, self.scale() if self.scale is not None else None)

    def folded_state(self) -> dict[str, Tensor]:
        """The γ a folded model keeps in this slot (QK-norm: Qwen3's q_norm/k_norm): materialized, or 1."""
        return {"scale.weight": self.scale()} if self.scale is not None else {}


def scale_vectors(model: nn.Module) -> dict[str, Tensor]:
    """``{module name: effective γ (detached)}`` for every ``ScaleVector`` of ``model`` (for telemetry)."""
    with torch.no_grad():
        return {name: m().detach() for name, m in model.named_modules() if isinstance(m, ScaleVector)}


__all__ = [
    "ROLES", "new_param", "param_roles", "init_params", "rms_norm", "ScaleVector", "Linear", "Branch",
    "NormLinear", "OutputNorm", "scale_vectors", "batched_scales",
]
