"""Weight decay on Input-Norm vs Output-Norm scale vectors (DESIGN.md §4, the paper's §"weight decay").

**Input-Norm** toy: least squares ``z = W diag(γ) u`` (u RMS-normalized). ``(γ_j, w_j) → (cγ_j, w_j/c)``
leaves the function unchanged, so weight decay can only choose a point on each orbit. With decay λ on
both W and γ, a stationary point of ``L + λ/2 (‖W‖² + ‖γ‖²)`` has ``w_jᵀg_j = −λγ_j`` and
``γ_j g_j = −λ w_j``, hence ``γ_j² = γ_j w_jᵀg_j/(−λ) = ‖w_j‖²``: balanced. Along the way gradient flow
gives ``d(γ_j² − ‖w_j‖²)/dt = −2λ (γ_j² − ‖w_j‖²)``: the imbalance decays like ``exp(−2λt)``, whereas
without decay on γ it is conserved (Theorem 2.2) and with decay on W alone it grows. On an orbit
(fixed ``v_j = γ_j w_j``), the Gauss-Newton curvature along column j scales with the top eigenvalue
``γ_j² + ‖w_j‖²`` of ``P_j``, which is smallest, ``2‖v_j‖``, at the balanced point. We train three runs
from the same start, same GD step: no decay, decay on W only (common practice: matrices decayed,
scale vectors not) and decay on W and γ (IWD), and compare the sharpness (top eigenvalue of the
Hessian of the data loss, without the penalty) at matched data loss: the IWD run's final loss, and
the point where each other run first reaches that loss.

**Output-Norm** toy: a residual branch ``y = x + γ ⊙ n(W x)`` fit to ``y* = x + c ⊙ n(W* x)`` with a large
``c`` (the target needs a large branch output). ``n`` removes the scale of W, so nothing upstream can
absorb a shrunken γ: decay λ on γ biases it to ``γ_j = c_j m_j / (m_j + λ)`` (``m_j = mean n(W* x)_j²``)
even with W = W*, which leaves the data-loss floor ``½ Σ_j m_j (c_j λ / (m_j + λ))²`` (``output_floor``).
Without decay the toy is realizable (loss → 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalevec.experiments.theory.toys import (
    DTYPE,
    descend,
    figure,
    generator,
    hessian_top_eigenvalue,
    leaf,
    least_squares_task,
    mse,
    randn,
    rms_normalize,
    steps_to_target,
)
from scalevec.outpath import write_figure
from scalevec.training.probes import top_hessian_eigenvalue

# Input-Norm toy: small teacher columns (‖v*_j‖ ≈ 0.28) and noisy targets (loss floor > 0).
N, D_IN, D_OUT, TEACHER_STD, NOISE_STD, INIT_STD = 256, 16, 8, 0.1, 0.05, 0.02
LR, STEPS, WD = 0.05, 2000, 0.05  # IWD: γ_j² − ‖w_j‖² shrinks by (1 − LR·WD)² per step (+ O(LR²))
POWER_ITERS = 100  # Hessian-vector products per sharpness estimate (toy Hessians: 144 × 144)
# Output-Norm toy: y = x + γ ⊙ n(W x), target gain c = 3 on every channel.
OUT_N, OUT_D, OUT_GAIN, OUT_LR, OUT_STEPS, OUT_WD = 256, 16, 3.0, 0.1, 1500, 0.05

RUNS = {"none": {}, "matrix": {"W": WD}, "iwd": {"W": WD, "gamma": WD}}  # parameter -> decay λ
LABELS = {"none": "no wd", "matrix": "wd on W", "iwd": "wd on W and γ"}


def _imbalance(p: dict[str, Tensor]) -> float:
    """``max_j |γ_j² − ‖w_j‖²| / (γ_j² + ‖w_j‖²)``: 0 at the balanced point."""
    g2, w2 = p["gamma"].pow(2), p["W"].pow(2).sum(0)
    return ((g2 - w2).abs() / (g2 + w2)).max().item()


def input_norm(seed: int) -> dict:
    """The Input-Norm toy: three decay settings, balance over time, sharpness at matched data loss."""
    gen = generator(seed)
    u, y, _ = least_squares_task(N, D_IN, D_OUT, TEACHER_STD, gen, noise_std=NOISE_STD)
    w0 = randn(D_OUT, D_IN, gen=gen, std=INIT_STD)

    def loss(p: dict[str, Tensor]) -> Tensor:
        return mse(u @ (p["W"] * p["gamma"]).T, y)

    def sharp(p: dict[str, Tensor]) -> dict:
        q = {k: leaf(v) for k, v in p.items()}
        return {"power": top_hessian_eigenvalue(lambda: loss(q), list(q.values()), n_iters=POWER_ITERS, seed=seed),
                "exact": hessian_top_eigenvalue(loss, q), "imbalance": _imbalance(q), "loss": loss(q).item()}

    snapshot = lambda p: {k: v.detach().clone() for k, v in p.items()}
    runs = {}
    for name, decay in RUNS.items():
        params = {"W": leaf(w0), "gamma": leaf(torch.ones(D_IN, dtype=DTYPE))}
        run = descend(loss, params, LR, STEPS, decay=decay, observe=snapshot, every=1)
        runs[name] = {"loss": run["loss"], "imbalance": [_imbalance(s) for s in run["observed"][::25]],
                      "final": sharp(run["observed"][-1]), "_snapshots": run["observed"]}
    matched_loss = runs["iwd"]["final"]["loss"]
    for name in ("none", "matrix"):
        step = steps_to_target(runs[name]["loss"], matched_loss)
        runs[name]["matched_step"] = step
        runs[name]["matched"] = sharp(runs[name]["_snapshots"][step]) if step is not None else None
    for r in runs.values():
        r.pop("_snapshots")
    runs["iwd"]["matched_step"], runs["iwd"]["matched"] = STEPS, runs["iwd"]["final"]
    return {"matched_loss": matched_loss, "runs": runs, "imbalance_every": 25}


def output_floor(m: Tensor, gain: Tensor, wd: float) -> float:
    """Data loss (``mse``, per sample) of ``y = x + γ ⊙ n`` vs ``x + c ⊙ n`` at the γ minimizing
    ``mse + wd/2 ‖γ‖²`` with the branch direction exact: ``γ_j = c_j m_j / (m_j + wd)``, loss
    ``½ Σ_j m_j (γ_j − c_j)²``; ``m_j = mean_i n_ij²``. Zero when ``wd = 0``."""
    gamma = gain * m / (m + wd)
    return 0.5 * (m * (gamma - gain).pow(2)).sum().item()


def output_norm(seed: int) -> dict:
    """The Output-Norm toy: final data loss with and without weight decay on γ, and the analytic floor."""
    gen = generator(seed + 1)
    x = randn(OUT_N, OUT_D, gen=gen)
    w_star, w0 = randn(OUT_D, OUT_D, gen=gen), randn(OUT_D, OUT_D, gen=gen)
    gain = torch.full((OUT_D,), OUT_GAIN, dtype=DTYPE)
    branch_star = rms_normalize(x @ w_star.T)
    y = x + gain * branch_star

    def loss(p: dict[str, Tensor]) -> Tensor:
        return mse(x + p["gamma"] * rms_normalize(x @ p["W"].T), y)

    runs = {}
    for name, decay in (("none", {}), ("wd", {"gamma": OUT_WD})):
        params = {"W": leaf(w0), "gamma": leaf(torch.ones(OUT_D, dtype=DTYPE))}
        run = descend(loss, params, OUT_LR, OUT_STEPS, decay=decay)
        runs[name] = {"loss": run["loss"], "final_loss": run["loss"][-1],
                      "gamma_abs_mean": params["gamma"].abs().mean().item()}
    floor = output_floor(branch_star.pow(2).mean(0), gain, OUT_WD)
    return {"runs": runs, "floor": floor}


def compute(seed: int = 0) -> dict:
    """Both toys (a few seconds on one core). JSON-ready; see the module docstring."""
    return {
        "setup": {"input_norm": {"n": N, "d_in": D_IN, "d_out": D_OUT, "teacher_std": TEACHER_STD,
                                 "noise_std": NOISE_STD, "init_std": INIT_STD, "lr": LR, "steps": STEPS, "wd": WD,
                                 "power_iters": POWER_ITERS},
                  "output_norm": {"n": OUT_N, "d": OUT_D, "gain": OUT_GAIN, "lr": OUT_LR, "steps": OUT_STEPS,
                                  "wd": OUT_WD}, "seed": seed},
        "input_norm": input_norm(seed),
        "output_norm": output_norm(seed),
    }


def summarize(r: dict) -> list[str]:
    inp, out, labels = r["input_norm"], r["output_norm"], LABELS
    lines = ["Input-Norm toy, sharpness (top Hessian eigenvalue, power iteration) at matched loss "
             + f"{inp['matched_loss']:.5f}:"]
    for name, label in LABELS.items():
        m = inp["runs"][name]["matched"]
        lines.append(f"  {label:14s} " + ("never reaches it" if m is None else
                     f"{m['power']:.4f} (exact {m['exact']:.4f}) at step {inp['runs'][name]['matched_step']}, "
                     f"imbalance max|γ²−‖w‖²|/(γ²+‖w‖²) {m['imbalance']:.3f}"))
    finals = ", ".join(f"{labels[n]} {inp['runs'][n]['final']['power']:.3f} (loss "
                       f"{inp['runs'][n]['final']['loss']:.4f})"
                       for n in inp["runs"])
    lines.append(f"  after {STEPS} steps: {finals}")
    lines.append(f"Output-Norm toy, final loss: no wd {out['runs']['none']['final_loss']:.2e}, wd on γ "
                 f"{out['runs']['wd']['final_loss']:.4f} (analytic floor with exact W: {out['floor']:.4f}); "
                 f"mean |γ| {out['runs']['none']['gamma_abs_mean']:.3f} vs {out['runs']['wd']['gamma_abs_mean']:.3f} "
                 f"(target gain {OUT_GAIN:g})")
    return lines


def plot(r: dict, path: str) -> None:
    """Three panels: Input-Norm loss and imbalance over training, sharpness bars, Output-Norm losses."""
    fig, (a, b, c) = figure(3)
    inp = r["input_norm"]
    labels = LABELS
    for name, run in inp["runs"].items():
        steps = [k * inp["imbalance_every"] for k in range(len(run["imbalance"]))]
        a.semilogy(steps, run["imbalance"], label=labels[name])
    a.set(title="Input-Norm: imbalance of γ_j² vs ‖w_j‖²", xlabel="GD step", ylabel="max relative imbalance")
    a.legend()
    names = [n for n in inp["runs"] if inp["runs"][n]["matched"] is not None]
    b.bar([labels[n] for n in names], [inp["runs"][n]["matched"]["power"] for n in names], color="C0")
    b.set(title=f"sharpness at matched loss {inp['matched_loss']:.4f}", ylabel="top Hessian eigenvalue")
    out = r["output_norm"]
    c.semilogy(out["runs"]["none"]["loss"], label="no wd on γ")
    c.semilogy(out["runs"]["wd"]["loss"], label="wd on γ")
    c.axhline(out["floor"], color="gray", ls=":", label="floor with wd (exact W)")
    c.set(title="Output-Norm: x + γ ⊙ n(Wx)", xlabel="GD step", ylabel="loss")
    c.legend()
    write_figure(fig, path, dpi=110)
