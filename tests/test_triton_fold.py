"""The fused fold op (model/triton_fold.py) against the plain formula ``scales.fold_weight`` and its autograd.

Without a GPU the Triton kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py before
anything imports triton: numpy on CPU tensors); with one, the same tests run the compiled kernels on CUDA, and the
``gpu`` test checks them at llama-0.12b's widths.
Triton is a test dependency (the ``dev`` extra): this module fails to import without it, on purpose.

Shape: W 37 × 129 (odd: three row blocks of 16, the last partial; two column tiles of 128, the second masked), so
each backward program walks several column tiles and the ∂L/∂c partial sums cover several programs.
"""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401  (a test dependency: a missing Triton fails here, never skips)
from torch.profiler import ProfilerActivity, profile

from scalevec.model import kernels, triton_fold
from scalevec.model import scales as plain

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
D_OUT, D_IN = 37, 129
SIDES = [(True, True), (True, False), (False, True)]  # (c given, s given)
# Tolerances against the float64 formula on the same inputs. fp32: W' and ∂L/∂W are one or two float32 products
# (relative 2 × 6e-8); ∂L/∂s and ∂L/∂c are float32 sums of <= 129 terms of O(1): 1e-5 is ~100 roundoffs. A bf16 W'
# is rounded once to bf16: relative 2^-7 (one ulp: Triton's interpreter truncates, the GPU rounds to nearest, half);
# fp16: 2^-10. ∂L/∂W, ∂L/∂c, ∂L/∂s come out in float32 whatever G's dtype (a bf16/fp16 G is exact in float32): the
# fp32 tolerance.
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2**-7, 1e-5), torch.float16: (2**-10, 1e-5)}


def _inputs(has_c: bool, has_s: bool, seed: int = 0, shape=(D_OUT, D_IN)):
    """W: (d_out, d_in) float32; c: (d_in,), s: (d_out,) float32 around 1 (None where absent); leaves requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_()
    vec = lambda n, on: (1 + 0.5 * torch.randn(n, generator=gen)).to(DEVICE).requires_grad_() if on else None
    return w, vec(shape[1], has_c), vec(shape[0], has_s)


def _reference(w, c, s, grad):
    """``scales.fold_weight`` in float64 on the same values: W' and the gradients of every given input."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (w, c, s)]
    out = plain.fold_weight(*leaves)
    return out, torch.autograd.grad(out, [t for t in leaves if t is not None], grad.double())


@pytest.mark.parametrize("has_c, has_s", SIDES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_matches_plain_formula(dtype, has_c, has_s):
    """W' = diag(s) W diag(c) in the requested dtype, to that dtype's rounding of the float64 formula."""
    w, c, s = _inputs(has_c, has_s)
    out = triton_fold.fold_weight(w, c, s, dtype)
    ref, _ = _reference(w, c, s, torch.zeros(D_OUT, D_IN))
    assert out.dtype == dtype and out.shape == w.shape
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


def test_float32_forward_is_fold_weight_to_the_bit():
    """In float32 the op takes fold_weight's products in its order: the same bits."""
    w, c, s = (t.detach() for t in _inputs(True, True))
    assert torch.equal(triton_fold.fold_weight(w, c, s, torch.float32), plain.fold_weight(w, c, s))


@pytest.mark.parametrize("has_c, has_s", SIDES)
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradients_match_plain_formula(grad_dtype, has_c, has_s):
    """∂L/∂W, ∂L/∂c, ∂L/∂s (float32, from a float32, bf16 or fp16 ∂L/∂W') equal the float64 formula's."""
    w, c, s = _inputs(has_c, has_s)
    grad = torch.randn(D_OUT, D_IN, generator=torch.Generator().manual_seed(9)).to(grad_dtype).to(DEVICE)
    leaves = [t for t in (w, c, s) if t is not None]
    grads = torch.autograd.grad(triton_fold.fold_weight(w, c, s, grad_dtype), leaves, grad)
    _, ref = _reference(w, c, s, grad)
    for got, want, leaf in zip(grads, ref, leaves):
        assert got.dtype == leaf.dtype and got.shape == leaf.shape
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("has_c, has_s", SIDES)
def test_fold_grads_routes_and_matches_the_composed_chain_rule(monkeypatch, has_c, has_s):
    """kernels.fold_grads where the op is supported (here forced) gives the composed chain rule's ∂L/∂W bitwise and
    ∂L/∂c, ∂L/∂s to float32 rounding (1e-5: sums in another order), and None for what is not needed."""
    w, c, s = (t.detach() if t is not None else None for t in _inputs(has_c, has_s))
    g = torch.randn(D_OUT, D_IN, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to(DEVICE)
    want = kernels.fold_grads(g.clone(), w, c, s)
    monkeypatch.setattr(triton_fold, "supported", lambda *args: True)
    got = kernels.fold_grads(g.clone(), w, c, s)
    assert torch.equal(got[0], want[0])
    for a, b in zip(got[1:], want[1:]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert kernels.fold_grads(g.clone(), w, c, s, (False, True, True))[0] is None


def test_double_backward_is_the_plain_formulas():
    """Under create_graph the op's gradients and their derivatives are the plain formula's, bitwise (float32)."""
    results = []
    for fn in (lambda w, c, s: triton_fold.fold_weight(w, c, s, torch.float32), plain.fold_weight):
        leaves = _inputs(True, True, shape=(5, 7))
        weight = torch.randn(5, 7, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        first = torch.autograd.grad((fn(*leaves) * weight).sum(), leaves, create_graph=True)
        second = torch.autograd.grad(sum((g * g).sum() for g in first), leaves)
        results.append(first + second)
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_fake_impl_gives_shapes_and_dtypes():
    """On meta tensors (the fake implementations): W' of W's shape in the requested dtype; backward ∂L/∂W in W's
    dtype, ∂L/∂s float32 (d_out,), the ∂L/∂c partials float32 (d_out / 16 rounded up, d_in), empty where absent."""
    w = torch.empty(D_OUT, D_IN, device="meta")
    c, s = torch.empty(D_IN, device="meta"), torch.empty(D_OUT, device="meta")
    out = torch.ops.scalevec.fold_weight(w, c, s, torch.bfloat16)
    assert (out.shape, out.dtype, out.device.type) == (w.shape, torch.bfloat16, "meta")
    grads = torch.ops.scalevec.fold_weight_backward(out, w, c, s, True)
    assert [(tuple(g.shape), g.dtype) for g in grads] == [((D_OUT, D_IN), torch.float32), ((D_OUT,), torch.float32),
                                                         ((3, D_IN), torch.float32)]
    grads = torch.ops.scalevec.fold_weight_backward(out, w, None, s, False)
    assert [tuple(g.shape) for g in grads] == [(0,), (D_OUT,), (0, D_IN)]


def test_opcheck_both_ops():
    """torch.library.opcheck: schema, autograd registration, fake tensors and AOT dispatch agree with the kernels."""
    w, c, s = (t.detach() for t in _inputs(True, True, shape=(19, 21)))
    ops = torch.ops.scalevec
    torch.library.opcheck(ops.fold_weight.default, (w.clone().requires_grad_(), c.clone().requires_grad_(), s,
                                                     torch.bfloat16))
    torch.library.opcheck(ops.fold_weight_backward.default, (torch.randn_like(w), w, c, s, True))


def test_bad_shapes_are_refused():
    """A vector that does not fit W, or a ∂L/∂W' not of W's shape, raises a ValueError naming the shapes."""
    w, c, s = _inputs(True, True)
    with pytest.raises(ValueError, match=r"c of shape \(129,\)"):
        triton_fold.fold_weight(w, c[:-1], s, torch.float32)
    with pytest.raises(ValueError, match="of W's shape"):
        torch.ops.scalevec.fold_weight_backward(w.detach()[:, :-1], w.detach(), c.detach(), s.detach(), True)


def test_cpu_float64_and_expert_banks_keep_the_composed_fold():
    """CPU tensors, float64 and (E, d_out, d_in) banks are not served: fold_weight_to stays composed, bitwise."""
    w, c, s = (t.detach().cpu() for t in _inputs(True, True))
    assert not triton_fold.supported(w, c, s)
    assert not triton_fold.supported(w.double(), c.double(), s.double())
    assert not triton_fold.supported(w.expand(2, D_OUT, D_IN), c, s)
    assert torch.equal(kernels.fold_weight_to(w, c, s, torch.bfloat16), plain.fold_weight(w, c, s).to(torch.bfloat16))


def test_folded_linear_launches_one_op_each_way(monkeypatch):
    """Where the op is supported (CUDA; here forced), kernels.folded_linear under bf16 autocast (the CUDA trainer's
    step) runs the fold as one scalevec::fold_weight forward and its chain rule as one scalevec::fold_weight_backward,
    with the composed path's output, ∂L/∂u and ∂L/∂W bitwise and ∂L/∂c, ∂L/∂s to float32 rounding (1e-5: sums in
    another order). W holds small integers and c, s powers of two, so W' is exact in bf16 and no rounding mode
    (the interpreter truncates, torch rounds to nearest) can make the two differ."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randint(-8, 9, (D_OUT, D_IN), generator=gen).float().to(DEVICE)
    c, s = (2.0 ** torch.randint(-2, 3, (n,), generator=gen).float().to(DEVICE) for n in (D_IN, D_OUT))
    u = torch.randn(11, D_IN, generator=gen).to(DEVICE)

    def run():
        leaves = [t.clone().requires_grad_() for t in (u, w, c, s)]
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = kernels.folded_linear(*leaves)
        (out.float() * torch.linspace(-1, 1, D_OUT, device=DEVICE)).sum().backward()
        return out.detach(), [t.grad for t in leaves]

    ref, ref_grads = run()
    monkeypatch.setattr(triton_fold, "supported", lambda *args: True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out, grads = run()
    counts = {e.key: e.count for e in prof.key_averages() if e.key.startswith("scalevec::")}
    assert counts == {"scalevec::fold_weight": 1, "scalevec::fold_weight_backward": 1}
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    for i, (got, want) in enumerate(zip(grads, ref_grads)):
        if i < 2:
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_float32_folded_linear_refolds_in_backward(monkeypatch):
    """Without autocast W' is not kept (it is W's dtype: one weight-sized copy saved), so backward folds again for
    ∂L/∂u: two scalevec::fold_weight, one scalevec::fold_weight_backward, the composed path's values (fp32, 1e-5)."""
    w, c, s = (t.detach() for t in _inputs(True, True))
    u = torch.randn(11, D_IN, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def run():
        leaves = [t.clone().requires_grad_() for t in (u, w, c, s)]
        kernels.folded_linear(*leaves).sum().backward()
        return [t.grad for t in leaves]

    ref_grads = run()
    monkeypatch.setattr(triton_fold, "supported", lambda *args: True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        grads = run()
    counts = {e.key: e.count for e in prof.key_averages() if e.key.startswith("scalevec::")}
    assert counts == {"scalevec::fold_weight": 2, "scalevec::fold_weight_backward": 1}
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# Compiles both kernels for an H100/H200 (sm_90) with Triton's own compiler and ptxas, which ship in its wheel and
# need no GPU. A fresh process: this one runs Triton's interpreter, which accepts code the compiler may not.
COMPILE_PROBE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from scalevec.model import triton_fold_kernels as k
from scalevec.model.triton_fold import BLOCK_M, BLOCK_N

ptr = lambda dtype, on=True: f"*{dtype}" if on else "constexpr"
for g_dtype in ("bf16", "fp32"):
    for has_c, has_s in ((True, True), (True, False), (False, True)):
        flags = {"HAS_C": has_c, "HAS_S": has_s, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N}
        absent = {name: None for name, on in (("c_ptr", has_c), ("s_ptr", has_s)) if not on}
        vectors = {"c_ptr": ptr("fp32", has_c), "s_ptr": ptr("fp32", has_s)}
        fwd = {"w_ptr": "*fp32", **vectors, "out_ptr": ptr(g_dtype),
               **dict.fromkeys(["d_out", "d_in", "stride_w", "stride_out"], "i32"), **dict.fromkeys(flags, "constexpr")}
        bwd = {"g_ptr": ptr(g_dtype), "w_ptr": "*fp32", **vectors, "gw_ptr": "*fp32", "gs_ptr": ptr("fp32", has_s),
               "gc_ptr": ptr("fp32", has_c), **dict.fromkeys(["d_out", "d_in", "stride_g", "stride_w"], "i32"),
               "stride_gw": "i32", **dict.fromkeys([*flags, "NEED_W"], "constexpr")}
        absent_grads = {"g" + name[0] + "_ptr": None for name in absent}
        for fn, sig, consts in ((k.fold_fwd, fwd, {**flags, **absent}),
                                (k.fold_bwd, bwd, {**flags, "NEED_W": True, **absent, **absent_grads})):
            compiled = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": 4})
            assert compiled.asm["cubin"], (fn, g_dtype, has_c, has_s)
print("compiled")
"""


@pytest.mark.slow  # ~10 s: 12 kernels through Triton's compiler and ptxas
def test_kernels_compile_for_sm90_without_a_gpu():
    """Both kernels, bf16 and fp32 W' / ∂L/∂W', with c and s, c only and s only, compile to sm_90 machine code."""
    from triton_probe import compiles_without_interpreter

    compiles_without_interpreter(COMPILE_PROBE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("d_out, d_in", [(768, 768), (1706, 768), (768, 1706)])
def test_cuda_op_matches_plain_formula_at_llama_widths(d_out, d_in):
    """On CUDA, compiled kernels at llama-0.12b's weights (attention, gate/up, down), bf16: W' is fold_weight_to's bits
    (both round to nearest), the gradients within float32 rounding of the float64 formula, and kernels routes CUDA
    tensors to the op."""
    w, c, s = _inputs(True, True, shape=(d_out, d_in))
    assert triton_fold.supported(w, c, s)
    out = triton_fold.fold_weight(w, c, s, torch.bfloat16)
    assert torch.equal(out, kernels.fold_weight_to(w.detach(), c.detach(), s.detach(), torch.bfloat16))
    grad = torch.randn(d_out, d_in, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(DEVICE)
    grads = torch.autograd.grad(out, (w, c, s), grad)
    _, ref = _reference(w, c, s, grad)
    for got, want in zip(grads, ref):
        # ∂L/∂c, ∂L/∂s sum up to 1706 float32 terms of O(1) in another order than float64: 1e-4 relative
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-3)


def test_strided_vectors_are_read_by_their_stride():
    """c and s given as strided views (every other element of a longer tensor) fold and differentiate as the same
    values made contiguous (the kernels index them at unit stride: they read the wrong elements otherwise)."""
    w, _, _ = _inputs(False, False)
    base = (1 + 0.5 * torch.randn(2 * D_IN + 2 * D_OUT, generator=torch.Generator().manual_seed(4))).to(DEVICE)
    base.requires_grad_()
    c, s = base[: 2 * D_IN : 2], base[2 * D_IN :: 2]
    assert c.shape == (D_IN,) and s.shape == (D_OUT,) and c.stride(0) == s.stride(0) == 2
    grad = torch.randn(D_OUT, D_IN, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    out = triton_fold.fold_weight(w, c, s, torch.float32)
    ref, ref_grads = _reference(w, c, s, grad)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)  # TOL's fp32 bound
    grads = torch.autograd.grad(out, [w, c, s], grad)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
