"""What a run logs about its own state, besides the loss: per-scale-vector, per-layer and MoE statistics
(DESIGN.md §8).

Every ``train.log_every`` steps the trainer puts into its ``metrics.jsonl`` row, from a ``ScaleTelemetry``:

- ``scales``: per scale vector (every ``scales.ScaleVector``, named by its module: layer, site, branch, side),
  its ``role`` (``input_scale`` / ``output_scale``, DESIGN.md §5) and the ``mean``, ``std``, ``min``, ``max`` and
  ``rms`` of its effective γ after the step, the ``grad_norm`` of its own parameters' gradient (γ, or β and α
  under OR/ER: the gradient the optimizer steps on, after clipping) and the ``update_norm`` ‖γ_after − γ_before‖
  of the step;
- ``grad_norms``: per layer (``layers.3``, ``embed``, ``head.branches.lm_head``, or an HF model's paths), the
  norm of the gradient of its matrices (roles ``matrix``, ``router``, ``embedding``, ``lm_head``), after clipping;
- for an MoE model, ``moe_stats`` (load balance, router entropy).

All numbers of one row come to the host in one device-to-host transfer (one ``tolist``): on a GPU, one sync per
logged step instead of four ``.item()`` per vector. Gradients and γ before the step are taken by an optimizer
step pre-hook (``torch.optim.Optimizer.register_step_pre_hook``, a public API) on logged steps only, so the
other steps cost nothing. Everything is computed on every rank (FSDP2 shards are gathered or summed with one
all-reduce), so every rank must call. Reads the model; changes nothing. The same object serves any training
loop (``capture`` after backward, ``collect`` after the optimizer step) and the HF ``TrainerCallback`` of
``scalevec.integrations``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import nn

from scalevec.config.typed import is_int
from scalevec.model.params import param_roles
from scalevec.model.scales import ScaleVector
from scalevec.training import distributed

MATRIX_ROLES = ("matrix", "router", "embedding", "lm_head")  # the per-layer gradient norms
VECTOR_STATS = ("mean", "std", "min", "max", "rms")  # of γ; with a capture also grad_norm, update_norm
_LAYER = re.compile(r"^(.*?layers\.\d+)\.")


def layer_key(name: str) -> str:
    """The layer a parameter belongs to, for the per-layer gradient norms: ``…layers.N`` when its name has one
    (``layers.3.attn.o.weight`` -> ``layers.3``; ``model.layers.3.mlp.down_proj.weight`` -> ``model.layers.3``), else
    its module (``embed.weight`` -> ``embed``)."""
    m = _LAYER.match(name)
    return m.group(1) if m else name.rpartition(".")[0] or name


def vector_role(module: ScaleVector) -> str:
    """The role of a scale vector: its γ's, or under OR/ER its magnitude's (the direction is ``scale_direction``)."""
    roles = set(module.__dict__.get("_roles", {}).values()) - {"scale_direction"}
    return roles.pop() if len(roles) == 1 else "output_scale"


def _sq(t: torch.Tensor | None, device: torch.device) -> tuple[torch.Tensor, bool]:
    """``(Σ t², sharded)`` in float32 of a gradient: a DTensor's local shard (summed over ranks later), else whole."""
    if t is None:
        return torch.zeros((), device=device), False
    sharded = hasattr(t, "to_local")
    local = t.to_local() if sharded else t
    return local.detach().float().pow(2).sum().to(device), sharded


def _gamma(module: ScaleVector) -> torch.Tensor:
    return distributed.full_tensor(module().detach()).float().flatten()  # FSDP2: a collective (every rank calls)


class ScaleTelemetry:
    """Per-scale-vector and per-layer statistics of a model, for metrics rows and dashboards (module docstring).

    ``model``: the unwrapped model (a scalevec ``Transformer``, a model ``apply_strategy`` touched, anything whose
    scale vectors are ``scales.ScaleVector`` modules); ``roles``: ``{parameter name: role}`` (default
    ``params.param_roles(model)``; ``scalevec.integrations.model_roles`` for a plain HF model). Use:
    ``capture()`` after the backward pass (gradients final, clipped) and before the optimizer step, then
    ``collect()`` after it; or ``attach(optimizers, due)`` to capture from an optimizer pre-hook. ``collect()``
    without a capture gives γ's statistics only.
    """

    def __init__(self, model: nn.Module, roles: dict[str, str] | None = None):
        roles = param_roles(model) if roles is None else roles
        params = dict(model.named_parameters())
        self.vectors = [(name, m, vector_role(m), list(m.parameters()))
                        for name, m in model.named_modules() if isinstance(m, ScaleVector)]
        self.layers: dict[str, list[nn.Parameter]] = {}
        for name, role in roles.items():
            if role in MATRIX_ROLES and name in params:
                self.layers.setdefault(layer_key(name), []).append(params[name])
        ref = next(iter(params.values()), None)
        self.device = ref.device if ref is not None else torch.device("cpu")
        self._captured: tuple | None = None
        self.latest: dict | None = None  # the last ``collect``'s row part (``attach(..., collect=True)``)
        self._steps = 0

    # -- the two halves of one logged step ------------------------------------------------------------------

    @torch.no_grad()
    def capture(self) -> None:
        """Take the gradients (squared norms, on the device: no sync) and γ before the optimizer step."""
        before = [_gamma(m).clone() for _, m, _, _ in self.vectors]  # a direct γ is the parameter: copy it
        vec = [[_sq(p.grad, self.device) for p in ps] for _, _, _, ps in self.vectors]
        lay = [[_sq(p.grad, self.device) for p in ps] for ps in self.layers.values()]
        self._captured = (before, vec, lay)

    @torch.no_grad()
    def collect(self) -> dict:
        """``{"scales": {vector: {"role", "mean", "std", "min", "max", "rms"[, "grad_norm", "update_norm"]}}[,
        "grad_norms": {layer: norm}]}`` after the optimizer step (the gradient and update parts when ``capture``
        ran before it). One device-to-host transfer; with several ranks, every rank must call."""
        captured, self._captured = self._captured, None
        values: list[torch.Tensor] = []
        gammas = [_gamma(m) for _, m, _, _ in self.vectors]
        for g in gammas:
            values += [g.mean(), g.std(unbiased=False), g.min(), g.max(), g.pow(2).mean().sqrt()]
        n_stats = len(VECTOR_STATS)
        if captured is not None:
            before, vec, lay = captured
            sq = [torch.stack([s for s, _ in parts]).sum() if parts else torch.zeros((), device=self.device)
                  for parts in vec + lay]
            sharded = [any(f for _, f in parts) for parts in vec + lay]
            if sq:
                sq_t = torch.stack(sq)
                if distributed.world_size() > 1 and any(sharded):  # FSDP2: local shards' sums, added over ranks
                    mask = torch.tensor(sharded, device=sq_t.device, dtype=sq_t.dtype)
                    sq_t = distributed.all_reduce_sum(sq_t * mask) + sq_t * (1 - mask)
                norms = sq_t.sqrt()
            else:
                norms = torch.zeros(0, device=self.device)
            nv = len(vec)
            for i, (g, b) in enumerate(zip(gammas, before)):
                values += [norms[i], (g - b).pow(2).sum().sqrt()]
            values += list(norms[nv:])
        host = torch.stack([v.float().to(self.device) for v in values]).tolist() if values else []
        scales, k = {}, 0
        for name, _, role, _ in self.vectors:
            scales[name] = {"role": role, **dict(zip(VECTOR_STATS, host[k:k + n_stats]))}
            k += n_stats
        out: dict = {"scales": scales}
        if captured is not None:
            for name, *_ in self.vectors:
                scales[name]["grad_norm"], scales[name]["update_norm"] = host[k], host[k + 1]
                k += 2
            out["grad_norms"] = dict(zip(self.layers, host[k:]))
        return out

    # -- optimizer hooks ---------------------------------------------------------------------------------------

    def attach(self, optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer],
               due: Callable[[], bool] | None = None, every: int | None = None,
               collect: bool = False) -> ScaleTelemetry:
        """Capture from a step pre-hook of the first optimizer (before any parameter moves) on the steps where
        ``due()`` is true, or every ``every``-th optimizer step counted from the first (step 0, ``every``, ...);
        with ``collect``, a post-hook of the last optimizer fills ``latest`` with ``collect()``'s row part after
        those steps (else call ``collect()`` yourself). Returns ``self``. Raises ``ValueError`` unless exactly one
        of ``due`` and ``every`` (a positive int) is given."""
        opts = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        if (due is None) == (every is None) or (every is not None and not is_int(every, least=1)):
            raise ValueError("attach needs exactly one of due (a callable) or every (a positive int)")
        if every is not None:
            def due() -> bool:
                return self._steps % every == 0

        def pre(opt, args, kwargs):
            self.latest = None
            if due():
                self.capture()

        def post(opt, args, kwargs):
            if collect and self._captured is not None:
                self.latest = self.collect()
            self._steps += 1

        self.handles = [opts[0].register_step_pre_hook(pre), opts[-1].register_step_post_hook(post)]
        return self

    def detach(self) -> None:
        """Remove the hooks ``attach`` registered."""
        for h in getattr(self, "handles", []):
            h.remove()
        self.handles = []


def scale_stats(model: torch.nn.Module) -> dict[str, dict]:
    """Statistics of every effective scale vector (``ScaleTelemetry.collect`` without a capture): ``{vector:
    {"role", "mean", "std", "min", "max", "rms"}}``, in one device-to-host transfer."""
    return ScaleTelemetry(model).collect()["scales"]


def moe_stats(model: torch.nn.Module) -> dict:
    """Per-layer MoE telemetry that ``moe.MoE`` leaves in ``last_stats`` (load balance, entropy); with
    several processes every tensor is averaged over ranks (each rank's last micro-batch; every rank calls)."""
    out = {}
    world = distributed.world_size()
    for name, m in model.named_modules():
        stats = getattr(m, "last_stats", None)
        if stats:
            if world > 1:
                stats = {k: distributed.all_reduce_sum(v.float()) / world if torch.is_tensor(v) else v
                         for k, v in stats.items()}
            out[name] = {k: (v.tolist() if torch.is_tensor(v) else v) for k, v in stats.items()}
    return out


__all__ = ["MATRIX_ROLES", "VECTOR_STATS", "ScaleTelemetry", "layer_key", "moe_stats", "scale_stats", "vector_role"]
