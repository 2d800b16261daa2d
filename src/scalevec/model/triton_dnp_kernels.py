"""The two Triton kernels of ``triton_dnp`` (DNP's SwiGLU, DESIGN.md §3 ``dual_norm``): forward and backward.

Imported only when a kernel is first launched (``triton_dnp._launch_*``), never by the package's import: this
module needs ``triton``, and Triton decides when a kernel is defined whether it is compiled for the GPU or run by
its interpreter (``TRITON_INTERPRET=1``: numpy on CPU tensors, the CPU tests' way). The formulas and the launch
geometry are documented in ``triton_dnp``; this module holds only the device code.

Each program owns whole rows (tokens): a row of d_ff values lives in registers (``BLOCK_F`` = d_ff rounded up to
a power of two), so the per-token RMS of each branch is one in-register reduction and every element of y_g, y_u
is read once per kernel (the layout of Liger-Kernel's RMSNorm; its SwiGLU does not normalize).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _scale(s_ptr, cols, col_mask, NORM: tl.constexpr):
    """A branch's output scale s as a float32 ``(BLOCK_F,)`` tile, loaded once per program (ones when the branch
    is not normalized: then it is never read)."""
    if NORM:
        return tl.load(s_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    else:
        return tl.full(cols.shape, 1.0, tl.float32)


@triton.jit
def _normalized(y, s, d_ff, eps, NORM: tl.constexpr):
    """``(z, n, r)`` of one branch's tile ``y`` (float32, ``(BLOCK_N, BLOCK_F)``): with ``NORM``,
    ``r = 1/sqrt(mean(y², -1) + eps)`` per row, ``n = y r`` and ``z = s ⊙ n``; without, ``z = n = y``, ``r = 1``."""
    if NORM:
        r = tl.rsqrt(tl.sum(y * y, axis=1) / d_ff + eps)  # (BLOCK_N,), float32; masked columns hold 0
        n = y * r[:, None]
        return n * s[None, :], n, r
    else:
        return y, y, tl.full((y.shape[0],), 1.0, tl.float32)


@triton.jit
def dnp_swiglu_fwd(yg_ptr, yu_ptr, sg_ptr, su_ptr, out_ptr, n_rows, d_ff, stride_g, stride_u, stride_out, eps,
                   NORM_G: tl.constexpr, NORM_U: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
    """``out = silu(z_g) ⊙ z_u`` for the ``BLOCK_N`` rows of this program; reads y_g, y_u (and s), writes out."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_F)
    col_mask = cols < d_ff
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    yg = tl.load(yg_ptr + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    yu = tl.load(yu_ptr + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    zg, _, _ = _normalized(yg, _scale(sg_ptr, cols, col_mask, NORM_G), d_ff, eps, NORM_G)
    zu, _, _ = _normalized(yu, _scale(su_ptr, cols, col_mask, NORM_U), d_ff, eps, NORM_U)
    out = zg * tl.sigmoid(zg) * zu
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _branch_grad(dz, n, r, s, d_ff, NORM: tl.constexpr):
    """``∂L/∂y`` of one branch from ``∂L/∂z`` (float32 tiles): RMSNorm's backward with ``dn = dz ⊙ s``,
    ``∂L/∂y = r (dn − n · mean(dn ⊙ n))`` where the branch is normalized, else ``dz``."""
    if NORM:
        dn = dz * s[None, :]
        return r[:, None] * (dn - n * (tl.sum(dn * n, axis=1) / d_ff)[:, None])
    else:
        return dz


@triton.jit
def dnp_swiglu_bwd(g_ptr, yg_ptr, yu_ptr, sg_ptr, su_ptr, dyg_ptr, dyu_ptr, dsg_ptr, dsu_ptr,
                   n_rows, d_ff, stride_gout, stride_g, stride_u, stride_dg, stride_du, eps,
                   NORM_G: tl.constexpr, NORM_U: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
    """∂L/∂y_g, ∂L/∂y_u of every row, and this program's partial sums of ∂L/∂s_g, ∂L/∂s_u (row ``pid`` of
    ``(programs, d_ff)`` float32 buffers). Programs stride over the row blocks; r is recomputed from y
    (forward saves nothing but its inputs)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_F)
    col_mask = cols < d_ff
    sg = _scale(sg_ptr, cols, col_mask, NORM_G)
    su = _scale(su_ptr, cols, col_mask, NORM_U)
    dsg = tl.zeros((BLOCK_F,), tl.float32)
    dsu = tl.zeros((BLOCK_F,), tl.float32)
    for start in range(pid * BLOCK_N, n_rows, tl.num_programs(0) * BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N).to(tl.int64)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        g = tl.load(g_ptr + rows[:, None] * stride_gout + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        yg = tl.load(yg_ptr + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        yu = tl.load(yu_ptr + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        zg, ng, rg = _normalized(yg, sg, d_ff, eps, NORM_G)
        zu, nu, ru = _normalized(yu, su, d_ff, eps, NORM_U)
        sig = tl.sigmoid(zg)
        dzu = g * (zg * sig)  # ∂L/∂z_u = g ⊙ silu(z_g)
        dzg = g * zu * sig * (1.0 + zg * (1.0 - sig))  # silu'(z) = σ(z) (1 + z (1 − σ(z)))
        if NORM_G:
            dsg += tl.sum(dzg * ng, axis=0)  # ∂L/∂s = Σ_tokens ∂L/∂z ⊙ n
        if NORM_U:
            dsu += tl.sum(dzu * nu, axis=0)
        dyg = _branch_grad(dzg, ng, rg, sg, d_ff, NORM_G)
        dyu = _branch_grad(dzu, nu, ru, su, d_ff, NORM_U)
        tl.store(dyg_ptr + rows[:, None] * stride_dg + cols[None, :], dyg.to(dyg_ptr.dtype.element_ty), mask=mask)
        tl.store(dyu_ptr + rows[:, None] * stride_du + cols[None, :], dyu.to(dyu_ptr.dtype.element_ty), mask=mask)
    if NORM_G:
        tl.store(dsg_ptr + pid * d_ff + cols, dsg, mask=col_mask)
    if NORM_U:
        tl.store(dsu_ptr + pid * d_ff + cols, dsu, mask=col_mask)
