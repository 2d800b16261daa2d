"""The fused DNP SwiGLU op (model/triton_dnp.py) against the plain formula ``scales.dnp_swiglu``.

Without a GPU the Triton kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py before
anything imports triton: numpy on CPU tensors); with one, the same tests run the compiled kernels on CUDA, and the
``gpu`` test checks them at llama-0.12b's width.
Triton is a test dependency (the ``dev`` extra): this module fails to import without it, on purpose.

Shapes: d_ff 37 and 129 (odd: masked columns; BLOCK_F 64 and 256, so BLOCK_N 16 and 4 rows a program) and 53
tokens: the last row block is partial and each of the two backward programs strides over several blocks.
"""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401  (a test dependency: a missing Triton fails here, never skips)
from torch.profiler import ProfilerActivity, profile

from scalevec.config import ScaleConfig
from scalevec.model import kernels, triton_dnp
from scalevec.model import scales as plain
from scalevec.model.params import init_params
from scalevec.model.scales import norm_plan, swiglu_proj

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
N_TOKENS = 53
NORMS = [(True, True), (True, False), (False, True)]  # DNP on both branches or one (scale.norm_sites)
# Tolerances against the float64 formula on the same inputs. fp32: every intermediate is float32 (unit roundoff
# 6e-8) and the reductions run over <= 129 terms, so 1e-5 is ~100 roundoffs. bf16/fp16: the op rounds its result
# once to the input dtype: at most one ulp, relative 2^-7 (bf16, 8 significant bits; Triton's interpreter truncates
# float32 -> bf16, the GPU rounds to nearest: half that) and 2^-10 (fp16); the float32 work before it adds ~1e-6.
# ∂L/∂s comes out in s's float32 (a sum over 53 tokens): the fp32 tolerance.
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2**-7, 1e-5), torch.float16: (2**-10, 1e-5)}


def _inputs(d_ff: int, dtype: torch.dtype, norm_g: bool, norm_u: bool, seed: int = 0, shape=(N_TOKENS,)):
    """y_g, y_u: (*shape, d_ff) in ``dtype``; s_g, s_u: (d_ff,) float32 around 1 (None where not normalized);
    all leaves requiring grad. y has an offset so the per-token RMS is not ~1 (a wrong r shows)."""
    gen = torch.Generator().manual_seed(seed)
    y = lambda: (torch.randn(*shape, d_ff, generator=gen) * 1.7 + 0.3).to(dtype).to(DEVICE).requires_grad_()
    s = lambda on: (1 + 0.5 * torch.randn(d_ff, generator=gen)).to(DEVICE).requires_grad_() if on else None
    return y(), y(), s(norm_g), s(norm_u)


def _reference(yg, yu, sg, su, grad):
    """``scales.dnp_swiglu`` in float64 on the same values: the output and the gradients of every input."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (yg, yu, sg, su)]
    out = plain.dnp_swiglu(*leaves, EPS)
    grads = torch.autograd.grad(out, [t for t in leaves if t is not None], grad.double())
    return out, grads


@pytest.mark.parametrize("norm_g, norm_u", NORMS)
@pytest.mark.parametrize("d_ff", [37, 129])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_matches_plain_formula(dtype, d_ff, norm_g, norm_u):
    """out = silu(s_g ⊙ n(y_g)) ⊙ (s_u ⊙ n(y_u)) in the input dtype, to that dtype's rounding of the float64 formula."""
    yg, yu, sg, su = _inputs(d_ff, dtype, norm_g, norm_u)
    out = triton_dnp.dnp_swiglu(yg, yu, sg, su, EPS)
    ref, _ = _reference(yg, yu, sg, su, torch.zeros(N_TOKENS, d_ff))
    assert out.dtype == dtype and out.shape == yg.shape
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("norm_g, norm_u", NORMS)
@pytest.mark.parametrize("d_ff", [37, 129])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradients_match_plain_formula(dtype, d_ff, norm_g, norm_u):
    """∂L/∂y_g, ∂L/∂y_u (input dtype) and ∂L/∂s_g, ∂L/∂s_u (float32, summed over tokens) equal the float64 formula's."""
    yg, yu, sg, su = _inputs(d_ff, dtype, norm_g, norm_u)
    grad = torch.randn(N_TOKENS, d_ff, generator=torch.Generator().manual_seed(9)).to(dtype).to(DEVICE)
    leaves = [t for t in (yg, yu, sg, su) if t is not None]
    grads = torch.autograd.grad(triton_dnp.dnp_swiglu(yg, yu, sg, su, EPS), leaves, grad)
    _, ref = _reference(yg, yu, sg, su, grad)
    for i, (got, want, leaf) in enumerate(zip(grads, ref, leaves)):
        assert got.dtype == leaf.dtype and got.shape == leaf.shape
        rtol, atol = TOL[dtype] if i < 2 else TOL[torch.float32]
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)


def test_batch_dims_and_strided_rows():
    """(B, T, d_ff) inputs, and gate/up as column halves of one (N, 2 d_ff) buffer (row stride 2 d_ff), give the
    plain formula's values and gradients."""
    d_ff = 37
    yg, yu, sg, su = _inputs(d_ff, torch.float32, True, True, shape=(3, 7))
    out = triton_dnp.dnp_swiglu(yg, yu, sg, su, EPS)
    assert out.shape == (3, 7, d_ff)
    ref, _ = _reference(yg, yu, sg, su, torch.zeros(3, 7, d_ff))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    both = torch.cat([yg, yu], -1).detach().reshape(21, 2 * d_ff).requires_grad_()
    out = triton_dnp.dnp_swiglu(both[:, :d_ff], both[:, d_ff:], sg, su, EPS)
    (grad_both,) = torch.autograd.grad(out.sum(), both)
    ref_both = both.detach().double().requires_grad_()
    ref = plain.dnp_swiglu(ref_both[:, :d_ff], ref_both[:, d_ff:], sg.detach().double(), su.detach().double(), EPS)
    ref.sum().backward()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_both.double(), ref_both.grad, rtol=1e-5, atol=1e-5)


def test_double_backward_is_the_plain_formulas():
    """Under create_graph the op's gradients and their derivatives are the plain formula's, bitwise (float32)."""
    results = []
    for fn in (triton_dnp.dnp_swiglu, plain.dnp_swiglu):
        leaves = _inputs(37, torch.float32, True, True, shape=(5,))
        weight = torch.randn(5, 37, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        first = torch.autograd.grad((fn(*leaves, EPS) * weight).sum(), leaves, create_graph=True)
        second = torch.autograd.grad(sum((g * g).sum() for g in first), leaves)
        results.append(first + second)
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_fake_impl_gives_shapes_and_dtypes():
    """On meta tensors (the fake implementations) the ops give the real ones' shapes and dtypes: out like y (bf16),
    ∂L/∂y like y, and ∂L/∂s a float32 row for each scale given."""
    yg = torch.empty(2, 3, 37, dtype=torch.bfloat16, device="meta")
    s = torch.empty(37, dtype=torch.float32, device="meta")
    out = torch.ops.scalevec.dnp_swiglu(yg, yg, s, None, EPS)
    assert (out.shape, out.dtype, out.device.type) == (yg.shape, torch.bfloat16, "meta")
    grads = torch.ops.scalevec.dnp_swiglu_backward(out, yg, yg, None, s, EPS)
    assert [(g.shape, g.dtype) for g in grads] == [(yg.shape, yg.dtype)] * 2 + [((1, 37), torch.float32)]


def test_opcheck_both_ops():
    """torch.library.opcheck: schema, autograd registration, fake tensors and AOT dispatch agree with the kernels."""
    yg, yu, sg, su = (t.detach() for t in _inputs(37, torch.float32, True, True, shape=(2, 5)))
    ops = torch.ops.scalevec
    leaves = (yg.clone().requires_grad_(), yu, sg.clone().requires_grad_(), su)
    torch.library.opcheck(ops.dnp_swiglu.default, (*leaves, EPS))
    torch.library.opcheck(ops.dnp_swiglu_backward.default, (torch.randn_like(yg), yg, yu, sg, su, EPS))


def test_bad_shapes_are_refused():
    """Mismatched y_gate / y_up shapes, or an s that is not (d_ff,), raise a ValueError naming the shapes."""
    yg, yu, sg, _ = _inputs(37, torch.float32, True, False)
    with pytest.raises(ValueError, match="one shape and dtype"):
        triton_dnp.dnp_swiglu(yg, yu[:, :36], sg, None, EPS)
    with pytest.raises(ValueError, match=r"s_gate of shape \(d_ff,\)"):
        triton_dnp.dnp_swiglu(yg, yu, sg[:36], None, EPS)


def test_cpu_and_float64_keep_the_fast_path():
    """CPU tensors and float64 are not served by the fused op, so kernels.dnp_swiglu stays _DNPSwiGLU there, bitwise."""
    yg, yu, sg, su = _inputs(37, torch.float32, True, True)
    assert not triton_dnp.supported(yg.detach().cpu(), yu.detach().cpu())
    assert not triton_dnp.supported(yg.detach().double(), yu.detach().double())
    cpu = [t.detach().cpu() for t in (yg, yu, sg, su)]
    assert torch.equal(kernels.dnp_swiglu(*cpu, EPS), kernels._DNPSwiGLU.apply(*cpu, EPS))


def test_dnp_mlp_launches_one_op_each_way(monkeypatch):
    """Where the op is supported (CUDA; here forced), unified's DNPSwiGLUProj on the fast path runs forward as one
    scalevec::dnp_swiglu and backward as one scalevec::dnp_swiglu_backward, with _DNPSwiGLU's output and parameter
    gradients (fp32, 1e-5: the two differ only in float32 rounding order)."""
    proj = swiglu_proj(16, 37, norm_plan(ScaleConfig.preset("unified"), {"gate": "gate", "up": "up"}), EPS,
                       kernels.FAST).to(DEVICE)
    assert isinstance(proj, plain.DNPSwiGLUProj)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        init_params(proj)
    with torch.no_grad():  # move every scale off its init so that each one matters
        for p in proj.parameters():
            if p.dim() == 1 or p.shape[-1] == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE))
    u = torch.randn(N_TOKENS, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def run():
        proj.zero_grad()
        out = proj(u)
        (out * torch.linspace(-1, 1, 37, device=DEVICE)).sum().backward()
        return out.detach(), {name: p.grad.clone() for name, p in proj.named_parameters()}

    monkeypatch.setattr(triton_dnp, "supported", lambda yg, yu: False)
    ref, ref_grads = run()  # kernels._DNPSwiGLU
    monkeypatch.setattr(triton_dnp, "supported", lambda yg, yu: True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out, grads = run()
    counts = {e.key: e.count for e in prof.key_averages() if e.key.startswith("scalevec::")}
    assert counts == {"scalevec::dnp_swiglu": 1, "scalevec::dnp_swiglu_backward": 1}
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)


# Compiles both kernels for an H100/H200 (sm_90) with Triton's own compiler and ptxas, which ship in its wheel and
# need no GPU. A fresh process: this one runs Triton's interpreter, which accepts code the compiler may not.
COMPILE_PROBE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from scalevec.model import triton_dnp_kernels as k
from scalevec.model.triton_dnp import _geometry

block_n, block_f, warps = _geometry(1706)
ptr = lambda dtype, on=True: f"*{dtype}" if on else "constexpr"
for dtype in ("bf16", "fp32"):
    for norm_g, norm_u in ((True, True), (True, False), (False, True)):
        flags = {"NORM_G": norm_g, "NORM_U": norm_u, "BLOCK_N": block_n, "BLOCK_F": block_f}
        absent = {name: None for name, on in (("sg_ptr", norm_g), ("su_ptr", norm_u)) if not on}
        ints = ["n_rows", "d_ff"]
        fwd = {"yg_ptr": ptr(dtype), "yu_ptr": ptr(dtype), "sg_ptr": ptr("fp32", norm_g), "su_ptr": ptr("fp32", norm_u),
               "out_ptr": ptr(dtype), **dict.fromkeys(ints + ["stride_g", "stride_u", "stride_out"], "i32"),
               "eps": "fp32", **dict.fromkeys(flags, "constexpr")}
        bwd = {"g_ptr": ptr(dtype), "yg_ptr": ptr(dtype), "yu_ptr": ptr(dtype), "sg_ptr": ptr("fp32", norm_g),
               "su_ptr": ptr("fp32", norm_u), "dyg_ptr": ptr(dtype), "dyu_ptr": ptr(dtype),
               "dsg_ptr": ptr("fp32", norm_g), "dsu_ptr": ptr("fp32", norm_u),
               **dict.fromkeys(ints + ["stride_gout", "stride_g", "stride_u", "stride_dg", "stride_du"], "i32"),
               "eps": "fp32", **dict.fromkeys(flags, "constexpr")}
        absent_grads = {"d" + name: None for name in absent}
        for fn, sig, consts in ((k.dnp_swiglu_fwd, fwd, {**flags, **absent}),
                                (k.dnp_swiglu_bwd, bwd, {**flags, **absent, **absent_grads})):
            compiled = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": warps})
            assert compiled.asm["cubin"], (fn, dtype, norm_g, norm_u)
print("compiled")
"""


@pytest.mark.slow  # ~12 s: 12 kernels through Triton's compiler and ptxas
def test_kernels_compile_for_sm90_without_a_gpu():
    """Both kernels, bf16 and fp32, DNP on both or one branch, compile to sm_90 machine code (what the GPU runs)."""
    from triton_probe import compiles_without_interpreter

    compiles_without_interpreter(COMPILE_PROBE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_op_matches_plain_formula_at_llama_width(dtype):
    """On CUDA, compiled kernels at llama-0.12b's d_ff = 1706 over 4096 tokens: values and every gradient within the
    dtype's rounding of the float64 formula, and kernels.dnp_swiglu routes CUDA tensors to the op."""
    d_ff, n = 1706, 4096
    gen = torch.Generator().manual_seed(0)
    yg, yu = ((torch.randn(n, d_ff, generator=gen) * 1.7 + 0.3).to(dtype).cuda().requires_grad_() for _ in range(2))
    sg, su = ((1 + 0.5 * torch.randn(d_ff, generator=gen)).cuda().requires_grad_() for _ in range(2))
    assert triton_dnp.supported(yg, yu)
    grad = torch.randn(n, d_ff, generator=gen).to(dtype).cuda()
    out = kernels.dnp_swiglu(yg, yu, sg, su, EPS)
    assert out.grad_fn is not None and "scalevec_dnp_swiglu" in type(out.grad_fn).__name__
    grads = torch.autograd.grad(out, (yg, yu, sg, su), grad)
    ref, ref_grads = _reference(yg, yu, sg, su, grad)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)
    for i, (got, want) in enumerate(zip(grads, ref_grads)):
        # ∂L/∂s sums 4096 float32 terms of O(10) in a different order than float64: 1e-4 relative
        torch.testing.assert_close(got.double(), want, rtol=rtol if i < 2 else 1e-4, atol=atol if i < 2 else 1e-3)


def test_strided_scale_vectors_are_read_by_their_stride():
    """s_g, s_u given as strided views (every other element of a longer tensor) give the output and gradients of
    the same values made contiguous (the kernels index s at unit stride: they read the wrong elements otherwise)."""
    d_ff = 37
    yg, yu, _, _ = _inputs(d_ff, torch.float32, False, False)
    base = (1 + 0.5 * torch.randn(2, 2 * d_ff, generator=torch.Generator().manual_seed(3))).to(DEVICE)
    base.requires_grad_()
    sg, su = base[0, ::2], base[1, ::2]
    grad = torch.randn(N_TOKENS, d_ff, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    out = triton_dnp.dnp_swiglu(yg, yu, sg, su, EPS)
    ref, ref_grads = _reference(yg, yu, sg, su, grad)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)  # TOL's fp32 bound
    grads = torch.autograd.grad(out, [sg, su], grad)
    for got, want in zip(grads, ref_grads[2:]):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
