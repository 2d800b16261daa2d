"""Dual placement (DP): the paper's Theorem 3.1 as we read it (DESIGN.md §3, §4).

Single placement computes ``z = W diag(γ) u``; dual placement ``z = diag(s) W diag(γ) u``. At a point
with ``s = 1`` both compute the same function with the same (W, γ), so ``∂L/∂W`` and ``∂L/∂γ`` agree,
and dual placement has the extra gradient ``∂L/∂s_i = Σ_j W_ij γ_j ∂L/∂V_ij`` (row i of V = W diag γ).
Under gradient flow ``θ' = −∇L`` the instantaneous loss decrease rate is ``−dL/dt = ‖∇L‖²``, hence

    rate_dual − rate_single = ‖∂L/∂s‖² ≥ 0.

The experiment does not use this formula to compute the rates: each rate is the directional
derivative ``−d/dε L(θ − ε ∇L(θ))`` at ε = 0 by forward-mode AD (``torch.func.jvp``) on its own
model, in float64, at many random (W, γ, data) points; ``‖∂L/∂s‖²`` comes from reverse mode. It
also trains both placements by gradient descent from the same start (s = 1) on the least-squares
toy of ``precondition.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import grad, jvp

from scalevec.experiments.theory.toys import (
    DTYPE,
    descend,
    figure,
    generator,
    leaf,
    least_squares_task,
    mse,
    randn,
    steps_to_target,
)
from scalevec.outpath import write_figure

N, D_IN, D_OUT, N_POINTS = 64, 8, 6, 200
CURVE_N, CURVE_D_IN, CURVE_D_OUT, TEACHER_STD, INIT_STD = 256, 16, 8, 1.0, 0.1
LR, STEPS, TARGET_FRACTION = 0.05, 150, 1e-3


def single_loss(u: Tensor, y: Tensor):
    """``L(W, γ) = ½ mean ‖W diag(γ) u_i − y_i‖²``."""
    return lambda w, gamma: mse(u @ (w * gamma).T, y)


def dual_loss(u: Tensor, y: Tensor):
    """``L(W, γ, s) = ½ mean ‖diag(s) W diag(γ) u_i − y_i‖²``."""
    return lambda w, gamma, s: mse(u @ (s[:, None] * w * gamma).T, y)


def flow_rate(loss, params: tuple[Tensor, ...]) -> float:
    """``−dL/dt`` along gradient flow at ``params``: ``−jvp(L, params, −∇L)`` (forward over reverse)."""
    grads = grad(loss, argnums=tuple(range(len(params))))(*params)
    _, dl = jvp(loss, params, tuple(-g for g in grads))
    return -dl.item()


def random_point(gen: torch.Generator) -> dict:
    """One check: random data and γ; W = the teacher's W·diag(1/γ) plus noise of a random size 10^U(−3, 0),
    so the points range from near the optimum to far from it (s = 1). The two rates and ``‖∂L/∂s‖²``."""
    u, y, teacher = least_squares_task(N, D_IN, D_OUT, 1.0, gen, noise_std=0.1)
    gamma = 1.0 + randn(D_IN, gen=gen, std=0.5).clamp(-0.75, 0.75)  # |γ_j| >= 0.25: W stays moderate
    distance = 10.0 ** (-3.0 * torch.rand((), generator=gen, dtype=DTYPE).item())
    w = teacher / gamma + randn(D_OUT, D_IN, gen=gen, std=distance)
    s = torch.ones(D_OUT, dtype=DTYPE)
    single = flow_rate(single_loss(u, y), (w, gamma))
    dual = flow_rate(dual_loss(u, y), (w, gamma, s))
    grad_s = grad(dual_loss(u, y), argnums=2)(w, gamma, s)
    return {"rate_single": single, "rate_dual": dual, "grad_s_sq": grad_s.pow(2).sum().item()}


def curves(seed: int) -> dict:
    """GD from the same (W0, γ = 1, s = 1): single vs dual placement, loss per step and steps to target."""
    gen = generator(seed + 1)
    u, y, _ = least_squares_task(CURVE_N, CURVE_D_IN, CURVE_D_OUT, TEACHER_STD, gen)
    w0 = randn(CURVE_D_OUT, CURVE_D_IN, gen=gen, std=INIT_STD)
    ones = lambda n: torch.ones(n, dtype=DTYPE)
    single = descend(lambda p: single_loss(u, y)(p["W"], p["gamma"]),
                     {"W": leaf(w0), "gamma": leaf(ones(CURVE_D_IN))}, LR, STEPS)["loss"]
    dual = descend(lambda p: dual_loss(u, y)(p["W"], p["gamma"], p["s"]),
                   {"W": leaf(w0), "gamma": leaf(ones(CURVE_D_IN)), "s": leaf(ones(CURVE_D_OUT))}, LR, STEPS)["loss"]
    target = TARGET_FRACTION * single[0]
    s_single, s_dual = steps_to_target(single, target), steps_to_target(dual, target)
    return {"loss_single": single, "loss_dual": dual, "target": target, "steps_single": s_single,
            "steps_dual": s_dual, "speedup": s_single / s_dual if s_single and s_dual else None}


def compute(seed: int = 0) -> dict:
    """``N_POINTS`` random checks and the training curves (about a second). JSON-ready."""
    gen = generator(seed)
    points = [random_point(gen) for _ in range(N_POINTS)]
    rel = [abs(p["rate_dual"] - p["rate_single"] - p["grad_s_sq"]) / p["grad_s_sq"] for p in points]
    return {
        "setup": {"n": N, "d_in": D_IN, "d_out": D_OUT, "points": N_POINTS, "curve": {
            "n": CURVE_N, "d_in": CURVE_D_IN, "d_out": CURVE_D_OUT, "teacher_std": TEACHER_STD,
            "init_std": INIT_STD, "lr": LR, "steps": STEPS, "target_fraction": TARGET_FRACTION}, "seed": seed},
        "points": points,
        "max_rel_err": max(rel),
        "min_rate_difference": min(p["rate_dual"] - p["rate_single"] for p in points),
        "curves": curves(seed),
    }


def summarize(r: dict) -> list[str]:
    c = r["curves"]
    speed = "n/a" if c["speedup"] is None else f"{c['speedup']:.2f}×"
    return [
        (f"rate_dual − rate_single vs ‖∂L/∂s‖² at {len(r['points'])} random points (s = 1): max relative error "
         f"{r['max_rel_err']:.1e}; smallest difference {r['min_rate_difference']:.3e} (≥ 0)"),
        f"GD steps to {TARGET_FRACTION:g}×initial loss: single {c['steps_single']}, dual {c['steps_dual']} ({speed})",
    ]


def plot(r: dict, path: str) -> None:
    """Two panels: rate difference vs ‖∂L/∂s‖² at every point (on the diagonal), and the loss curves."""
    fig, (a, b) = figure(2)
    x = [p["grad_s_sq"] for p in r["points"]]
    a.loglog(x, [p["rate_dual"] - p["rate_single"] for p in r["points"]], "o", ms=3, label="random points")
    a.loglog([min(x), max(x)], [min(x), max(x)], "k:", label="y = x")
    a.set(title="rate_dual − rate_single at s = 1", xlabel="‖∂L/∂s‖²", ylabel="rate difference")
    a.legend()
    c = r["curves"]
    b.semilogy(c["loss_single"], label="W diag(γ)")
    b.semilogy(c["loss_dual"], label="diag(s) W diag(γ)")
    b.axhline(c["target"], color="gray", ls=":", label="target")
    b.set(title="least squares, same start", xlabel="GD step", ylabel="loss")
    b.legend()
    write_figure(fig, path, dpi=110)
