"""The fast path (``kernels.FAST``) equals the plain formulas of ``scales.py`` it replaces (DESIGN.md §1, §3).

``rms_norm``, the linear map with folded scales, OR/ER scale vectors and DNP's SwiGLU carry their own
backward for speed and memory. Each is checked here against the plain torch formula of
``scales.py`` (``scales.PLAIN``; tests/test_scale_plan.py compares whole models built on either path):
values, first derivatives (``gradcheck``) and second derivatives (``gradgradcheck``: the Hessian-vector
products of ``training/probes.py``), in float64; and the memory claim of the fused DNP SwiGLU by
counting what autograd keeps for backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

from scalevec import ScaleConfig, build_model
from scalevec.model import scales as plain
from scalevec.model.kernels import FAST, _DNPSwiGLU, _FoldedLinear, _MagDir, rms_norm
from scalevec.model.params import init_params
from scalevec.model.scales import NormLinear, norm_plan, swiglu_proj

EPS = 1e-6


def _rand(*shape, seed=0, offset=0.0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (offset + scale * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()


@pytest.mark.parametrize("with_weight", [False, True])
def test_rms_norm_values_and_derivatives_match_composed_form(with_weight):
    """rms_norm: values equal scales.rms_norm; gradients and second derivatives checked (float64, gradcheck)."""
    x = _rand(2, 3, 6, seed=1)
    w = _rand(6, seed=2, offset=1.0, scale=0.3) if with_weight else None
    torch.testing.assert_close(rms_norm(x, EPS, w), plain.rms_norm(x, EPS, w), rtol=1e-12, atol=1e-12)
    inputs = (x, w) if with_weight else (x,)
    fn = (lambda x, w: rms_norm(x, EPS, w)) if with_weight else (lambda x: rms_norm(x, EPS))
    assert gradcheck(fn, inputs)
    assert gradgradcheck(fn, inputs)


def test_rms_norm_low_precision_input_computes_in_float32():
    """A bfloat16 input is normalized in float32 and returned in bfloat16, as the plain formula does."""
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    w = (1 + 0.1 * torch.randn(32, generator=torch.Generator().manual_seed(1))).bfloat16()
    y = rms_norm(x, EPS, w)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, plain.rms_norm(x.float(), EPS).bfloat16() * w, rtol=0, atol=0)


@pytest.mark.parametrize("in_scale, out_scale", [(True, False), (False, True), (True, True)])
def test_folded_linear_matches_linear_of_diag_s_w_diag_gamma(in_scale, out_scale):
    """u (diag(s) W diag(γ))ᵀ fused equals F.linear of scales.fold_weight, with first and second derivatives."""
    u, w = _rand(2, 3, 5, seed=1), _rand(4, 5, seed=2)
    c = _rand(5, seed=3, offset=1.0, scale=0.3) if in_scale else None
    s = _rand(4, seed=4, offset=1.0, scale=0.3) if out_scale else None
    leaves = tuple(t for t in (u, w, c, s) if t is not None)

    def split(*ts):
        it = iter(ts)
        return next(it), next(it), next(it) if in_scale else None, next(it) if out_scale else None

    def fused(*ts):
        return _FoldedLinear.apply(*split(*ts))

    def composed(*ts):
        u, w, c, s = split(*ts)
        return F.linear(u, plain.fold_weight(w, c, s))

    torch.testing.assert_close(fused(*leaves), composed(*leaves), rtol=1e-12, atol=1e-12)
    assert gradcheck(fused, leaves)
    assert gradgradcheck(fused, leaves)


def test_folded_linear_under_autocast_matches_f_linear():
    """Under CPU bfloat16 autocast the fused map computes and differentiates as F.linear of the fold does."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(6, 8, generator=g, requires_grad=True)
    w = torch.randn(4, 8, generator=g, requires_grad=True)
    c = (1 + 0.2 * torch.randn(8, generator=g)).requires_grad_()
    s = (1 + 0.2 * torch.randn(4, generator=g)).requires_grad_()
    outs = []
    for fused in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = _FoldedLinear.apply(u, w, c, s) if fused else F.linear(u, s.unsqueeze(-1) * (w * c))
        assert y.dtype == torch.bfloat16
        grads = torch.autograd.grad(y.float().pow(2).sum(), (u, w, c, s))
        assert [t.dtype for t in grads] == [torch.float32] * 4
        outs.append((y, grads))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=0)
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("exp", [False, True])
@pytest.mark.parametrize("shape", [(7,), (3, 5)])
def test_magdir_matches_formula_with_derivatives_and_jacrev(exp, shape):
    """OR/ER γ = m α/rms(α) (m = β or e^b): values, gradcheck, gradgradcheck, and torch.func.jacrev."""
    mag = _rand(*shape[:-1], 1, seed=1, offset=1.0, scale=0.3)
    direction = _rand(*shape, seed=2, offset=1.0, scale=0.4)
    ref = (plain.er_gamma if exp else plain.or_gamma)(mag, direction)
    fn = lambda mag, direction: _MagDir.apply(mag, direction, exp)[0]  # noqa: E731 (outputs: γ, 1/rms(α))
    torch.testing.assert_close(fn(mag, direction), ref, rtol=1e-12, atol=0)
    assert gradcheck(fn, (mag, direction))
    assert gradgradcheck(fn, (mag, direction))
    jac = torch.func.jacrev(fn, argnums=1)(mag.detach(), direction.detach())
    ref_jac = torch.autograd.functional.jacobian(lambda a: fn(mag.detach(), a), direction.detach())
    torch.testing.assert_close(jac, ref_jac, rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # gradgradcheck in float64: ~1 s per case
@pytest.mark.parametrize("norm_gate, norm_up", [(True, True), (True, False), (False, True)])
def test_dnp_swiglu_matches_composed_form(norm_gate, norm_up):
    """silu(s_g ⊙ n(y_g)) ⊙ (s_u ⊙ n(y_u)) fused equals scales.dnp_swiglu, with both derivatives (float64)."""
    yg, yu = _rand(2, 3, 6, seed=1), _rand(2, 3, 6, seed=2)
    sg, su = _rand(6, seed=3, offset=1.0, scale=0.3), _rand(6, seed=4, offset=1.0, scale=0.3)

    def fused(yg, yu, sg, su):
        return _DNPSwiGLU.apply(yg, yu, sg if norm_gate else None, su if norm_up else None, EPS)

    def composed(yg, yu, sg, su):
        return plain.dnp_swiglu(yg, yu, sg if norm_gate else None, su if norm_up else None, EPS)

    inputs = (yg, yu, sg, su)
    torch.testing.assert_close(fused(*inputs), composed(*inputs), rtol=1e-12, atol=1e-12)
    assert gradcheck(fused, inputs)
    assert gradgradcheck(fused, inputs)


@pytest.mark.parametrize("strategy", ["baseline", "dnp", "unified"])
@pytest.mark.parametrize("fast", [True, False])
def test_swiglu_proj_equals_silu_of_norm_linear(strategy, fast):
    """The MLP's SwiGLUProj (DNP: DNPSwiGLUProj, normalizations fused) equals silu(gate) ⊙ up of a NormLinear with
    the same branches: same output and parameter gradients (fp32, 1e-6), fast path and plain formulas."""
    plan = norm_plan(ScaleConfig.preset(strategy), {"gate": "gate", "up": "up"})
    ops = FAST if fast else plain.PLAIN
    results = []
    for fused in (True, False):
        m = swiglu_proj(16, 24, plan, EPS, ops) if fused else NormLinear(16, {"gate": 24, "up": 24}, plan, EPS, ops)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            init_params(m)
        with torch.no_grad():  # move every scale off 1 so that each one matters
            g = torch.Generator().manual_seed(5)
            for p in m.parameters():
                if p.dim() == 1 or p.shape[-1] == 1:
                    p.add_(0.3 * torch.randn(p.shape, generator=g))
        x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(6))
        if fused:
            h = m(m.norm(x))
        else:
            gate, up = m(m.norm(x))
            h = F.silu(gate) * up
        (h * torch.linspace(-1, 1, 24)).sum().backward()
        results.append((h.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (h0, g0), (h1, g1) = results
    torch.testing.assert_close(h0, h1, rtol=1e-6, atol=1e-7)
    total = torch.cat([v.flatten() for v in g1.values()]).norm()
    for name in g0:  # DNP's in-scale magnitudes have a vanishing gradient: held to the total's rounding
        assert (g0[name] - g1[name]).norm() <= 1e-5 * g1[name].norm() + 1e-6 * total, name


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn()`` runs (parameters excluded)."""
    storages: dict[int, int] = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_dnp_mlp_saves_no_more_for_backward_than_baseline(make_cfg):
    """Peak-memory claim of the fused DNP SwiGLU: unified's MLP keeps no more activation bytes than baseline's."""
    cfg = make_cfg(d_model=32, d_ff=96)
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    saved = {}
    for strategy in ("baseline", "dnp", "unified"):
        mlp = build_model(cfg, ScaleConfig.preset(strategy), seed=0).layers[0].mlp
        saved[strategy] = _saved_bytes(lambda m=mlp: m(m.norm(x)))
    assert saved["dnp"] <= saved["baseline"]
    assert saved["unified"] <= saved["baseline"]
