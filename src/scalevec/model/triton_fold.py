"""The fold ``W' = diag(s) W diag(c)`` as one Triton kernel each way, registered as the ``torch.library`` ops
``scalevec::fold_weight`` and ``scalevec::fold_weight_backward`` (DESIGN.md §3 note; the formula is
``scales.fold_weight``, its chain rule ``kernels.fold_grads``).

With ``W: (d_out, d_in)``, an input-side ``c: (d_in,)`` (HG's γ_b) and an output-side ``s: (d_out,)`` (DP's s_b),
either of them None (ones)::

    W' = s cᵀ ⊙ W   (written in the matmul's dtype: bf16 under autocast)

and backward, with ``G = ∂L/∂W'`` (float32 or the matmul's bf16) and ``P = G ⊙ W``::

    ∂L/∂W = G ⊙ s cᵀ,   ∂L/∂s = P c  (Σ over d_in),   ∂L/∂c = Pᵀ s  (Σ over d_out)

What it fuses: ``kernels.fold_weight_to`` runs the forward as two products (W ⊙ c, then s ⊙ · written in bf16) and
``kernels.fold_grads`` the backward as five kernels over the weight (P = G ⊙ W, two matrix-vector products, two
products for ∂L/∂W): per folded branch five weight-sized kernels more than the baseline's two casts of its weight
(``bench --count``). Here forward reads W and writes W' in the output dtype; backward reads G and W and writes
∂L/∂W, ∂L/∂s and per-program partial sums of ∂L/∂c. A backward program owns ``BLOCK_M`` whole rows and walks their
column tiles, so ∂L/∂s of its rows is complete in registers; ∂L/∂c needs the sum over every row, so each program
writes its rows' sum into one float32 row of a ``(programs, d_in)`` buffer and one ``sum`` over programs follows
(deterministic, no atomics). That ``sum`` runs outside the op, in ``fold_grads`` below, so ``bench --count`` counts
it: with c given, backward is two launches (the kernel and the sum), with s only, one.

Precision: W bf16, fp16 or fp32; every product float32 in ``scales.fold_weight``'s order (W ⊙ c, then s ⊙ ·),
rounded once to the output's dtype, so an fp32 W' is that formula's, to the bit, and a bf16 W' is its rounding
(on the GPU, to nearest: ``fold_weight_to``'s bits; Triton's interpreter truncates instead). ∂L/∂W is
``fold_grads``'s product in its order, to the bit; ∂L/∂s and ∂L/∂c are float32 sums in another order (equal to
rounding), cast to the vectors' dtypes. float64, expert banks (W of three dims) and vectors of another shape are
not served (``supported``): ``kernels`` computes them.

Where it runs: ``kernels.fold_weight_to`` and ``kernels.fold_grads`` call ``supported(w, c, s)`` (the CUDA code
path, Triton installed) and route here, so the CUDA trainer's folded branches (``kernels.folded_linear``, and the
opt-in ``fused.py``) take it and CPU training is untouched. The op ``fold_weight`` also carries autograd
(``register_autograd``); under ``create_graph`` (double backward: training/probes.py) its backward differentiates the
composed plain formula instead, so second derivatives stay exact, as in ``kernels``. ``torch.compile`` and dispatch
counters see one op each way, through the fake implementations below. The kernels (``triton_fold_kernels``) are
imported at first launch, so this module and the package import without Triton; the CPU tests run them under
Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from scalevec.model import scales as plain
from scalevec.model.device_path import on_cuda_path

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_HAS_TRITON = importlib.util.find_spec("triton") is not None
BLOCK_M = 16  # rows per program: a backward program's ∂L/∂c partial covers 16 rows (buffer: d_out/16 × d_in fp32)
BLOCK_N = 128  # columns per tile: 2048 elements per (16, 128) tile, 16 per thread at 4 warps


def supported(w: Tensor, c: Tensor | None, s: Tensor | None, g: Tensor | None = None) -> bool:
    """True if the fused ops compute the fold of ``w`` with ``c``, ``s`` (and its gradients from ``g = ∂L/∂W'``): a
    matrix ``W: (d_out, d_in)`` on the CUDA code path (``device_path.on_cuda_path``: CUDA, or meta while
    ``bench --count`` walks that path) in bf16, fp16 or fp32, at least one vector given, each of shape ``(d_in,)`` /
    ``(d_out,)`` in one of those dtypes, ``g`` (if given) of W's shape in one of them, and Triton installed.
    Anything else takes ``kernels``' composed form."""
    tensors = [(v, (n,)) for v, n in ((c, w.shape[-1]), (s, w.shape[0])) if v is not None]
    return (_HAS_TRITON and w.dim() == 2 and on_cuda_path(w) and w.dtype in _DTYPES and bool(tensors)
            and all(tuple(t.shape) == shape and t.dtype in _DTYPES and t.device == w.device
                    for t, shape in tensors + ([(g, tuple(w.shape))] if g is not None else [])))


def fold_weight(w: Tensor, c: Tensor | None, s: Tensor | None, dtype: torch.dtype) -> Tensor:
    """``scales.fold_weight(w, c, s).to(dtype)`` in one kernel: ``W: (d_out, d_in)``, ``c: (d_in,)``, ``s: (d_out,)``
    or None -> ``(d_out, d_in)`` in ``dtype`` (module docstring). Differentiable. Raises ``ValueError`` on shapes
    that do not fit."""
    return torch.ops.scalevec.fold_weight(w, c, s, dtype)


def fold_grads(g: Tensor, w: Tensor, c: Tensor | None, s: Tensor | None,
               need: tuple[bool, bool, bool] = (True, True, True)) -> tuple[Tensor | None, ...]:
    """``kernels.fold_grads`` fused: ``(∂L/∂W, ∂L/∂c, ∂L/∂s)`` of the fold given ``G = ∂L/∂W': (d_out, d_in)`` (float32
    or bf16/fp16), each None where ``need`` says so or its vector is absent; ∂L/∂W in W's dtype, the vectors'
    gradients in theirs. One kernel, and one ``sum`` when c is given (module docstring)."""
    gw, gs, gc_part = torch.ops.scalevec.fold_weight_backward(g, w, c, s, need[0])
    grad_c = gc_part.sum(0).to(c.dtype) if c is not None and need[1] else None
    grad_s = gs.to(s.dtype) if s is not None and need[2] else None
    return (gw if need[0] else None), grad_c, grad_s


def _check(w: Tensor, c: Tensor | None, s: Tensor | None, g: Tensor | None = None) -> None:
    if g is not None and g.shape != w.shape:
        raise ValueError(f"fold_weight_backward needs ∂L/∂W' of W's shape {tuple(w.shape)}, got {tuple(g.shape)}")
    if w.dim() != 2:
        raise ValueError(f"fold_weight needs a matrix W (d_out, d_in), got shape {tuple(w.shape)}")
    for name, v, n in (("c", c, w.shape[1]), ("s", s, w.shape[0])):
        if v is not None and tuple(v.shape) != (n,):
            raise ValueError(f"fold_weight needs {name} of shape ({n},) for W of shape {tuple(w.shape)}, "
                             f"got {tuple(v.shape)}")


def _unit_stride(t: Tensor) -> Tensor:
    """``t`` with unit stride along its last dim (itself where it has one; the kernels take a row stride)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _programs(d_out: int) -> int:
    """Backward's grid: one program per ``BLOCK_M`` rows (so also the rows of the ∂L/∂c partial-sum buffer)."""
    return max(1, -(-d_out // BLOCK_M))


def _block_n(d_in: int) -> int:
    """Column tile: ``BLOCK_N``, or d_in rounded up to a power of two where that is narrower."""
    return min(BLOCK_N, 1 << max(d_in - 1, 0).bit_length())


@torch.library.custom_op("scalevec::fold_weight", mutates_args=())
def _fold_weight_op(w: Tensor, c: Tensor | None, s: Tensor | None, dtype: torch.dtype) -> Tensor:
    from scalevec.model import triton_fold_kernels as k  # at first launch: Triton picks compiled or interpreted then

    _check(w, c, s)
    w, c, s = (_unit_stride(t) if t is not None else None for t in (w, c, s))  # the kernels read c, s at stride 1
    d_out, d_in = w.shape
    out = torch.empty((d_out, d_in), dtype=dtype, device=w.device)
    block_n = _block_n(d_in)
    grid = (-(-d_out // BLOCK_M), -(-d_in // block_n))
    k.fold_fwd[grid](w, c, s, out, d_out, d_in, w.stride(0), out.stride(0), HAS_C=c is not None,
                     HAS_S=s is not None, BLOCK_M=BLOCK_M, BLOCK_N=block_n, num_warps=4)
    return out


@_fold_weight_op.register_fake
def _(w: Tensor, c: Tensor | None, s: Tensor | None, dtype: torch.dtype) -> Tensor:
    _check(w, c, s)
    return w.new_empty(w.shape, dtype=dtype)


@torch.library.custom_op("scalevec::fold_weight_backward", mutates_args=())
def _fold_weight_backward_op(g: Tensor, w: Tensor, c: Tensor | None, s: Tensor | None,
                             need_w: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(∂L/∂W, ∂L/∂s, ∂L/∂c partials)``: ∂L/∂W in W's dtype (empty ``(0,)`` without ``need_w``), ∂L/∂s float32
    ``(d_out,)`` (``(0,)`` without s), the partial sums float32 ``(programs, d_in)`` (``(0, d_in)`` without c)."""
    from scalevec.model import triton_fold_kernels as k

    _check(w, c, s, g)
    g, w, c, s = (_unit_stride(t) if t is not None else None for t in (g, w, c, s))
    d_out, d_in = w.shape
    programs = _programs(d_out)
    gw = torch.empty((d_out, d_in) if need_w else (0,), dtype=w.dtype, device=w.device)
    gs = torch.empty((d_out,) if s is not None else (0,), dtype=torch.float32, device=w.device)
    gc_part = torch.empty((programs if c is not None else 0, d_in), dtype=torch.float32, device=w.device)
    k.fold_bwd[(programs,)](g, w, c, s, gw, gs, gc_part, d_out, d_in, g.stride(0), w.stride(0),
                            gw.stride(0) if need_w else 0, HAS_C=c is not None, HAS_S=s is not None, NEED_W=need_w,
                            BLOCK_M=BLOCK_M, BLOCK_N=_block_n(d_in), num_warps=4)
    return gw, gs, gc_part


@_fold_weight_backward_op.register_fake
def _(g: Tensor, w: Tensor, c: Tensor | None, s: Tensor | None, need_w: bool) -> tuple[Tensor, Tensor, Tensor]:
    _check(w, c, s, g)
    d_out, d_in = w.shape
    return (w.new_empty((d_out, d_in) if need_w else (0,)),
            w.new_empty((d_out,) if s is not None else (0,), dtype=torch.float32),
            w.new_empty((_programs(d_out) if c is not None else 0, d_in), dtype=torch.float32))


def _setup_context(ctx, inputs, output) -> None:
    w, c, s, dtype = inputs
    ctx.save_for_backward(w, c, s)
    ctx.dtype = dtype


def _backward(ctx, grad: Tensor):
    w, c, s = ctx.saved_tensors
    need = ctx.needs_input_grad[:3]
    if torch.is_grad_enabled():  # create_graph: let autograd differentiate the composed plain formula
        inputs = [t for t, n in zip((w, c, s), need) if n]
        grads = iter(torch.autograd.grad(plain.fold_weight(w, c, s).to(ctx.dtype), inputs, grad, create_graph=True))
        return (*(next(grads) if n else None for n in need), None)
    return (*fold_grads(grad, w, c, s, need), None)


_fold_weight_op.register_autograd(_backward, setup_context=_setup_context)

__all__ = ["supported", "fold_weight", "fold_grads", "BLOCK_M", "BLOCK_N"]
