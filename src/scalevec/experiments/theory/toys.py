"""Float64 toy problems and a plain gradient-descent loop shared by the §4 experiments (DESIGN.md §4).

The exact first-order statements of §4 need float64: every toy here is float64 on the CPU, draws its
randomness from an explicit ``torch.Generator`` (deterministic given the seed) and normalizes with
the exact RMS, ``n(x) = x / sqrt(mean(x²))`` (no eps: no toy input is near zero). Nothing here
touches the Transformer; ``expressivity.py`` is the experiment that uses the real model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

DTYPE = torch.float64


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (one per experiment, so runs are reproducible)."""
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, gen: torch.Generator, std: float = 1.0) -> Tensor:
    """``std · N(0, 1)`` of ``shape`` in float64."""
    return std * torch.randn(shape, generator=gen, dtype=DTYPE)


def rms_normalize(x: Tensor) -> Tensor:
    """``x / sqrt(mean(x², -1))``: RMSNorm without affine and without eps (float64 toys). Shape kept."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))


def mse(z: Tensor, y: Tensor) -> Tensor:
    """Least-squares loss ``½ · mean over samples of ‖z_i − y_i‖²`` for ``z, y: (n, d_out)``."""
    return 0.5 * (z - y).pow(2).sum(-1).mean()


def least_squares_task(n: int, d_in: int, d_out: int, teacher_std: float, gen: torch.Generator,
                       noise_std: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """Normalized inputs ``u: (n, d_in)`` (``rms(u_i) = 1``), targets ``y = u V*ᵀ + noise: (n, d_out)``
    and the teacher ``V*: (d_out, d_in)`` with entries ``N(0, teacher_std²)``."""
    u = rms_normalize(randn(n, d_in, gen=gen))
    teacher = randn(d_out, d_in, gen=gen, std=teacher_std)
    y = u @ teacher.T + randn(n, d_out, gen=gen, std=noise_std)
    return u, y, teacher


def leaf(t: Tensor) -> Tensor:
    """A detached float64 copy of ``t`` that requires grad (a fresh parameter)."""
    return t.detach().clone().to(DTYPE).requires_grad_(True)


def descend(loss_fn: Callable[[dict[str, Tensor]], Tensor], params: dict[str, Tensor], lr: float, steps: int,
            decay: dict[str, float] | None = None,
            observe: Callable[[dict[str, Tensor]], dict] | None = None, every: int = 1) -> dict:
    """Plain gradient descent ``θ ← θ − lr (∇L(θ) + λ_θ θ)`` for ``steps`` steps, in place on ``params``.

    ``loss_fn(params)`` is the data loss L (scalar); ``decay`` maps a parameter name to its weight
    decay λ (the penalty ``λ/2 ‖θ‖²`` is not part of the recorded loss). Returns ``{"loss": [L(θ_0),
    ..., L(θ_steps)], "observed": [observe(params) every `every` steps, at step 0 and at the end],
    "observed_steps": [...]}``. Raises ``FloatingPointError`` if the loss stops being finite.
    """
    decay = decay or {}
    names = list(params)
    losses, observed, observed_steps = [], [], []
    for step in range(steps + 1):
        loss = loss_fn(params)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step} (lr {lr} too large)")
        losses.append(loss.item())
        if observe is not None and (step % every == 0 or step == steps):
            with torch.no_grad():
                observed.append(observe(params))
            observed_steps.append(step)
        if step == steps:
            break
        grads = torch.autograd.grad(loss, [params[k] for k in names])
        with torch.no_grad():
            for k, g in zip(names, grads):
                params[k] -= lr * (g + decay.get(k, 0.0) * params[k])
    return {"loss": losses, "observed": observed, "observed_steps": observed_steps}


def steps_to_target(losses: list[float], target: float) -> int | None:
    """The first step whose loss is ``<= target``, or None if the run never reaches it."""
    return next((k for k, v in enumerate(losses) if v <= target), None)


def hessian_top_eigenvalue(loss_fn: Callable[[dict[str, Tensor]], Tensor], params: dict[str, Tensor]) -> float:
    """The exact largest eigenvalue of the Hessian of ``loss_fn`` in all of ``params`` (dense, for toys
    with a few hundred parameters): ``torch.autograd.functional.hessian`` then ``eigvalsh``."""
    names = list(params)
    sizes = [params[k].numel() for k in names]
    shapes = [params[k].shape for k in names]
    flat0 = torch.cat([params[k].detach().flatten() for k in names])

    def flat_loss(flat: Tensor) -> Tensor:
        parts = flat.split(sizes)
        return loss_fn({k: p.view(s) for k, p, s in zip(names, parts, shapes)})

    h = torch.autograd.functional.hessian(flat_loss, flat0)
    return torch.linalg.eigvalsh(h)[-1].item()


def figure(n_panels: int, width: float = 4.2, height: float = 3.4):
    """A matplotlib ``Figure`` with ``n_panels`` axes in a row, drawn with the Agg canvas (no pyplot, no
    global backend switch). Returns ``(fig, axes list)``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * n_panels, height), layout="constrained")
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    return fig, list(axes)
