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
norm, the folded linear map, OR/ER and DNP's SwiGLU carry hand-written backward passes (same
function and gradients, less time and memory: docs/performance.md). Parameter roles (DESIGN.md §5)
are assigned here, where the parameters are created, by ``new_param``.

This module does not build a Transformer (``model.py``) nor optimizers (``optim.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ScaleConfig

ROLES = ("matrix", "embedding", "lm_head", "router", "input_scale", "output_scale", "scale_direction")


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


def rms_norm(x: Tensor, eps: float, weight: Tensor | None = None) -> Tensor:
    """``x / sqrt(mean(x², -1) + eps)`` in float32, cast back to ``x.dtype`` (DESIGN.md §1), then times
    ``weight`` (a scale vector over the last dim, in ``x.dtype``) if given. Shape kept.

    Autograd through the composed ops spends most of a norm's time in ``PowBackward`` on a broadcast
    gradient and in fresh temporaries, so ``_RMSNorm`` carries a hand-written backward: the same
    function and gradients (measured on the 2-core CPU, one fp32 ``(2048, 682)`` norm with its scale,
    forward + backward, median of 60: 13 ms composed, 3 ms here). ``weight`` is one vector ``(d,)``.
    """
    return _RMSNorm.apply(x, weight, eps)


def _inv_rms(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(x, 1 / sqrt(mean(x², -1) + eps))`` with x in float32 (float64 stays float64).

    ``mean(x²)`` is taken as ``‖x‖² / d``: one reduction pass and no temporary the size of x.
    """
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    mean_sq = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square() / x.shape[-1]
    return xf, torch.rsqrt(mean_sq + eps)


class _RMSNorm(torch.autograd.Function):
    """``rms_norm`` with the backward written out (``r = 1/rms(x)``, ``n = x r``, ``y = n ⊙ w``)::

        ∂L/∂x = r (g ⊙ w) − x r³ mean(g ⊙ w ⊙ x),        ∂L/∂w = Σ_tokens g ⊙ n

    It saves x, w and r (one number per token) and reuses its own temporaries in place: on
    CPU every fresh activation-sized tensor can cost page faults, and autograd of the composed form
    makes about twice as many (and is slow on the broadcast gradient of the mean). Under
    ``create_graph`` (a double backward: Hessian-vector products, ``theory/probes.py``) the same
    formula runs out of place on a recomputed r, so autograd differentiates it.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        xf, r = _inv_rms(x, eps)
        ctx.save_for_backward(x, weight, r)
        ctx.eps = eps
        y = (xf * r).to(x.dtype)
        return y.mul_(weight.to(y.dtype)) if weight is not None else y

    @staticmethod
    def backward(ctx, g: Tensor):
        x, weight, r = ctx.saved_tensors
        # r from forward is a constant to autograd: under create_graph recompute it from x
        xr = None if torch.is_grad_enabled() else (x.to(r.dtype), r)
        grad_x, grad_w = _rms_norm_grads(x, weight, g, ctx.eps, *ctx.needs_input_grad[:2], xr=xr)
        return grad_x, grad_w, None


def _rms_norm_grads(x: Tensor, weight: Tensor | None, g: Tensor, eps: float, need_x: bool = True,
                    need_w: bool = True, xr: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor | None, Tensor | None]:
    """``(∂L/∂x, ∂L/∂w)`` of ``y = rms_norm(x, eps, w)`` given ``g = ∂L/∂y`` (formula: ``_RMSNorm``);
    ``w`` is a vector over the last dim. ``xr``: ``_inv_rms(x, eps)`` if already computed.

    ``g`` is never modified; the temporaries made here are reused in place unless grad mode is on
    (under ``create_graph``, where every op must stay differentiable).
    """
    inplace = not torch.is_grad_enabled()
    xf, r = xr if xr is not None else _inv_rms(x, eps)
    d = xf.shape[-1]
    g = g.to(xf.dtype)
    w = weight.to(xf.dtype) if weight is not None else None
    gx = g * xf
    grad_x = grad_w = None
    if w is not None and need_w:  # Σ_tokens r g ⊙ x, as a matrix-vector product
        grad_w = (r.reshape(1, -1) @ gx.reshape(-1, d)).reshape(weight.shape).to(weight.dtype)
    if need_x:
        dot = (gx @ w).unsqueeze(-1) if w is not None else gx.sum(-1, keepdim=True)  # Σ g ⊙ w ⊙ x
        coef = dot * r.pow(3) / d
        grad_x = g * w if w is not None else g.clone()
        grad_x = grad_x.mul_(r).addcmul_(xf, coef, value=-1) if inplace else grad_x * r - xf * coef
        grad_x = grad_x.to(x.dtype)
    return grad_x, grad_w


class _DNPSwiGLU(torch.autograd.Function):
    """SwiGLU over DNP outputs (DESIGN.md §3 ``dual_norm``): ``silu(z_g) ⊙ z_u`` with ``z = s ⊙ n(y)``
    for a normalized branch (``s`` given) and ``z = y`` otherwise; ``y`` are the raw ``W u`` outputs.

    Composed from ``rms_norm``, ``silu`` and ``*``, autograd keeps z_g, z_u and silu(z_g) until
    backward: three (tokens × d_ff) tensors per block that the baseline's MLP does not hold (+21 %
    peak memory at ``small``). This keeps y, s and r = 1/rms(y) (one number per token) and
    recomputes z in backward (a few elementwise passes), so DNP's MLP holds less than the baseline's. Under ``create_graph`` the
    backward differentiates the composed form instead, so a double backward is exact.
    """

    @staticmethod
    def forward(ctx, yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None, eps: float) -> Tensor:
        def z(y: Tensor, s: Tensor | None) -> tuple[Tensor, Tensor | None]:  # (z, r) as in rms_norm
            if s is None:
                return y, None
            xf, r = _inv_rms(y, eps)
            zf = (xf * r).to(y.dtype)
            return zf.mul_(s.to(zf.dtype)), r

        (zg, rg), (zu, ru) = z(yg, sg), z(yu, su)
        ctx.save_for_backward(yg, yu, sg, su, rg, ru)
        ctx.eps = eps
        return (F.silu(zg, inplace=True) if sg is not None else F.silu(zg)).mul_(zu)

    @staticmethod
    def backward(ctx, gp: Tensor):
        yg, yu, sg, su, rg, ru = ctx.saved_tensors
        eps, need = ctx.eps, ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph: let autograd differentiate the composed form
            inputs = [t for t, n in zip((yg, yu, sg, su), need) if n]
            zg = rms_norm(yg, eps, sg) if sg is not None else yg
            zu = rms_norm(yu, eps, su) if su is not None else yu
            grads = iter(torch.autograd.grad(F.silu(zg) * zu, inputs, gp, create_graph=True))
            return (*(next(grads) if n else None for n in need[:4]), None)

        def z(y: Tensor, s: Tensor | None, r: Tensor | None):  # recompute z in float32, and (x, r) of its norm
            if s is None:
                return y.float(), None
            xf = y.to(r.dtype)
            return (xf * r).mul_(s.to(r.dtype)), (xf, r)

        (zg, xr_g), (zu, xr_u) = z(yg, sg, rg), z(yu, su, ru)
        gp = gp.float()
        grad_zg = torch.ops.aten.silu_backward(gp * zu, zg)  # gp ⊙ z_u ⊙ silu'(z_g), one fused pass
        del zu
        grad_zu = (F.silu(zg, inplace=True) if sg is not None else F.silu(zg)).mul_(gp)
        del zg
        gyg, gsg = _rms_norm_grads(yg, sg, grad_zg, eps, need[0], need[2], xr_g) if sg is not None else (grad_zg, None)
        del grad_zg
        gyu, gsu = _rms_norm_grads(yu, su, grad_zu, eps, need[1], need[3], xr_u) if su is not None else (grad_zu, None)
        return gyg.to(yg.dtype), gyu.to(yu.dtype), gsg, gsu, None


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
        if self.param == "direct":
            return self.weight
        if self.param == "magdir":
            return _MagDir.apply(self.magnitude, self.direction, False)
        return _MagDir.apply(self.log_magnitude, self.direction, True)


class _MagDir(torch.autograd.Function):
    """OR / ER: ``γ = m · u``, ``u = α / rms(α)``, ``m = β`` (OR) or ``exp(b)`` (ER), rms over the last dim.

    One autograd node instead of six: these are tiny vectors, so the cost is per operation, and
    ``unified`` has ~10 of them per block. Backward, with ``∂u/∂α = (I − u uᵀ/d) / rms(α)``::

        ∂L/∂α = (m / rms(α)) (g − u · mean(g ⊙ u)),   ∂L/∂β = Σ g ⊙ u,   ∂L/∂b = m Σ g ⊙ u

    in differentiable ops (double backward, ``torch.func.jacrev`` in ``theory/magdir.py``).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(mag: Tensor, direction: Tensor, exp: bool) -> Tensor:
        r = torch.rsqrt(direction.pow(2).mean(-1, keepdim=True))
        return (mag.exp() if exp else mag) * (direction * r)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        mag, direction, ctx.exp = inputs
        ctx.save_for_backward(mag, direction)

    @staticmethod
    def backward(ctx, g: Tensor):
        mag, direction = ctx.saved_tensors
        r = torch.rsqrt(direction.pow(2).mean(-1, keepdim=True))
        unit = direction * r
        m = mag.exp() if ctx.exp else mag
        gu = (g * unit).sum(-1, keepdim=True)
        grad_mag = gu * m if ctx.exp else gu
        grad_dir = (m * r) * (g - unit * (gu / unit.shape[-1]))
        return grad_mag, grad_dir, None


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


class _FoldedLinear(torch.autograd.Function):
    """One branch's linear map with its scale vectors folded into the weight on the fly (DESIGN.md §3 note):
    ``y = u W'ᵀ``, ``W' = diag(s) W diag(c)`` (c: HG's γ_b, s: DP's s_b; None counts as ones).

    Autograd of ``F.linear(u, W')`` keeps W' alive until backward: one weight-sized copy per branch
    (+4 % peak memory at ``medium``). This saves u, W, c and s only and recomputes W' in backward (one
    pass over W). Backward, with ``G = gyᵀ u`` (d_out × d_in) and ``P = G ⊙ W``::

        ∂L/∂u = gy W',   ∂L/∂W = G ⊙ s cᵀ,   ∂L/∂c = Pᵀ s,   ∂L/∂s = P c

    Under autocast the matmuls run in the autocast dtype, as ``F.linear`` would. Under
    ``create_graph`` (a double backward, run without autocast) autograd differentiates the composed form.
    """

    @staticmethod
    def forward(ctx, u: Tensor, w: Tensor, c: Tensor | None, s: Tensor | None) -> Tensor:
        device = u.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else u.dtype
        ctx.u_dtype = u.dtype
        u = u.to(dtype)  # what F.linear under autocast would save
        ctx.save_for_backward(u, w, c, s)
        return F.linear(u, _fold(w, c, s).to(dtype))

    @staticmethod
    def backward(ctx, gy: Tensor):
        u, w, c, s = ctx.saved_tensors
        need_u, need_w, need_c, need_s = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph: let autograd differentiate the composed form
            inputs = [t for t, n in zip((u, w, c, s), ctx.needs_input_grad) if n]
            wf = w * c.to(w.dtype) if c is not None else w
            wf = s.to(w.dtype).unsqueeze(-1) * wf if s is not None else wf
            grads = iter(torch.autograd.grad(F.linear(u, wf.to(u.dtype)), inputs, gy, create_graph=True))
            return tuple(next(grads) if n else None for n in ctx.needs_input_grad)
        grad_u = grad_w = grad_c = grad_s = None
        if need_u:
            grad_u = (gy @ _fold(w, c, s).to(gy.dtype)).to(ctx.u_dtype)
        if need_w or need_c or need_s:
            g = (gy.reshape(-1, gy.shape[-1]).t() @ u.reshape(-1, u.shape[-1])).to(w.dtype)  # (d_out, d_in)
            if need_c or need_s:
                p = g * w
                if need_c:
                    grad_c = (p.sum(0) if s is None else s.to(p.dtype) @ p).to(c.dtype)
                if need_s:
                    grad_s = (p.sum(1) if c is None else p @ c.to(p.dtype)).to(s.dtype)
                del p
            if need_w:
                grad_w = g.mul_(c.to(g.dtype)) if c is not None else g
                grad_w = grad_w.mul_(s.to(g.dtype).unsqueeze(-1)) if s is not None else grad_w
        return grad_u, grad_w, grad_c, grad_s


def _fold(w: Tensor, c: Tensor | None, s: Tensor | None) -> Tensor:
    """``diag(s) W diag(c)`` as a new tensor, in the order of ``Branch.folded_weight`` (None counts as ones)."""
    out = w * c.to(w.dtype) if c is not None else w.clone()
    return out.mul_(s.to(w.dtype).unsqueeze(-1)) if s is not None else out


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
        branch's own vectors fold into its W on the fly (``_FoldedLinear``), one matmul per branch:
        measured the fastest of the exact forms on CPU (docs/performance.md). ``'activation'``: the
        reference form, every scale multiplies an activation.
        """
        shared = self.scale() if self.scale is not None else None
        ys = []
        if self.apply_mode == "weight":
            u = rms_norm(x, self.eps, shared)
            for b in self.branches.values():
                g, s = b.fold_vectors()
                ys.append(_FoldedLinear.apply(u, b.weight, g, s) if g is not None or s is not None
                          else F.linear(u, b.weight.to(u.dtype)))
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
        ``forward(x)``. Under DNP the output normalizations are fused into it (``_DNPSwiGLU``)."""
        gate, up = self.branches["gate"], self.branches["up"]
        ys = dict(zip(self.branches, self.project(x)))
        if not (gate.out_norm or up.out_norm):
            return F.silu(ys["gate"]) * ys["up"]
        dnp_s = [b.out_scale() if b.out_norm else None for b in (gate, up)]
        return _DNPSwiGLU.apply(ys["gate"], ys["up"], *dnp_s, self.eps)

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
    "NormLinear", "OutputNorm", "scale_vectors",
]
