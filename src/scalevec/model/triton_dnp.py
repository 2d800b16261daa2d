"""DNP's SwiGLU as one fused Triton kernel each way, registered as the ``torch.library`` ops ``scalevec::dnp_swiglu``
and ``scalevec::dnp_swiglu_backward`` (DESIGN.md §3 ``dual_norm``; the formula is ``scales.dnp_swiglu``).

With ``y_g, y_u: (N, d_ff)`` the gate/up matmul outputs and ``s_g, s_u: (d_ff,)`` their output scales (None: that
branch is not normalized, ``z = y``)::

    r_b = 1 / sqrt(mean(y_b², -1) + eps)   (per token, over d_ff, float32)
    z_b = s_b ⊙ y_b r_b,   out = silu(z_g) ⊙ z_u

and backward, with ``g = ∂L/∂out``, ``σ = sigmoid(z_g)``, ``n_b = y_b r_b``::

    ∂L/∂z_u = g ⊙ silu(z_g),   ∂L/∂z_g = g ⊙ z_u ⊙ σ (1 + z_g (1 − σ))
    ∂L/∂y_b = r_b (dn_b − n_b mean(dn_b ⊙ n_b)),  dn_b = ∂L/∂z_b ⊙ s_b,   ∂L/∂s_b = Σ_tokens ∂L/∂z_b ⊙ n_b

What it fuses: ``kernels.dnp_swiglu`` (the fast path on CPU) runs this as ~17 elementwise passes over
``(N, d_ff)`` forward and backward, each reading and writing its operands in memory; here forward reads y_g, y_u
and writes out (what the baseline's ``silu(gate) ⊙ up`` reads and writes), and backward reads g, y_g, y_u and
writes ∂L/∂y_g, ∂L/∂y_u: per token 6 and 10 bytes × d_ff in bf16 (docs/performance.md has the unfused count).
Forward saves only its inputs (y_g, y_u, s); backward recomputes r in registers from the rows it reads anyway.
The vector gradients are reduced in two stages: each backward program sums its rows into one float32 row of a
``(programs, d_ff)`` buffer per scale, then one ``sum`` over programs for both (deterministic, no atomics): backward
launches that Triton kernel and one small reduction.

Precision: inputs bf16, fp16 or fp32; every intermediate float32, the outputs rounded once to the input dtype
(∂L/∂s to s's dtype). The plain formula rounds z to the input dtype before silu, so in bf16 the two agree to
bf16 rounding, not to the bit (tests/test_triton_dnp.py). float64 and rows wider than ``MAX_D_FF`` are not
served (``supported``): the fast path computes them.

Where it runs: ``kernels.dnp_swiglu`` calls ``supported(y_g, y_u)`` (the CUDA code path, Triton installed) and
routes here, so the CUDA trainer's DNP MLP (``scales.DNPSwiGLUProj`` on ``kernels.FAST``) takes it and CPU training
is untouched. Under ``create_graph`` (double backward: training/probes.py) the backward differentiates the composed
plain formula instead, so second derivatives stay exact, as in ``kernels``. ``torch.compile`` and dispatch counters
see one op each way, through the fake implementations below. The kernels (``triton_dnp_kernels``) are imported at
first launch, so this module and the package import without Triton; the CPU tests run them under Triton's
interpreter (``TRITON_INTERPRET=1``). The row layout follows Liger-Kernel's RMSNorm (a row in registers, r per row,
partial vector gradients per program); Liger's SwiGLU does not normalize, so its ops would run the two norms and the
SwiGLU as three kernels each way and keep z_g, z_u in memory.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from scalevec.model import scales as plain
from scalevec.model.device_path import on_cuda_path

MAX_D_FF = 65536  # a row of d_ff float32 values is held in registers (Triton's largest practical block)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_HAS_TRITON = importlib.util.find_spec("triton") is not None


def supported(yg: Tensor, yu: Tensor) -> bool:
    """True if the fused op computes ``dnp_swiglu(yg, yu, ...)``: tensors on the CUDA code path
    (``device_path.on_cuda_path``: CUDA, or meta while ``bench --count`` walks that path) of one dtype among bf16,
    fp16, fp32, ``d_ff <= MAX_D_FF``, and Triton installed. Anything else takes the fast path (``kernels``)."""
    return (_HAS_TRITON and on_cuda_path(yg) and yg.dtype == yu.dtype and yg.dtype in _DTYPES
            and yg.shape[-1] <= MAX_D_FF)


def dnp_swiglu(yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None, eps: float) -> Tensor:
    """``scales.dnp_swiglu`` fused: ``y_g, y_u: (..., d_ff)`` of one dtype, ``s_g, s_u: (d_ff,)`` or None ->
    ``(..., d_ff)`` in the inputs' dtype (module docstring). Raises ``ValueError`` on mismatched shapes."""
    return torch.ops.scalevec.dnp_swiglu(yg, yu, sg, su, eps)


def _check(yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None) -> None:
    if yg.shape != yu.shape or yg.dtype != yu.dtype:
        raise ValueError(f"dnp_swiglu needs y_gate and y_up of one shape and dtype, got {tuple(yg.shape)} "
                         f"{yg.dtype} and {tuple(yu.shape)} {yu.dtype}")
    for name, s in (("s_gate", sg), ("s_up", su)):
        if s is not None and tuple(s.shape) != (yg.shape[-1],):
            raise ValueError(f"dnp_swiglu needs {name} of shape (d_ff,) = ({yg.shape[-1]},), got {tuple(s.shape)}")


def _rows(t: Tensor) -> Tensor:
    """``t`` as ``(N, d_ff)`` with unit stride along d_ff (a view where possible; the kernels take a row stride)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _unit_stride(s: Tensor | None) -> Tensor | None:
    """A scale vector with unit stride (the kernels read ``s[j]`` at ``s + j``; a strided view gave wrong values)."""
    return s if s is None or s.stride(-1) == 1 else s.contiguous()


def _geometry(d_ff: int) -> tuple[int, int, int]:
    """``(BLOCK_N, BLOCK_F, num_warps)``: a program holds ``BLOCK_N`` whole rows, ``BLOCK_F`` = d_ff rounded up to
    a power of two; short rows share a program up to a 1024-element tile; one warp per 128 elements (4 per
    thread), 4 to 32 warps. Chosen with ptxas's report for sm_90 (bf16, both branches normalized): backward, the
    heavier kernel, then uses <= 80 registers and spills nothing up to BLOCK_F = 4096 (llama-1b's d_ff = 4778:
    8192, 64 registers, 192 bytes spilled); 8 elements per thread doubled its registers (1 block of 8 warps per SM)."""
    block_f = 1 << max(d_ff - 1, 0).bit_length()
    block_n = max(1, 1024 // block_f)
    return block_n, block_f, min(32, max(4, block_n * block_f // 128))


def _backward_programs(device: torch.device, n_blocks: int) -> int:
    """Backward's grid: two programs per SM on CUDA, each striding over row blocks (the fewer programs, the
    smaller the ``(programs, d_ff)`` partial-sum buffer); two elsewhere (the interpreter), so tests cover the loop."""
    per_device = 2 * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2
    return max(1, min(n_blocks, per_device))


@torch.library.custom_op("scalevec::dnp_swiglu", mutates_args=())
def _dnp_swiglu_op(yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None, eps: float) -> Tensor:
    from scalevec.model import triton_dnp_kernels as k  # at first launch: Triton picks compiled or interpreted then

    _check(yg, yu, sg, su)
    yg2, yu2, sg, su = _rows(yg), _rows(yu), _unit_stride(sg), _unit_stride(su)
    n, d_ff = yg2.shape
    out = torch.empty((n, d_ff), dtype=yg.dtype, device=yg.device)
    block_n, block_f, warps = _geometry(d_ff)
    grid = (-(-n // block_n),)
    k.dnp_swiglu_fwd[grid](yg2, yu2, sg, su, out, n, d_ff, yg2.stride(0), yu2.stride(0), out.stride(0), eps,
                           NORM_G=sg is not None, NORM_U=su is not None, BLOCK_N=block_n, BLOCK_F=block_f,
                           num_warps=warps)
    return out.view(yg.shape)


@_dnp_swiglu_op.register_fake
def _(yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None, eps: float) -> Tensor:
    _check(yg, yu, sg, su)
    return torch.empty_like(yg, memory_format=torch.contiguous_format)


@torch.library.custom_op("scalevec::dnp_swiglu_backward", mutates_args=())
def _dnp_swiglu_backward_op(grad: Tensor, yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None,
                            eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(∂L/∂y_g, ∂L/∂y_u, ∂L/∂s)``: ∂L/∂s float32 ``(k, d_ff)``, a row for each of ``s_g``, ``s_u`` that is given."""
    from scalevec.model import triton_dnp_kernels as k

    g2, yg2, yu2, sg, su = _rows(grad), _rows(yg), _rows(yu), _unit_stride(sg), _unit_stride(su)
    n, d_ff = yg2.shape
    dyg, dyu = (torch.empty((n, d_ff), dtype=y.dtype, device=y.device) for y in (yg, yu))
    block_n, block_f, warps = _geometry(d_ff)
    programs = _backward_programs(yg.device, -(-n // block_n))
    scales = [s for s in (sg, su) if s is not None]
    # each program's sums of ∂L/∂s over its rows, a (programs, d_ff) slice per given scale: one sum(1) reduces both
    partial = torch.empty((len(scales), programs, d_ff), dtype=torch.float32, device=yg.device)
    slices = iter(partial)
    dsg_part, dsu_part = (next(slices) if s is not None else None for s in (sg, su))
    k.dnp_swiglu_bwd[(programs,)](g2, yg2, yu2, sg, su, dyg, dyu, dsg_part, dsu_part, n, d_ff, g2.stride(0),
                                  yg2.stride(0), yu2.stride(0), dyg.stride(0), dyu.stride(0), eps,
                                  NORM_G=sg is not None, NORM_U=su is not None, BLOCK_N=block_n, BLOCK_F=block_f,
                                  num_warps=warps)
    return dyg.view(yg.shape), dyu.view(yu.shape), partial.sum(1)


@_dnp_swiglu_backward_op.register_fake
def _(grad: Tensor, yg: Tensor, yu: Tensor, sg: Tensor | None, su: Tensor | None,
      eps: float) -> tuple[Tensor, Tensor, Tensor]:
    n_scales = (sg is not None) + (su is not None)
    return (torch.empty_like(yg, memory_format=torch.contiguous_format),
            torch.empty_like(yu, memory_format=torch.contiguous_format),
            yg.new_empty((n_scales, yg.shape[-1]), dtype=torch.float32))


def _setup_context(ctx, inputs, output) -> None:
    yg, yu, sg, su, eps = inputs
    ctx.save_for_backward(yg, yu, sg, su)
    ctx.eps = eps


def _backward(ctx, grad: Tensor):
    yg, yu, sg, su = ctx.saved_tensors
    need = ctx.needs_input_grad[:4]
    if torch.is_grad_enabled():  # create_graph: let autograd differentiate the composed plain formula
        inputs = [t for t, n in zip((yg, yu, sg, su), need) if n]
        grads = iter(torch.autograd.grad(plain.dnp_swiglu(yg, yu, sg, su, ctx.eps), inputs, grad, create_graph=True))
        return (*(next(grads) if n else None for n in need), None)
    dyg, dyu, ds = torch.ops.scalevec.dnp_swiglu_backward(grad, yg, yu, sg, su, ctx.eps)
    rows = iter(ds)
    dsg, dsu = (next(rows).to(s.dtype) if s is not None else None for s in (sg, su))
    return tuple(gr if n else None for gr, n in zip((dyg, dyu, dsg, dsu), need)) + (None,)


_dnp_swiglu_op.register_autograd(_backward, setup_context=_setup_context)

__all__ = ["supported", "dnp_swiglu", "MAX_D_FF"]
