"""The fast path of the research object: scales.py's formulas with hand-written backward passes (``FAST``).

``scales.py`` says *what* is computed (the plain torch formulas, ``scales.PLAIN``); this module computes the
same functions faster on CPU and GPU, measured in docs/performance.md, with the same signatures, so a model
is built with one or the other (``ScalePlan.fast``: ``ScaleConfig.apply='weight'``). Checked against the plain
formulas, values, gradients and second derivatives, by tests/test_kernels.py and tests/test_scale_plan.py:

- ``rms_norm(x, eps, weight)``: RMSNorm (DESIGN.md §1) with an optional scale in the same pass;
- ``dnp_swiglu``: SwiGLU over DNP's normalized gate/up outputs (DESIGN.md §3 ``dual_norm``); on CUDA with
  Triton, one fused kernel each way (``triton_dnp``);
- ``or_gamma`` / ``er_gamma``: OR / ER's ``γ = m · α / rms(α)`` (DESIGN.md §3 ``param``);
- ``folded_linear``: ``u (diag(s) W diag(c))ᵀ`` with the fold (``scales.fold_weight``) done on the fly.
- ``fold_grads``: the fold's chain rule, shared with the opt-in fused path (``fused.py``); on CUDA with Triton,
  the fold and its chain rule are one fused kernel each way (``triton_fold``).

Under ``create_graph`` (double backward: Hessian-vector products in training/probes.py) every backward
here falls back to differentiating a composed form, so second derivatives stay exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from scalevec.model import scales as plain
from scalevec.model import triton_dnp, triton_fold
from scalevec.model.device_path import autocast_dtype, on_cuda_path


def rms_norm(x: Tensor, eps: float, weight: Tensor | None = None) -> Tensor:
    """``x / sqrt(mean(x², -1) + eps)`` in float32, cast back to ``x.dtype`` (DESIGN.md §1), then times
    ``weight`` (a scale vector over the last dim, in ``x.dtype``) if given. Shape kept.

    Autograd through the composed ops spends most of a norm's time in ``PowBackward`` on a broadcast
    gradient and in fresh temporaries, so ``_RMSNorm`` carries a hand-written backward: the same
    function and gradients (measured on the 2-core CPU, one fp32 ``(2048, 682)`` norm with its scale,
    forward + backward, median of 60: 13 ms composed, 3 ms here). ``weight`` is one vector ``(d,)``.
    On the CUDA path (``device_path.on_cuda_path``) it is torch's ``F.rms_norm``, one fused kernel forward
    and backward instead of ~6 and ~8 (``bench --count``), statistics in float32, the weight applied before
    the one rounding to ``x.dtype`` (here: after it), so equal to rounding, not to the bit.
    """
    if on_cuda_path(x):
        return F.rms_norm(x, x.shape[-1:], weight.to(x.dtype) if weight is not None else None, eps)
    return _RMSNorm.apply(x, weight, eps)


def matmul_input(u: Tensor) -> Tensor:
    """A norm's output ``u`` in the dtype its linear maps read it in: on the CUDA path under autocast, cast once
    here instead of once per branch by autocast (q, k, v: three casts of one tensor); elsewhere ``u`` as it is
    (on CPU every branch casts it as before, so the gradients sum in float32 as they always have). On the CUDA
    path the branches' gradients of ``u`` then sum in bf16 before the one cast back: two more roundings at bf16
    precision, the precision each of them already has."""
    dtype = autocast_dtype(u) if on_cuda_path(u) else None
    return u.to(dtype) if dtype is not None else u


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
    ``create_graph`` (a double backward: Hessian-vector products, ``training/probes.py``) the same
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


def _rms_norm_grads(x: Tensor, weight: Tensor | None, g: Tensor, eps: float, need_x: bool = True, need_w: bool = True,
                    xr: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor | None, Tensor | None]:
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
    recomputes z in backward (a few elementwise passes), so DNP's MLP holds less than the baseline's. Under
    ``create_graph`` the backward differentiates the plain formula (``scales.dnp_swiglu``) instead, so a double
    backward is exact.
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
            grads = iter(torch.autograd.grad(plain.dnp_swiglu(yg, yu, sg, su, eps), inputs, gp, create_graph=True))
            return (*(next(grads) if n else None for n in need[:4]), None)

        compute = torch.promote_types(yg.dtype, torch.float32)  # float32, or float64 for a float64 input

        def z(y: Tensor, s: Tensor | None, r: Tensor | None):  # recompute z in float32, and (x, r) of its norm
            if s is None:
                return y.to(compute), None
            xf = y.to(r.dtype)
            return (xf * r).mul_(s.to(r.dtype)), (xf, r)

        (zg, xr_g), (zu, xr_u) = z(yg, sg, rg), z(yu, su, ru)
        gp = gp.to(compute)
        grad_zg = torch.ops.aten.silu_backward(gp * zu, zg)  # gp ⊙ z_u ⊙ silu'(z_g), one fused pass
        del zu
        grad_zu = (F.silu(zg, inplace=True) if sg is not None else F.silu(zg)).mul_(gp)
        del zg
        gyg, gsg = _rms_norm_grads(yg, sg, grad_zg, eps, need[0], need[2], xr_g) if sg is not None else (grad_zg, None)
        del grad_zg
        gyu, gsu = _rms_norm_grads(yu, su, grad_zu, eps, need[1], need[3], xr_u) if su is not None else (grad_zu, None)
        return gyg.to(yg.dtype), gyu.to(yu.dtype), gsg, gsu, None


class _MagDir(torch.autograd.Function):
    """OR / ER: ``γ = m · u``, ``u = α / rms(α)``, ``m = β`` (OR) or ``exp(b)`` (ER), rms over the last dim.

    One autograd node instead of six: these are tiny vectors, so the cost is per operation, and
    ``unified`` has ~10 of them per block; backward reuses forward's ``1/rms(α)`` (not recomputed,
    except under ``create_graph``, where it must be differentiable). Backward, with ``∂u/∂α = (I − u uᵀ/d) / rms(α)``::

        ∂L/∂α = (m / rms(α)) (g − u · mean(g ⊙ u)),   ∂L/∂β = Σ g ⊙ u,   ∂L/∂b = m Σ g ⊙ u

    in differentiable ops (double backward, ``torch.func.jacrev`` in ``theory/magdir.py``).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(mag: Tensor, direction: Tensor, exp: bool) -> tuple[Tensor, Tensor]:
        r = torch.rsqrt(direction.pow(2).mean(-1, keepdim=True))
        return (mag.exp() if exp else mag) * (direction * r), r  # r: saved for backward, not differentiable

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        mag, direction, ctx.exp = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(mag, direction, output[1])

    @staticmethod
    def backward(ctx, g: Tensor, _g_r: Tensor | None = None):
        mag, direction, r = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: r from forward is a constant to autograd, recompute it
            r = torch.rsqrt(direction.pow(2).mean(-1, keepdim=True))
        unit = direction * r  # the same ops as forward: the same numbers, to the bit
        m = mag.exp() if ctx.exp else mag
        gu = (g * unit).sum(-1, keepdim=True)
        grad_mag = gu * m if ctx.exp else gu
        grad_dir = (m * r) * (g - unit * (gu / unit.shape[-1]))
        return grad_mag, grad_dir, None


class _FoldedLinear(torch.autograd.Function):
    """One branch's linear map with its scale vectors folded into the weight on the fly (DESIGN.md §3 note):
    ``y = u W'ᵀ``, ``W' = diag(s) W diag(c)`` (c: HG's γ_b, s: DP's s_b; None counts as ones).

    Autograd of ``F.linear(u, W')`` keeps W' alive until backward: one weight-sized copy per branch
    (+4 % peak memory at ``medium``, fp32). This saves u, W, c and s only and recomputes W' in backward (one
    pass over W). Under autocast it keeps W' in the autocast dtype instead, as the baseline's autocast keeps
    its bf16 cast of W for backward: the same memory as the baseline, and two kernels fewer (the same bits
    either way). Backward, with ``G = gyᵀ u`` (d_out × d_in) and ``P = G ⊙ W``::

        ∂L/∂u = gy W',   ∂L/∂W = G ⊙ s cᵀ,   ∂L/∂c = Pᵀ s,   ∂L/∂s = P c

    Under autocast the matmuls run in the autocast dtype, as ``F.linear`` would. Under
    ``create_graph`` (a double backward, run without autocast) autograd differentiates the composed form.
    """

    @staticmethod
    def forward(ctx, u: Tensor, w: Tensor, c: Tensor | None, s: Tensor | None) -> Tensor:
        dtype = autocast_dtype(u) or u.dtype
        ctx.u_dtype = u.dtype
        u = u.to(dtype)  # what F.linear under autocast would save
        wf = fold_weight_to(w, c, s, dtype)
        ctx.save_for_backward(u, w, c, s, wf if dtype != w.dtype else None)  # autocast: kept as autocast keeps W
        return F.linear(u, wf)

    @staticmethod
    def backward(ctx, gy: Tensor):
        u, w, c, s, wf = ctx.saved_tensors
        need_u, need_w, need_c, need_s = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph: let autograd differentiate the composed form
            inputs = [t for t, n in zip((u, w, c, s), ctx.needs_input_grad) if n]
            wf = plain.fold_weight(w, c, s).to(u.dtype)
            grads = iter(torch.autograd.grad(F.linear(u, wf), inputs, gy, create_graph=True))
            return tuple(next(grads) if n else None for n in ctx.needs_input_grad)
        grad_u = grad_w = grad_c = grad_s = None
        if need_u:
            wf = wf if wf is not None and wf.dtype == gy.dtype else fold_weight_to(w, c, s, gy.dtype)
            grad_u = (gy @ wf).to(ctx.u_dtype)
        if need_w or need_c or need_s:
            g = gy.reshape(-1, gy.shape[-1]).t() @ u.reshape(-1, u.shape[-1])  # (d_out, d_in), the matmul's dtype
            grad_w, grad_c, grad_s = fold_grads(g, w, c, s, (need_w, need_c, need_s))
        return grad_u, grad_w, grad_c, grad_s


def fold_grads(g: Tensor, w: Tensor, c: Tensor | None, s: Tensor | None,
               need: tuple[bool, bool, bool] = (True, True, True)) -> tuple[Tensor | None, ...]:
    """``(∂L/∂W, ∂L/∂c, ∂L/∂s)`` of the fold ``W' = diag(s) W diag(c)`` (``scales.fold_weight``, a matrix
    ``W: (d_out, d_in)``) given ``G = ∂L/∂W'`` (None counts as ones; ``need`` says which of the three to make)::

        ∂L/∂W = G ⊙ s cᵀ,   ∂L/∂c = (G ⊙ W)ᵀ s,   ∂L/∂s = (G ⊙ W) c

    The one home of this chain rule (``_FoldedLinear`` and ``fused.py`` use it). ``G`` must be a fresh tensor
    the caller gives away: ∂L/∂W is made in its storage. ``G`` may also come in a matmul's lower dtype (bf16
    under autocast): the first product with W, c or s then promotes it to W's dtype exactly, in the same pass,
    so the results are those of casting ``G`` first, to the bit, with one pass over W fewer. On the CUDA path
    (``triton_fold.supported``) one fused kernel computes all three (and one ``sum`` completes ∂L/∂c)."""
    if triton_fold.supported(w, c, s, g):
        return triton_fold.fold_grads(g, w, c, s, need)
    need_w, need_c, need_s = need
    grad_w = grad_c = grad_s = None
    if (need_c and c is not None) or (need_s and s is not None):
        p = g * w  # in W's dtype
        if need_c and c is not None:
            grad_c = (p.sum(0) if s is None else s.to(p.dtype) @ p).to(c.dtype)
        if need_s and s is not None:
            grad_s = (p.sum(1) if c is None else p @ c.to(p.dtype)).to(s.dtype)
        del p
    if need_w:
        sides = [v for v in (c.to(w.dtype) if c is not None else None,
                             s.to(w.dtype).unsqueeze(-1) if s is not None else None) if v is not None]
        if g.dtype == w.dtype:
            grad_w = g
        else:  # promoted in the first product, or cast where there is none
            grad_w = g * sides.pop(0) if sides else g.to(w.dtype)
        for v in sides:
            grad_w = grad_w.mul_(v)
    return grad_w, grad_c, grad_s


def fold_weight_to(w: Tensor, c: Tensor | None, s: Tensor | None, dtype: torch.dtype) -> Tensor:
    """``scales.fold_weight(w, c, s).to(dtype)`` with the cast done in the fold's last product (its result written
    in ``dtype``): the same bits, every product computed in W's dtype and rounded once, and one pass over the
    weight fewer (a kernel on CUDA). Used without autograd (the backward passes here). On the CUDA path
    (``triton_fold.supported``) one fused kernel, its products in the same order."""
    if c is None and s is None:
        return w.to(dtype)
    if triton_fold.supported(w, c, s):
        return triton_fold.fold_weight(w, c, s, dtype)
    if c is not None and s is not None:
        w, last = w * c.to(w.dtype).unsqueeze(-2), s.to(w.dtype).unsqueeze(-1)
    else:
        last = c.to(w.dtype).unsqueeze(-2) if c is not None else s.to(w.dtype).unsqueeze(-1)
    if dtype == w.dtype:
        return last * w
    return torch.mul(last, w, out=torch.empty(w.shape, dtype=dtype, device=w.device))


def or_gamma(magnitude: Tensor, direction: Tensor) -> Tensor:
    """``scales.or_gamma`` (OR: ``β · α/rms(α)``, rms over the last dim) as one autograd node."""
    return _MagDir.apply(magnitude, direction, False)[0]


def er_gamma(log_magnitude: Tensor, direction: Tensor) -> Tensor:
    """``scales.er_gamma`` (ER: ``exp(b) · α/rms(α)``) as one autograd node."""
    return _MagDir.apply(log_magnitude, direction, True)[0]


def folded_linear(u: Tensor, w: Tensor, c: Tensor | None = None, s: Tensor | None = None) -> Tensor:
    """``scales.scaled_linear``: ``u (diag(s) W diag(c))ᵀ``, ``u: (..., d_in)``, ``W: (d_out, d_in)`` ->
    ``(..., d_out)``, with the fold done on the fly; None counts as ones."""
    if c is None and s is None:
        return F.linear(u, w.to(u.dtype))
    return _FoldedLinear.apply(u, w, c, s)


def dnp_swiglu(yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None, eps: float) -> Tensor:
    """``scales.dnp_swiglu``: ``silu(z_g) ⊙ z_u`` with ``z = s ⊙ n(y)`` where ``s`` is given, else ``z = y``.

    The one place the device picks the implementation: CUDA tensors with Triton installed take the fused op
    (``triton_dnp``: one kernel forward, one backward, equal to rounding); everything else (CPU, float64) this
    module's ``_DNPSwiGLU``, so CPU training is bitwise what it was."""
    if triton_dnp.supported(yg, yu):
        return triton_dnp.dnp_swiglu(yg, yu, sg, su, eps)
    return _DNPSwiGLU.apply(yg, yu, sg, su, eps)


# The fast path: a drop-in for ``scales.PLAIN`` (same signatures), chosen when a model is built.
FAST = plain.Ops("fast", rms_norm, or_gamma, er_gamma, folded_linear, dnp_swiglu, matmul_input)

__all__ = ["rms_norm", "matmul_input", "or_gamma", "er_gamma", "folded_linear", "dnp_swiglu", "fold_grads",
           "fold_weight_to", "FAST"]
