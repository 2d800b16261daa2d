"""Self-amplifying preconditioning: the paper's Theorem 2.2, checked numerically (DESIGN.md §4).

A linear map reads a normalized input through a scale vector, ``z = W diag(γ) u`` with ``u = n(x)``,
``W: (d_out, d_in)``. For input channel j write ``w_j`` (column j of W), the effective column
``v_j = γ_j w_j`` and ``g_j = ∂L/∂v_j``. Then ``∂L/∂w_j = γ_j g_j`` and ``∂L/∂γ_j = w_jᵀ g_j``, so
under gradient flow on (W, γ)

    dv_j/dt = γ_j dw_j/dt + w_j dγ_j/dt = −(γ_j² I + w_j w_jᵀ) g_j = −P_j g_j,
    d(γ_j² − ‖w_j‖²)/dt = −2 γ_j w_jᵀ g_j + 2 γ_j w_jᵀ g_j = 0.

P_j has eigenvalues γ_j² (on w_j^⊥, d_out − 1 times) and γ_j² + ‖w_j‖² (along w_j): λ_min = γ_j²,
and since γ_j² − ‖w_j‖² is conserved, a column that grows (‖w_j‖↑) also grows γ_j and with it its own
step size: the preconditioning amplifies itself. One gradient-descent step of size η is exactly

    Δv_j = −η P_j g_j + η² (w_jᵀ g_j) γ_j g_j,
    Δ(γ_j² − ‖w_j‖²) = η² ((w_jᵀ g_j)² − γ_j² ‖g_j‖²),

so the first-order error of (b) is O(η) relative, and the drift of (a) over a fixed time T = η·steps
is a sum of T/η terms of size η²: O(η), halving when η halves. The experiment measures all of it
with autograd in float64 (nothing above is used to compute the numbers, only to predict them):
(a) the drift for three step sizes, (b) the one-step match for several η, (c) λ_min(P_j) vs γ_j²
along a training run, (d) loss curves with and without γ from the same effective initial weight,
on least squares and on a two-layer network whose two linear maps each read an RMS-normalized input.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from scalevec.experiments.theory.toys import (
    DTYPE,
    descend,
    figure,
    generator,
    leaf,
    least_squares_task,
    mse,
    randn,
    rms_normalize,
    steps_to_target,
)
from scalevec.outpath import write_figure

# Least-squares toy: the teacher's columns (‖v*_j‖ ≈ 2.8) are much larger than the student's at init
# (‖w_j‖ ≈ 0.28), so the columns must grow, the regime where the scale vector amplifies itself.
N, D_IN, D_OUT, TEACHER_STD, INIT_STD = 256, 16, 8, 1.0, 0.1
LR, STEPS, TARGET_FRACTION = 0.05, 150, 1e-3  # target: loss at or below 1e-3 × the initial loss
DRIFT_TIME, DRIFT_LRS = 4.0, (0.04, 0.02, 0.01)  # same time T = lr · steps for every step size
MATCH_LRS = (1e-2, 1e-3, 1e-4, 1e-5)
# Two-layer toy: z = W2 diag(γ2) n(tanh(W1 diag(γ1) n(x))), teacher of the same form without γ.
# Non-convex and slower: its target is 1e-2 × the initial loss.
NET_N, NET_D, NET_H, NET_OUT, NET_LR, NET_STEPS, NET_TARGET_FRACTION = 256, 16, 32, 4, 0.05, 1000, 1e-2


def linear_loss(u: Tensor, y: Tensor):
    """``L(W, γ) = ½ mean ‖W diag(γ) u_i − y_i‖²``; without ``gamma`` in params, γ ≡ 1."""

    def loss(p: dict[str, Tensor]) -> Tensor:
        w = p["W"] * p["gamma"] if "gamma" in p else p["W"]
        return mse(u @ w.T, y)

    return loss


def drift(u: Tensor, y: Tensor, w0: Tensor, lr: float, time: float) -> dict:
    """(a) Train (W, γ=1) by GD with step ``lr`` for ``time / lr`` steps; return the per-column change of
    ``γ_j² − ‖w_j‖²`` (``delta``), its norm over j (``norm``) and the norm over time (``curve``)."""
    params = {"W": leaf(w0), "gamma": leaf(torch.ones(w0.shape[1], dtype=DTYPE))}
    balance = lambda p: p["gamma"].pow(2) - p["W"].pow(2).sum(0)
    start = balance(params).detach()
    steps = round(time / lr)
    run = descend(linear_loss(u, y), params, lr, steps, observe=lambda p: (balance(p) - start).norm().item(),
                  every=max(1, steps // 50))
    delta = (balance(params) - start).detach()
    return {"lr": lr, "steps": steps, "delta": delta.tolist(), "norm": delta.norm().item(),
            "curve_time": [s * lr for s in run["observed_steps"]], "curve": run["observed"]}


def first_order_match(u: Tensor, y: Tensor, w: Tensor, gamma: Tensor, lr: float) -> float:
    """(b) Relative error ``‖Δv + η P g‖ / ‖η P g‖`` (Frobenius over all columns) of one GD step on (W, γ).

    ``Δv`` is the change of ``W diag(γ)`` after one autograd step on (W, γ); ``g = ∂L/∂V`` is taken by
    autograd at ``V = W diag(γ)`` as a free matrix, and ``P_j g_j = γ_j² g_j + w_j (w_jᵀ g_j)``.
    """
    params = {"W": leaf(w), "gamma": leaf(gamma)}
    loss = linear_loss(u, y)
    v_before = (w * gamma).detach()
    descend(loss, params, lr, 1)
    delta_v = (params["W"] * params["gamma"]).detach() - v_before
    v = leaf(v_before)
    g = torch.autograd.grad(loss({"W": v}), v)[0]  # (d_out, d_in), column j is g_j
    pg = gamma.pow(2) * g + w * (w * g).sum(0)  # P_j g_j for every column j
    return ((delta_v + lr * pg).norm() / (lr * pg).norm()).item()


def preconditioner_bound(observed: list[dict]) -> dict:
    """(c) From snapshots ``{"W", "gamma"}``: eigenvalues of ``P_j = γ_j² I + w_j w_jᵀ`` by ``eigvalsh``.

    Returns the smallest ``(λ_min − γ_j²) / γ_j²`` over columns and snapshots (≥ 0 up to rounding), the
    largest relative error of ``λ_max`` against ``γ_j² + ‖w_j‖²``, and the count of (snapshot, column)
    pairs checked."""
    worst_min, worst_max, count = float("inf"), 0.0, 0
    for snap in observed:
        w, g2 = snap["W"], snap["gamma"].pow(2)
        cols = w.T  # (d_in, d_out)
        p = g2[:, None, None] * torch.eye(w.shape[0], dtype=DTYPE) + cols[:, :, None] * cols[:, None, :]
        eig = torch.linalg.eigvalsh(p)  # (d_in, d_out), ascending
        worst_min = min(worst_min, ((eig[:, 0] - g2) / g2).min().item())
        predicted_max = g2 + cols.pow(2).sum(-1)
        worst_max = max(worst_max, ((eig[:, -1] - predicted_max).abs() / predicted_max).max().item())
        count += w.shape[1]
    return {"min_rel_gap": worst_min, "max_rel_err_lambda_max": worst_max, "pairs_checked": count}


def least_squares_curves(u: Tensor, y: Tensor, w0: Tensor) -> dict:
    """(d) GD from the same effective weight ``W0`` (γ = 1): with γ trained vs without γ. Also records
    (W, γ) snapshots of the run with γ for (c)."""
    loss = linear_loss(u, y)
    with_gamma = descend(loss, {"W": leaf(w0), "gamma": leaf(torch.ones(w0.shape[1], dtype=DTYPE))}, LR, STEPS,
                         observe=lambda p: {"W": p["W"].detach().clone(), "gamma": p["gamma"].detach().clone()},
                         every=5)
    without = descend(loss, {"W": leaf(w0)}, LR, STEPS)
    return _compare(with_gamma, without, TARGET_FRACTION)


def _compare(with_gamma: dict, without: dict, target_fraction: float) -> dict:
    target = target_fraction * with_gamma["loss"][0]
    s_with, s_without = steps_to_target(with_gamma["loss"], target), steps_to_target(without["loss"], target)
    ratio = s_without / s_with if s_with and s_without else None
    return {"target": target, "steps_with_gamma": s_with, "steps_without_gamma": s_without,
            "speedup": ratio, "loss_with_gamma": with_gamma["loss"], "loss_without_gamma": without["loss"],
            "_observed": with_gamma["observed"]}


def two_layer_curves(seed: int) -> dict:
    """(d) The two-layer Pre-Norm network ``z = W2 diag(γ2) n(tanh(W1 diag(γ1) n(x)))`` on a teacher of
    the same form (no γ, larger weights): GD with and without (γ1, γ2) from the same W1, W2."""
    gen = generator(seed + 1)
    x = randn(NET_N, NET_D, gen=gen)
    t1, t2 = randn(NET_H, NET_D, gen=gen, std=NET_D ** -0.5), randn(NET_OUT, NET_H, gen=gen)
    y = rms_normalize(torch.tanh(rms_normalize(x) @ t1.T)) @ t2.T
    w1, w2 = randn(NET_H, NET_D, gen=gen, std=INIT_STD), randn(NET_OUT, NET_H, gen=gen, std=INIT_STD)

    def loss(p: dict[str, Tensor]) -> Tensor:
        a, b = (p["W1"] * p["g1"], p["W2"] * p["g2"]) if "g1" in p else (p["W1"], p["W2"])
        return mse(rms_normalize(torch.tanh(rms_normalize(x) @ a.T)) @ b.T, y)

    ones = lambda n: torch.ones(n, dtype=DTYPE)
    with_gamma = descend(loss, {"W1": leaf(w1), "W2": leaf(w2), "g1": leaf(ones(NET_D)), "g2": leaf(ones(NET_H))},
                         NET_LR, NET_STEPS)
    without = descend(loss, {"W1": leaf(w1), "W2": leaf(w2)}, NET_LR, NET_STEPS)
    return _compare(with_gamma, without, NET_TARGET_FRACTION)


def compute(seed: int = 0) -> dict:
    """Run (a)–(d) (about a second on one core). Returns the JSON-ready figures; see the module docstring."""
    gen = generator(seed)
    u, y, _ = least_squares_task(N, D_IN, D_OUT, TEACHER_STD, gen)
    w0 = randn(D_OUT, D_IN, gen=gen, std=INIT_STD)
    drifts = [drift(u, y, w0, lr, DRIFT_TIME) for lr in DRIFT_LRS]
    w_rand, g_rand = randn(D_OUT, D_IN, gen=gen, std=0.5), 1.0 + randn(D_IN, gen=gen, std=0.5)
    match = [{"lr": lr, "rel_err": first_order_match(u, y, w_rand, g_rand, lr)} for lr in MATCH_LRS]
    ls = least_squares_curves(u, y, w0)
    bound = preconditioner_bound(ls.pop("_observed"))
    net = two_layer_curves(seed)
    net.pop("_observed")
    return {
        "setup": {"n": N, "d_in": D_IN, "d_out": D_OUT, "teacher_std": TEACHER_STD, "init_std": INIT_STD,
                  "lr": LR, "steps": STEPS, "target_fraction": TARGET_FRACTION, "drift_time": DRIFT_TIME,
                  "two_layer": {"n": NET_N, "d": NET_D, "hidden": NET_H, "d_out": NET_OUT, "lr": NET_LR,
                                "steps": NET_STEPS, "target_fraction": NET_TARGET_FRACTION}, "seed": seed},
        "drift": drifts,
        "drift_ratios": [b["norm"] / a["norm"] for a, b in itertools.pairwise(drifts)],
        "first_order": match,
        "lambda_min": bound,
        "least_squares": ls,
        "two_layer": net,
    }


def summarize(r: dict) -> list[str]:
    ls, net = r["least_squares"], r["two_layer"]
    return [
        "(a) conserved γ_j²−‖w_j‖²: drift " + ", ".join(f"{d['norm']:.2e} (lr {d['lr']})" for d in r["drift"])
        + "; ratio per halving " + ", ".join(f"{x:.3f}" for x in r["drift_ratios"]) + " (theory 0.5)",
        "(b) one step vs −η(γ_j²I + w_j w_jᵀ)g: rel err " + ", ".join(f"{m['rel_err']:.1e} (η {m['lr']:g})"
                                                                       for m in r["first_order"]),
        (f"(c) λ_min(P_j) ≥ γ_j²: smallest (λ_min−γ²)/γ² = {r['lambda_min']['min_rel_gap']:.1e} over "
         f"{r['lambda_min']['pairs_checked']} (step, column) pairs"),
        (f"(d) GD steps to {TARGET_FRACTION:g}×initial loss, least squares: {ls['steps_with_gamma']} with γ vs "
         f"{ls['steps_without_gamma']} without ({_fmt(ls['speedup'])}×); to {NET_TARGET_FRACTION:g}×, two-layer "
         f"Pre-Norm net: {net['steps_with_gamma']} vs {net['steps_without_gamma']} ({_fmt(net['speedup'])}×)"),
    ]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def plot(r: dict, path: str) -> None:
    """Four panels: drift vs time per step size, one-step error vs η, and the two pairs of loss curves."""
    fig, (a, b, c, d) = figure(4)
    for dr in r["drift"]:
        a.plot(dr["curve_time"], dr["curve"], label=f"lr {dr['lr']}")
    a.set(title="(a) drift of γ_j² − ‖w_j‖² (norm over j)", xlabel="time = lr · step", ylabel="drift")
    a.legend()
    b.loglog([m["lr"] for m in r["first_order"]], [m["rel_err"] for m in r["first_order"]], "o-")
    b.set(title="(b) one step vs −η P g", xlabel="step η", ylabel="relative error")
    for ax, key, name in ((c, "least_squares", "least squares"), (d, "two_layer", "2-layer Pre-Norm net")):
        res = r[key]
        ax.semilogy(res["loss_with_gamma"], label="with γ")
        ax.semilogy(res["loss_without_gamma"], label="without γ")
        ax.axhline(res["target"], color="gray", ls=":", label="target")
        ax.set(title=f"(d) {name}: speedup {_fmt(res['speedup'])}×", xlabel="GD step", ylabel="loss")
        ax.legend()
    write_figure(fig, path, dpi=110)
