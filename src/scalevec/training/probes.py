"""Probes for training: the preconditioner every scale vector induces, and the loss sharpness (DESIGN.md §4).

``probe_scales(model)`` reads the model's norms without running it (cheap; call it every K steps).
``sharpness(model, loss_fn)`` runs ``n_iters`` Hessian-vector products (each about two backward
passes). Both are off the training path: nothing here changes parameters, their ``.grad`` or the
global RNG state (``sharpness``'s forward pass does refresh an MoE's ``last_stats`` telemetry). The trainer decides when
to call them (``--probe-every``, ``--sharpness-every``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalevec.model.moe import MoE
from scalevec.model.scales import NormLinear, OutputNorm


def _summary(t: Tensor) -> dict[str, float]:
    """``{"min", "median", "max"}`` of all entries of ``t`` (median: ``torch.median``, the lower of the
    two middle values for an even count)."""
    t = t.detach().float().flatten()
    return {"min": t.min().item(), "median": t.median().item(), "max": t.max().item()}


def _branch_probe(shared: Tensor | None, branch: nn.Module) -> dict:
    """Theorem 2.2 summary for one branch ``y = [diag(s)] W diag(γ) u`` of a NormLinear (see ``probe_scales``)."""
    gamma = branch.in_scale() if branch.in_scale is not None else None
    if shared is not None:
        gamma = shared if gamma is None else gamma * shared
    col_norm = branch.weight.norm(dim=-2)  # ‖w_j‖ over d_out: (d_in,) or (E, d_in)
    out = {"gamma_sq": None, "lambda_max": None, "col_norm": _summary(col_norm)}
    if gamma is not None:
        gamma_sq = gamma.float().pow(2)
        out["gamma_sq"] = _summary(gamma_sq)
        out["lambda_max"] = _summary(gamma_sq + col_norm.float().pow(2))
    if branch.out_scale is not None:
        out["out_scale_sq"] = _summary(branch.out_scale().pow(2))
    return out


def _moe_branches(moe: MoE) -> dict[str, nn.Module]:
    """The linear maps reading an MoE's Input-Norm: router, expert banks, shared experts (moe.py sketch)."""
    branches = {"router": moe.router, "gate": moe.experts.gate, "up": moe.experts.up}
    if moe.shared_experts is not None:
        branches.update({"shared_gate": moe.shared_experts.gate, "shared_up": moe.shared_experts.up})
    return branches


def probe_scales(model: nn.Module) -> dict:
    """The preconditioner each norm's scale vector induces, per norm and branch (DESIGN.md §4, Theorem 2.2).

    For input channel j of a branch ``W: (d_out, d_in)`` reading an Input-Norm with effective gain γ_j
    (shared γ × HG branch γ, after the OR/ER reparameterization), gradient flow moves the effective
    column ``γ_j w_j`` with the preconditioner ``P_j = γ_j² I + w_j w_jᵀ``, whose eigenvalues are
    λ_min = γ_j² (on w_j^⊥) and λ_max = γ_j² + ‖w_j‖² (along w_j); ``w_j`` is the stored column.

    Returns ``{module name: entry}`` for every ``NormLinear``, ``MoE`` (its norm feeds the router, the
    expert banks ``(E, d_out, d_in)`` and the shared experts) and ``OutputNorm`` in ``model``:
    - NormLinear / MoE: ``{"kind": "input_norm", "branches": {branch: {"gamma_sq", "lambda_max", "col_norm"
      [, "out_scale_sq"]}}}``; each value is ``{"min", "median", "max"}`` over channels j (and experts)
      of γ_j², γ_j² + ‖w_j‖², ‖w_j‖ and, under DP/DNP, the output scale s_i². ``gamma_sq`` and
      ``lambda_max`` are None where the norm has no scale vector (strategy ``none``: P_j = I).
    - OutputNorm: ``{"kind": "output_norm", "gamma_sq": {...} or None}`` (it feeds no linear map).
    All values are Python floats (JSON-ready). No forward pass; parameters untouched.
    """
    out: dict[str, dict] = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (NormLinear, MoE)):
                shared = module.scale() if module.scale is not None else None
                maps = module.branches if isinstance(module, NormLinear) else _moe_branches(module)
                out[name] = {"kind": "input_norm", "branches": {b: _branch_probe(shared, m) for b, m in maps.items()}}
            elif isinstance(module, OutputNorm):
                gamma_sq = _summary(module.scale().pow(2)) if module.scale is not None else None
                out[name] = {"kind": "output_norm", "gamma_sq": gamma_sq}
    return out


def top_hessian_eigenvalue(loss_fn: Callable[[], Tensor], params: list[Tensor], n_iters: int = 20,
                           seed: int = 0) -> float:
    """The top (most positive) Hessian eigenvalue λ_max by power iteration on Hessian-vector products.

    ``loss_fn()`` returns the scalar loss at the current ``params``. The gradient is taken once with
    ``create_graph=True``; each iteration is one Hessian-vector product ``Hv = ∂(∇L · v)/∂θ`` (double
    backward through that graph), then ``v ← Hv / ‖Hv‖``, from a unit Gaussian ``v_0`` drawn on the CPU
    from ``seed``. Pass 1 runs ``n_iters`` iterations on H: if the Rayleigh quotient ``vᵀHv`` is at
    least 0.99 ``‖Hv‖`` (v has settled on a positive eigenvalue, the usual case near a minimum), it is
    returned. Otherwise a negative eigenvalue competes (typical at init: then plain power iteration
    oscillates or converges to it), and pass 2 runs ``n_iters`` iterations on ``H + ρI`` with
    ``ρ = ‖Hv‖`` from pass 1 (≈ the spectral radius, so ``H + ρI`` is ≈ PSD and its top eigenvector is
    H's λ_max one) and returns ``vᵀHv`` of its last iterate. Either way the result is a Rayleigh
    quotient of H, hence ≤ λ_max, and pass 2's rises monotonically towards it (H + ρI PSD); the error decays like
    ``(λ_2/λ_1)^(2·n_iters)`` of the matrix iterated. At most ``2·n_iters`` products. Raises
    ``ValueError`` if ``n_iters < 1`` or no parameter is given.
    """
    if n_iters < 1 or not params:
        raise ValueError(f"need n_iters >= 1 (got {n_iters}) and at least one parameter (got {len(params)})")
    gen = torch.Generator().manual_seed(seed)
    start = _unit([torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device) for p in params])
    with torch.enable_grad():
        grads = torch.autograd.grad(loss_fn(), params, create_graph=True)

        def power(shift: float) -> tuple[float, float]:
            """``n_iters`` steps on ``H + shift·I``; the last ``(vᵀHv, ‖(H + shift·I) v‖)``."""
            v, rayleigh, norm = start, 0.0, 0.0
            for _ in range(n_iters):
                hv = [h.detach() for h in torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)]
                rayleigh = sum((a * b).sum() for a, b in zip(hv, v)).item()  # vᵀHv, ‖v‖ = 1
                hv = [h + shift * x for h, x in zip(hv, v)] if shift else hv
                norm = torch.sqrt(sum(h.pow(2).sum() for h in hv)).item()
                v = _unit(hv)
            return rayleigh, norm

        rayleigh, radius = power(0.0)
        if rayleigh >= 0.99 * radius:
            return rayleigh
        return power(radius)[0]


def _unit(vs: list[Tensor]) -> list[Tensor]:
    """``vs / ‖vs‖`` with the norm over all tensors together (a vector in parameter space)."""
    norm = torch.sqrt(sum(x.pow(2).sum() for x in vs))
    if norm == 0:
        return vs  # Hv = 0: H is zero along v; the next Rayleigh quotient is 0, the honest answer
    return [x / norm for x in vs]


def sharpness(model: nn.Module, loss_fn: Callable[[nn.Module], Tensor], n_iters: int = 20, seed: int = 0) -> float:
    """Top Hessian eigenvalue of ``loss_fn(model)`` in all trainable parameters (DESIGN.md §4 sharpness).

    ``loss_fn(model) -> scalar Tensor`` (e.g. ``batch_loss(tokens, targets)``: mean nats/token on a
    fixed batch). Power iteration with ``n_iters`` (default 20) Hessian-vector products, twice that when
    a negative eigenvalue competes (see ``top_hessian_eigenvalue``). Runs in the parameters' dtype with
    autocast off (call it in eval mode if the model has dropout; ours has none). Attention is forced
    onto SDPA's math backend: the fused CPU (flash) kernel has no double backward in torch 2.13
    ("derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented")
    and no forward-mode AD either, so neither double backward nor forward-over-reverse
    (``torch.func.jvp`` of ``torch.func.grad``) works through it; the math backend computes the same
    function with ordinary differentiable ops, at more memory than a training step (the math backend
    materializes the attention matrix and the graph is kept for the double backward). Returns a float.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    device_type = params[0].device.type if params else "cpu"
    with sdpa_kernel(SDPBackend.MATH), torch.autocast(device_type=device_type, enabled=False):
        return top_hessian_eigenvalue(lambda: loss_fn(model), params, n_iters=n_iters, seed=seed)


def batch_loss(tokens: Tensor, targets: Tensor) -> Callable[[nn.Module], Tensor]:
    """``loss_fn`` for ``sharpness``: mean cross-entropy (nats/token) on a fixed batch plus the MoE
    auxiliary loss, ``model(tokens, targets) -> (ce_sum, n, aux)`` → ``ce_sum / n + aux``."""

    def loss_fn(model: nn.Module) -> Tensor:
        ce_sum, n_targets, aux = model(tokens, targets)
        return ce_sum / n_targets + aux

    return loss_fn
