"""The opt-in fused path (``scale.apply=fused``): a norm's branches as one matmul (``fused_project``) and the
whole SwiGLU MLP, DNP's normalizations included, as one autograd node (``fused_mlp``), with hand-written
backward passes. The same functions as the exact path, not the same bits.

DESIGN.md §2 (SwiGLU) and §3 (``dual_norm``). With ``u`` the Input-Norm's output (shared γ already applied),
``c_b`` a branch's input scale (HG's γ_b) and ``s_b`` its output scale, the MLP is::

    y_b = u (diag(s_b) W_b diag(c_b))ᵀ                          b = gate, up    (s_b folded: DP)
    out = (silu(y_gate) ⊙ y_up) W_downᵀ
    DNP:  y_b = u (W_b diag(c_b))ᵀ,   z_b = s_b ⊙ y_b r_b,   r_b = 1/rms(y_b)  (per token, over d_ff)
          out = (silu(z_gate) ⊙ z_up) W_downᵀ = r_up ⊙ [(silu(z_gate) ⊙ y_up) (W_down diag(s_up))ᵀ]

The exact path (``scales.SwiGLUProj`` / ``DNPSwiGLUProj`` on ``kernels.FAST``) runs one matmul per branch
and five activation-sized passes per normalized branch. Here (1) the branches of a norm (q, k, v; gate and
up) are one forward matmul on their stacked folded weights; (2) under DNP the up branch's per-token
``r_up`` is applied after W_down, on ``(N, d_model)`` instead of ``(N, d_ff)``, and its ``s_up`` is folded
into W_down's columns (the identity on the last line), so ``z_up`` is never formed; (3) the MLP's backward
works in place in two activation buffers. The backward keeps one matmul pair per branch: merging them
measured no faster on CPU and would hold one more activation-sized buffer at the step's peak.
All of it changes the order of floating-point operations: the results agree with the exact path to
rounding (fp32: ~1e-6 relative, tests/test_fused.py; float64 ``gradcheck`` of the backward), not to the
bit, so this path is never the default: tests/test_golden.py and the reproduction study run the exact one.

Chosen when a model is built (``ScalePlan.fused``), never in ``forward``: the attention's Input-Norm becomes
a ``FusedNormLinear`` (q, k, v in one matmul) and the dense MLP a ``transformer.FusedMLP`` where the plan has
its form (``mlp_fusable``). The formulas are ``scales``'s (``fold_weight``, ``scaled_linear``,
``dnp_swiglu``: ``mlp_reference``) and the fold's chain rule is ``kernels.fold_grads``.

Under ``create_graph`` (double backward: Hessian-vector products in training/probes.py) the backward
differentiates the composed form (``mlp_reference``), so second derivatives are exact. Under autocast the
matmuls run in the autocast dtype and everything elementwise in float32, as ``kernels`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from scalevec.model import scales as plain
from scalevec.model.device_path import autocast_dtype
from scalevec.model.kernels import fold_grads


def _inv_rms_cols(yt: Tensor, eps: float) -> Tensor:
    """``1 / sqrt(mean(y², -1) + eps)`` of ``y = ytᵀ`` given ``yt: (d, N)`` (float32 or float64), shape ``(1, N)``.

    A column sum of squares, not ``linalg.vector_norm(yt, dim=0)``: on CPU that reduction over the outer
    dimension measured 15x slower than the square-and-sum (2.6 vs 0.17 ms at (341, 2048))."""
    return torch.rsqrt(yt.square().sum(0, keepdim=True) / yt.shape[0] + eps)


def _stack_fold(*triples: tuple[Tensor, Tensor | None, Tensor | None]) -> Tensor:
    """``[diag(s_1) W_1 diag(c_1); diag(s_2) W_2 diag(c_2); ...]`` of ``(W, c, s)`` triples (``scales.fold_weight``
    each, None counting as ones): ``(Σ d_out, d_in)``."""
    return torch.cat([plain.fold_weight(w, c, s) for w, c, s in triples])


def mlp_reference(u: Tensor, wg: Tensor, wu: Tensor, wd: Tensor, cg: Tensor | None, cu: Tensor | None,
                  sg: Tensor | None, su: Tensor | None, eps: float, dnp: bool) -> Tensor:
    """The MLP as scales.py's plain formulas (the module docstring's first lines): what ``fused_mlp`` computes.

    ``u: (..., d)``, ``W_g, W_u: (d_ff, d)``, ``W_down: (d, d_ff)``, ``c: (d,)``, ``s: (d_ff,)`` or None;
    returns ``(..., d)``. ``dnp``: gate and up are RMS-normalized over d_ff before their ``s`` (which must
    then be given), else ``s`` multiplies the branch output (DP)."""
    yg, yu = plain.scaled_linear(u, wg, cg, None if dnp else sg), plain.scaled_linear(u, wu, cu, None if dnp else su)
    h = plain.dnp_swiglu(yg, yu, sg, su, eps) if dnp else F.silu(yg) * yu
    return F.linear(h, wd.to(h.dtype))


class _FusedMLP(torch.autograd.Function):
    """``fused_mlp``'s forward and backward (formulas in the module docstring).

    Activations live transposed, ``(d_ff, N)`` per branch: ``yᵀ = W' uᵀ`` puts the gate and up outputs in two
    contiguous halves of one ``(2 d_ff, N)`` matmul result, so every elementwise pass runs on contiguous
    memory (on CPU, silu on a strided half of an ``(N, 2 d_ff)`` result measured 1.3-2x slower). The per-token
    ``r`` is then a ``(1, N)`` row, its reduction a column sum of squares.

    Saves u, ``yᵀ`` (what the exact path keeps as two tensors), the hidden ``hᵀ`` (W_down's backward needs it
    in either path), under DNP ``o = h W_down'ᵀ`` (N × d, for ``∂L/∂r_up``) and the two ``r``, else
    ``silu(y_g)`` (as autograd of the exact path does); the stacked weight is rebuilt in backward (one
    weight-sized pass). Backward, with ``g = ∂L/∂out`` and, under DNP, ``a = silu(z_g)``::

        ∂L/∂r_u = Σ_d g ⊙ o,   g_h = (r_u g) W_down',   ∂L/∂W_down' = (r_u g)ᵀ h
        ∂L/∂z_g = silu'(z_g) ⊙ g_h ⊙ y_u,   ∂L/∂y_u = g_h ⊙ a − ∂L/∂r_u · r_u³ y_u / d_ff
        ∂L/∂y_g, ∂L/∂s_g: RMSNorm's backward of z_g = s_g ⊙ y_g r_g (kernels._RMSNorm)
        ∂L/∂u = [∂L/∂y_g, ∂L/∂y_u] W',   ∂L/∂W' = [∂L/∂y_g, ∂L/∂y_u]ᵀ u   (then the fold's chain rule)
    """

    @staticmethod
    def forward(ctx, u: Tensor, wg: Tensor, wu: Tensor, wd: Tensor, cg: Tensor | None, cu: Tensor | None,
                sg: Tensor | None, su: Tensor | None, eps: float, dnp: bool) -> Tensor:
        dtype = autocast_dtype(u) or u.dtype
        f, shape = wg.shape[0], u.shape
        u2 = u.reshape(-1, shape[-1]).to(dtype)  # (N, d)
        w = _stack_fold((wg, cg, None if dnp else sg), (wu, cu, None if dnp else su))
        yt = w.to(dtype) @ u2.t()  # (2 d_ff, N)
        a = rg = ru = o = None
        if dnp:
            acc = torch.promote_types(dtype, torch.float32)  # elementwise precision, as kernels.py
            ygt, yut = yt[:f].to(acc), yt[f:].to(acc)
            rg, ru = _inv_rms_cols(ygt, eps), _inv_rms_cols(yut, eps)  # (1, N)
            ht = F.silu((ygt * rg).mul_(sg.to(acc).unsqueeze(-1)), inplace=True).mul_(yut).to(dtype)
            o = ht.t() @ (wd * su.to(wd.dtype)).to(dtype).t()  # (N, d), W_down' = W_down diag(s_u)
            out = (o.to(acc) * ru.t()).to(dtype)
        else:
            a = F.silu(yt[:f])
            ht = a * yt[f:]
            out = ht.t() @ wd.to(dtype).t()
        ctx.save_for_backward(u, yt, ht, o, a, rg, ru, wg, wu, wd, cg, cu, sg, su)  # u: double backward needs it
        ctx.eps, ctx.dnp, ctx.dtype = eps, dnp, dtype
        return out.reshape(*shape[:-1], wd.shape[0])

    @staticmethod
    def backward(ctx, g: Tensor):
        u, yt, ht, o, a, rg, ru, wg, wu, wd, cg, cu, sg, su = ctx.saved_tensors
        need = ctx.needs_input_grad
        eps, dnp, dtype = ctx.eps, ctx.dnp, ctx.dtype
        if torch.is_grad_enabled():  # create_graph: let autograd differentiate the composed form
            args = [u, wg, wu, wd, cg, cu, sg, su]
            inputs = [t for t, n in zip(args, need) if n]
            grads = iter(torch.autograd.grad(mlp_reference(*args, eps, dnp), inputs, g, create_graph=True))
            return (*(next(grads) if n else None for n in need[:8]), None, None)
        f = wg.shape[0]
        u2, g2 = u.reshape(-1, u.shape[-1]).to(dtype), g.reshape(-1, g.shape[-1])
        grad_wd = grad_sg = grad_su = None
        # ∂L/∂y_gᵀ and ∂L/∂y_uᵀ are built in place in the two (d_ff, N) buffers that first hold g_hᵀ and
        # g_hᵀ ⊙ y_uᵀ, so at most three such temporaries exist at once: the step's peak is this backward's
        if dnp:
            acc = torch.promote_types(dtype, torch.float32)
            gf = g2.to(acc)
            grad_ru = (gf * o.to(acc)).sum(-1).unsqueeze(0)  # (1, N)
            go = (gf * ru.t()).to(dtype)  # (N, d)
            gyu = ((wd * su.to(wd.dtype)).to(dtype).t() @ go.t()).to(acc)  # g_hᵀ, (d_ff, N)
            if need[3] or need[7]:
                gwd = (go.t() @ ht.t()).to(wd.dtype)  # ∂L/∂W_down', (d, d_ff)
                grad_wd, grad_su, _ = fold_grads(gwd, wd, su, None, (need[3], need[7], False))
            ygt, yut = yt[:f].to(acc), yt[f:].to(acc)
            sgc = sg.to(acc).unsqueeze(-1)  # (d_ff, 1)
            z = (ygt * rg).mul_(sgc)
            gyg = gyu * yut
            torch.ops.aten.silu_backward.grad_input(gyg, z, grad_input=gyg)  # ∂L/∂z_g
            gyu.mul_(F.silu(z, inplace=True)).addcmul_(yut, grad_ru * ru.pow(3), value=-1.0 / f)  # ∂L/∂y_u
            del z
            gx = gyg * ygt  # RMSNorm's backward of z_g = s_g ⊙ y_g r_g
            if need[6]:
                grad_sg = (gx @ rg.t()).reshape(sg.shape).to(sg.dtype)
            coef = (sgc.t() @ gx) * rg.pow(3) / f  # (1, N)
            del gx
            gyg.mul_(sgc).mul_(rg).addcmul_(ygt, coef, value=-1)  # ∂L/∂y_g
        else:
            gyu = wd.to(dtype).t() @ g2.to(dtype).t()  # g_hᵀ, (d_ff, N)
            if need[3]:
                grad_wd = (g2.to(dtype).t() @ ht.t()).to(wd.dtype)
            gyg = gyu * yt[f:]
            torch.ops.aten.silu_backward.grad_input(gyg, yt[:f], grad_input=gyg)
            gyu.mul_(a)
        grad_u = grad_wg = grad_wu = grad_cg = grad_cu = None
        fold_s = (None, None) if dnp else (sg, su)
        if need[0]:  # ∂L/∂u = [∂L/∂y_g, ∂L/∂y_u] W', as two matmuls into one result (no (2 d_ff, N) copy)
            w = _stack_fold((wg, cg, fold_s[0]), (wu, cu, fold_s[1])).to(dtype)
            grad_u = (gyg.to(dtype).t() @ w[:f]).addmm_(gyu.to(dtype).t(), w[f:])  # in place: the peak is here
            grad_u = grad_u.to(u.dtype).reshape(u.shape)  # (N, d)
        if any(need[1:3]) or any(need[4:6]) or (not dnp and any(need[6:8])):
            gw_g, gw_u = (gyg.to(dtype) @ u2).to(wg.dtype), (gyu.to(dtype) @ u2).to(wu.dtype)  # ∂L/∂W', (d_ff, d)
            grad_wg, grad_cg, gsg = fold_grads(gw_g, wg, cg, fold_s[0], (need[1], need[4], need[6]))
            grad_wu, grad_cu, gsu = fold_grads(gw_u, wu, cu, fold_s[1], (need[2], need[5], need[7]))
            if not dnp:
                grad_sg, grad_su = gsg, gsu
        return grad_u, grad_wg, grad_wu, grad_wd, grad_cg, grad_cu, grad_sg, grad_su, None, None


class _FusedProj(torch.autograd.Function):
    """``fused_project``: ``y_b = u (diag(s_b) W_b diag(c_b))ᵀ`` for every branch b as one matmul on the stacked
    weight; the outputs are column blocks (views) of one ``(N, Σ d_b)`` result, the last one copied out.

    Backward: ``∂L/∂u = Σ_b g_b W'_b`` accumulated into one result (``addmm``) and ``∂L/∂W'_b = g_bᵀ u`` per
    branch, from the branches' own output gradients (concatenating them first would cost one more
    activation-sized buffer at the step's peak and measured no faster); the per-branch vectors' gradients
    are the fold's chain rule (``kernels.fold_grads``). Saves u and the parameters; the stacked weight is rebuilt.
    """

    @staticmethod
    def forward(ctx, u: Tensor, *wcs: Tensor | None):
        dtype = autocast_dtype(u) or u.dtype
        triples = [wcs[i:i + 3] for i in range(0, len(wcs), 3)]
        y = u.reshape(-1, u.shape[-1]).to(dtype) @ _stack_fold(*triples).to(dtype).t()  # (N, Σ d_b)
        ctx.save_for_backward(u, *wcs)
        ctx.dtype = dtype
        outs = [yb.view(*u.shape[:-1], yb.shape[-1]) for yb in y.split([t[0].shape[0] for t in triples], -1)]
        outs[-1] = outs[-1].contiguous()  # own storage: attention keeps v for backward, and a view of y would
        return tuple(outs)                # keep q and k alive with it (+2 MiB per block at `small`)

    @staticmethod
    def backward(ctx, *gs: Tensor | None):
        u, *wcs = ctx.saved_tensors
        need, dtype = ctx.needs_input_grad, ctx.dtype
        triples = [wcs[i:i + 3] for i in range(0, len(wcs), 3)]
        if torch.is_grad_enabled():  # create_graph: let autograd differentiate the composed form
            args = [u, *wcs]
            inputs = [t for t, n in zip(args, need) if n]
            outs = [F.linear(u, plain.fold_weight(*t).to(u.dtype)) for t in triples]
            pairs = [(o, g) for o, g in zip(outs, gs) if g is not None]
            grads = iter(torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], create_graph=True))
            return tuple(next(grads) if n else None for n in need)
        n_tok = u.numel() // u.shape[-1]
        u2 = u.reshape(n_tok, -1).to(dtype)
        w = _stack_fold(*triples).to(dtype) if need[0] else None
        grad_u, out, start = None, [], 0
        for i, ((wb, c, s), gb) in enumerate(zip(triples, gs)):
            rows, nb = slice(start, start + wb.shape[0]), need[1 + 3 * i:4 + 3 * i]
            start += wb.shape[0]
            if gb is None:  # an output the loss does not use
                out += [None, None, None] if not any(nb) else [torch.zeros_like(t) if t is not None and n else None
                                                               for t, n in zip((wb, c, s), nb)]
                continue
            g2 = gb.reshape(n_tok, -1).to(dtype)
            if need[0]:  # ∂L/∂u = Σ_b g_b W'_b, accumulated in one result
                grad_u = g2 @ w[rows] if grad_u is None else grad_u.addmm_(g2, w[rows])
            out += fold_grads((g2.t() @ u2).to(wb.dtype), wb, c, s, nb) if any(nb) else [None, None, None]
        if need[0]:
            grad_u = (grad_u if grad_u is not None else u2.new_zeros(u2.shape)).to(u.dtype).reshape(u.shape)
        return (grad_u, *out)


def fused_project(u: Tensor, triples: list[tuple[Tensor, Tensor | None, Tensor | None]]) -> list[Tensor]:
    """``[u (diag(s_b) W_b diag(c_b))ᵀ for (W_b, c_b, s_b) in triples]`` in one autograd node and one matmul
    (``_FusedProj``); ``u: (..., d_in)``, ``W_b: (d_b, d_in)``, ``c_b: (d_in,)``, ``s_b: (d_b,)`` or None; the
    outputs ``(..., d_b)`` are views into one buffer but the last, which has its own (attention saves v for
    backward; q and k's storage is then freed after RoPE as on the exact path). Equal to the per-branch form up
    to summation order."""
    return list(_FusedProj.apply(u, *(x for t in triples for x in t)))


def fused_mlp(u: Tensor, wg: Tensor, wu: Tensor, wd: Tensor, cg: Tensor | None, cu: Tensor | None,
              sg: Tensor | None, su: Tensor | None, eps: float, dnp: bool) -> Tensor:
    """The SwiGLU MLP ``(..., d) -> (..., d)`` of ``mlp_reference`` in one autograd node (module docstring).

    Raises ``ValueError`` under ``dnp`` without both output scales (DNP always has them, DESIGN.md §3)."""
    if dnp and (sg is None or su is None):
        raise ValueError("fused_mlp with dnp=True needs the output scales s_gate and s_up")
    return _FusedMLP.apply(u, wg, wu, wd, cg, cu, sg, su, eps, dnp)


class FusedNormLinear(plain.NormLinear):
    """``scales.NormLinear`` under ``apply='fused'`` (opt-in, ``ScalePlan.fused``): every branch of the norm in one
    matmul on the stacked folded weights (``fused_project``); the same function, equal to ``NormLinear.project``
    to rounding. DNP's normalization, where a branch has one, stays in ``finish`` as on the exact path."""

    def project(self, u: Tensor) -> list[Tensor]:
        return fused_project(u, [(b.weight, *b.fold_vectors()) for b in self.branches.values()])


def mlp_fusable(plan: plain.NormPlan) -> bool:
    """True if the MLP of ``plan`` (branches gate and up) has ``fused_mlp``'s form: DNP on both branches or on
    neither. DNP on one only (``scale.norm_sites``) has no fused form; that MLP is built exact."""
    return len({b.normalized for b in plan.branches.values()}) == 1


__all__ = ["fused_mlp", "fused_project", "mlp_reference", "FusedNormLinear", "mlp_fusable"]
