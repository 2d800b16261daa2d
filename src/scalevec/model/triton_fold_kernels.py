"""The two Triton kernels of ``triton_fold`` (the fold ``W' = diag(s) W diag(c)``, DESIGN.md §3 note): forward and
backward.

Imported only when a kernel is first launched (``triton_fold``'s ops), never by the package's import: this module
needs ``triton``, and Triton decides when a kernel is defined whether it is compiled for the GPU or run by its
interpreter (``TRITON_INTERPRET=1``: numpy on CPU tensors, the CPU tests' way). The formulas and the launch geometry
are documented in ``triton_fold``; this module holds only the device code.

Every product is taken in float32 in the order of ``scales.fold_weight`` (W ⊙ c first, then s ⊙ ·) and rounded once
to the output's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _vector(v_ptr, idx, mask, HAS: tl.constexpr):
    """A scale vector's float32 tile at ``idx`` (ones when it is absent: then it is never read)."""
    if HAS:
        return tl.load(v_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    else:
        return tl.full(idx.shape, 1.0, tl.float32)


@triton.jit
def fold_fwd(w_ptr, c_ptr, s_ptr, out_ptr, d_out, d_in, stride_w, stride_out,
             HAS_C: tl.constexpr, HAS_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``out = s ⊙ (W ⊙ c)`` (s over rows, c over columns) for this program's ``(BLOCK_M, BLOCK_N)`` tile, written
    in out's dtype: reads W (and the vectors' tiles), writes W'."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < d_out, cols < d_in
    mask = row_mask[:, None] & col_mask[None, :]
    w = tl.load(w_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_C:
        w = w * _vector(c_ptr, cols, col_mask, HAS_C)[None, :]
    if HAS_S:
        w = _vector(s_ptr, rows, row_mask, HAS_S)[:, None] * w
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fold_bwd(g_ptr, w_ptr, c_ptr, s_ptr, gw_ptr, gs_ptr, gc_ptr, d_out, d_in, stride_g, stride_w, stride_gw,
             HAS_C: tl.constexpr, HAS_S: tl.constexpr, NEED_W: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr):
    """For this program's ``BLOCK_M`` rows of ``G = ∂L/∂W'``, over every column tile: ``∂L/∂W = (G ⊙ c) ⊙ s``
    (with ``NEED_W``), ``∂L/∂s`` of its rows complete (``Σ_j G ⊙ W ⊙ c``), and its partial sum of ``∂L/∂c``
    over its rows (``Σ_i G ⊙ W ⊙ s``) as row ``pid`` of a ``(programs, d_in)`` float32 buffer."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < d_out
    s = _vector(s_ptr, rows, row_mask, HAS_S)
    gs = tl.zeros((BLOCK_M,), tl.float32)
    for start in range(0, d_in, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < d_in
        mask = row_mask[:, None] & col_mask[None, :]
        c = _vector(c_ptr, cols, col_mask, HAS_C)
        g = tl.load(g_ptr + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if NEED_W:
            gw = g
            if HAS_C:
                gw = gw * c[None, :]
            if HAS_S:
                gw = gw * s[:, None]
            tl.store(gw_ptr + rows[:, None] * stride_gw + cols[None, :], gw.to(gw_ptr.dtype.element_ty), mask=mask)
        if HAS_C or HAS_S:
            p = g * tl.load(w_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_S:
                gs += tl.sum(p * c[None, :], axis=1)
            if HAS_C:
                tl.store(gc_ptr + pid * d_in + cols, tl.sum(p * s[:, None], axis=0), mask=col_mask)
    if HAS_S:
        tl.store(gs_ptr + rows, gs, mask=row_mask)
