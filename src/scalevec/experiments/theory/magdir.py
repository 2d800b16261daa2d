"""Magnitude-direction reparameterization: the paper's Theorem 3.2 (DESIGN.md §3 ``param``, §4).

For γ = γ(θ), gradient flow on the parameters θ moves γ as ``dγ/dt = −J Jᵀ ∇_γ L`` with ``J = ∂γ/∂θ``
(d × dim θ): ``P = J Jᵀ`` is the preconditioner the parameterization induces on γ. We compute J with
``torch.func.jacrev`` on the real ``scales.ScaleVector`` in float64 and report P's eigenvalues along γ
(radial, ``γ̂ᵀ P γ̂``, γ̂ = γ/‖γ‖) and on γ^⊥ (tangential: ``eigvalsh(Bᵀ P B)``, B an orthonormal basis of
γ^⊥), plus ``‖P γ̂ − (γ̂ᵀPγ̂) γ̂‖`` to show γ̂ is an eigenvector. By hand, with ``α̂ = α/‖α‖``,
``rms(α) = ‖α‖/√d`` and ``∂(α/rms α)/∂α = (I − α̂α̂ᵀ)/rms(α)``:

- plain (``direct``): J = I, P = I: every eigenvalue 1.
- OR (``magdir``, γ = β α/rms(α)): ``∂γ/∂β = α/rms(α)``, ``∂γ/∂α = β (I − α̂α̂ᵀ)/rms(α)``, so
  ``P = d α̂α̂ᵀ + (β²/rms(α)²)(I − α̂α̂ᵀ)``: radial eigenvalue d at every point (‖α/rms α‖² = d),
  tangential β²/rms(α)². At init (β = 1, α = 1): ``P = 11ᵀ + (I − 11ᵀ/d)``, eigenvalues d and 1.
- ER (``magdir_exp``, γ = e^b α/rms(α)): ``∂γ/∂b = γ`` itself, so the radial term is ``γγᵀ`` and
  ``P = ‖γ‖² γ̂γ̂ᵀ + (e^{2b}/rms(α)²)(I − α̂α̂ᵀ)``: radial eigenvalue ‖γ‖² = d e^{2b}, tangential
  e^{2b}/rms(α)². At init (b = 0) the same d and 1 as OR; away from it ER's radial step grows with
  the magnitude (multiplicative updates of e^b), OR's stays d.
The experiment reports these at init for several d, and at a random point (β or b and α perturbed)
against the formulas above.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import functional_call, jacrev

from scalevec.experiments.theory.toys import DTYPE, figure, generator
from scalevec.model.kernels import FAST
from scalevec.model.params import init_params
from scalevec.model.scales import SCALE_KINDS, ScaleVector
from scalevec.outpath import write_figure

DIMS = (2, 4, 16, 64, 256)
PARAMS = ("direct", "magdir", "magdir_exp")
LABELS = {"direct": "plain γ", "magdir": "OR", "magdir_exp": "ER"}


def preconditioner(vec: ScaleVector) -> tuple[Tensor, Tensor]:
    """``(γ, P = J Jᵀ)`` for a ScaleVector of shape (d,), J the Jacobian of γ in all its parameters."""
    params = {k: v.detach() for k, v in vec.named_parameters()}
    jac = jacrev(lambda p: functional_call(vec, p, ()))(params)  # {name: (d, *param shape)}
    j = torch.cat([jac[k].reshape(jac[k].shape[0], -1) for k in params], dim=1)  # (d, dim θ)
    return vec().detach(), j @ j.T


def spectrum(gamma: Tensor, p: Tensor) -> dict:
    """Radial eigenvalue ``γ̂ᵀPγ̂``, the eigenvector residual ``‖Pγ̂ − (γ̂ᵀPγ̂)γ̂‖``, and the tangential
    eigenvalues (min, max) of P restricted to γ^⊥."""
    d = gamma.numel()
    g_hat = gamma / gamma.norm()
    radial = (g_hat @ p @ g_hat).item()
    residual = (p @ g_hat - radial * g_hat).norm().item()
    q, _ = torch.linalg.qr(torch.cat([g_hat[:, None], torch.eye(d, dtype=DTYPE)], dim=1))
    basis = q[:, 1:d]  # orthonormal basis of γ^⊥ (the first column of q spans γ̂)
    tangential = torch.linalg.eigvalsh(basis.T @ p @ basis)
    return {"radial": radial, "eigvec_residual": residual, "tangential_min": tangential.min().item(),
            "tangential_max": tangential.max().item()}


def predicted(param: str, vec: ScaleVector) -> dict:
    """The module docstring's formulas: radial and tangential eigenvalues of P at the current parameters."""
    if param == "direct":
        return {"radial": 1.0, "tangential": 1.0}
    a = vec.direction.detach()
    rms2 = a.pow(2).mean().item()
    if param == "magdir":
        return {"radial": float(a.numel()), "tangential": vec.magnitude.item() ** 2 / rms2}
    scale2 = torch.exp(2 * vec.log_magnitude).item()
    return {"radial": a.numel() * scale2, "tangential": scale2 / rms2}


def make(param: str, d: int) -> ScaleVector:
    """The real scale vector of ``param`` (``scales.SCALE_KINDS``: direct, OR, ER), shape (d,), on the fast path a
    model trains with (``kernels.FAST``), in float64, initialized as declared (γ = 1)."""
    vec = SCALE_KINDS[param]((d,), "input_scale", FAST).to(DTYPE)
    init_params(vec)
    return vec


def perturb(vec: ScaleVector, gen: torch.Generator) -> None:
    """Move every parameter off its init: magnitudes β → 1.5 + 0.3·N, b → 0.4 + 0.3·N, α → 1 + 0.5·N."""
    with torch.no_grad():
        for name, p in vec.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=DTYPE)
            p.copy_({"weight": 1.0 + 0.5 * noise, "magnitude": 1.5 + 0.3 * noise, "log_magnitude": 0.4 + 0.3 * noise,
                     "direction": 1.0 + 0.5 * noise}[name])


def compute(seed: int = 0) -> dict:
    """For each parameterization and each d in ``DIMS``: the spectrum of P at init and at a random point,
    with the predicted values. JSON-ready (well under a second)."""
    gen = generator(seed)
    rows = []
    for param in PARAMS:
        for d in DIMS:
            vec = make(param, d)
            at_init = {**spectrum(*preconditioner(vec)), "predicted": predicted(param, vec)}
            perturb(vec, gen)
            at_random = {**spectrum(*preconditioner(vec)), "predicted": predicted(param, vec)}
            rows.append({"param": param, "d": d, "init": at_init, "random": at_random})
    return {"setup": {"dims": list(DIMS), "seed": seed}, "rows": rows, **_errors(rows)}


def _errors(rows: list[dict]) -> dict:
    """Largest relative errors of the measured against the predicted eigenvalues, at init and at random points."""
    out = {}
    for where in ("init", "random"):
        errs = []
        for r in rows:
            s = r[where]
            pr = s["predicted"]
            errs += [abs(s["radial"] - pr["radial"]) / pr["radial"],
                     abs(s["tangential_min"] - pr["tangential"]) / pr["tangential"],
                     abs(s["tangential_max"] - pr["tangential"]) / pr["tangential"]]
        out[f"max_rel_err_{where}"] = max(errs)
    return out


def summarize(r: dict) -> list[str]:
    lines = [f"eigenvalues of J Jᵀ at init, d = {', '.join(str(d) for d in r['setup']['dims'])}:"]
    for param in PARAMS:
        rows = [x["init"] for x in r["rows"] if x["param"] == param]
        tang = [x["tangential_min"] for x in rows] + [x["tangential_max"] for x in rows]
        radial = ", ".join(f"{x['radial']:.6g}" for x in rows)
        lines.append(f"  {LABELS[param]:8s} radial {radial}; "
                     f"tangential in [{min(tang):.6g}, {max(tang):.6g}]")
    lines.append(f"max relative error vs the formulas: {r['max_rel_err_init']:.1e} at init, "
                 f"{r['max_rel_err_random']:.1e} at random points (OR radial stays d; ER radial = ‖γ‖² = d·e^(2b))")
    return lines


def plot(r: dict, path: str) -> None:
    """Two panels: radial and tangential eigenvalues vs d at init, and at the random points."""
    fig, axes = figure(2)
    for ax, where in zip(axes, ("init", "random")):
        for k, param in enumerate(PARAMS):
            rows = [x for x in r["rows"] if x["param"] == param]
            ds = [x["d"] for x in rows]
            ax.loglog(ds, [x[where]["radial"] for x in rows], "o-", color=f"C{k}", label=f"{LABELS[param]} radial")
            ax.loglog(ds, [x[where]["tangential_max"] for x in rows], "s--", color=f"C{k}",
                      label=f"{LABELS[param]} tangential (max)")
        ax.set(title=f"eigenvalues of J Jᵀ ({'at init' if where == 'init' else 'random point'})", xlabel="d",
               ylabel="eigenvalue")
        ax.legend(fontsize=7)
    write_figure(fig, path, dpi=110)
